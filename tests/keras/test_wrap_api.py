"""wrap(): bad input is refused with the cause named; the model stays usable."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasjit
from kerasjit import workloads

pytestmark = pytest.mark.tensorflow_reference


def small_model():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def test_wrap_refuses_what_is_not_a_keras_model():
    with pytest.raises(TypeError, match="expects a keras.Model, got function"):
        kerasjit.wrap(lambda x: x)


def test_wrap_refuses_an_uncompiled_model_and_leaves_it_untouched():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="not compiled: call model.compile"):
        kerasjit.wrap(model)
    assert not hasattr(model, "_kerasjit")
    assert model.make_train_function.__func__ is keras.Model.make_train_function


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="unknown kerasjit backend 'tpu'"):
        kerasjit.wrap(small_model(), backend="tpu")


@pytest.mark.parametrize("bad_x, bad_y, message", [
    (np.zeros((8, 5), np.float32), np.zeros(8), "incompatible|expected"),
    (np.zeros((8, 6), np.float32), np.zeros(7), "cardinality"),
    (np.array([["a"] * 6] * 8), np.zeros(8), "Invalid dtype|string"),
])
def test_bad_data_gives_the_keras_error_and_loses_nothing(bad_x, bad_y, message):
    plain = small_model()
    with pytest.raises(Exception, match=message) as plain_error:
        plain.fit(bad_x, bad_y, epochs=1, verbose=0)
    model = kerasjit.wrap(small_model(), backend="reference")
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(type(plain_error.value), match=message):
        model.fit(bad_x, bad_y, epochs=1, verbose=0)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    x, y = np.ones((8, 6), np.float32), np.zeros(8)
    model.fit(x, y, epochs=1, verbose=0)     # still trains on good data


class CustomStepModel(keras.Model):
    """A user-written train_step (gradient clipping) is traced like any other."""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(8, activation="tanh")
        self.out = keras.layers.Dense(1)

    def call(self, x):
        return self.out(self.hidden(x))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        grads = [tf.clip_by_norm(g, 0.5) for g in tape.gradient(loss, self.trainable_variables)]
        self.optimizer.apply(grads, self.trainable_variables)
        for metric in self.metrics:
            metric.update_state(loss) if metric.name == "loss" else metric.update_state(y, self(x))
        return {m.name: m.result() for m in self.metrics}


def custom_model():
    keras.utils.set_random_seed(7)
    model = CustomStepModel()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
    return model


def test_custom_train_step_matches_plain_keras():
    rng = np.random.default_rng(1)
    x = rng.random((40, 5), dtype=np.float32)
    y = x.sum(axis=1, keepdims=True)
    plain = custom_model()
    plain_h = plain.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    wrapped = kerasjit.wrap(custom_model(), backend="reference")
    jit_h = wrapped.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    for a, b in zip(plain.get_weights(), wrapped.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6)
    for key in plain_h:
        np.testing.assert_allclose(jit_h[key], plain_h[key], rtol=1e-5)


def test_wrapped_model_saves_and_loads(tmp_path):
    x, y = workloads.classification_data(32, (6,), 2)
    model = kerasjit.wrap(small_model(), backend="reference")
    model.fit(x, y.argmax(1), epochs=1, verbose=0)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0),
                               atol=1e-6)


def test_compile_events_and_buffers_are_reported_for_the_profiler():
    x, y = workloads.classification_data(64, (6,), 2)
    model = kerasjit.wrap(small_model(), backend="cpu")
    model.fit(x, y.argmax(1), batch_size=32, epochs=2, verbose=0)
    events = model._kerasjit.compile_events
    assert len(events) == 1 and "train_step" in events[0][2] and events[0][1] > 0
    model.fit(x[:40], y[:40].argmax(1), batch_size=32, epochs=1, verbose=0)   # last batch of 8
    assert len(events) == 2 and "(8, 6)" in events[1][2]
    assert model._kerasjit.buffer_bytes() > 0


def test_a_verbose_fit_announces_compiles_and_a_quiet_one_does_not(capsys):
    x, y = workloads.classification_data(32, (6,), 2)
    kerasjit.wrap(small_model(), backend="cpu").fit(x, y.argmax(1), epochs=1, verbose=0)
    assert "kerasjit" not in capsys.readouterr().out
    kerasjit.wrap(small_model(), backend="cpu").fit(x, y.argmax(1), epochs=1, verbose=2)
    out = capsys.readouterr().out
    assert "kerasjit: train_step: tracing and compiling for inputs [(32, 6), (32,)]" in out


def test_wrapping_again_switches_backend_without_stacking_wrappers():
    x, y = workloads.classification_data(32, (6,), 2)
    model = kerasjit.wrap(small_model(), backend="reference")
    model.fit(x, y.argmax(1), epochs=1, verbose=0)
    fit_after_first = model.fit
    model = kerasjit.wrap(model, backend="cpu")
    assert model._kerasjit.backend.name == "cpu"
    assert model.fit.__wrapped__ == fit_after_first.__wrapped__     # Keras's own fit, once
    model.fit(x, y.argmax(1), epochs=1, verbose=0)


def fit_twice(x, y, batch, mode):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu"),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], jit_compile=(mode == "xla"))
    if mode == "cpu":         # (no race: every step is compiled code, HLO semantics)
        model = kerasjit.wrap(model, backend="cpu", race=False)
    history = model.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0)
    return history.history, model.get_weights()


def assert_same_outcome(a, b, keys=None):
    (a_h, a_w), (b_h, b_w) = a, b
    for key in keys or a_h:
        np.testing.assert_allclose(b_h[key], a_h[key], rtol=1e-5, equal_nan=True)
    for p, q in zip(a_w, b_w):
        np.testing.assert_allclose(q, p, atol=1e-6, equal_nan=True)


def test_a_batch_size_larger_than_the_data_trains_like_keras():
    x, y = workloads.classification_data(20, (6,), 2)
    assert_same_outcome(fit_twice(x, y.argmax(1), 64, "plain"),
                        fit_twice(x, y.argmax(1), 64, "cpu"))


def test_nan_inputs_follow_hlo_semantics_without_crashing():
    # NaN goes through compiled code as XLA's HLO defines it (NaN-propagating
    # maximum/reductions), so the loss and weights are Keras+XLA's: TensorFlow's
    # own CPU kernels drop NaN in places (its cross-entropy returns a finite
    # loss). The order of a reduction's fold, which HLO leaves open, is
    # TensorFlow's: an all-NaN row's argmax is 0 (XLA's CPU code picks the last),
    # so the accuracy is plain Keras's way of counting.
    x, y = workloads.classification_data(20, (6,), 2)
    x[3, 2] = np.nan
    ours = fit_twice(x, y.argmax(1), 8, "cpu")
    assert np.isnan(ours[0]["loss"]).all()
    assert_same_outcome(fit_twice(x, y.argmax(1), 8, "xla"), ours, keys=["loss"])


def test_compiling_a_wrapped_model_again_trains_with_the_new_optimizer_and_metrics():
    x, y = workloads.classification_data(128, (20,), 3)

    def train(wrapped):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(3, activation="softmax")])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="categorical_crossentropy")
        if wrapped:
            model = kerasjit.wrap(model, race=False)
        first = model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0).history
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="categorical_crossentropy",
                      metrics=["accuracy"])
        second = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history
        return first, second, model.get_weights(), model
    *plain, _ = train(False)
    *ours, model = train(True)
    assert "compile" in vars(model)          # still wrapped, for the next compile too
    assert ours[1].keys() == plain[1].keys() == {"loss", "accuracy"}
    for a, b in zip(ours[:2], plain[:2]):
        for key in b:
            np.testing.assert_allclose(a[key], b[key], rtol=1e-5)
    for a, b in zip(ours[2], plain[2]):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_predictions_from_several_threads_at_once_are_each_right():
    import threading
    x, _ = workloads.classification_data(400, (32,), 4)
    keras.utils.set_random_seed(0)
    plain = keras.Sequential([keras.Input((32,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(4, activation="softmax")])
    plain.compile(optimizer="adam", loss="categorical_crossentropy")
    want = plain.predict(x, batch_size=40, verbose=0)
    model = kerasjit.wrap(plain, race=False)
    model.predict(x, batch_size=40, verbose=0)         # compiled before the threads start
    wrong = []

    def serve(seed):
        rng = np.random.default_rng(seed)
        for _ in range(40):      # (other batch sizes run on the compiled step for 40 rows)
            i, n = int(rng.integers(0, 360)), int(rng.integers(1, 41))
            if not np.allclose(model.predict_on_batch(x[i:i + n]), want[i:i + n], atol=1e-5):
                wrong.append((i, n))
    threads = [threading.Thread(target=serve, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong
