"""Shuffled batches with steps_per_execution stay Rows of the training data,
gathered by the native multi-step call (a thread of its own gathering the
next step's rows): the same batches, the same training, as gathering them
with numpy; anything the driver cannot gather is gathered by numpy."""
import keras
import numpy as np
import pytest

import kerasjit
from kerasjit.backends.cpu import parallel
from kerasjit.backends.cpu.executable import CpuExecutable
from kerasjit.runtime import feed
from kerasjit.arrays import Rows, gathered

from tests.support.small_classifier import X, Y, model

pytestmark = pytest.mark.tensorflow_reference


def trained(shuffle, **fit_kwargs):
    m = model(True, steps_per_execution=3, race=False)
    np.random.seed(7)
    # 72 training rows in batches of 10: calls of 3 steps, 3 steps, then 1 and a
    # partial batch of 2 (each its own signature: run one by one).
    history = m.fit(X, Y, batch_size=10, epochs=3, shuffle=shuffle, verbose=0,
                    validation_split=0.2, **fit_kwargs).history
    return history, m.get_weights()


@pytest.fixture
def native_gathers(monkeypatch):
    """How many per-step inputs the driver gathered (one per input per call)."""
    count = []
    original = CpuExecutable._gather

    def spy(self, bid, values):
        result = original(self, bid, values)
        count.append(result is not None)
        return result
    monkeypatch.setattr(CpuExecutable, "_gather", spy)
    return count


@pytest.mark.parametrize("threads", [2, 1])      # a gathering thread, or the loop itself
@pytest.mark.parametrize("shuffle, fit_kwargs", [
    (True, {}), ("batch", {}), (True, {"class_weight": {0: 1.0, 1: 2.0, 2: 0.5}})])
def test_gathered_natively_trains_as_gathered_by_numpy(shuffle, fit_kwargs, threads,
                                                       native_gathers, monkeypatch):
    before = parallel._threads.value
    parallel.set_threads(threads)
    try:
        history, weights = trained(shuffle, **fit_kwargs)
    finally:
        parallel.set_threads(before)
    # x, y (and the class weights' sample weights) of each multi-step call
    assert sum(native_gathers) >= 3 * 2 * 2
    monkeypatch.setattr(feed, "_LAZY", False)
    want_history, want_weights = trained(shuffle, **fit_kwargs)
    assert history == want_history
    for got, want in zip(weights, want_weights):
        np.testing.assert_array_equal(got, want)


def test_unshuffled_batches_are_views_not_rows(native_gathers):
    trained(False)
    assert not any(native_gathers)


def test_rows_are_gathered_by_numpy_as_fancy_indexing_gathers_them():
    indices = np.array([5, 0, 5, 89])
    rows = Rows(X, indices)
    assert rows.shape == (4, 6) and rows.dtype == X.dtype
    np.testing.assert_array_equal(np.asarray(rows), X[indices])
    np.testing.assert_array_equal(np.asarray(rows, np.float64), X[indices].astype(np.float64))
    assert gathered(X) is X


def step_of():
    keras.utils.set_random_seed(1)
    m = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    w = m.layers[0].kernel

    def step(x):
        w.assign_sub(0.01 * keras.ops.matmul(keras.ops.transpose(x), keras.ops.ones((4, 3))))
        return keras.ops.sum(w)
    return kerasjit.jit(step, race=False), w


@pytest.mark.parametrize("sources", [
    [np.asfortranarray(X)] * 3,             # rows not contiguous
    [X, X.copy(), X],                       # steps drawing from different arrays
], ids=["layout", "sources"])
def test_rows_the_driver_cannot_gather_are_gathered_by_numpy(sources, native_gathers):
    batches = [(Rows(source, np.array([3, 1, 4, 1]) + 10 * s),) for s, source in
               enumerate(sources)]
    compiled, w = step_of()
    start = w.numpy().copy()
    got = compiled.run_many(batches)
    assert native_gathers and not any(native_gathers)
    expected = start
    for (rows,) in batches:
        expected = expected - 0.01 * np.asarray(rows).T @ np.ones((4, 3), np.float32)
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(got, expected.sum(), rtol=1e-5)


def test_rows_the_driver_gathers_give_what_numpy_gives(native_gathers):
    batches = [(Rows(X, np.array([3, 1, 4, 1]) + 10 * s),) for s in range(5)]
    compiled, w = step_of()
    start = w.numpy().copy()
    compiled.run_many(batches)
    assert native_gathers and all(native_gathers)
    expected = start
    for (rows,) in batches:
        expected = expected - 0.01 * np.asarray(rows).T @ np.ones((4, 3), np.float32)
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6)


def test_named_inputs_are_gathered_natively_too(native_gathers, monkeypatch):
    def fit_named():
        keras.utils.set_random_seed(3)
        a, b = keras.Input((4,), name="a"), keras.Input((2,), name="b")
        h = keras.layers.Dense(5, activation="relu")(keras.layers.Concatenate()([a, b]))
        m = keras.Model({"a": a, "b": b}, keras.layers.Dense(3, activation="softmax")(h))
        m.compile(optimizer="sgd", loss="categorical_crossentropy", steps_per_execution=3)
        m = kerasjit.wrap(m, race=False)
        np.random.seed(7)
        named = {"a": np.ascontiguousarray(X[:, :4]), "b": np.ascontiguousarray(X[:, 4:])}
        m.fit(named, Y, batch_size=10, epochs=2, verbose=0)
        return m.get_weights()
    weights = fit_named()
    assert sum(native_gathers) == 2 * 3 * 3     # epochs x calls x (a, b, y)
    monkeypatch.setattr(feed, "_LAZY", False)
    for got, want in zip(weights, fit_named()):
        np.testing.assert_array_equal(got, want)
