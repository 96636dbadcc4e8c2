"""Kernel IR -> CUDA C: one __global__ function per loop kernel.

Each kernel runs a grid-stride loop over its flattened iteration space, so
any grid covers it. Per element the expression DAG is rendered once into const
locals; a Reduce becomes an inner loop nest over accumulator locals. GemmCalls
go to cuBLAS on the host (executable.py); ImplicitGemms to cuda_implicit_gemm.py.

A kernel with a long reduction (BLOCK_REDUCE_TERMS terms or more, e.g. a loss
over the batch) is cooperative: a block per output element, its threads
striding over the terms, then a shared-memory tree with the reduction's own
combiner (HLO reductions may combine in any order); thread 0 stores. One
thread per element would sum a scalar loss serially.
"""
import math
import re

from ...kernels.indexing import load_terms
from ...kernels.ir import (ChunkIndex, Const, ImplicitGemm, Index, Load, LoopKernel, Op, Reduce,
                           ReduceVar, ScatterKernel, Var, kernel_exprs, leaf_steps, walk)
from . import cuda_implicit_gemm
from .cuda_ops import PRELUDE, ctype, expression, literal, memory_ctype

SIGNATURE = 'extern "C" __global__ void {name}(void** buffers, long long chunk)'
THREADS = 256               # per block, a power of two (the shared-memory tree halves it)
BLOCK_REDUCE_TERMS = 1024   # from this many terms a reduction takes a block per element,
BLOCK_REDUCE_ELEMENTS = 1 << 14     # up to this many elements (a big GPU's resident blocks x4)


def _long_reductions(kernel):
    """The kernel's Reduces that a block combines: long ones not inside another,
    in a kernel of few enough elements (a block each) that are no scatter's."""
    if isinstance(kernel, ScatterKernel) or math.prod(kernel.dims) > BLOCK_REDUCE_ELEMENTS:
        return []
    return [n for _, e in kernel.stores for n in walk(e, into_reductions=False)
            if isinstance(n, Reduce) and math.prod(n.extents) >= BLOCK_REDUCE_TERMS]


ATOMIC_ADD_TYPES = {"f32", "f64", "s32", "u32", "u64"}     # CUDA's atomicAdd


def _atomic(kernel):
    """A scatter whose updates add: each thread adds its own with atomicAdd, in
    whatever order they come (as TensorFlow's GPU scatter does)."""
    return isinstance(kernel, ScatterKernel) and kernel.adds \
        and kernel.stores[0][1].dtype in ATOMIC_ADD_TYPES


def _serial(kernel):
    """A scatter whose updates apply one after another, on one thread."""
    return isinstance(kernel, ScatterKernel) and kernel.ordered and not _atomic(kernel)


def launch_threads(kernel):
    """Threads a launch of `kernel` wants: one per element, for a cooperative
    kernel a block per element, for a non-atomic scatter a single thread (its
    updates apply in order, several to one element), for an implicit GEMM one
    per tile."""
    if isinstance(kernel, ImplicitGemm):
        return cuda_implicit_gemm.tiles(kernel, THREADS)
    if _serial(kernel):
        return 1
    return math.prod(kernel.dims) * (THREADS if _long_reductions(kernel) else 1)


class _Scope:
    """What rendered code at one C block nesting level can refer to."""

    def __init__(self, parent=None):
        self.values = dict(parent.values) if parent else {}   # id(node) -> C expression
        self.vars = dict(parent.vars) if parent else {}       # Var name -> C expression
        self.counters = dict(parent.counters) if parent else {}   # (key, dim) -> loop variable
        self.reduced = dict(parent.reduced) if parent else {}     # Reduce key -> accumulators


class _KernelWriter:
    def __init__(self, program, kernel):
        self.program, self.kernel = program, kernel
        self.lines, self.depth, self.count = [], 1, 0
        self.cooperative = {n.key for n in _long_reductions(kernel)}

    def emit(self, line):
        self.lines.append("    " * self.depth + line)

    def fresh(self, prefix="v"):
        self.count += 1
        return f"{prefix}{self.count}"

    def local(self, dtype, value, prefix="v"):
        name = self.fresh(prefix)
        self.emit(f"const {ctype(dtype)} {name} = {value};")
        return name

    def block(self, header, body):
        self.emit(header + " {")
        self.depth += 1
        body()
        self.depth -= 1
        self.emit("}")

    # ------------------------------------------------------------------ kernel
    def declare_buffers(self, written, read):
        """The kernel's buffers as `b{id}` pointers, const where only read."""
        for bid in sorted(written | read):
            t = memory_ctype(self.program.buffers[bid].dtype)
            t = t if bid in written else f"const {t}"
            self.emit(f"{t}* const b{bid} = ({t}*)buffers[{bid}];")

    def source(self, name):
        """The kernel `name` around the lines emitted."""
        body = "\n".join(self.lines)
        return f"{SIGNATURE.format(name=name)} {{\n{body}\n}}\n"

    def render(self, name):
        stores = self.kernel.stores
        self.declare_buffers({bid for bid, _ in stores}, set().union(
            *({n.buffer for n in walk(e) if isinstance(n, Load)} for e in kernel_exprs(self.kernel))))
        dims = self.kernel.dims
        total = math.prod(dims)
        if _serial(self.kernel):
            loop = (f"if (blockIdx.x == 0 && threadIdx.x == 0) "
                    f"for (s64 flat = 0; flat < {total}LL; ++flat)")
        elif self.cooperative:     # (uniform over the block: every thread meets each barrier)
            loop = f"for (s64 flat = blockIdx.x; flat < {total}LL; flat += gridDim.x)"
        else:
            loop = (f"for (s64 flat = (s64)blockIdx.x * blockDim.x + threadIdx.x; "
                    f"flat < {total}LL; flat += (s64)blockDim.x * gridDim.x)")
        self.block(loop, lambda: self.element(dims))
        return self.source(name)

    def element(self, dims):
        # Every dimension but unit ones (their index is 0) is in the store's address.
        stride = 1
        for d in reversed(range(len(dims))):
            if dims[d] != 1:
                split = f"flat / {stride}LL" if stride > 1 else "flat"
                if stride * dims[d] != math.prod(dims):
                    split = f"{split} % {dims[d]}LL"
                self.emit(f"const s64 i{d} = {split};")
            stride *= dims[d]
        scope = _Scope()
        if _atomic(self.kernel):
            self.atomic_add(scope)
            return
        for bid, expr in self.kernel.stores:
            value = self.value(expr, scope)
            if expr.dtype == "pred":
                value = f"(u8){value}"
            # (at the loop index, whose dims the kernel passes may have merged)
            at = (self.address(bid, [self.value(t, scope) for t in self.kernel.target])
                  if isinstance(self.kernel, ScatterKernel)
                  else self.address(bid, [f"i{d}" for d in range(len(dims))], dims))
            store = f"b{bid}[{at}] = {value};"
            self.emit(f"if (threadIdx.x == 0) {store}" if self.cooperative else store)

    def atomic_add(self, scope):
        kernel = self.kernel
        (bid, expr), = kernel.stores
        at = self.address(bid, [self.value(t, scope) for t in kernel.target])
        add = f"atomicAdd(&b{bid}[{at}], {self.value(kernel.update, scope)});"
        self.emit(f"if ({self.value(kernel.fits, scope)}) {add}" if kernel.fits else add)

    def address(self, bid, index, dims=None):
        """Where buffer `bid`'s element `index` lies, the buffer laid out
        row-major as `dims` (by default its own)."""
        terms, stride = [], 1
        for i, n in reversed(list(zip(index, dims or self.program.buffers[bid].dims))):
            if n != 1:
                terms.append(i if stride == 1 else f"{i} * {stride}LL")
            stride *= n
        return " + ".join(reversed(terms)) or "0"

    # ------------------------------------------------------------- expressions
    def value(self, expr, scope):
        """C expression for `expr`, emitting locals for the nodes not yet in scope."""
        for node in walk(expr, into_reductions=False):
            if id(node) not in scope.values:
                scope.values[id(node)] = self.node(node, scope)
        return scope.values[id(expr)]

    def node(self, node, scope):
        if isinstance(node, Const):
            return literal(node.dtype, node.value)
        if isinstance(node, Index):
            return f"i{node.dim}" if self.kernel.dims[node.dim] != 1 else "0LL"
        if isinstance(node, ChunkIndex):
            return "chunk"
        if isinstance(node, ReduceVar):
            return scope.counters[(node.owner, node.dim)]
        if isinstance(node, Var):
            return scope.vars[node.name]
        if isinstance(node, Load):
            at = " + ".join(scope.values[id(i)] if s == 1 else f"{scope.values[id(i)]} * {s}LL"
                            for i, s in load_terms(node.index,
                                                   self.program.buffers[node.buffer].dims)) or "0"
            loaded = f"b{node.buffer}[{at}]"
            return self.local(node.dtype, f"{loaded} != 0" if node.dtype == "pred" else loaded)
        if isinstance(node, Op):
            args = [scope.values[id(a)] for a in node.args]
            return self.local(node.dtype, expression(node.opcode, node.attr, node.dtype,
                                                     [a.dtype for a in node.args], args))
        if isinstance(node, Reduce):
            if node.key not in scope.reduced:
                reduce = self.block_reduce if node.key in self.cooperative else self.reduce
                scope.reduced[node.key] = reduce(node, scope)
            return scope.reduced[node.key][node.result]
        raise TypeError(node)

    def accumulators(self, node, scope):
        accs = []
        for var, init in zip(node.accs, node.inits):
            accs.append(self.fresh("acc"))
            self.emit(f"{ctype(var.dtype)} {accs[-1]} = {scope.values[id(init)]};")
        return accs

    def combine(self, node, scope, accs, current, counters=()):
        """accs = the reduction's combiner of (accs, current)."""
        inner = _Scope(scope)     # outer values are loop-invariant: reuse them
        inner.counters.update(((node.key, d), c) for d, c in enumerate(counters))
        if current is None:       # a term: the bodies at the counters
            current = [self.value(body, inner) for body in node.bodies]
        inner.vars.update((v.name, a) for v, a in zip(node.accs, accs))
        inner.vars.update((v.name, c) for v, c in zip(node.curs, current))
        # All new values first: a combiner may read an accumulator another one updates.
        combined = [self.value(c, inner) for c in node.combined]
        for acc, value in zip(accs, combined):
            self.emit(f"{acc} = {value};")

    def block_reduce(self, node, scope):
        """The block's threads split the terms, then combine in shared memory."""
        accs = self.accumulators(node, scope)
        counters = [self.fresh("r") for _ in node.extents]
        term = self.fresh("t")

        def strided():
            stride = 1
            for d in reversed(range(len(counters))):
                split = f"{term} / {stride}LL" if stride > 1 else term
                if d:
                    split = f"{split} % {node.extents[d]}LL"
                self.emit(f"const s64 {counters[d]} = {split};")
                stride *= node.extents[d]
            self.combine(node, scope, accs, None, counters)
        self.block(f"for (s64 {term} = threadIdx.x; {term} < {math.prod(node.extents)}LL; "
                   f"{term} += blockDim.x)", strided)
        shared = [self.fresh("shared") for _ in accs]
        for var, acc, sh in zip(node.accs, accs, shared):
            self.emit(f"__shared__ {ctype(var.dtype)} {sh}[{THREADS}];")
            self.emit(f"{sh}[threadIdx.x] = {acc};")
        self.emit("__syncthreads();")
        half = self.fresh("half")

        def merge():
            others = [self.local(v.dtype, f"{sh}[threadIdx.x + {half}]")
                      for v, sh in zip(node.accs, shared)]
            self.combine(node, scope, accs, others)
            for acc, sh in zip(accs, shared):
                self.emit(f"{sh}[threadIdx.x] = {acc};")

        def halve():
            self.block(f"if (threadIdx.x < {half})", merge)
            self.emit("__syncthreads();")
        self.block(f"for (unsigned {half} = blockDim.x / 2; {half} > 0; {half} >>= 1)", halve)
        results = [self.local(v.dtype, f"{sh}[0]", "reduced") for v, sh in zip(node.accs, shared)]
        self.emit("__syncthreads();")    # before the next element writes the shared arrays
        return results

    def reduce(self, node, scope):
        accs = self.accumulators(node, scope)
        counters = [self.fresh("r") for _ in node.extents]

        def step():
            self.combine(node, scope, accs, None, counters)

        def nest(d):
            if d == len(counters):
                step()
                return
            c = counters[d]
            self.block(f"for (s64 {c} = 0; {c} < {node.extents[d]}LL; ++{c})",
                       lambda: nest(d + 1))
        if 0 not in node.extents:
            nest(0)
        return accs


def _identifier(text):
    return re.sub(r"\W", "_", text)


def kernel_names(program, name="cluster"):
    """[(C function name, LoopKernel or ImplicitGemm)] in execution order,
    ChunkLoop bodies included."""
    kernels = [s for s in leaf_steps(program.steps) if isinstance(s, (LoopKernel, ImplicitGemm))]
    return [(f"{name}_{i}_{_identifier(k.name)}", k) for i, k in enumerate(kernels)]


def render_kernel(program, kernel, name):
    """CUDA C source of one LoopKernel or ImplicitGemm (needs PRELUDE before it)."""
    if isinstance(kernel, ImplicitGemm):
        return cuda_implicit_gemm.render(program, kernel, name, _KernelWriter, THREADS)
    return _KernelWriter(program, kernel).render(name)


def render_program(program, name="cluster"):
    """(complete .cu source, [(kernel name, kernel source)]) for every loop kernel."""
    kernels = [(n, render_kernel(program, k, n)) for n, k in kernel_names(program, name)]
    return PRELUDE + "\n" + "\n".join(src for _, src in kernels), kernels
