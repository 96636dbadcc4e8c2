"""Threads for large loop kernels: the outermost loop cut into one part per core.

A split kernel takes rows [lo, hi) of its outermost loop as two extra
arguments; its `{kernel}_task(ptr part)` runs it on one part {table, chunk,
lo, hi}, and `kerasjit_split` runs the parts on the process's pool of threads
(thread_pool.py). Results are bit-identical to one thread. The thread count
is read at run time from `kerasjit_threads`, so a cached object follows the
loading process's affinity.
"""
import ctypes
import math
import os

import llvmlite.binding as llvm
from llvmlite import ir

from ...hlo.opcodes import OPCODES, TRANSCENDENTAL
from ...kernels.ir import (GemmCall, Index, Op, Reduce, ReduceVar, ScatterKernel, children,
                           leaf_steps, walk)
from . import narrow_gemm, thread_pool
from .blas import SINGLE_THREAD_MNK
from .llvm_types import I32, I64, PTR
from .thread_pool import PART, TASK, THREADS_SYMBOL


# Break-even work for a second thread (reports/tuning-measurements.md);
# work = elements x varying ops x reduction terms, a libm-like op counting LIBM_COST.
MIN_WORK = 1 << 20
LIBM_COST = 16


# OpenBLAS's threads busy-wait after each threaded sgemm, leaving no core free;
# this is its generic threading threshold (reports/tuning-measurements.md).
BLAS_THREADED_MNK = 1 << 18


def usable_cores():
    return len(os.sched_getaffinity(0))


# Generated code reads the count here. Registered on import: codegen imports
# this module, so the symbol resolves before any object (built or cached) links.
_threads = ctypes.c_int64(usable_cores())
llvm.add_symbol(THREADS_SYMBOL, ctypes.addressof(_threads))


def set_threads(n):
    """How many threads split kernels use from now on (1: none are started)."""
    _threads.value = max(1, int(n))


def cores_free(steps, blas_threads_local):
    """Whether loop kernels may split over threads beside the program's sgemm
    calls: always where the BLAS lets each call run on the calling thread alone
    (kerasjit's threads split the large ones: gemm_parts); otherwise only if no
    call is large enough for OpenBLAS's threads, which spin after each call and
    would take the cores (narrow GEMMs are no sgemm at all)."""
    if blas_threads_local:
        return True
    return not any(isinstance(step, GemmCall) and step.m * step.n * step.k >= BLAS_THREADED_MNK
                   and not narrow_gemm.plan(step) for step in leaf_steps(steps))


def gemm_parts(call):
    """How GemmCall `call` splits across threads: (axis, extent), the axis
    "batch" (its outermost batch level), "rows" or "columns" of C; None to
    keep it whole. Whole products go to each thread from MIN_WORK
    multiply-adds on (attention's 256 products of 40x40x16 each); one
    product splits from SINGLE_THREAD_MNK: below, a thread costs more than it
    saves, as each part reads all of the operand the axis does not cut. So a
    product splits along C's longer side (an MLP layer's 64 rows x 256
    columns by columns: each part packs half of B, not all of it)."""
    work = call.m * call.n * call.k * call.count
    if call.batch and call.batch[0][0] >= 2:
        return ("batch", call.batch[0][0]) if work >= MIN_WORK else None
    if work < SINGLE_THREAD_MNK:
        return None
    axis, extent = ("rows", call.m) if call.m >= call.n else ("columns", call.n)
    return (axis, extent) if extent >= 2 else None


def gemm_geometry(call):
    """What a GemmCall's code depends on besides its buffers."""
    return (call.m, call.n, call.k, call.lhs_transposed, call.rhs_transposed,
            call.chunk_strides(), call.accumulate, call.lda, call.ldb, call.batch)


def worth_splitting(kernel, outer_dims):
    """Whether to split `kernel` over the first of `outer_dims` (its loops
    outside any reduction): one with work enough to pay for the threads."""
    if not outer_dims or outer_dims[0] < 2 or (isinstance(kernel, ScatterKernel)
                                               and kernel.ordered):
        return False         # (a scatter's updates of one element must apply in order)
    varies, ops, terms = {}, 0, {}
    for node in (n for _, expr in kernel.stores for n in walk(expr)):
        varies[id(node)] = isinstance(node, (Index, ReduceVar)) or any(
            varies[id(c)] for c in children(node))
        if isinstance(node, Op) and varies[id(node)]:   # (LLVM hoists the others)
            ops += LIBM_COST if OPCODES[node.opcode].cost == TRANSCENDENTAL else 1
        if isinstance(node, Reduce):
            terms[node.key] = math.prod(node.extents)
    return math.prod(kernel.dims) * max(ops, 1) * (1 + sum(terms.values())) >= MIN_WORK


def call_split(b, kernel_fn, load_buffers, table, chunk, extent):
    """At `b`: run `kernel_fn` (buffers..., chunk, lo, hi) over [0, extent) on
    all threads (thread_pool.py); `load_buffers(builder, table)` gives its
    buffer arguments."""
    module = kernel_fn.module
    task = ir.Function(module, TASK, module.get_unique_name(f"{kernel_fn.name}_task"))
    task.linkage = "internal"
    tb = ir.IRBuilder(task.append_basic_block("entry"))
    part = task.args[0]
    fields = [tb.load(tb.gep(part, [ir.Constant(I32, 0), ir.Constant(I32, i)], source_etype=PART),
                      typ=ty) for i, ty in enumerate(PART.elements)]
    tb.call(kernel_fn, load_buffers(tb, fields[0]) + fields[1:])
    tb.ret(ir.Constant(PTR, None))
    b.call(thread_pool.declare_split(module), [task, table, chunk, ir.Constant(I64, extent)])
    return task


def pthreads(module):
    """`module`'s declarations of pthread_create, pthread_join and the thread
    count global (external: set from Python)."""
    # pthread_t is an unsigned long on Linux (glibc and musl): an i64 slot holds one.
    return (ir.Function(module, ir.FunctionType(I32, [PTR, PTR, PTR, PTR]), "pthread_create"),
            ir.Function(module, ir.FunctionType(I32, [I64, PTR]), "pthread_join"),
            ir.GlobalVariable(module, I64, THREADS_SYMBOL))
