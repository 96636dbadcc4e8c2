"""The machine's f32 multiply-add peak, measured: what a kernel's GFLOP/s is
read against (kernel_profile, the benchmark's convolution table).

A generated loop keeps independent vector FMAs in flight (more accumulators
than the FMA units' latency times their count), with no memory traffic; run
on every usable core at once (ctypes lets go of the GIL), its rate is the
peak this process can reach: clock, vector width and FMA units as they are,
KERASJIT_CPU's level included. The best of a few runs: a busy moment (another
thread of this process, a neighbour on the host) only ever lowers a run's rate,
and a peak measured low reads kernels as faster than the machine.
"""
import ctypes
import functools
import threading
import time

from llvmlite import ir

from . import engine
from .llvm_types import I64
from .vector_code import F32

ACCUMULATORS = 12       # FMAs in flight: e.g. 2 units x 4 cycles' latency, and some
ITERATIONS = 1 << 25    # ~0.05-0.5 s at the peaks in reach
RUNS = 5                # the best of these is the peak


def _kernel(lanes):
    """`void fma_peak(i64 n)`: n rounds of ACCUMULATORS vector FMAs; their sum
    is stored to a global, so LLVM keeps the work."""
    module = ir.Module(name="kerasjit_peak")
    vec = ir.VectorType(F32, lanes)
    fma = ir.Function(module, ir.FunctionType(vec, [vec] * 3), f"llvm.fma.v{lanes}f32")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64]), "fma_peak")
    sink = ir.GlobalVariable(module, vec, "fma_peak_sink")
    sink.initializer = ir.Constant(vec, None)
    entry, loop, done = (fn.append_basic_block(n) for n in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    scale = ir.Constant(vec, [0.999999] * lanes)
    step = ir.Constant(vec, [1e-7] * lanes)
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(I64)
    i.add_incoming(ir.Constant(I64, 0), entry)
    accs = []
    for a in range(ACCUMULATORS):
        acc = b.phi(vec)
        acc.add_incoming(ir.Constant(vec, [float(a)] * lanes), entry)
        accs.append(acc)
    new = [b.call(fma, [acc, scale, step]) for acc in accs]
    for acc, value in zip(accs, new):
        acc.add_incoming(value, loop)
    nxt = b.add(i, ir.Constant(I64, 1))
    i.add_incoming(nxt, loop)
    b.cbranch(b.icmp_signed("<", nxt, fn.args[0]), loop, done)
    b.position_at_end(done)
    total = new[0]
    for value in new[1:]:
        total = b.fadd(total, value)
    b.store(total, sink)
    b.ret_void()
    return module


@functools.cache
def _fma_loop():
    """The compiled FMA loop, callable as run(n)."""
    code = engine.object_code(engine.optimize(str(_kernel(engine.vector_lanes())),
                                              unroll=False))
    return ctypes.CFUNCTYPE(None, ctypes.c_int64)(engine.load_objects([code], "fma_peak"))


@functools.cache
def fma_peak_gflops(threads):
    """GFLOP/s of f32 multiply-adds (2 flops each) on `threads` threads at
    once, the best of RUNS runs."""
    run = _fma_loop()
    run(ITERATIONS >> 6)            # (the clock up, the code paged in)
    return max(_rate(run, threads) for _ in range(RUNS))


def _rate(run, threads):
    workers = [threading.Thread(target=run, args=(ITERATIONS,)) for _ in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - start
    return 2 * engine.vector_lanes() * ACCUMULATORS * ITERATIONS * threads / seconds / 1e9
