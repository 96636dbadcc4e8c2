"""Compiled or TensorFlow, whichever is faster (runtime/race.py): a compiled
cluster is timed against TensorFlow on its first calls and TensorFlow takes
over only when clearly faster; the step stays right either way.

Where a test needs a given winner, it does not leave that to this machine's
speed: its races read a clock (race.py's time.perf_counter) that moves only by
the seconds each contender's call is set to cost."""
import warnings
from types import SimpleNamespace

import keras
import numpy as np
import pytest

import kerasjit
from kerasjit.runtime import race
from kerasjit.runtime.race import MAX_TRIALS, MIN_TRIALS

X = np.random.default_rng(0).normal(size=(64, 6)).astype(np.float32)
Y = keras.utils.to_categorical(np.random.default_rng(1).integers(0, 3, 64), 3)   # float64


FIRST_LAYERS = {   # what TensorFlow may run faster (so the cluster races), or not
    "convolution": lambda: [keras.layers.Reshape((6, 1)),
                            keras.layers.Conv1D(4, 3, activation="relu"), keras.layers.Flatten()],
    "batched matmul": lambda: [keras.layers.Reshape((2, 3)), keras.layers.Lambda(
        lambda t: keras.ops.matmul(t, keras.ops.transpose(t, (0, 2, 1)))),
        keras.layers.Flatten()],
    "dense": lambda: [keras.layers.Dense(5, activation="relu")],
    # Products of 16x16x32: sgemm calls, no loop nest, so no race.
    "batched GEMMs": lambda: [keras.layers.Dense(16 * 32), keras.layers.Reshape((16, 32)),
                              keras.layers.Lambda(lambda t: keras.ops.matmul(
                                  t, keras.ops.transpose(t, (0, 2, 1)))),
                              keras.layers.Flatten()],
}


def model(first="convolution", **wrap_kwargs):
    """A step of one cluster, starting with FIRST_LAYERS[first]."""
    keras.utils.set_random_seed(3)
    first = FIRST_LAYERS[first]()
    m = keras.Sequential([keras.Input((6,)), *first, keras.layers.Dense(3, activation="softmax")])
    m.compile(optimizer="sgd", loss="categorical_crossentropy")
    return kerasjit.wrap(m, **wrap_kwargs) if wrap_kwargs else m


def race_costs(monkeypatch, compiled, tensorflow):
    """Races timed by a clock that each call of a contender moves by its cost in
    seconds (and nothing else moves): the contenders still run."""
    clock = SimpleNamespace(seconds=0.0)
    monkeypatch.setattr(race, "time", SimpleNamespace(perf_counter=lambda: clock.seconds))
    run = race.Race.run

    def costing(seconds, contender):
        def call(args):
            clock.seconds += seconds
            return contender(args)
        return call

    def run_costed(self, args, compiled_fn, tensorflow_fn):
        return run(self, args, costing(compiled, compiled_fn),
                   costing(tensorflow, tensorflow_fn))
    monkeypatch.setattr(race.Race, "run", run_costed)


@pytest.fixture
def slow_compiled_code(monkeypatch):
    """Compiled calls that take 50 ms, TensorFlow's 1 ms: TensorFlow must win."""
    race_costs(monkeypatch, compiled=0.05, tensorflow=0.001)


@pytest.fixture
def fast_compiled_code(monkeypatch):
    """Compiled calls that take 1 ms, TensorFlow's 50 ms: compiled code must win."""
    race_costs(monkeypatch, compiled=0.001, tensorflow=0.05)


def train(m, epochs=2):
    return m.fit(X, Y, batch_size=8, epochs=epochs, shuffle=False, verbose=0).history["loss"]


def clusters(m):
    (program,) = [run.program for run in m._kerasjit.train.programs.values()]
    return program.clusters


def test_tensorflow_takes_over_a_cluster_it_runs_clearly_faster(slow_compiled_code):
    plain = train(model())
    wrapped = model(backend="cpu")
    with pytest.warns(RuntimeWarning, match="now runs in TensorFlow: TensorFlow ran it faster"):
        losses = train(wrapped)
    np.testing.assert_allclose(losses, plain, rtol=1e-5)
    (cluster,) = clusters(wrapped)
    assert cluster.kind == "tensorflow" and "faster" in cluster.reason
    assert len(cluster.race.times["compiled"]) == len(cluster.race.times["tensorflow"]) \
        == MIN_TRIALS     # (a clear verdict: no more calls)


@pytest.mark.parametrize("tensorflow, winner", [(0.00085, "compiled"), (0.00075, "tensorflow")])
def test_a_near_tie_is_timed_longer_and_decided_by_the_margin(monkeypatch, tensorflow, winner):
    race_costs(monkeypatch, compiled=0.001, tensorflow=tensorflow)
    wrapped = model(backend="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train(wrapped, epochs=3)
    (cluster,) = clusters(wrapped)
    assert len(cluster.race.times["compiled"]) == MAX_TRIALS
    assert cluster.race.winner == winner


def test_calls_timed_beside_a_compile_do_not_count(slow_compiled_code):
    """A compile running beside the training (another model's, another step's)
    takes cores from whichever contender is timed then: the race counts no
    such call, and decides on the calls timed after it."""
    wrapped = model(backend="cpu")
    with race.BACKGROUND_COMPILES.one():
        train(wrapped)
    (cluster,) = clusters(wrapped)
    assert cluster.race.winner is None and cluster.race.calls > 2 * MIN_TRIALS + 2
    assert cluster.race.times == {"compiled": [], "tensorflow": []}
    with pytest.warns(RuntimeWarning, match="now runs in TensorFlow"):
        train(wrapped)
    assert cluster.race.winner == "tensorflow" and len(cluster.race.times["compiled"]) == MIN_TRIALS


def test_a_batched_matmul_races():
    wrapped = model("batched matmul", backend="cpu")
    train(wrapped, epochs=1)
    (cluster,) = clusters(wrapped)
    assert cluster.race is not None and cluster.race.winner is not None


def test_compiled_code_that_is_faster_keeps_the_cluster(fast_compiled_code):
    wrapped = model(backend="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        train(wrapped)
    (cluster,) = clusters(wrapped)
    assert cluster.kind == "compiled" and cluster.race.winner == "compiled"
    text = str(kerasjit.explain(wrapped, X[:8], Y[:8], verbose=True))  # Y cast as fit does
    assert "race against TensorFlow: compiled" in text and "runs compiled" in text
    assert "variable update(s) written in place" in text


@pytest.mark.parametrize("wrap_kwargs", [
    {"backend": "cpu", "race": False}, {"backend": "reference"},
    {"backend": "cpu", "first": "dense"}, {"backend": "cpu", "first": "batched GEMMs"}],
    ids=["race=False", "reference", "dense", "batched GEMMs"])
def test_no_race_without_one_asked_for_the_oracle_or_for_dense_math(
        wrap_kwargs, slow_compiled_code):
    wrapped = model(**wrap_kwargs)
    train(wrapped, epochs=1)
    (cluster,) = clusters(wrapped)
    # (a race asked for finds at its first call that TensorFlow has no library kernel to win)
    assert cluster.kind == "compiled" and (cluster.race is None or cluster.race.calls == 0)
