"""Tiered execution: TensorFlow runs a new signature's steps while it compiles
in the background; the compiled step takes over between two steps."""
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from types import SimpleNamespace

import keras
import numpy as np
import pytest

import kerasjit
from kerasjit.backends import get_backend
from kerasjit import step as step_module
from kerasjit.compiler import Backend, Executable
from kerasjit.errors import NotCached
from tests.support import bn_classifier


@pytest.fixture(autouse=True)
def _cold_starts(request, monkeypatch):
    """Every compile here starts cold, in the background (the same model's code
    from an earlier test would compile at once from the cache), unless the
    test asks for a cache of its own."""
    if "compile_cache_dir" not in request.fixturenames:
        monkeypatch.setenv("KERASJIT_CACHE_DIR", "")


_model, _data = bn_classifier.model, bn_classifier.data


def _compiled_now(model):
    """Whether the train step the model runs now is the compiled one."""
    (run,) = model._kerasjit.train.programs.values()
    return any(c.kind == "compiled" for c in run.program.clusters)


class _Watch(keras.callbacks.Callback):
    """Records, per batch, whether the compiled step ran it; holds the second
    epoch's start until the background compile is done (so the switch falls
    inside this fit, after TensorFlow ran the first epoch), releasing first a
    _HeldBackend's code."""

    def __init__(self):
        super().__init__()
        self.compiled = []

    def on_train_batch_end(self, batch, logs=None):
        self.compiled.append(_compiled_now(self.model))

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            backend = self.model._kerasjit.train.backend
            if isinstance(backend, _HeldBackend):
                backend.released.set()
            for job in self.model._kerasjit.train.compiling.values():
                job.done.wait()


def test_training_starts_in_tensorflow_and_hands_over_to_the_compiled_step_exactly():
    x, y = _data()
    plain = _model()
    history = plain.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0)
    # (race=False: no verdict that might hand a step this small back to TensorFlow)
    model = kerasjit.wrap(_model(), background=True, race=False)
    model._kerasjit.train.backend = _HeldBackend()
    watch = _Watch()
    jit_history = model.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0,
                            callbacks=[watch])
    # TensorFlow ran the first epoch, the compiled step the last one, with the
    # updates of both: the result is plain Keras's, up to float rounding.
    assert not any(watch.compiled[:8]) and all(watch.compiled[-8:])
    for ours, theirs in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(jit_history.history["loss"], history.history["loss"], rtol=1e-4)
    events = model._kerasjit.compile_events
    assert [e.background for e in events] == [False, True]
    assert "tracing" in events[0].what and "in the background" in events[1].what


def test_explain_waits_for_the_background_compile():
    x, y = _data(64)
    model = kerasjit.wrap(_model(), background=True)
    model.train_on_batch(x[:32], y[:32])
    explanation = kerasjit.explain(model, x[:32], y[:32])
    assert any(c.kind == "compiled" for c in explanation.clusters)
    assert _compiled_now(model)


def test_a_failed_background_compile_leaves_the_step_to_tensorflow_with_a_warning(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no plan for this step today")
    monkeypatch.setattr(step_module, "build_program", broken)
    x, y = _data()
    plain = _model()
    plain.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    model = kerasjit.wrap(_model(), background=True)
    with pytest.warns(RuntimeWarning, match="failed, TensorFlow runs the step: RuntimeError: "
                                            "no plan for this step today"):
        model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0, callbacks=[_Watch()])
    for ours, theirs in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


class _Slow(Executable):
    """A compiled cluster that takes 30 ms longer than it should."""

    def __init__(self, inner):
        self.inner, self.program, self.kernels = inner, inner.program, inner.kernels

    def __call__(self, args):
        time.sleep(0.03)
        return self.inner(args)


class _HeldBackend(Backend):
    """The CPU backend (its executables passed through `wrap`), its code held
    back until `released` is set (_Watch: at the first epoch's end), so the
    switch falls after TensorFlow's first epoch however fast the compile (a
    module compiled earlier in this process comes back at once)."""
    name = "held"

    def __init__(self, wrap=lambda executable: executable):
        self.wrap, self.released = wrap, threading.Event()

    def compile_optimized(self, module, donate, only_cached=False):
        if only_cached and not self.released.is_set():
            raise NotCached("held until the first epoch ends")
        self.released.wait()
        return self.wrap(get_backend("cpu").compile_optimized(module, donate, only_cached))


def test_tensorflow_takes_the_step_back_where_it_ran_it_clearly_faster():
    x, y = _data()
    plain = _model()
    plain.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0)
    model = kerasjit.wrap(_model(), background=True)
    model._kerasjit.train.backend = _HeldBackend(_Slow)
    watch = _Watch()
    with pytest.warns(RuntimeWarning, match="TensorFlow ran the step faster"):
        model.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0, callbacks=[watch])
    # TensorFlow's epoch, the compiled step's first calls (timed), TensorFlow's again.
    assert not any(watch.compiled[:8]) and any(watch.compiled) and not watch.compiled[-1]
    for ours, theirs in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=2e-4, atol=2e-5)


def test_the_program_ends_cleanly_while_a_compile_runs_in_the_background():
    # A daemon thread inside TensorFlow's C++ at exit aborts the process; the
    # compile must instead notice the ending program and stop.
    script = textwrap.dedent("""
        import numpy as np, keras, kerasjit
        model = keras.Sequential([keras.Input((32, 32, 3))] + [
            keras.layers.Conv2D(8, 3, padding="same", activation="relu") for _ in range(6)] +
            [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])
        model.compile(optimizer="adam", loss="mse")
        kerasjit.wrap(model, background=True)
        model.train_on_batch(np.ones((4, 32, 32, 3), np.float32), np.ones((4, 3), np.float32))
        print("trained", model._kerasjit.train.compiling != {})
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "trained True" in done.stdout
    assert "terminate called" not in done.stderr


def test_past_max_shapes_new_batch_sizes_run_in_tensorflow_traced_once():
    """(The test step: its metrics sum over the batch, so one batch size's
    compiled step cannot serve another, as a predict step's can.)"""
    x, y = _data(64)
    model = kerasjit.wrap(_model(), max_shapes=2, background=False)
    plain = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (8, 9):
            np.testing.assert_allclose(model.test_on_batch(x[:n], y[:n]),
                                       plain.test_on_batch(x[:n], y[:n]), rtol=1e-5, atol=1e-6)
    with pytest.warns(RuntimeWarning, match="more than 2 input signatures") as caught:
        for n in range(10, 30):
            np.testing.assert_allclose(model.test_on_batch(x[:n], y[:n]),
                                       plain.test_on_batch(x[:n], y[:n]), rtol=1e-5, atol=1e-6)
    (warned,) = [w for w in caught if "input signatures" in str(w.message)]
    # attributed to the line that called Keras (this file), not to kerasjit's own
    assert warned.filename == __file__, warned.filename
    step = model._kerasjit.test
    assert len(step.programs) == 2 and len(step.open_programs) == 1


def test_train_and_test_on_batch_after_fit_and_evaluate_reuse_their_compiled_steps():
    x, y = _data(64)
    model = kerasjit.wrap(_model(), background=False)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    model.evaluate(x, y, batch_size=32, verbose=0)
    model.train_on_batch(x[:32], y[:32])
    model.test_on_batch(x[:32], y[:32])
    assert len(model._kerasjit.train.programs) == 1
    assert len(model._kerasjit.test.programs) == 1
    assert [e.background for e in model._kerasjit.compile_events] == [False, False]


def test_a_signature_after_the_first_compiles_once_its_time_in_tensorflow_repays_it():
    """The partial last batch of each epoch runs in TensorFlow until the time
    it spent there reaches what the step's compile took; then it compiles."""
    x, y = _data(80)                    # batches of 32, 32 and a partial one of 16
    plain = _model()
    plain.fit(x, y, batch_size=32, epochs=4, shuffle=False, verbose=0)
    model = kerasjit.wrap(_model(), background=True)
    step = model._kerasjit.train
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    step.wait()
    model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    assert len(step.programs) == 1 and len(step.open_programs) == 1
    (partial,) = step.tensorflow_seconds
    assert 0 < step.tensorflow_seconds[partial] < step._compile_cost()
    step.tensorflow_seconds[partial] = step._compile_cost()     # (as after many epochs)
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    assert len(step.programs) == 2          # the partial batch: compiling
    step.wait()
    for ours, theirs in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=2e-4, atol=2e-5)


def test_the_compile_cost_reads_a_clusters_own_compiles_among_the_events():
    """A cluster compiling for new shapes at run time records (start, seconds,
    what) in the same list as the step's CompileEvents."""
    step = kerasjit.jit(lambda x: x + 1.0)
    step.events += [step_module.CompileEvent(0.0, 2.0, f"{step.name}: tracing and compiling"),
                    (0.0, 5.0, "cluster 'add': new input shapes [(3,)]")]
    assert step._compile_cost() == 2.0


def test_one_off_predict_batch_sizes_share_one_trace_and_no_compile():
    x, _ = _data(64)
    plain = _model()
    model = kerasjit.wrap(_model(), background=True)
    for n in range(8, 32):
        np.testing.assert_allclose(model.predict_on_batch(x[:n]), plain.predict_on_batch(x[:n]),
                                   rtol=1e-5, atol=1e-6)
    step = model._kerasjit.predict
    step.wait()
    assert len(step.programs) == 1 and len(step.open_programs) == 1
    assert [e.background for e in model._kerasjit.compile_events].count(True) == 1


def test_a_warm_start_runs_compiled_from_the_first_step(compile_cache_dir):
    """With the step's code in the compile cache, it compiles at once from the
    cache instead of in the background: the first step already runs compiled,
    and training matches plain Keras."""
    x, y = _data()
    earlier = kerasjit.wrap(_model(), background=True, race=False)
    earlier.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    earlier._kerasjit.train.wait()           # (its code is in the cache now)
    plain = _model()
    plain.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    # (no verdict: TensorFlow may run this small step faster on a busy machine)
    model = kerasjit.wrap(_model(), background=True, race=False)
    compiling = []
    watch = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: compiling.append(bool(model._kerasjit.train.compiling)))
    model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0, callbacks=[watch])
    assert compiling == [False] * 16 and _compiled_now(model)
    assert [e.background for e in model._kerasjit.compile_events] == [False]
    for ours, theirs in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=2e-4, atol=2e-5)


def test_a_warm_start_whose_graph_is_not_the_one_compiled_compiles_it_anew(compile_cache_dir):
    """The compile cache's mark that a step compiled before makes a warm start
    trace it for the compiler alone. Where the graph traced is not the one
    that compiled (the mark is stale), the step is traced again for
    TensorFlow, which runs it while it compiles; training matches plain Keras
    and the mark names the graph compiled now."""
    from kerasjit.backends.cpu import cache
    x, y = _data()
    earlier = kerasjit.wrap(_model(), background=True, race=False)
    earlier.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    earlier._kerasjit.train.wait()
    (mark,) = compile_cache_dir.glob("warm-*.kjt")
    compiled = cache.load_text(mark.stem)
    cache.store_text(mark.stem, "0" * len(compiled))
    plain = _model()
    plain.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    model = kerasjit.wrap(_model(), background=True, race=False)
    watch = _Watch()
    model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0, callbacks=[watch])
    (run,) = model._kerasjit.train.programs.values()
    assert run.trace.unordered and run.trace.traces == 2
    assert not watch.compiled[0] and watch.compiled[8:] == [True] * 8
    assert cache.load_text(mark.stem) == compiled
    for ours, theirs in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=2e-4, atol=2e-5)


def test_the_step_verdict_counts_no_step_timed_beside_another_compile():
    """The compiled step is timed against TensorFlow's only while no other
    compile runs in the process (say another model's, in the background): a
    verdict made then would be the other compile's doing."""
    from kerasjit.runtime.race import BACKGROUND_COMPILES
    x, y = _data(64)
    model = kerasjit.wrap(_model(), background=True)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[_Watch()])
    for job in model._kerasjit.train.compiling.values():
        job.done.wait()
    with BACKGROUND_COMPILES.one():
        model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    (verdict,) = model._kerasjit.train.verdicts.values()
    assert verdict.times == {"compiled": [], "tensorflow": []}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # (either tier may win this small step)
        model.fit(x, y, batch_size=8, epochs=4, shuffle=False, verbose=0)    # (>= 24 steps)
    assert not model._kerasjit.train.verdicts


def test_a_warm_start_keeps_the_verdict_of_the_earlier_run(compile_cache_dir):
    """The step verdict (compiled against TensorFlow's whole step) is kept in
    the compile cache with the code: a warm start applies it without timing
    TensorFlow's step again (its first call of a large step costs seconds)."""
    from kerasjit.backends.cpu import cache
    x, y = _data(64)
    earlier = kerasjit.wrap(_model(), background=True)
    earlier.fit(x, y, batch_size=8, epochs=5, shuffle=False, verbose=0, callbacks=[_Watch()])
    # (decided in the last 32 steps: a near tie takes three blocks of each tier, 24 steps)
    assert not earlier._kerasjit.train.verdicts
    (recorded,) = compile_cache_dir.glob("verdict-*.kjt")
    kept = cache.load_text(recorded.stem)
    assert kept in ("compiled", "tensorflow")
    # (the mark that makes a warm start trace for the compiler alone comes
    # with a verdict for the compiled step: that start needs no TensorFlow step)
    assert bool(list(compile_cache_dir.glob("warm-*.kjt"))) == (kept == "compiled")
    cache.store_text(recorded.stem, "compiled")
    model = kerasjit.wrap(_model(), background=True)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert not model._kerasjit.train.verdicts and _compiled_now(model)
    assert list(compile_cache_dir.glob("warm-*.kjt"))
    cache.store_text(recorded.stem, "tensorflow")
    model = kerasjit.wrap(_model(), background=True)
    with pytest.warns(RuntimeWarning, match="TensorFlow ran the step faster here "
                                            r"\(timed on an earlier run of this code; race=False"):
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert not _compiled_now(model)


@pytest.mark.parametrize("tensorflow, kept, blocks", [
    (0.5, "tensorflow", 1), (2.0, "compiled", 1), (0.85, "tensorflow", 3), (0.95, "compiled", 3)])
def test_a_step_verdict_too_close_to_call_is_timed_longer(tensorflow, kept, blocks):
    """The compiled step (1 s a call here) against TensorFlow's: a clear
    verdict after a block of timed calls of each, a near one (within the
    races' band of the margin) after more blocks; the margin decides."""
    compiled = SimpleNamespace(program=SimpleNamespace(clusters=[]))
    verdict = step_module._Verdict("train_step", compiled, lambda: "tensorflow's run")
    costs = {"compiled": 1.0, "tensorflow": tensorflow}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for call in range(100):
            turn = verdict.turns[verdict.calls]
            kept_run = verdict.timed(verdict.next_run(), costs[turn], quiet=True)
            if kept_run is not None:
                break
    assert verdict.kept == kept
    assert len(verdict.times["compiled"]) == len(verdict.times["tensorflow"]) \
        == blocks * step_module._Verdict.CALLS
