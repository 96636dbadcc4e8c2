"""Bad and edge inputs meet what plain Keras does: the same exception with
the weights unchanged, the same results for no data and for NaN outputs."""
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasjit

pytestmark = pytest.mark.tensorflow_reference

RNG = np.random.default_rng(0)
X = RNG.normal(size=(64, 8)).astype(np.float32)
LABELS = RNG.integers(0, 10, 64)
TOKENS = RNG.integers(0, 20, (64, 6)).astype(np.int32)


def classifier(wrapped, steps_per_execution=1, activation="relu"):
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation=activation),
                          keras.layers.Dense(10)])
    m.compile(optimizer="adam", metrics=["accuracy"], steps_per_execution=steps_per_execution,
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return kerasjit.wrap(m) if wrapped else m


def embedder(wrapped):
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((6,), dtype="int32"), keras.layers.Embedding(20, 4),
                          keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
    m.compile(optimizer="adam", loss="mse")
    return kerasjit.wrap(m) if wrapped else m


def outcome(call, model):
    """((exception type, what the failing kernel said), weights after) of `call`."""
    error = None
    try:
        call()
    except Exception as e:
        said = getattr(e, "message", str(e)).split("\n\t [[")[0].strip().splitlines()[-1]
        error = (type(e), said)
    return error, [w.numpy() for w in model.weights]


def same_outcome(make, call, unchanged=True):
    """Run `call(model)` on a trained plain and a trained wrapped model; both
    must raise the same error and leave the same weights (with `unchanged`,
    those they had before)."""
    results = []
    for wrapped in (False, True):
        m = make(wrapped)
        m.fit(*call.data, batch_size=16, epochs=1, shuffle=False, verbose=0)
        before = [w.numpy() for w in m.weights]
        error, after = outcome(lambda: call(m), m)
        assert error is not None, "no error raised"
        for a, b in zip(before, after) if unchanged else ():
            np.testing.assert_array_equal(a, b)
        results.append((error, after))
    (plain_error, plain_weights), (error, weights) = results
    assert error == plain_error
    for a, b in zip(plain_weights, weights):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    return error


def with_data(data, fn):
    fn.data = data
    return fn


@pytest.mark.parametrize("entry, bad", [("fit", 10), ("evaluate", -1),
                                        ("train_on_batch", 2**31 - 1), ("test_on_batch", 12)])
def test_an_out_of_range_label_raises_keras_error_and_keeps_the_weights(bad, entry):
    labels = LABELS.copy()
    labels[5] = bad
    error = same_outcome(classifier, with_data((X, LABELS), lambda m: (
        getattr(m, entry)(X, labels, **({"batch_size": 64, "verbose": 0, "shuffle": False}
                                         if entry == "fit" else {"batch_size": 64, "verbose": 0}
                                         if entry == "evaluate" else {})))))
    assert error[0] is tf.errors.InvalidArgumentError
    assert error[1].startswith("Received a label value of ")


@pytest.mark.parametrize("entry", ["fit", "evaluate", "predict"])
def test_an_out_of_range_token_raises_keras_error_and_keeps_the_weights(entry):
    tokens = TOKENS.copy()
    tokens[40, 3] = 20
    y = RNG.normal(size=(64, 1)).astype(np.float32)
    args = (tokens,) if entry == "predict" else (tokens, y)
    error = same_outcome(embedder, with_data((TOKENS, y), lambda m: getattr(m, entry)(
        *args, batch_size=64, verbose=0, **({"shuffle": False} if entry == "fit" else {}))))
    assert error[0] is tf.errors.InvalidArgumentError
    assert error[1].startswith("indices[40,3] = 20 is not in [0, 20)")


def test_a_bad_label_within_steps_per_execution_stops_at_its_step():
    """Steps before the bad one are trained, the bad one and those after are not."""
    labels = LABELS.copy()
    labels[40] = 10          # third batch of 16, in the first execution of 4 steps
    same_outcome(lambda wrapped: classifier(wrapped, steps_per_execution=4),
                 with_data((X, LABELS), lambda m: m.fit(X, labels, batch_size=16, shuffle=False,
                                                        verbose=0)), unchanged=False)


def test_jit_raises_tensorflow_error_for_an_out_of_range_gather():
    gather = kerasjit.jit(lambda params, index: tf.gather(params, index) * 2.0)
    params = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(gather(params, np.array([3, 0])), params[[3, 0]] * 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"indices\[1\] = 4 is not in"):
        gather(params, np.array([3, 4]))


def test_an_integer_power_compiles_and_a_negative_exponent_raises_as_in_tensorflow():
    fn = lambda x, n: tf.pow(x, n) * 3   # noqa: E731
    x, n = np.array([2, -3, 5, 1, 0], np.int32), np.array([10, 3, 0, 7, 4], np.int32)
    assert kerasjit.explain(fn, x, n).clusters[0].kind == "compiled"
    np.testing.assert_array_equal(kerasjit.jit(fn)(x, n), fn(x, n).numpy())
    with pytest.raises(tf.errors.InvalidArgumentError, match="negative integer powers"):
        kerasjit.jit(fn)(x, np.array([1, 1, -1, 1, 1], np.int32))


@pytest.mark.parametrize("entry", ["fit", "evaluate"])
def test_no_samples_give_keras_results_and_warning(entry):
    results = []
    for wrapped in (False, True):
        m = classifier(wrapped)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = getattr(m, entry)(X[:0], LABELS[:0], verbose=0)
        results.append((out.history if entry == "fit" else out,
                        [str(w.message)[:40] for w in caught if "ran out of data" in
                         str(w.message)]))
    assert results[0] == results[1]
    assert results[0][1], "plain Keras warns of no data"


def test_nan_outputs_give_keras_accuracy():
    """An all-NaN row's argmax is index 0, as in TensorFlow's kernels. (No relu:
    TensorFlow's oneDNN relu maps NaN to 0, its own kernel and XLA keep NaN.)"""
    x = X.copy()
    x[::3, 2] = np.nan                    # every third row's outputs are all NaN
    found = []
    for wrapped in (False, True):
        m = classifier(wrapped, activation="tanh")
        m.fit(X, LABELS, batch_size=16, epochs=1, verbose=0)
        found.append(m.evaluate(x, np.zeros(64, np.int64), batch_size=64, verbose=0,
                                return_dict=True)["accuracy"])
    assert found[0] == found[1] and found[0] > 0


def test_a_failed_assertion_in_a_step_raises_as_in_tensorflow():
    """tf.debugging's assertions hold in compiled steps too (XLA drops them)."""
    def run(compile_step):
        total = tf.Variable(0.0)

        def accumulate(x):
            tf.debugging.assert_non_negative(x, message="negative input")
            total.assign_add(tf.reduce_sum(x))
            return total * 1.0
        step = compile_step(accumulate)
        step(np.ones(3, np.float32))
        with pytest.raises(tf.errors.InvalidArgumentError, match="negative input"):
            step(np.array([1, -1, 2], np.float32))
        return float(np.asarray(step(np.ones(3, np.float32))))
    assert run(kerasjit.jit) == run(tf.function)


def test_explaining_a_model_without_a_batch_says_it_needs_one():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)], name="tiny")
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(TypeError, match=r"kerasjit.explain\(tiny\) needs a batch to trace"):
        kerasjit.explain(model)
    x, y = np.ones((4, 3), np.float32), np.ones((4, 2), np.float32)
    assert "ops run compiled" in str(kerasjit.explain(model, x, y))


def test_explaining_a_model_of_several_inputs_takes_them_as_fit_does():
    images, tokens = keras.Input((4, 4, 1)), keras.Input((3,), dtype="int32")
    joined = keras.layers.Concatenate()([
        keras.layers.Flatten()(images),
        keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(9, 2)(tokens))])
    model = keras.Model([images, tokens], keras.layers.Dense(2)(joined))
    model.compile(optimizer="sgd", loss="mse")
    x = [np.ones((4, 4, 4, 1)), np.ones((4, 3), np.int32)]       # (float64 images)
    assert "ops run compiled" in str(kerasjit.explain(model, x, np.ones((4, 2))))
