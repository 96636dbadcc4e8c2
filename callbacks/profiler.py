"""JitProfiler: per-epoch speed and memory of a Keras fit, as a pandas DataFrame.

    profiler = kerasjit.JitProfiler(name="kerasjit", batch_size=64)
    model.fit(x, y, batch_size=64, epochs=3, callbacks=[profiler, keras.callbacks.CSVLogger(...)])
    profiler.dataframe          # one row per epoch, columns as in COLUMNS

Works on any Keras model, plain or wrapped. Every measured column also goes
into the History that `fit` returns as `jit_<column>`; the `log_columns`
go into each epoch's `logs` too (the progress bar, CSVLogger and callbacks
listed after it). Rows accumulate over `fit` calls, so contenders can be
interleaved epoch by epoch.

Optional, duck-typed compiler hooks (nothing of the compiler is imported):
`model._kerasjit.compile_events`, a list of `(perf_counter start, seconds,
reason, [background])` counted in the epoch it started as `compile_seconds`
(the steps waited for it; one that ran in the background, beside the steps,
is not counted); and
`model._kerasjit.buffer_bytes()`. Without them both are 0 and compiling stays
inside `epoch_seconds`, as for plain Keras.
"""
import importlib.util
import math
import os
import time

import keras
import numpy as np
import pandas as pd
import psutil

MIB = 2 ** 20

# Column -> what it measures; the report prints these under its tables.
COLUMNS = {
    "epoch": "Keras's epoch index (0-based)",
    "epoch_seconds": "wall time from epoch begin to epoch end: steps, compiling, validation, "
                     "callbacks",
    "compile_seconds": "compile time the compiler reported during the epoch (0 when it reports "
                       "none)",
    "steps": "training batches run",
    "outside_steps_seconds": "epoch time outside training batches: data iterator, validation, "
                             "callbacks, garbage collection",
    "samples_per_second": "steps x batch size / (epoch_seconds - compile_seconds); NaN when the "
                          "batch size is unknown",
    "step_p50_ms": "median time of one training batch (batch begin to batch end)",
    "step_p90_ms": "90th percentile of the batch time",
    "step_p99_ms": "99th percentile of the batch time",
    "peak_rss_mib": "largest RSS of the whole process, sampled at each batch end and at epoch "
                    "end",
    "rss_growth_mib": "peak RSS minus the previous epoch's (first epoch: minus the RSS at "
                      "its start)",
    "buffer_mib": "bytes held by compiled buffers (0 when the compiler reports none)",
    "gpu_mib": "CuPy memory pool bytes in use, largest sample (NaN without CuPy and a GPU)",
}


def _cupy_pool():
    """CuPy's default memory pool when CuPy and a device are there, else None."""
    if importlib.util.find_spec("cupy") is None:
        return None
    try:
        import cupy
        return cupy.get_default_memory_pool() if cupy.cuda.runtime.getDeviceCount() else None
    except Exception:  # CuPy installed without a usable driver raises its own error types
        return None


class JitProfiler(keras.callbacks.Callback):
    """Records COLUMNS for every epoch of `fit`; see the module docstring.

    name: the run's name in reports (default: the model's name).
    batch_size: for samples/s; by default the model's static input batch
    size if it has one, else samples/s is NaN. A last partial batch is
    counted as full.
    log_columns: the columns that also go into the epoch logs as
    `jit_<column>` (the progress bar, CSVLogger): by default the compile
    time and samples/s, "all" for every measured one, () for none. The
    History gets every measured column either way.
    """

    # It times batches but never reads the model's variables between them, so a
    # compiler keeping variables out of Keras between steps need not sync for it.
    kerasjit_batch_safe = True

    def __init__(self, name=None, batch_size=None,
                 log_columns=("compile_seconds", "samples_per_second")):
        super().__init__()
        self.name, self.batch_size = name, batch_size
        self.log_columns = [c for c in COLUMNS if c != "epoch"] if log_columns == "all" \
            else list(log_columns)
        unknown = set(self.log_columns) - set(COLUMNS)
        if unknown:
            raise ValueError(f"JitProfiler: no column {sorted(unknown)}; columns: {list(COLUMNS)}")
        self.rows = []
        self._process = psutil.Process()
        self._gpu = None

    @property
    def dataframe(self):
        frame = pd.DataFrame(self.rows, columns=list(COLUMNS) if not self.rows else None)
        frame.attrs["name"] = self.name
        frame.attrs["pid"] = os.getpid()    # (runs of one process share its RSS)
        return frame

    def _jit_state(self):
        return getattr(self.model, "_kerasjit", None)

    def _sample_memory(self):
        self._peak_rss = max(self._peak_rss, self._process.memory_info().rss)
        if self._gpu is not None:
            self._peak_gpu = max(self._peak_gpu, self._gpu.used_bytes())

    def _infer_batch_size(self):
        try:
            return self.model.inputs[0].shape[0]
        except (AttributeError, IndexError, TypeError, ValueError):  # subclassed or unbuilt models
            return None

    def on_train_begin(self, logs=None):
        self.name = self.name or self.model.name
        self.batch_size = self.batch_size or self._infer_batch_size()
        self._gpu = _cupy_pool()
        self._first_row = len(self.rows)

    def on_train_end(self, logs=None):
        # Keras's History sees only the logs; this fit's other columns join it here,
        # epoch for epoch, leaving out what no epoch measured.
        history, rows = getattr(self.model, "history", None), self.rows[self._first_row:]
        if not rows or len(getattr(history, "epoch", ())) != len(rows):
            return
        for column in COLUMNS:
            values = [row[column] for row in rows]
            if column != "epoch" and column not in self.log_columns \
                    and not all(math.isnan(v) for v in values):
                history.history.setdefault(f"jit_{column}", []).extend(values)

    def on_epoch_begin(self, epoch, logs=None):
        self._step_seconds = []
        self._start_rss = self._peak_rss = self._process.memory_info().rss
        self._peak_gpu = 0
        self._epoch_start = time.perf_counter()

    def on_train_batch_begin(self, batch, logs=None):
        self._batch_start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self._step_seconds.append(time.perf_counter() - self._batch_start)
        self._sample_memory()

    def on_epoch_end(self, epoch, logs=None):
        end = time.perf_counter()
        seconds = end - self._epoch_start
        self._sample_memory()
        state = self._jit_state()
        compile_seconds = sum(e[1] for e in getattr(state, "compile_events", ())
                              if self._epoch_start <= e[0] < end and not (len(e) > 3 and e[3]))
        buffer_bytes = state.buffer_bytes() if hasattr(state, "buffer_bytes") else 0
        steps = len(self._step_seconds)
        p50, p90, p99 = (np.percentile(self._step_seconds, [50, 90, 99]) * 1e3 if steps
                         else [math.nan] * 3)
        previous = self.rows[-1]["peak_rss_mib"] * MIB if self.rows else self._start_rss
        steady = seconds - compile_seconds
        row = {
            "epoch": epoch,
            "epoch_seconds": seconds,
            "compile_seconds": compile_seconds,
            "steps": steps,
            "outside_steps_seconds": seconds - sum(self._step_seconds),
            "samples_per_second": (steps * self.batch_size / steady
                                   if self.batch_size and steady > 0 else math.nan),
            "step_p50_ms": float(p50), "step_p90_ms": float(p90), "step_p99_ms": float(p99),
            "peak_rss_mib": self._peak_rss / MIB,
            "rss_growth_mib": (self._peak_rss - previous) / MIB,
            "buffer_mib": buffer_bytes / MIB,
            "gpu_mib": self._peak_gpu / MIB if self._gpu is not None else math.nan,
        }
        if logs is not None:
            # Keras's own numbers (loss, metrics) go into the row; the chosen ones of ours
            # into logs, leaving out what was not measured (no NaN columns in CSVLogger).
            row.update((k, v) for k, v in logs.items()
                       if isinstance(v, (int, float)) and not k.startswith("jit_"))
            logs.update((f"jit_{k}", row[k]) for k in self.log_columns
                        if not math.isnan(row[k]))
        self.rows.append(row)
