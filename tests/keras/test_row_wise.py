"""One compile for every batch size where the step is row-wise (a predict
step, as most are): other batch sizes run on the compiled step, padded or
split, and give plain Keras's results."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasjit


@pytest.fixture(autouse=True)
def _cold(monkeypatch):
    monkeypatch.setenv("KERASJIT_CACHE_DIR", "")


def _cnn():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((10, 10, 3)), keras.layers.Conv2D(6, 3, activation="relu"),
        keras.layers.BatchNormalization(), keras.layers.MaxPooling2D(2),
        keras.layers.Dropout(0.3), keras.layers.Flatten(),
        keras.layers.Dense(4, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def _images(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 10, 10, 3)).astype(np.float32)


def _compiles(model):
    return [e for e in model._kerasjit.compile_events if "compiling" in e.what]


@pytest.mark.parametrize("background", [False, True])
def test_predict_on_batch_over_24_batch_sizes_compiles_once(background):
    """In the background, the sizes met while the first one compiles run in
    TensorFlow, and on the compiled step when they come again."""
    plain, model = _cnn(), kerasjit.wrap(_cnn(), background=background)
    sizes = np.random.default_rng(2).permutation(np.arange(1, 25))
    step = model._kerasjit.predict
    for _ in range(1 + background):
        for i, n in enumerate(sizes):
            x = _images(n, seed=i)
            np.testing.assert_allclose(model.predict_on_batch(x), plain.predict_on_batch(x),
                                       rtol=1e-5, atol=1e-6)
        step.wait()
    assert len(_compiles(model)) == 1 and len(step.programs) == 1
    # every other size, the larger ones split, ran on the compiled step
    assert len(step.row_wise) == 23 and None not in step.row_wise.values()
    # the open trace was read and the compiled size bridged once for all 23
    assert len(step.row_wise_proofs) == 1


def test_a_batch_size_many_times_the_compiled_one_compiles_when_it_comes_again():
    plain, model = _cnn(), kerasjit.wrap(_cnn(), background=False)
    x = _images(64)
    for n in (2, 64, 64, 64, 3):
        np.testing.assert_allclose(model.predict_on_batch(x[:n]), plain.predict_on_batch(x[:n]),
                                   rtol=1e-5, atol=1e-6)
    step = model._kerasjit.predict
    assert len(_compiles(model)) == 2 and len(step.programs) == 2
    # (3 rows: served by the larger one)
    assert [run.size for run in step.row_wise.values() if run is not None] == [64]


def test_predict_with_a_partial_last_batch_compiles_once():
    plain, model = _cnn(), kerasjit.wrap(_cnn(), background=False)
    x = _images(100)
    np.testing.assert_allclose(model.predict(x, batch_size=32, verbose=0),
                               plain.predict(x, batch_size=32, verbose=0), rtol=1e-5, atol=1e-6)
    assert len(_compiles(model)) == 1


def test_predict_then_predict_on_batch_of_its_batch_size_share_one_compiled_step():
    """predict feeds the step x, predict_on_batch (x,): Keras's predict_step
    reads both alike, so the second finds the first one's program."""
    plain, model = _cnn(), kerasjit.wrap(_cnn(), background=False)
    x = _images(64)
    np.testing.assert_allclose(model.predict(x, batch_size=32, verbose=0),
                               plain.predict(x, batch_size=32, verbose=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.predict_on_batch(x[:32]), plain.predict_on_batch(x[:32]),
                               rtol=1e-5, atol=1e-6)
    assert len(_compiles(model)) == 1 and len(model._kerasjit.predict.programs) == 1


def test_a_predict_step_of_the_models_own_gets_its_batch_as_keras_passes_it():
    class FirstOfBatch(keras.Model):
        def predict_step(self, data):     # (reads predict_on_batch's (x,) only)
            return self(data[0], training=False)

    def first_of_batch():
        keras.utils.set_random_seed(1)
        inputs = keras.Input((5,))
        model = FirstOfBatch(inputs, keras.layers.Dense(3)(inputs))
        model.compile(optimizer="sgd", loss="mse")
        return model
    x = np.random.default_rng(3).standard_normal((8, 5)).astype(np.float32)
    plain, model = first_of_batch(), kerasjit.wrap(first_of_batch(), background=False)
    np.testing.assert_allclose(model.predict_on_batch(x), plain.predict_on_batch(x),
                               rtol=1e-5, atol=1e-6)


def test_a_step_whose_rows_meet_is_compiled_per_batch_size_and_stays_right():
    """A layer centring each batch on its mean: another batch size is no
    padded copy of the compiled one, so kerasjit does not serve it so."""
    def centred():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3),
                                  keras.layers.Lambda(lambda h: h - keras.ops.mean(h, axis=0))])
        model.compile(optimizer="sgd", loss="mse")
        return model
    plain, model = centred(), kerasjit.wrap(centred(), background=False)
    x = np.random.default_rng(3).standard_normal((30, 5)).astype(np.float32)
    for n in (8, 5, 12, 5, 12):
        np.testing.assert_allclose(model.predict_on_batch(x[:n]), plain.predict_on_batch(x[:n]),
                                   rtol=1e-5, atol=1e-6)
    step = model._kerasjit.predict
    assert set(step.row_wise.values()) == {None}
    assert len(step.programs) == 3


def test_a_step_that_branches_on_its_static_batch_size_is_not_served_so():
    """Traced for any batch size the step is row-wise, traced for the compiled
    size it centres the batch (as kerasjit's compiled steps, traced per batch
    size, run it; plain Keras traces it for any size): the program that runs
    is not the one proved, so every size runs its own, centred."""
    def branching():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3), keras.layers.Lambda(
            lambda h: h - keras.ops.mean(h, axis=0) if h.shape[0] is not None else h)])
        model.compile(optimizer="sgd", loss="mse")
        return model
    model = kerasjit.wrap(branching(), background=False)
    x = np.random.default_rng(3).standard_normal((30, 5)).astype(np.float32)
    for n in (8, 5, 12):
        np.testing.assert_allclose(model.predict_on_batch(x[:n]).mean(axis=0), 0, atol=1e-6)
    assert set(model._kerasjit.predict.row_wise.values()) == {None}


def test_a_step_asserting_on_the_whole_batch_is_not_served_so():
    """An assertion on the batch's sum holds for each part of a split batch
    and not for the whole: the step is compiled per batch size, and raises
    where plain Keras does."""
    import tensorflow as tf

    def asserting():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Lambda(
            lambda h: (tf.debugging.assert_less(tf.reduce_sum(h), 30.0), h * 2.0)[1])])
        model.compile(optimizer="sgd", loss="mse")
        return model
    plain, model = asserting(), kerasjit.wrap(asserting(), background=False)
    x = np.ones((12, 5), np.float32) * 0.4          # 8 rows sum to 16, 12 to 24
    np.testing.assert_allclose(model.predict_on_batch(x[:8]), plain.predict_on_batch(x[:8]))
    np.testing.assert_allclose(model.predict_on_batch(x[:12]), plain.predict_on_batch(x[:12]))
    x[:, :] = 0.6                                   # 8 rows sum to 24, 12 to 36
    with pytest.raises(tf.errors.InvalidArgumentError):
        plain.predict_on_batch(x)
    with pytest.raises(tf.errors.InvalidArgumentError):
        model.predict_on_batch(x)
    assert set(model._kerasjit.predict.row_wise.values()) == {None}


def test_an_index_out_of_range_in_another_batch_size_raises_as_in_keras():
    def embedded():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((6,), dtype="int32"), keras.layers.Embedding(10, 4),
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse")
        return model
    plain, model = embedded(), kerasjit.wrap(embedded(), background=False)
    ids = np.random.default_rng(4).integers(0, 10, (16, 6)).astype(np.int32)
    np.testing.assert_allclose(model.predict_on_batch(ids), plain.predict_on_batch(ids),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.predict_on_batch(ids[:5]), plain.predict_on_batch(ids[:5]),
                               rtol=1e-5, atol=1e-6)
    assert model._kerasjit.predict.row_wise
    bad = ids[:5].copy()
    bad[3, 2] = 10
    with pytest.raises(tf.errors.InvalidArgumentError, match="10 is not in"):
        plain.predict_on_batch(bad)
    with pytest.raises(tf.errors.InvalidArgumentError, match="10 is not in"):
        model.predict_on_batch(bad)


def test_a_causal_attention_model_over_batch_sizes_compiles_once():
    """Dense layers over a sequence flatten rows of positions for a matmul, and
    the causal mask is a constant as large as the batch: still row-wise."""
    def decoder():
        keras.utils.set_random_seed(1)
        tokens = keras.Input((10,), dtype="int32")
        h = keras.layers.Embedding(50, 8)(tokens)
        h = h + keras.layers.MultiHeadAttention(2, 4)(h, h, use_causal_mask=True)
        model = keras.Model(tokens, keras.layers.Dense(50)(keras.layers.LayerNormalization()(h)))
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        return model
    plain, model = decoder(), kerasjit.wrap(decoder(), background=False)
    ids = np.random.default_rng(5).integers(0, 50, (24, 10)).astype(np.int32)
    for n in (8, 3, 5, 12, 24):
        np.testing.assert_allclose(model.predict_on_batch(ids[:n]), plain.predict_on_batch(ids[:n]),
                                   rtol=1e-5, atol=1e-5)
    assert len(_compiles(model)) == 1
