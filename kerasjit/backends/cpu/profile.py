"""Per-kernel time inside compiled entries, for finding which kernel a step waits on.

With KERASJIT_PROFILE_KERNELS=1 (part of the compile-cache key), every step
of a compiled entry is bracketed by clock_gettime calls adding its nanoseconds
and a call count to a global array; `kerasjit.kernel_profile()` reads them.
Off by default: the clock costs time every step. The counts are plain adds:
two threads running the same cluster at once may lose some.
"""
import math
import os
import time

from llvmlite import ir

from ...errors import warn
from ...kernels.ir import GemmCall, ImplicitGemm
from . import narrow_gemm
from .llvm_types import I64, PTR

_loaded = {}            # global's address -> (cluster, labels): each compiled module once


def enabled():
    return os.environ.get("KERASJIT_PROFILE_KERNELS", "") not in ("", "0")


class Counters:
    """Emits the timing around each of a program's `steps` (leaf steps, in
    the order emitted) into a global array of [nanoseconds, calls] per step."""

    def __init__(self, module, name, steps):
        self.labels = [_label(step) for step in steps]
        self.flops = [_flops(step) for step in steps]
        self.global_name = f"{name}_kernel_ns"
        self._table = ir.GlobalVariable(module, ir.ArrayType(I64, 2 * len(self.labels)),
                                        self.global_name)
        self._table.initializer = ir.Constant(ir.ArrayType(I64, 2 * len(self.labels)), None)
        i32 = ir.IntType(32)
        self._clock = ir.Function(module, ir.FunctionType(i32, [i32, PTR]), "clock_gettime")
        self._next = 0

    def _now(self, b):
        with b.goto_entry_block():
            spec = b.alloca(ir.ArrayType(I64, 2))     # struct timespec {sec, nsec}
        b.call(self._clock, [ir.Constant(ir.IntType(32), time.CLOCK_MONOTONIC), spec])
        seconds, nanos = (b.load(b.gep(spec, [ir.Constant(I64, 0), ir.Constant(I64, i)]), typ=I64)
                          for i in (0, 1))
        return b.add(b.mul(seconds, ir.Constant(I64, 10 ** 9)), nanos)

    def timed(self, b, emit):
        """Emit the next step (`emit()`, at `b`) between two clock reads."""
        start = self._now(b)
        emit()
        elapsed = b.sub(self._now(b), start)
        i, self._next = self._next, self._next + 1
        for offset, amount in ((2 * i, elapsed), (2 * i + 1, ir.Constant(I64, 1))):
            slot = b.gep(self._table, [ir.Constant(I64, 0), ir.Constant(I64, offset)])
            b.store(b.add(b.load(slot, typ=I64), amount), slot)


def _label(step):
    """A step's kernel-IR name and size: loop extents, or the GEMM's M x N x K."""
    if isinstance(step, GemmCall):
        kind = "narrow GEMM" if narrow_gemm.plan(step) else "sgemm"
        batch = f"{step.count} x " if step.batch else ""
        return f"{step.name} ({kind} {batch}{step.m}x{step.n}x{step.k})"
    if isinstance(step, ImplicitGemm):
        dots = ", dot products" if step.b_feature_stride != 1 else ""
        epilogue = " + epilogue" if step.epilogue is not None else ""
        runs = f", {step.parts} runs" if step.parts > 1 else ""
        return f"{step.name} (implicit GEMM {step.m}x{step.n}x{step.k}{dots}{epilogue}{runs})"
    return f"{step.name} ({'x'.join(map(str, step.dims))})"


def _flops(step):
    """Floating-point operations of one call of a product (2 per multiply-add),
    else None."""
    if isinstance(step, GemmCall):
        return 2 * step.m * step.n * step.k * step.count
    if isinstance(step, ImplicitGemm):
        return 2 * step.m * step.n * step.k
    return None


def register(cluster, labels, flops, address):
    """A loaded entry's counters (`address`: its global's), read by kernel_profile();
    `flops`: each step's per call, or None."""
    _loaded[address] = (cluster, labels, flops)


def kernel_profile(reset=False):
    """Time per compiled step since the process started (or the last reset),
    as a DataFrame sorted by total time: cluster, kernel, calls, seconds,
    share, and for products (GEMMs, convolutions) GFLOP/s (NaN for the
    others; peak.fma_peak_gflops is the machine's). Empty unless
    KERASJIT_PROFILE_KERNELS=1 was set before compiling."""
    import ctypes

    import pandas as pd
    if not _loaded:
        warn("kerasjit.kernel_profile: no kernel was timed" + (
            "" if enabled() else ": set KERASJIT_PROFILE_KERNELS=1 before the model compiles"))
    rows = []
    for address, (cluster, labels, flops) in _loaded.items():
        counts = (ctypes.c_int64 * (2 * len(labels))).from_address(address)
        for i, (label, work) in enumerate(zip(labels, flops)):
            calls, seconds = counts[2 * i + 1], counts[2 * i] / 1e9
            rate = work * calls / seconds / 1e9 if work is not None and seconds else math.nan
            rows.append((cluster, label, calls, seconds, rate))
        if reset:
            ctypes.memset(address, 0, ctypes.sizeof(counts))
    frame = pd.DataFrame(rows, columns=["cluster", "kernel", "calls", "seconds", "gflops"])
    frame = frame.sort_values("seconds", ascending=False, ignore_index=True)
    total = frame["seconds"].sum()
    frame.insert(4, "share", frame["seconds"] / total if total else 0.0)
    return frame
