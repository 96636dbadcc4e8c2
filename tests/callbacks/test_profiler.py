"""JitProfiler's figures against independent measures, on plain Keras and on a wrapped model."""
import csv
import gc
import math
import resource
import time

import keras
import psutil
import pytest

import kerasjit
from kerasjit import workloads
from kerasjit.callbacks import COLUMNS, JitProfiler

MIB = 2 ** 20


class Stopwatch(keras.callbacks.Callback):
    """The independent measure: perf_counter and RSS at each epoch's begin and end."""

    def __init__(self):
        super().__init__()
        self.begin, self.end, self.rss_end = [], [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.begin.append(time.perf_counter())

    def on_epoch_end(self, epoch, logs=None):
        self.end.append(time.perf_counter())
        self.rss_end.append(psutil.Process().memory_info().rss)


def softmax(wrapped):
    keras.utils.set_random_seed(0)
    model = workloads.softmax_regression()
    return kerasjit.wrap(model, backend="reference") if wrapped else model


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "wrapped"])
def test_figures_agree_with_independent_measures(wrapped):
    # Enough batches for epochs of about 0.3 s or more, so 5% is far above callback overhead.
    x, y = workloads.classification_data(30000, (784,), 10)
    before, profiler, after = Stopwatch(), JitProfiler(batch_size=100), Stopwatch()
    # A garbage collection between two callbacks (the heap is large after other tests)
    # would land between the brackets and the profiler's own interval: keep it out.
    gc.collect()
    gc.disable()
    try:
        softmax(wrapped).fit(x, y, batch_size=100, epochs=3, verbose=0,
                             callbacks=[before, profiler, after])
    finally:
        gc.enable()
    frame = profiler.dataframe
    assert list(frame["epoch"]) == [0, 1, 2] and profiler.name == "softmax_regression"
    for e, row in frame.iterrows():
        outer = after.end[e] - before.begin[e]       # brackets the profiler's own interval
        inner = before.end[e] - after.begin[e]
        assert outer > 0.25
        assert inner <= row["epoch_seconds"] <= outer
        assert row["epoch_seconds"] == pytest.approx(outer, rel=0.05)
        assert row["steps"] == len(x) // 100
        assert 0 < row["step_p50_ms"] <= row["step_p90_ms"] <= row["step_p99_ms"]
        assert 0 < row["outside_steps_seconds"] < row["epoch_seconds"]
        assert row["samples_per_second"] == pytest.approx(
            row["steps"] * 100 / (row["epoch_seconds"] - row["compile_seconds"]))
        # RSS: at least what an independent sample just before saw (memory may be freed in
        # between), at most the process's lifetime peak (ru_maxrss, in KiB, which the kernel
        # updates lazily); 1% slack both ways.
        assert row["peak_rss_mib"] * MIB >= 0.99 * before.rss_end[e]
        lifetime_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        assert row["peak_rss_mib"] * MIB <= 1.01 * lifetime_peak
        if e:
            assert row["rss_growth_mib"] == pytest.approx(
                row["peak_rss_mib"] - frame["peak_rss_mib"][e - 1])
        # Until the compiler reports compile events and buffers, both stay 0.
        assert row["compile_seconds"] >= 0 and row["buffer_mib"] >= 0
        assert math.isnan(row["gpu_mib"]) or row["gpu_mib"] >= 0
    assert {"loss", "accuracy"} <= set(frame.columns)


def test_logs_reach_history_and_csvlogger(tmp_path):
    x, y = workloads.classification_data(300, (784,), 10)
    profiler = JitProfiler(name="run", batch_size=100, log_columns="all")
    csv_path = tmp_path / "log.csv"
    history = softmax(False).fit(x, y, batch_size=100, epochs=2, verbose=0,
                                 callbacks=[profiler, keras.callbacks.CSVLogger(str(csv_path))])
    frame = profiler.dataframe
    measured = [c for c in COLUMNS if c != "epoch" and not frame[c].isna().any()]
    assert "epoch_seconds" in measured and "samples_per_second" in measured
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    for column in measured:
        key = f"jit_{column}"
        assert history.history[key] == pytest.approx(list(frame[column]))
        assert [float(r[key]) for r in rows] == pytest.approx(list(frame[column]))
    # What was not measured (GPU memory without CuPy and a GPU) stays out of the logs.
    assert all(f"jit_{c}" not in history.history for c in COLUMNS if c not in measured)


class FakeJitState:
    """The compiler-side protocol the profiler reads (see callbacks/profiler.py)."""

    def __init__(self):
        self.compile_events = [(time.perf_counter(), 9.0, "before training: not counted")]

    def buffer_bytes(self):
        return 3 * MIB


class CompileDuringSecondEpoch(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if self._epoch == 1 and batch == 0:
            self.model._kerasjit.compile_events.append((time.perf_counter(), 0.25, "new shape"))

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch


def test_compile_events_and_buffer_bytes_protocol():
    x, y = workloads.classification_data(200, (784,), 10)
    model = softmax(False)
    model._kerasjit = FakeJitState()
    profiler = JitProfiler()
    model.fit(x, y, batch_size=100, epochs=3, verbose=0,
              callbacks=[profiler, CompileDuringSecondEpoch()])
    frame = profiler.dataframe
    assert list(frame["compile_seconds"]) == [0, 0.25, 0]
    assert list(frame["buffer_mib"]) == [3, 3, 3]


def test_batch_size_and_accumulation_over_fit_calls():
    x, y = workloads.classification_data(100, (784,), 10)
    fixed = keras.Sequential([keras.Input((784,), batch_size=50), keras.layers.Dense(10)])
    fixed.compile(optimizer="sgd", loss="mse")
    inferred = JitProfiler()
    fixed.fit(x, y, batch_size=50, epochs=1, verbose=0, callbacks=[inferred])
    assert inferred.batch_size == 50 and inferred.dataframe["samples_per_second"][0] > 0

    unknown = JitProfiler(name="interleaved")
    model = softmax(False)
    for epoch in range(2):   # how the main job interleaves contenders
        history = model.fit(x, y, batch_size=50, initial_epoch=epoch, epochs=epoch + 1,
                            verbose=0, callbacks=[unknown])
    assert list(unknown.dataframe["epoch"]) == [0, 1]
    assert unknown.dataframe["samples_per_second"].isna().all()
    assert "jit_samples_per_second" not in history.history


def test_the_progress_bar_gets_the_compile_time_and_throughput_only_by_default(capsys):
    x, y = workloads.classification_data(200, (784,), 10)
    profiler = JitProfiler(batch_size=100)
    history = softmax(False).fit(x, y, batch_size=100, epochs=2, verbose=2, callbacks=[profiler])
    epoch_line = [line for line in capsys.readouterr().out.splitlines() if "loss" in line][-1]
    assert "jit_samples_per_second" in epoch_line and "jit_peak_rss" not in epoch_line
    # The History that fit returns has every measured column all the same.
    frame = profiler.dataframe
    for column in ("epoch_seconds", "step_p99_ms", "peak_rss_mib", "samples_per_second"):
        assert history.history[f"jit_{column}"] == pytest.approx(list(frame[column]))
    assert "jit_gpu_mib" in history.history or frame["gpu_mib"].isna().all()

    quiet = softmax(False).fit(x, y, batch_size=100, epochs=1, verbose=2,
                               callbacks=[JitProfiler(batch_size=100, log_columns=())])
    epoch_line = [line for line in capsys.readouterr().out.splitlines() if "loss" in line][-1]
    assert "jit_" not in epoch_line and "jit_step_p50_ms" in quiet.history
    with pytest.raises(ValueError, match="no column \\['latency'\\]"):
        JitProfiler(log_columns=["latency"])


def test_a_history_kept_over_fit_calls_gets_each_fit_once():
    x, y = workloads.classification_data(100, (784,), 10)
    model, history, profiler = softmax(False), keras.callbacks.History(), JitProfiler()
    for _ in range(2):
        model.fit(x, y, batch_size=50, epochs=2, verbose=0, callbacks=[profiler, history])
    assert len(history.history["jit_step_p50_ms"]) == 4 == len(history.history["loss"])
    assert history.history["jit_step_p50_ms"] == pytest.approx(
        list(profiler.dataframe["step_p50_ms"]))


def test_empty_profiler_has_the_columns():
    frame = JitProfiler(name="nothing yet").dataframe
    assert frame.empty and list(frame.columns) == list(COLUMNS)
    assert frame.attrs["name"] == "nothing yet"
