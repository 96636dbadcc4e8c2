"""The per-step fast paths of a wrapped model change nothing Keras users see:
batch logs converted as Keras's pythonify_logs does, and each input signature
run straight through its executable once its cluster is settled."""
import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.utils import python_utils

import kerasjit
from kerasjit.runtime import feed

from tests.support.small_classifier import X, Y, model

pytestmark = pytest.mark.tensorflow_reference


def fit(m, **kwargs):
    return m.fit(X, Y, **{"batch_size": 16, "epochs": 2, "shuffle": False, "verbose": 0,
                          **kwargs}).history


def same_logs(got, want):
    assert list(got) == list(want)          # same keys, same order
    assert [type(v) for v in got.values()] == [type(v) for v in want.values()]
    np.testing.assert_equal(got, want)


NUMPY_LOGS = [
    {"loss": np.array(0.25, np.float32), "accuracy": np.float32(0.5)},
    # Nested dicts are flattened in sorted order, later keys overwriting earlier ones.
    {"val": {"x": np.array(1.5), "a": np.float64(2)}, "a": 3.5, "x": np.array(7, np.int64),
     "b": {"deep": {"ok": np.array(True)}}},
    {"outputs": np.ones((4, 3), np.float32), "loss": np.float32(1)},    # predict's batch logs
    {}, None,
]
OTHER_LOGS = [
    {"loss": tf.constant(1.5), "accuracy": np.array(0.5, np.float32)},
    {"nested": {"loss": tf.constant([2.0])}, "a": np.float32(1)},
    {"name": "abc", "vector": np.arange(3.0), "none": None, "count": 3, "flag": True,
     "complex": np.array(1 + 2j), "number": np.array("4.5")},
    {"single": np.ones((1, 1), np.float32)},
]


@pytest.mark.parametrize("logs", NUMPY_LOGS + OTHER_LOGS)
def test_quick_log_conversion_gives_what_keras_gives(logs):
    with feed.feeding(object()):
        got = python_utils.pythonify_logs(logs)
    same_logs(got, feed._KERAS_PYTHONIFY(logs))


@pytest.mark.parametrize("logs", NUMPY_LOGS[:2])
def test_numpy_logs_skip_the_tensor_test(logs, monkeypatch):
    tested = []
    monkeypatch.setattr(keras.src.backend, "is_tensor", tested.append)
    with feed.feeding(object()):
        python_utils.pythonify_logs(logs)
    assert tested == []
    python_utils.pythonify_logs(logs)       # outside a wrapped model's fit: Keras's own
    assert len(tested) >= 2


@pytest.mark.parametrize("outputs", [
    [np.ones((4, 3)), np.zeros((2, 3))], [np.arange(5.0)], [np.arange(3), np.arange(2)],
    [np.ones((2, 3)), np.ones((2, 4))],     # ragged: Keras's own joining
])
def test_predict_outputs_are_joined_as_keras_joins_them(outputs):
    from keras.src.backend.tensorflow import trainer
    want = feed._KERAS_TO_NUMPY(feed._KERAS_CONCAT([tf.constant(o) for o in outputs]))
    with feed.feeding(object()):
        got = trainer.convert_to_np_if_not_ragged(trainer.potentially_ragged_concat(outputs))
    if isinstance(want, tf.RaggedTensor):
        assert isinstance(got, tf.RaggedTensor) and got.to_list() == want.to_list()
    else:
        assert type(got) is np.ndarray
        np.testing.assert_array_equal(got, want)


def test_a_plain_model_fit_after_a_wrapped_one_converts_logs_with_keras_code(monkeypatch):
    calls, keras_own = [], feed._KERAS_PYTHONIFY

    def counted(logs):
        calls.append(logs)
        return keras_own(logs)
    monkeypatch.setattr(feed, "_KERAS_PYTHONIFY", counted)
    steps = 2 * 6                   # 2 epochs of 90 samples in batches of 16
    wrapped_history = fit(model(True, race=False))
    assert len(calls) < steps       # batch logs converted quickly
    calls.clear()
    plain_history = fit(model(False))
    assert len(calls) >= 2 * steps  # each batch's begin and end through Keras's code
    for key in plain_history:
        np.testing.assert_allclose(wrapped_history[key], plain_history[key], rtol=1e-4)


def test_a_plain_model_trained_inside_a_wrapped_models_callback_trains_as_outside():
    """The numpy batches are on while the wrapped model's fit runs, also for a
    plain model its callback fits: that model still sees every batch."""
    inside, outside = model(False), model(False)

    class FitAnother(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.history = fit(inside)
    callback = FitAnother()
    fit(model(True, race=False), epochs=1, callbacks=[callback])
    np.testing.assert_allclose(callback.history["loss"], fit(outside)["loss"], rtol=1e-6)
    for a, b in zip(inside.get_weights(), outside.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def runs(m):
    return m._kerasjit.train.programs


def batch_size(key):
    return key[1][0][0][0]          # key: (structure, ((x's shape, dtype), ...))


@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_each_signature_runs_directly_and_trains_like_keras(steps_per_execution):
    # 90 = 5 x 16 + 10: the partial last batch is a signature of its own; with 4
    # steps per execution it follows a full batch in the same execution.
    wrapped = model(True, steps_per_execution, race=False)
    history = fit(wrapped)
    plain = model(False, steps_per_execution)
    np.testing.assert_allclose(history["loss"], fit(plain)["loss"], rtol=1e-4)
    for a, b in zip(plain.get_weights(), wrapped.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6)
    assert sorted(map(batch_size, runs(wrapped))) == [10, 16]
    assert all(run.direct is not None for run in runs(wrapped).values())


def test_the_direct_route_computes_what_program_run_does():
    wrapped = model(True, race=False)
    fit(wrapped, epochs=1)
    run = next(run for key, run in runs(wrapped).items() if batch_size(key) == 16)
    batch = [X[:16], Y[:16].astype(np.float32)]
    state = run.state.read()
    # Fresh copies each: variables are updated in place (donated to the executable).
    direct = run.direct(batch, [np.array(v) for v in state])
    reference = run.program.run(batch, [np.array(v) for v in state])
    np.testing.assert_equal(direct, reference)


def test_the_direct_route_waits_for_the_race():
    keras.utils.set_random_seed(3)       # (a convolution: only such clusters race)
    wrapped = keras.Sequential([keras.Input((6,)), keras.layers.Reshape((6, 1)),
                                keras.layers.Conv1D(3, 3), keras.layers.GlobalMaxPooling1D()])
    wrapped.compile(optimizer="sgd", loss="categorical_crossentropy")
    wrapped = kerasjit.wrap(wrapped)
    wrapped.train_on_batch(X[:16], Y[:16])
    (run,) = runs(wrapped).values()
    race = run.program.clusters[0].race
    for _ in range(10):                 # the race's calls go through Program.run
        if race.winner is not None:
            break
        assert run.direct is None
        wrapped.train_on_batch(X[:16], Y[:16])
    wrapped.train_on_batch(X[:16], Y[:16])
    assert race.winner is not None
    assert (run.direct is not None) == (race.winner == "compiled")


def test_programs_with_tensorflow_clusters_run_through_program_run():
    class HostDoubling(keras.layers.Layer):        # tf.py_function: runs in TensorFlow
        def call(self, x):
            y = tf.py_function(lambda t: t * 2.0, [x], tf.float32)
            y.set_shape(x.shape)
            return y
    results = []
    for wrapped in (False, True):
        keras.utils.set_random_seed(3)
        m = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5), HostDoubling(),
                              keras.layers.Dense(3, activation="softmax")])
        m.compile(optimizer="sgd", loss="categorical_crossentropy")
        if wrapped:
            kerasjit.wrap(m, race=False)
        results.append(fit(m)["loss"])
    np.testing.assert_allclose(results[0], results[1], rtol=1e-4)
    assert all(run.direct is None and len(run.program.clusters) > 1
               for run in runs(m).values())


def test_read_only_arrays_and_numpy_scalars_are_taken_as_given():
    f = kerasjit.jit(lambda a, s: tf.reduce_sum(a * s, axis=0), race=False)
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    a.flags.writeable = False               # its address comes the long way
    np.testing.assert_allclose(f(a, np.float32(2)), a.sum(0) * 2)
    (executable,) = f.executables()
    two, three = np.float32(2), np.float32(3)
    for s in (two, two, three, two):
        np.testing.assert_allclose(executable([a, s])[0], a.sum(0) * s)
    with pytest.raises(ValueError, match=r"expected shape \(3, 2\), got \(2, 3\)"):
        executable([a.T.copy(), two])
