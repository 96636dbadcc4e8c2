"""Kernel IR: loop nests of per-element expressions, backend-neutral.

A LoopKernel iterates over an output shape; each of its outputs stores one
expression per index. Expressions are small immutable DAG nodes: loads from
buffers at computed indices, constants, elementwise HLO opcodes (the same
names and semantics as the evaluator's), and reductions that loop over extra
variables. Index arithmetic is ordinary s64 expressions, so broadcast,
transpose, reshape, slice, pad and concatenate are just indexing. Renderers
(LLVM for CPU, CUDA C for GPU) turn the same kernels into code.
"""
import itertools
import math
from dataclasses import dataclass, field, fields, replace
from typing import NamedTuple

from ..hlo.shape import DTYPES

S64 = "s64"


@dataclass(frozen=True, eq=False)
class Expr:
    dtype: str


@dataclass(frozen=True, eq=False)
class Index(Expr):
    """The kernel's loop variable for output dimension `dim`."""
    dim: int


@dataclass(frozen=True, eq=False)
class ChunkIndex(Expr):
    """The iteration of the enclosing ChunkLoop (0 outside one)."""


@dataclass(frozen=True, eq=False)
class ReduceVar(Expr):
    """The loop variable of reduction dimension `dim` of Reduce `owner`."""
    owner: int
    dim: int


@dataclass(frozen=True, eq=False)
class Const(Expr):
    value: object


@dataclass(frozen=True, eq=False)
class Load(Expr):
    buffer: int
    index: tuple          # one s64 Expr per dimension of the buffer


@dataclass(frozen=True, eq=False)
class Op(Expr):
    """Elementwise HLO opcode applied to `args`; `attr` is compare's direction."""
    opcode: str
    args: tuple
    attr: str = None


@dataclass(frozen=True, eq=False)
class Var(Expr):
    """A scalar bound by a Reduce while its combiner runs."""
    name: str


@dataclass(frozen=True, eq=False)
class Reduce(Expr):
    """Fold `bodies` over the box `extents`, then yield accumulator `result`.

    Accumulators start at `inits`; each step binds `accs` to the accumulators
    and `curs` to the bodies' values and computes `combined` (one Expr per
    accumulator over those Vars). Nodes sharing `key` are one loop with
    several results (variadic reduce). Bodies may use ReduceVar(key, d).
    """
    key: int
    extents: tuple
    accs: tuple
    curs: tuple
    combined: tuple
    inits: tuple
    bodies: tuple
    result: int = 0


@dataclass
class Buffer:
    id: int
    dtype: str
    dims: tuple
    role: str             # "param", "output", "temp", "constant", or "unused" (no step
    #                       touches it: a convolution's output its epilogue replaced)
    data: object = None   # ndarray for constants
    name: str = ""

    @property
    def nbytes(self):
        return int(DTYPES[self.dtype].itemsize * math.prod(self.dims))


@dataclass
class LoopKernel:
    name: str
    dims: tuple           # iteration space
    stores: list          # [(buffer id, Expr)] all indexed by the loop index
    fused: list = field(default_factory=list)   # HLO instruction names it computes
    reduction: bool = False   # computes a reduction-like value (kept alone)
    # A copy whose source's innermost dim is not its own (a transposed copy):
    # its two innermost dims run in square tiles, so both sides stay in cache.
    transposes: bool = False


@dataclass
class ScatterKernel(LoopKernel):
    """A loop over a scatter's updates, each stored at its own `target` (index
    Exprs into the one stored buffer, which already holds the operand), in
    order: later updates of an element combine with earlier ones, so it runs
    on one thread. Where the combiner is an add (`adds`: an embedding's
    gradient), `update` where `fits` (None: always) may instead be added
    atomically, in any order. Also a window's store (`ordered` False): a
    dynamic-update-slice's update, a concatenate's operand, each element
    landing in a place of its own, so in any order, on any threads."""
    target: tuple = ()
    update: object = None
    fits: object = None
    adds: bool = False
    ordered: bool = True


@dataclass
class MultiOutputReduction(LoopKernel):
    """A lone row reduction (collapse.rows_can_accumulate) that also stores
    terms it folds: each of `term_stores`, (buffer id, index Exprs, value
    Expr) over the loop index and the reduction's vars, is stored at every
    term, the value shared with the reduction's body (multi_output.py)."""
    term_stores: tuple = ()


@dataclass
class GemmCall:
    """C[M,N] (+)= op(A) @ op(B), f32, once per batch index (hlo/gemm.py).

    C is row-major and packed; A and B are row-major matrices whose rows lie
    `lda` and `ldb` elements apart (0: packed). `batch` holds the batch
    levels, outermost first, each (extent, A step, B step, C step): the
    elements each operand moves on by from one index of that level to the next."""
    name: str
    out: int
    lhs: int
    rhs: int
    m: int
    n: int
    k: int
    lhs_transposed: bool  # lhs stored [K, M] rather than [M, K]
    rhs_transposed: bool  # rhs stored [N, K] rather than [K, N]
    out_rows_per_chunk: int = 0   # inside a ChunkLoop: C starts at row chunk * this
    rhs_rows_per_chunk: int = 0   # inside a ChunkLoop: B starts at row chunk * this
    accumulate: bool = False      # chunks after the first add into C (beta = 1)
    lda: int = 0
    ldb: int = 0
    batch: tuple = ()

    @property
    def count(self):
        """Products per call (batch indices)."""
        return math.prod(level[0] for level in self.batch)

    def batch_offsets(self, levels=None):
        """(A, B, C) element offsets of each product, in order: of every index
        of `levels` (by default all the batch levels)."""
        levels = self.batch if levels is None else levels
        for index in itertools.product(*(range(level[0]) for level in levels)):
            yield tuple(sum(i * level[1 + operand] for i, level in zip(index, levels))
                        for operand in range(3))

    def column_major(self):
        """The product as a column-major BLAS (Fortran BLAS, cuBLAS) computes it on
        row-major data, C^T = op(B)^T op(A)^T: (transpose first, transpose second,
        m, n, k, ld first, ld second, ld out) in sgemm's argument order, where the
        first operand is B (rhs) and the second A (lhs)."""
        lead = (self.ldb or (self.k if self.rhs_transposed else self.n),
                self.lda or (self.m if self.lhs_transposed else self.k), self.n)
        # BLAS wants every leading dimension >= 1, also for an empty operand.
        return (self.rhs_transposed, self.lhs_transposed, self.n, self.m, self.k,
                *(max(1, d) for d in lead))

    def chunk_strides(self):
        """Elements (C, B) move on by from one chunk of a ChunkLoop to the next."""
        return self.out_rows_per_chunk * self.n, self.rhs_rows_per_chunk * self.n

    def beta(self, chunk):
        """0 where C is overwritten, 1 where this chunk adds into it."""
        return 1.0 if self.accumulate and chunk > 0 else 0.0


@dataclass
class ImplicitGemm:
    """C[row, j] = sum over k of A[a(row, k)] * B[b(k) + j * b_feature_stride], j < n, f32: a
    convolution or its filter gradient read straight from its operands,
    without the patch matrix of conv_gemm.py (a backend that has this step).

    Rows run over the `outer` levels and, innermost, the `rows` level: each a
    (extent, stride in A, stride in C). The contraction runs over the `depth`
    levels, outermost first: each (extent, stride in A, stride in B). So
    a(row, k) = sum of index * A-stride over the row's and k's levels, and a
    row of C starts at the sum of index * C-stride. A row of C holds n
    contiguous features; B's features lie `b_feature_stride` apart (1, or B
    transposed: an input gradient's weights read as they lie, the innermost
    contraction level then contiguous in A and B). `b_offset` is where B
    starts (a reversed window walks the weights backwards). `epilogue`, if
    set, is the value finally stored at each element of C: an expression of
    the loop index over C's dims reading C itself only at that index (a bias
    add and activation, run on each block of rows while it is in cache;
    epilogues.py). `parts` > 1: the outermost contraction level is cut into
    that many equal runs, run p summed into copy p of C, p * `part_stride`
    elements on (a step after adds the copies up: split_reductions.py), so
    that threads given different runs each stream only their run of the
    operands."""
    name: str
    out: int
    lhs: int              # A
    rhs: int              # B
    n: int
    outer: tuple
    rows: tuple
    depth: tuple
    b_offset: int = 0
    epilogue: Expr = None
    b_feature_stride: int = 1
    parts: int = 1
    part_stride: int = 0

    @property
    def m(self):
        return math.prod(e for e, _, _ in self.outer) * self.rows[0]

    @property
    def k(self):
        return math.prod(e for e, _, _ in self.depth)


@dataclass
class ChunkLoop:
    """Run `steps` `count` times; they see the iteration as ChunkIndex.

    Bounds temporaries: a convolution's patch matrix is built and multiplied
    a slice of the batch at a time instead of all at once."""
    count: int
    steps: list


@dataclass
class WhileLoop:
    """An HLO while: run `test`, then, while its pred scalar `condition` is
    true, `body` and `test` again.

    The loop-carried values live in the `state` buffers: the body reads them,
    and its last steps write their next values over them (in place where a
    single kernel reads each element only where it writes it)."""
    name: str
    test: list
    condition: int
    body: list
    state: tuple = ()


def nested_steps(step):
    """The step lists a compound step runs (a ChunkLoop's, a WhileLoop's test
    and body), else ()."""
    if isinstance(step, ChunkLoop):
        return (step.steps,)
    if isinstance(step, WhileLoop):
        return (step.test, step.body)
    return ()


class FusionDecision(NamedTuple):
    """Whether HLO value `producer` is inlined into `consumer` ("fused"), or why not."""
    producer: str
    consumer: str
    reason: str


@dataclass
class KernelProgram:
    """What a backend compiles: buffers and the steps that fill them, in order."""
    buffers: list
    steps: list           # LoopKernel | GemmCall | ImplicitGemm | ChunkLoop | WhileLoop
    params: list          # buffer id per entry parameter
    outputs: list         # buffer id per flat output
    decisions: list = field(default_factory=list)  # FusionDecision per HLO edge
    storage: dict = field(default_factory=dict)    # temp buffer id -> memory slot
    slot_bytes: list = field(default_factory=list)  # size of each memory slot
    aliases: dict = field(default_factory=dict)     # output index -> parameter index whose
    #                                                 buffer it is written over (aliasing.py)


def replace_steps(steps, change):
    """Each step of `steps`, compound steps' own first, replaced in place by
    change(step) (a kernel pass over every kernel of a program)."""
    for i, step in enumerate(steps):
        for inside in nested_steps(step):
            replace_steps(inside, change)
        steps[i] = change(step)


def leaf_steps(steps):
    """The LoopKernels and GemmCalls of `steps` in program order, those of
    compound steps included (once each, not per iteration)."""
    for step in steps:
        inner = nested_steps(step)
        if not inner:
            yield step
        for steps_inside in inner:
            yield from leaf_steps(steps_inside)


def kernel_exprs(kernel):
    """Every expression a loop kernel evaluates: its stored values and, for a
    scatter, where each lands and the update; a multi-output reduction's
    term stores, where and what."""
    exprs = [expr for _, expr in kernel.stores]
    if isinstance(kernel, MultiOutputReduction):
        exprs += [e for _, index, value in kernel.term_stores for e in (*index, value)]
    if isinstance(kernel, ScatterKernel):
        exprs += [e for e in (*kernel.target, kernel.update, kernel.fits) if e is not None]
    return exprs


def same_expr(a, b):
    """Whether two expressions compute the same value by the same steps (equal
    structure; expressions compare by identity): short ones, as indices are."""
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same_expr(x, y) for x, y in zip(a, b))
    if not isinstance(a, Expr) or not isinstance(b, Expr):
        return a == b
    return a is b or type(a) is type(b) and all(
        same_expr(getattr(a, f.name), getattr(b, f.name)) for f in fields(a))


def walk(expr, into_reductions=True):
    """Every node of an expression DAG once, operands before users. Without
    `into_reductions`, a Reduce's bodies (which run inside its loop) are skipped."""
    seen, order, stack = set(), [], [(expr, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        kids = children(node) if into_reductions or not isinstance(node, Reduce) else node.inits
        stack.extend((c, False) for c in kids)
    return order


def children(node):
    if isinstance(node, Load):
        return node.index
    if isinstance(node, Op):
        return node.args
    if isinstance(node, Reduce):
        return node.inits + node.bodies
    return ()


def map_nodes(expr, kind, change, memo):
    """`expr` with every node of type `kind` (its children mapped first)
    replaced by change(node); untouched subtrees are shared, and `memo`
    (id -> node) keeps a DAG a DAG across calls with the same `change`."""
    if id(expr) in memo:
        return memo[id(expr)]
    changes = {}
    for f in fields(expr):
        value = getattr(expr, f.name)
        if isinstance(value, Expr):
            mapped = map_nodes(value, kind, change, memo)
        elif isinstance(value, tuple) and any(isinstance(v, Expr) for v in value):
            mapped = tuple(map_nodes(v, kind, change, memo) for v in value)
            if all(a is b for a, b in zip(mapped, value)):
                mapped = value
        else:
            continue
        if mapped is not value:
            changes[f.name] = mapped
    node = replace(expr, **changes) if changes else expr
    memo[id(expr)] = change(node) if isinstance(node, kind) else node
    return memo[id(expr)]


def rename_buffer(expr, renames, memo):
    """`expr` with its loads of each buffer in `renames` ({old: new}) reading the new one."""
    return map_nodes(expr, Load, lambda load: replace(load, buffer=renames[load.buffer])
                     if load.buffer in renames else load, memo)
