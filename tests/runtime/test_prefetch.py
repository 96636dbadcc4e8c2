"""Batches drawn one ahead on a second thread: same batches, same order, same
errors, same RNG draws as drawing them in place; no thread left behind."""
import threading
import time

import keras
import numpy as np
import pytest

import kerasjit
from kerasjit.runtime import feed
from kerasjit.runtime.prefetch import Prefetcher


def prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "kerasjit-prefetch"]


def wait_for_no_prefetch_threads(seconds=2.0):
    end = time.monotonic() + seconds
    while prefetch_threads() and time.monotonic() < end:
        time.sleep(0.01)
    return not prefetch_threads()


@pytest.mark.parametrize("ahead", [1, 7])
def test_items_in_order_then_the_end(ahead):
    items = Prefetcher(range(50), ahead)
    assert list(items) == list(range(50))
    with pytest.raises(StopIteration):
        next(items)
    assert wait_for_no_prefetch_threads()


def test_the_first_item_on_the_calling_thread_the_rest_ahead_on_another():
    drawn_on = []

    def source():
        for i in range(4):
            drawn_on.append(threading.current_thread())
            yield i
    items = Prefetcher(source())
    assert next(items) == 0 and drawn_on[0] is threading.current_thread()
    assert list(items) == [1, 2, 3]
    assert all(t is not threading.current_thread() for t in drawn_on[1:])


def test_an_error_arrives_in_place_of_its_item():
    def source():
        yield 1
        yield 2
        raise ValueError("bad batch 3")
    items = Prefetcher(source())
    assert [next(items), next(items)] == [1, 2]
    with pytest.raises(ValueError, match="bad batch 3"):
        next(items)


def test_an_abandoned_prefetcher_stops_its_thread():
    items = Prefetcher(iter(range(10**9)))
    next(items), next(items)
    assert prefetch_threads()
    del items                       # as when Keras stops an epoch early
    assert wait_for_no_prefetch_threads()


X = np.random.default_rng(0).normal(size=(200, 6)).astype(np.float32)
Y = keras.utils.to_categorical(np.random.default_rng(1).integers(0, 3, 200), 3)


def trained(shuffle, validation_split=0.2, seed=7, steps_per_execution=1):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")])
    m.compile(optimizer=keras.optimizers.SGD(0.1), loss="categorical_crossentropy",
              steps_per_execution=steps_per_execution)
    m = kerasjit.wrap(m, race=False)
    np.random.seed(seed)
    history = m.fit(X, Y, batch_size=16, epochs=3, shuffle=shuffle, verbose=0,
                    validation_split=validation_split).history
    return history, m.get_weights()


@pytest.mark.parametrize("shuffle", [True, False, "batch"])
def test_fit_trains_on_the_batches_it_would_draw_in_place(shuffle, monkeypatch):
    made = []
    monkeypatch.setattr(feed, "Prefetcher",
                        lambda batches, ahead: made.append(1) or Prefetcher(batches, ahead))
    trained(shuffle, validation_split=0)
    assert bool(made) == (shuffle != "batch")     # "batch" draws RNG for every batch
    history, weights = trained(shuffle)
    monkeypatch.setattr(feed, "Prefetcher", lambda batches, ahead: batches)
    in_place_history, in_place_weights = trained(shuffle)
    assert history == in_place_history
    for a, b in zip(weights, in_place_weights):
        np.testing.assert_array_equal(a, b)


def test_no_thread_draws_batches_after_fit_returns():
    keras.utils.set_random_seed(2)
    m = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")])
    m.compile(optimizer="sgd", loss="categorical_crossentropy")
    m = kerasjit.wrap(m, race=False)
    m.fit(X, Y, batch_size=16, epochs=2, steps_per_epoch=3, validation_split=0.2, verbose=0)
    assert not prefetch_threads()     # an epoch cut short by steps_per_epoch included
    m.predict(X, batch_size=16, verbose=0)
    assert not prefetch_threads()


def test_with_steps_per_execution_the_batches_are_those_drawn_in_place(monkeypatch):
    monkeypatch.setattr(feed, "_LAZY", False)     # (else they are Rows: test_lazy_batches.py)
    history, weights = trained(True, steps_per_execution=4)     # 4 batches ahead
    monkeypatch.setattr(feed, "Prefetcher", lambda batches, ahead: batches)
    in_place_history, in_place_weights = trained(True, steps_per_execution=4)
    assert history == in_place_history
    for a, b in zip(weights, in_place_weights):
        np.testing.assert_array_equal(a, b)


def test_a_closed_prefetcher_ends_instead_of_waiting():
    items = Prefetcher(iter(range(10)))
    next(items)
    items.close()
    assert not prefetch_threads()
    with pytest.raises(StopIteration):
        next(items)
