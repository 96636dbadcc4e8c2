"""Kernel IR -> LLVM IR: one function per loop kernel, one entry per program.

The entry takes a table of buffer pointers and runs every step in order
(loop kernels, generated narrow GEMMs, sgemm calls), so a compiled cluster
is one native call, run with denormals flushed as TensorFlow runs its kernels.
Expressions are rendered once per loop iteration (a DAG, memoised);
reductions become inner loops whose accumulators live in allocas that
LLVM promotes to registers. Large kernels run their outermost loop on
several threads (parallel.py).
"""
import math

from llvmlite import ir

from ...hlo.opcodes import OPCODES, TRANSCENDENTAL
from ...hlo.shape import row_major_strides
from ...kernels.collapse import rows_can_accumulate
from ...kernels.identity import identity
from ...kernels.indexing import load_terms
from ...kernels.ir import (ChunkIndex, ChunkLoop, Const, GemmCall, ImplicitGemm, Index, Load,
                           LoopKernel, MultiOutputReduction, Op, Reduce, ReduceVar, ScatterKernel,
                           Var, WhileLoop, kernel_exprs, leaf_steps, walk)
from ...kernels.storage import loaded, writes
from . import implicit_gemm, narrow_gemm, parallel
from .blas import SGEMM_SYMBOL, THREADS_LOCAL_SYMBOL
from .llvm_types import (I64, PTR, constant, counted_loop, linear, memory_type, register_type,
                         run_time_loop, self_referential_loops, unflatten, while_loop)
from .module_split import top_level
from .ops import OpEmitter
from .profile import Counters


# Innermost iterations from which a kernel's loops gain from unrolling. Measured:
# without unrolling the elephant CNN's step (kernels of up to ~10^8 iterations)
# took 3x as long, the MNIST convnet's (~3*10^6) 1.4x; the softmax regression's
# and MLP's (up to ~2*10^5) ran as fast, and compiled in a third of the time.
LONG_LOOP = 1 << 18

# Innermost loops of these extents (from a vector of 8 floats to where LLVM no
# longer unrolls a loop whole) are left rolled for the loop vectoriser.
VECTOR_ROWS = (8, 512)


def long_running(kernel):
    """Whether a loop kernel runs LONG_LOOP innermost iterations or more (its
    elements times its longest reduction): its loops are unrolled, others' not."""
    folds = [math.prod(n.extents) for _, e in kernel.stores for n in walk(e)
             if isinstance(n, Reduce)]
    return math.prod(kernel.dims) * max(folds, default=1) >= LONG_LOOP


def kernel_buffers(kernel):
    """Ids of the buffers a loop kernel touches, in the order it takes them."""
    return sorted(writes(kernel).union(*map(loaded, kernel_exprs(kernel))))


def outer_dims(kernel, buffers):
    """The kernel's loops outside any reduction loop or tile (those a thread may own part of)."""
    if tiled(kernel):
        return kernel.dims[:-2]
    return kernel.dims[:-1] if rows_can_accumulate(kernel, buffers) else kernel.dims


# The side of a transposed copy's tiles, in elements: TILE rows of the
# source and of the copy, a cache line or more each, stay in L1 while a tile
# is copied (one element a row at a time, the source's rows are a stride of
# a whole row apart: 8 MB of weights took 11 ms copied row by row, untiled).
TILE = 16


def tiled(kernel):
    """Whether loop kernel `kernel` runs its two innermost dims in tiles."""
    return type(kernel) is LoopKernel and kernel.transposes and len(kernel.dims) >= 2 \
        and min(kernel.dims[-2:]) > TILE


class _KernelBuilder:
    """One loop kernel: `void k(ptr noalias buffer..., i64 chunk)`, and when
    split, `i64 lo, i64 hi`: the part of its outermost loop it runs.

    The buffers come as noalias arguments (distinct buffers never overlap:
    storage.py gives a kernel's inputs and outputs different memory), which
    is what lets LLVM vectorise without run-time overlap checks and hoist
    loop-invariant work such as a scalar's pow out of the loops.
    """

    def __init__(self, module, ops, program, kernel, fn, split=False, at=None):
        """`at`: (builder, buffer id -> pointer, chunk) to emit into a function
        already under construction (an implicit GEMM's epilogue) instead."""
        self.module, self.ops, self.program, self.kernel = module, ops, program, kernel
        self.fn, self.split = fn, split
        self.unroll = long_running(kernel)
        if at is None:
            self.b = ir.IRBuilder(fn.append_basic_block("entry"))
            buffers = kernel_buffers(kernel)
            self.pointers = dict(zip(buffers, fn.args))
            self.chunk = fn.args[len(buffers)]
        else:
            self.b, self.pointers, self.chunk = at
        self.alloca_block = fn.entry_basic_block

    # ----------------------------------------------------------------- loops
    def loop(self, extent, body):
        """An innermost loop: one LLVM vectorises. A short one is not unrolled
        (VECTOR_ROWS): LLVM would unroll it whole and vectorise the loop around
        it instead, across rows, with a gather and a scatter per vector."""
        counted_loop(self.b, self.fn, extent, body,
                     self.unroll and not VECTOR_ROWS[0] <= extent <= VECTOR_ROWS[1])

    def nest(self, extents, body, prefix=(), outermost=False, innermost=True):
        """Loops over `extents` around `body`; `innermost`: the last is the
        innermost loop (else `body` loops further)."""
        if not extents:
            body(prefix)
            return

        def inner(i):
            self.nest(extents[1:], body, prefix + (i,), innermost=innermost)
        if outermost and self.split:     # this thread's rows [lo, hi) only
            run_time_loop(self.b, self.fn, *self.fn.args[-2:], inner, self.unroll)
        elif innermost and len(extents) == 1:
            self.loop(extents[0], inner)
        else:
            counted_loop(self.b, self.fn, extents[0], inner, self.unroll)

    def build(self):
        dims = self.kernel.dims
        if 0 in dims:
            self.b.ret_void()
            return
        if rows_can_accumulate(self.kernel, self.program.buffers):
            self.nest(list(dims[:-1]), self._accumulate_rows, outermost=True, innermost=False)
            self.b.ret_void()
            return
        if isinstance(self.kernel, MultiOutputReduction):
            raise ValueError(f"kernel {self.kernel.name}: term stores outside a row reduction")

        target = self.kernel.target if isinstance(self.kernel, ScatterKernel) else None

        def element(index):
            values = {}
            env = {"index": index, "reduce": {}}
            for bid, expr in self.kernel.stores:
                value = self.render(expr, values, env)
                if target is None:    # (at the loop index, whose dims collapse_dims may merge)
                    self.store(bid, expr.dtype, index, value, dims)
                else:
                    self.store(bid, expr.dtype, [self.render(t, values, env) for t in target],
                               value)
        if tiled(self.kernel):
            self.nest(list(dims[:-2]), lambda prefix: self._tiles(prefix, dims[-2:], element),
                      outermost=True, innermost=False)
        else:
            self.nest(list(dims), element, outermost=True)
        self.b.ret_void()

    def _tiles(self, prefix, extents, element):
        """`element` over the two innermost dims in TILE x TILE tiles (the last
        ones cut short at the edges)."""
        b, fn = self.b, self.fn

        def span(tile, extent):
            lo = b.mul(tile, ir.Constant(I64, TILE))
            hi = b.add(lo, ir.Constant(I64, TILE))
            bound = ir.Constant(I64, extent)
            return lo, b.select(b.icmp_signed("<", hi, bound), hi, bound)

        def tile(rows, cols):
            run_time_loop(b, fn, *span(rows, extents[0]), lambda i: run_time_loop(
                b, fn, *span(cols, extents[1]), lambda j: element(prefix + (i, j)), False),
                False)
        counted_loop(b, fn, -(-extents[0] // TILE), lambda rows: counted_loop(
            b, fn, -(-extents[1] // TILE), lambda cols: tile(rows, cols), False), False)

    def _accumulate_rows(self, prefix):
        """Reduction loops outside, the output's last dimension innermost.

        Each element still folds its terms in the same order, so results are
        bit-identical to the element-by-element loop; but the innermost loop
        now runs along contiguous memory, which LLVM vectorises (the row stays
        in L1 while every term is added to it). The result accumulates in the
        output's row; any other accumulator (an argmax's value, a pooling
        gradient's flag) in a row on the stack. A multi-output reduction
        stores its terms as they are computed.
        """
        (bid, red), last = self.kernel.stores[0], self.kernel.dims[-1]
        rows = {i: self._stack_row(a.dtype, last) for i, a in enumerate(red.accs)
                if i != red.result}
        terms = self.kernel.term_stores if isinstance(self.kernel, MultiOutputReduction) else ()

        def load(i, j):
            if i == red.result:
                return self.load(Load(red.dtype, bid, ()), self.address(bid, prefix + (j,)))
            return rows[i].load(j)

        def store(i, j, value):
            if i == red.result:
                self.store(bid, red.dtype, prefix + (j,), value)
            else:
                rows[i].store(j, value)

        def init(j):
            env = {"index": prefix + (j,), "reduce": {}}
            for i, value in enumerate(red.inits):
                store(i, j, self.render(value, {}, env))
        self.loop(last, init)

        def term(counters):
            def add_to_row(j):
                env = {"index": prefix + (j,),
                       "reduce": {(red.key, d): c for d, c in enumerate(counters)}}
                values = {}
                current = [self.render(body, values, env) for body in red.bodies]
                for term, index, value in terms:
                    self.store(term, value.dtype, [self.render(i, values, env) for i in index],
                               self.render(value, values, env))
                accs = [load(i, j) for i in range(len(red.accs))]
                env["vars"] = {**{a.name: v for a, v in zip(red.accs, accs)},
                               **{c.name: v for c, v in zip(red.curs, current)}}
                values = {}     # (the combined values use the accumulators bound just now)
                for i, value in enumerate([self.render(c, values, env) for c in red.combined]):
                    store(i, j, value)
            self.loop(last, add_to_row)
        self.nest(list(red.extents), term, innermost=False)

    # ------------------------------------------------------------ memory
    def _stack_row(self, dtype, length):
        """`length` values of `dtype` on the stack, a pred as a byte: LLVM's
        loop vectoriser leaves a loop that reads or writes i1 memory scalar."""
        return _StackRow(self.b, self.alloca_block, dtype, length)

    def address(self, bid, index, dims=None):
        """Where buffer `bid`'s element `index` lies, the buffer laid out
        row-major as `dims` (by default its own)."""
        dims = dims or self.program.buffers[bid].dims
        return self.at(bid, [(i, s) for i, s, n in zip(index, row_major_strides(dims), dims)
                             if n != 1])

    def at(self, bid, terms):
        """Buffer `bid`'s element at the offset summed from (i64, stride) `terms`."""
        return self.b.gep(self.pointers[bid], [linear(self.b, *terms)], inbounds=True,
                          source_etype=memory_type(self.program.buffers[bid].dtype))

    def store(self, bid, dtype, index, value, dims=None):
        if dtype == "pred":
            value = self.b.zext(value, ir.IntType(8))
        self.b.store(value, self.address(bid, index, dims))

    def load(self, node, pointer):
        value = self.b.load(pointer, typ=memory_type(node.dtype))
        return self.b.trunc(value, ir.IntType(1)) if node.dtype == "pred" else value

    # ------------------------------------------------------------ expressions
    def render(self, expr, values, env):
        for node in walk(expr, into_reductions=False):
            if id(node) not in values:
                values[id(node)] = self.node(node, values, env)
        return values[id(expr)]

    def node(self, node, values, env):
        if isinstance(node, Const):
            return constant(node.dtype, node.value)
        if isinstance(node, Index):
            return env["index"][node.dim]
        if isinstance(node, ChunkIndex):
            return self.chunk
        if isinstance(node, ReduceVar):
            return env["reduce"][(node.owner, node.dim)]
        if isinstance(node, Var):
            return env["vars"][node.name]
        if isinstance(node, Load):
            terms = load_terms(node.index, self.program.buffers[node.buffer].dims)
            return self.load(node, self.at(node.buffer, [(values[id(i)], s) for i, s in terms]))
        if isinstance(node, Op):
            return self.ops.emit(self.b, node.opcode, node.attr, node.dtype,
                                 [a.dtype for a in node.args], [values[id(a)] for a in node.args])
        if isinstance(node, Reduce):
            results = env.setdefault("reduced", {})
            if node.key not in results:
                results[node.key] = self.reduce(node, values, env)
            return results[node.key][node.result]
        raise TypeError(node)

    def reduce(self, node, values, env):
        b = self.b
        with b.goto_block(self.alloca_block):
            b.position_at_start(self.alloca_block)
            slots = [b.alloca(register_type(v.dtype)) for v in node.accs]
        for slot, init in zip(slots, node.inits):
            b.store(values[id(init)], slot)

        def bound(counters):
            inner_env = dict(env)
            inner_env["reduce"] = dict(env["reduce"])
            inner_env["reduce"].update(((node.key, d), c) for d, c in enumerate(counters))
            inner_env["reduced"] = dict(env.get("reduced", {}))
            return inner_env, dict(values)      # outer values dominate the loop body

        def fold(inner_env, inner_values, current):
            accs = [b.load(slot, typ=register_type(v.dtype)) for slot, v in zip(slots, node.accs)]
            inner_env["vars"] = dict(env.get("vars", {}))
            inner_env["vars"].update((v.name, a) for v, a in zip(node.accs, accs))
            inner_env["vars"].update((v.name, c) for v, c in zip(node.curs, current))
            combined = [self.render(c, dict(inner_values), inner_env) for c in node.combined]
            if _is_float_sum(node):
                # Any order of the terms: LLVM keeps vectors of partial sums (as
                # XLA's and Eigen's reductions do), rounding aside the same sum.
                combined[0].flags.append("reassoc")
            for slot, value in zip(slots, combined):
                b.store(value, slot)

        def step(counters):
            inner_env, inner_values = bound(counters)
            fold(inner_env, inner_values,
                 [self.render(body, inner_values, inner_env) for body in node.bodies])
        if _terms_first(node):
            self._terms_then_fold(node, bound, fold)
        elif 0 not in node.extents:
            self.nest(list(node.extents), step)
        return [b.load(slot, typ=register_type(v.dtype)) for slot, v in zip(slots, node.accs)]

    def _terms_then_fold(self, node, bound, fold):
        """Reduction `node`'s terms along its innermost dim first, into rows on
        the stack (a loop without a carried value, which LLVM vectorises), then
        folded in order: the same results as term by term, but a costly term
        (a softmax's exp) no longer waits on the serial fold."""
        inner = node.extents[-1]
        rows = [self._stack_row(body.dtype, inner) for body in node.bodies]

        def row(outer):
            def term(r):
                inner_env, inner_values = bound(outer + (r,))
                for body, stack_row in zip(node.bodies, rows):
                    stack_row.store(r, self.render(body, inner_values, inner_env))

            def fold_term(r):
                inner_env, inner_values = bound(outer + (r,))
                fold(inner_env, inner_values, [stack_row.load(r) for stack_row in rows])
            self.loop(inner, term)
            self.loop(inner, fold_term)
        self.nest(list(node.extents[:-1]), lambda outer: row(tuple(outer)), innermost=False)


class _StackRow:
    """A row of values on the stack (`_KernelBuilder._stack_row`)."""

    def __init__(self, b, alloca_block, dtype, length):
        self.b, self.pred, self.type = b, dtype == "pred", memory_type(dtype)
        with b.goto_block(alloca_block):
            b.position_at_start(alloca_block)
            self.row = b.alloca(self.type, size=ir.Constant(I64, length))

    def _at(self, j):
        return self.b.gep(self.row, [j], inbounds=True, source_etype=self.type)

    def load(self, j):
        value = self.b.load(self._at(j), typ=self.type)
        return self.b.trunc(value, ir.IntType(1)) if self.pred else value

    def store(self, j, value):
        self.b.store(self.b.zext(value, self.type) if self.pred else value, self._at(j))


# Sums of this many terms or more are added in any order (two vectors of
# AVX-512's 16 floats): below, partial sums gain nothing, and the sum stays in
# index order (a batch's mean over 8 examples rounds as it always did).
REASSOCIATE_FROM = 32


def _is_float_sum(node):
    """Whether Reduce `node` is a float sum of REASSOCIATE_FROM terms or more:
    one accumulator, added to."""
    (combined,) = node.combined if len(node.combined) == 1 else (None,)
    return (math.prod(node.extents) >= REASSOCIATE_FROM
            and isinstance(combined, Op) and combined.opcode == "add"
            and combined.dtype in ("f32", "f64")
            and {a.name for a in combined.args if isinstance(a, Var)}
            == {node.accs[0].name, node.curs[0].name})


# Terms a reduction computes into a row on the stack before folding them
# (_terms_then_fold): at most this many bytes of rows (reports/tuning-measurements.md).
TERM_ROW_BYTES = 16 << 10


def _terms_first(node):
    """Whether Reduce `node` computes its terms ahead of the fold: a costly
    one (a transcendental op), along an innermost dim long enough for vectors
    and short enough for the stack."""
    inner = node.extents[-1] if node.extents and 0 not in node.extents else 0
    costly = any(isinstance(n, Op) and OPCODES[n.opcode].cost == TRANSCENDENTAL
                 for body in node.bodies for n in walk(body, into_reductions=False))
    return costly and 8 <= inner and inner * 8 * len(node.bodies) <= TERM_ROW_BYTES


def _epilogue(module, ops, program, step, extra):
    """Emits ImplicitGemm `step`'s epilogue over a block's rows (implicit_gemm.emit):
    element by element along each row's features, in place in C. The element's
    own value in C is read and written through one pointer: addresses of it
    computed apart (the load's terms in another order) left LLVM unsure they
    were one, so it checked at run time and ran every row but the first
    scalar (three quarters of a 3-channel convolution's time, its ReLU)."""
    dims = program.buffers[step.out].dims
    kernel = LoopKernel(f"{step.name}_epilogue", dims, [(step.out, step.epilogue)])
    own = [n for n in walk(step.epilogue, into_reductions=False)
           if isinstance(n, Load) and n.buffer == step.out]
    element_type = memory_type(program.buffers[step.out].dtype)

    def emit(code, starts, j0, width):
        b = code.b
        pointers = {step.out: code.c_ptr, **dict(zip(extra, code.extra))}
        builder = _KernelBuilder(module, ops, program, kernel, code.fn,
                                 at=(b, pointers, code.chunk))
        for start in starts:          # a row's index but its feature, once per row
            prefix = unflatten(b, b.udiv(start, ir.Constant(I64, dims[-1])), dims[:-1])

            def element(j, prefix=prefix, start=start):
                at = b.gep(code.c_ptr, [linear(b, start, j)], inbounds=True,
                           source_etype=element_type)
                value = b.load(at, typ=element_type)
                values = {id(n): value for n in own}
                index = prefix + [linear(b, j, j0)]
                b.store(builder.render(step.epilogue, values, {"index": index, "reduce": {}}),
                        at)
            # Vectorised, not unrolled: the block's rows are unrolled already, and
            # unrolling more costs LLVM time for no speed (reports/tuning-measurements.md).
            counted_loop(b, code.fn, width, element, unroll=False)
    return emit


def _buffer_pointer(b, table, bid):
    return b.load(b.gep(table, [ir.Constant(I64, bid)], inbounds=True, source_etype=PTR), typ=PTR)


def _gemm(b, fn, sgemm, call, starts, chunk, threads_local=None, part=None):
    """sgemm on row-major data (GemmCall.column_major) at `starts` (A, B, C),
    once per batch index, on this thread alone by `threads_local` (OpenBLAS's
    per-thread setter, where the BLAS has one: kerasjit's own threads split
    large products, parallel.gemm_parts). `part`: (axis, lo, hi), one
    thread's share: those indices of the outermost batch level, or those rows
    or columns of C."""
    i32, f32, i8 = ir.IntType(32), ir.FloatType(), ir.IntType(8)

    def by_reference(ty, value):      # Fortran BLAS takes every argument by pointer
        with b.goto_entry_block():    # (an alloca inside a loop would grow the stack)
            slot = b.alloca(ty)
        b.store(value if isinstance(value, ir.Value) else ir.Constant(ty, value), slot)
        return slot

    def moved(pointer, elements):
        return b.gep(pointer, [elements], inbounds=True, source_etype=f32)
    trans_b, trans_a, m, n, k, ld_b, ld_a, ld_c = call.column_major()
    out_stride, rhs_stride = call.chunk_strides()
    starts = list(starts)
    for operand, stride in ((1, rhs_stride), (2, out_stride)):
        if stride:
            starts[operand] = moved(starts[operand], b.mul(chunk, ir.Constant(I64, stride)))
    axis, *bounds = part or (None,)
    if axis == "rows":        # rows lo..hi of C: columns of the column-major C^T
        lo, hi = bounds
        n = b.trunc(b.sub(hi, lo), i32)
        starts[0] = moved(starts[0], lo if call.lhs_transposed else b.mul(lo, ir.Constant(I64, ld_a)))
        starts[2] = moved(starts[2], b.mul(lo, ir.Constant(I64, ld_c)))
    elif axis == "columns":   # columns lo..hi of C: rows of C^T
        lo, hi = bounds
        m = b.trunc(b.sub(hi, lo), i32)
        starts[1] = moved(starts[1], b.mul(lo, ir.Constant(I64, ld_b)) if call.rhs_transposed
                          else lo)
        starts[2] = moved(starts[2], lo)
    beta = by_reference(f32, 0.0)
    if call.accumulate:               # the first chunk overwrites, later ones add
        b.store(b.select(b.icmp_signed("==", chunk, ir.Constant(I64, 0)),
                         ir.Constant(f32, 0.0), ir.Constant(f32, 1.0)), beta)
    arguments = [by_reference(i8, ord("T" if trans_b else "N")),
                 by_reference(i8, ord("T" if trans_a else "N")),
                 *(by_reference(i32, v) for v in (m, n, k)), by_reference(f32, 1.0)]
    leading = [by_reference(i32, v) for v in (ld_b, ld_a, ld_c)]

    def product(pointers):
        lhs, rhs, out = pointers
        b.call(sgemm, [*arguments, rhs, leading[0], lhs, leading[1], beta, out, leading[2]])
    if threads_local is not None:
        previous = b.call(threads_local, [ir.Constant(i32, 1)])
    _for_each_batch(b, fn, call.batch, starts, product, bounds if axis == "batch" else None)
    if threads_local is not None:
        b.call(threads_local, [previous])


def _gemm_part(module, sgemm, threads_local, call, axis, name):
    """`void name(ptr A, ptr B, ptr C, i64 chunk, i64 lo, i64 hi)`: one thread's
    share of GemmCall `call`, [lo, hi) along `axis` (parallel.gemm_parts)."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR] * 3 + [I64] * 3), name)
    fn.linkage = "internal"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    *starts, chunk, lo, hi = fn.args
    _gemm(b, fn, sgemm, call, starts, chunk, threads_local, (axis, lo, hi))
    b.ret_void()
    return fn


def _narrow_arguments(gemm, pointers):
    """A narrow GEMM function's (C, A, B) from a GemmCall's (lhs, rhs, out)."""
    lhs, rhs, out = pointers
    return [out, rhs, lhs] if gemm.swapped else [out, lhs, rhs]


def _narrow_part(module, fn, gemm, batch, name):
    """`void name(ptr lhs, ptr rhs, ptr out, i64 chunk, i64 lo, i64 hi)`: the
    narrow GEMM `fn` on the products [lo, hi) of the outermost `batch` level."""
    part = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR] * 3 + [I64] * 3), name)
    part.linkage = "internal"
    b = ir.IRBuilder(part.append_basic_block("entry"))
    *pointers, _, lo, hi = part.args
    _for_each_batch(b, part, batch, pointers,
                    lambda abc: b.call(fn, _narrow_arguments(gemm, abc)), (lo, hi))
    b.ret_void()
    return part


def _for_each_batch(b, fn, levels, pointers, product, part=None):
    """product([A, B, C]) at each index of GemmCall batch `levels` (their
    loops at `b`; the outermost's indices only in `part`, (lo, hi), if given),
    the (lhs, rhs, out) `pointers` moved on to that product."""
    if not levels:
        product(pointers)
        return
    extent, *steps = levels[0]

    def at(i):
        _for_each_batch(b, fn, levels[1:], [
            b.gep(p, [b.mul(i, ir.Constant(I64, s))], inbounds=True, source_etype=ir.FloatType())
            for p, s in zip(pointers, steps)], product)
    if part:
        run_time_loop(b, fn, *part, at)
    else:
        counted_loop(b, fn, extent, at)


def _flush_denormals(module, b):
    """Set MXCSR's flush-to-zero and denormals-are-zero bits at `b`, as
    TensorFlow does around its CPU kernels (denormals are slow:
    reports/tuning-measurements.md); returns a function that emits the restore.
    Threads the step starts inherit it (pthread_create copies MXCSR); OpenBLAS's
    pooled workers do not, so a threaded sgemm flushes only in the calling
    thread's share (as TensorFlow's own calls into BLAS would)."""
    i32 = ir.IntType(32)
    save, load = (ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), f"llvm.x86.sse.{n}")
                  for n in ("stmxcsr", "ldmxcsr"))
    slot = b.alloca(i32)
    b.call(save, [slot])
    old = b.load(slot, typ=i32)
    b.store(b.or_(old, ir.Constant(i32, 0x8040)), slot)     # FTZ (bit 15) | DAZ (bit 6)
    b.call(load, [slot])

    def restore():
        b.store(old, slot)
        b.call(load, [slot])
    return restore


def render_program(program, name="cluster", blas_threads_local=False, lanes=8, x86=False,
                   timed=False):
    """The LLVM IR text of a module with `{name}_entry(ptr buffers)` running
    every step, and the (name, LLVM IR) of the entry and each kernel function
    for explain() (a split kernel's listing ends with its thread entry). `lanes`: floats per
    vector register, for the narrow GEMMs' hand-blocked vector code; `x86`:
    the entry flushes denormals (MXCSR) while it runs; `timed`: each step is
    timed (profile.py), and the Counters come back third (else None);
    `sgemm_threading`: parallel.sgemm_threading of the program, if known."""
    module = ir.Module(name=name)
    ops = OpEmitter(module)
    entry = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR]), f"{name}_entry")
    eb = ir.IRBuilder(entry.append_basic_block("entry"))
    table = entry.args[0]
    restore_fp_mode = _flush_denormals(module, eb) if x86 else (lambda: None)
    sgemm = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR] * 13), SGEMM_SYMBOL)
    i32 = ir.IntType(32)
    threads_local = ir.Function(module, ir.FunctionType(i32, [i32]), THREADS_LOCAL_SYMBOL) \
        if blas_threads_local else None
    may_split = parallel.cores_free(program.steps, blas_threads_local)
    kernels, functions = [], {}       # functions: kernel identity -> its function
    counters = Counters(module, name, list(leaf_steps(program.steps))) if timed else None

    def emit(steps, chunk, looped=False):
        """`looped`: inside a while loop, whose kernels split over no threads:
        threads started on every iteration would cost more than its (per-step
        sized) kernels gain."""
        for step in steps:
            if isinstance(step, ChunkLoop):
                counted_loop(eb, entry, step.count, lambda i, s=step: emit(s.steps, i, looped))
            elif isinstance(step, WhileLoop):
                while_loop(eb, entry, lambda s=step: test(s, chunk),
                           lambda s=step: emit(s.body, chunk, True))
            elif counters is not None:
                counters.timed(eb, lambda s=step: emit_leaf(s, chunk, looped))
            else:
                emit_leaf(step, chunk, looped)

    def test(loop, chunk):
        emit(loop.test, chunk, True)
        flag = eb.load(_buffer_pointer(eb, table, loop.condition), typ=ir.IntType(8))
        return eb.icmp_unsigned("!=", flag, ir.Constant(ir.IntType(8), 0))

    def emit_leaf(step, chunk, looped):
        may_split_here = may_split and not looped
        if isinstance(step, GemmCall) and (gemm := narrow_gemm.plan(step)):
            fn = function(("narrow", gemm), lambda fn_name: narrow_gemm.emit(
                module, gemm, fn_name, lanes))
            parts = may_split_here and parallel.gemm_parts(step)
            if parts and parts[0] == "batch":        # (whole products to each thread)
                part = function(("narrow", gemm, step.batch), lambda fn_name: _narrow_part(
                    module, fn, gemm, step.batch, fn_name))
                call(part, (step.lhs, step.rhs, step.out), chunk, True, parts[1], [])
                kernels[-1][1:1] = [fn.name]
            else:
                pointers = [_buffer_pointer(eb, table, bid)
                            for bid in (step.lhs, step.rhs, step.out)]
                _for_each_batch(eb, entry, step.batch, pointers,
                                lambda abc: eb.call(fn, _narrow_arguments(gemm, abc)))
                kernels.append([fn.name])
        elif isinstance(step, GemmCall) and may_split_here and threads_local is not None \
                and (parts := parallel.gemm_parts(step)):
            fn = function(("gemm", *parallel.gemm_geometry(step)), lambda fn_name: _gemm_part(
                module, sgemm, threads_local, step, parts[0], fn_name))
            call(fn, (step.lhs, step.rhs, step.out), chunk, True, parts[1], [])
        elif isinstance(step, GemmCall):
            _gemm(eb, entry, sgemm, step, [_buffer_pointer(eb, table, bid) for bid in
                                           (step.lhs, step.rhs, step.out)], chunk, threads_local)
        elif isinstance(step, ImplicitGemm):
            extra = sorted(loaded(step.epilogue) - {step.out})
            fn, blocks_total = function(
                identity(step, program.buffers, (step.out, step.lhs, step.rhs, *extra)),
                lambda fn_name: implicit_gemm.emit(
                    module, step, fn_name, lanes, len(extra),
                    step.epilogue and _epilogue(module, ops, program, step, extra)))
            # (All live in this step, so storage.py gave them distinct memory: the
            # function's noalias arguments hold.)
            call(fn, (step.out, step.lhs, step.rhs, *extra), chunk,
                 may_split_here and implicit_gemm.worth_splitting(step, blocks_total),
                 blocks_total, [ir.Constant(I64, 0), ir.Constant(I64, blocks_total)])
        else:
            buffers = kernel_buffers(step)
            split = may_split_here and parallel.worth_splitting(step, outer_dims(step, program.buffers))

            def build(fn_name, step=step):
                fn = ir.Function(module, ir.FunctionType(
                    ir.VoidType(), [PTR] * len(buffers) + [I64] * (3 if split else 1)), fn_name)
                fn.linkage = "internal"
                # Never inlined into the entry: LLVM takes float arithmetic to be
                # independent of MXCSR and could move it across the denormal
                # flush's ldmxcsr there (and a call per kernel costs nothing).
                fn.attributes.add("noinline")
                for arg in fn.args[:len(buffers)]:
                    arg.add_attribute("noalias")
                _KernelBuilder(module, ops, program, step, fn, split).build()
                return fn
            fn = function(identity(step, program.buffers, buffers, split), build)
            call(fn, buffers, chunk, split, step.dims[0] if split else 0, [])

    def function(key, build):
        """The function (and whatever else `build` returns) for a kernel of
        identity `key`: built once per module, called by every step it serves."""
        if key not in functions:
            functions[key] = build(f"{name}_k{len(module.functions)}")
        return functions[key]

    def call(fn, buffers, chunk, split, extent, whole):
        """At the entry: `fn` over `buffers` (from the table) and `chunk`, split
        over the threads in [0, extent), else called once with `whole` after."""
        def load(b, table):
            return [_buffer_pointer(b, table, bid) for bid in buffers]
        if split:
            task = parallel.call_split(eb, fn, load, table, chunk, extent)
            kernels.append([fn.name, task.name])
        else:
            eb.call(fn, load(eb, table) + [chunk] + whole)
            kernels.append([fn.name])
    emit(program.steps, ir.Constant(I64, 0))
    restore_fp_mode()
    eb.ret_void()
    text = self_referential_loops(str(module))
    listings, _ = top_level(text)     # (formatting each function apart would format it twice)
    return text, [(names[0], "\n".join(listings[n] for n in names))
                  for names in [[entry.name]] + kernels], counters
