"""ImplicitGemm steps (convolutions, lowered as for the CPU) as CUDA C.

Each thread keeps a tile of TILE_ROWS rows by TILE_FEATURES features in
registers over the whole contraction, reading operand elements where the
strides put them (a broadcast within a warp) and consecutive weights
(coalesced). No shared memory, so no barrier: the kernel runs as is in the
tests' CPU harness. An epilogue (epilogues.py) runs on each element once
stored. Rows past the end repeat the last one and are not stored.
"""
import math

from ...kernels.ir import LoopKernel
from ...kernels.storage import loaded

TILE_ROWS, TILE_FEATURES = 4, 4
TILE = TILE_ROWS * TILE_FEATURES
# A contraction this long over this few tiles (a filter gradient: few weights, each a sum
# over the batch and every position) takes a block per tile, its threads splitting the
# contraction: a thread per tile would leave most of the device idle on one long loop.
SPLIT_DEPTH, SPLIT_TILES = 2048, 1 << 15


def _tile_count(step):
    return math.ceil(step.m / TILE_ROWS) * math.ceil(step.n / TILE_FEATURES)


def split_depth(step):
    """Whether a block's threads split each tile's contraction (see SPLIT_DEPTH)."""
    return (math.prod(e for e, _, _ in step.depth) >= SPLIT_DEPTH
            and _tile_count(step) <= SPLIT_TILES)


def tiles(step, threads_per_block):
    """Threads a launch of ImplicitGemm `step` wants: one per tile, or a block per tile."""
    return _tile_count(step) * (threads_per_block if split_depth(step) else 1)


def render(program, step, name, writer_class, threads_per_block):
    """CUDA C source of ImplicitGemm `step` (needs the prelude before it)."""
    out = program.buffers[step.out]
    epilogue = LoopKernel(step.name, out.dims, [(step.out, step.epilogue)] if step.epilogue
                          else [])
    w = writer_class(program, epilogue)
    w.declare_buffers({step.out}, {step.lhs, step.rhs} | loaded(step.epilogue))
    feature_tiles = math.ceil(step.n / TILE_FEATURES)
    if split_depth(step):
        w.emit(f"__shared__ float part[{TILE}][{threads_per_block}];")
        w.block(f"for (s64 tile = blockIdx.x; tile < {_tile_count(step)}LL; tile += gridDim.x)",
                lambda: _tile(w, step, feature_tiles, epilogue, split=True))
    else:
        w.block(f"for (s64 tile = (s64)blockIdx.x * blockDim.x + threadIdx.x; "
                f"tile < {_tile_count(step)}LL; tile += (s64)blockDim.x * gridDim.x)",
                lambda: _tile(w, step, feature_tiles, epilogue))
    return w.source(name)


def _tile(w, step, feature_tiles, epilogue, split=False):
    a, c, b = f"b{step.lhs}", f"b{step.out}", f"b{step.rhs}"
    w.emit(f"const s64 r0 = tile / {feature_tiles}LL * {TILE_ROWS}LL;")
    w.emit(f"const s64 j0 = tile % {feature_tiles}LL * {TILE_FEATURES}LL;")
    w.emit(f"s64 a_row[{TILE_ROWS}], c_row[{TILE_ROWS}];")

    def row():
        w.emit(f"s64 rest = r0 + i < {step.m}LL ? r0 + i : {step.m - 1}LL;")
        w.emit("s64 at_a = 0, at_c = 0;")
        for extent, stride_a, stride_c in [step.rows, *reversed(step.outer)]:
            w.emit(f"at_a += rest % {extent}LL * {stride_a}LL; "
                   f"at_c += rest % {extent}LL * {stride_c}LL; rest /= {extent}LL;")
        w.emit("a_row[i] = at_a; c_row[i] = at_c;")
    w.block(f"for (int i = 0; i < {TILE_ROWS}; ++i)", row)
    w.emit(f"float acc[{TILE_ROWS}][{TILE_FEATURES}] = {{}};")

    def depth(level, a_terms, b_terms):
        if level == len(step.depth):
            w.emit(f"const s64 at_k = {' + '.join(a_terms) or '0'};")
            w.emit(f"const s64 at_b = {' + '.join(b_terms)} + j0;")
            w.emit(f"float weight[{TILE_FEATURES}];")
            w.emit("#pragma unroll")
            w.emit(f"for (int j = 0; j < {TILE_FEATURES}; ++j) "
                   f"weight[j] = j0 + j < {step.n}LL ? {b}[at_b + j] : 0.0f;")
            w.emit("#pragma unroll")
            w.block(f"for (int i = 0; i < {TILE_ROWS}; ++i)", lambda: (
                w.emit(f"const float x = {a}[a_row[i] + at_k];"),
                w.emit("#pragma unroll"),
                w.emit(f"for (int j = 0; j < {TILE_FEATURES}; ++j) "
                       "acc[i][j] = fmaf(x, weight[j], acc[i][j]);")))
            return
        extent, stride_a, stride_b = step.depth[level]
        k = f"k{level}"
        w.block(f"for (s64 {k} = 0; {k} < {extent}LL; ++{k})", lambda: depth(
            level + 1, a_terms + [f"{k} * {stride_a}LL"], b_terms + [f"{k} * {stride_b}LL"]))

    def split_levels():
        """This thread's terms: every blockDim.x-th of the depth levels flattened."""
        w.emit("s64 rest = term;")
        for level, (extent, _, _) in reversed(list(enumerate(step.depth))):
            w.emit(f"const s64 k{level} = rest % {extent}LL; rest /= {extent}LL;")
        depth(len(step.depth), [f"k{d} * {sa}LL" for d, (_, sa, _) in enumerate(step.depth)],
              [f"{step.b_offset}LL", *(f"k{d} * {sb}LL" for d, (_, _, sb) in
                                       enumerate(step.depth))])
    if split:
        w.block(f"for (s64 term = threadIdx.x; term < "
                f"{math.prod(e for e, _, _ in step.depth)}LL; term += blockDim.x)", split_levels)
        _combine(w)
    else:
        depth(0, [], [f"{step.b_offset}LL"])

    def store():
        w.emit(f"{c}[c_row[i] + j0 + j] = acc[i][j];")
        if epilogue.stores:       # over the element just stored, in place
            w.emit("const s64 flat = c_row[i] + j0 + j;")
            w.element(epilogue.dims)
    if split:                     # thread i * TILE_FEATURES + j stores element (i, j)
        w.block(f"if (threadIdx.x < {TILE})", lambda: (
            w.emit(f"const int i = threadIdx.x / {TILE_FEATURES}, "
                   f"j = threadIdx.x % {TILE_FEATURES};"),
            w.block(f"if (r0 + i < {step.m}LL && j0 + j < {step.n}LL)", store)))
        w.emit("__syncthreads();")    # before the next tile writes `part`
    else:
        w.block(f"for (int i = 0; i < {TILE_ROWS}; ++i) for (int j = 0; j < {TILE_FEATURES}; "
                f"++j) if (r0 + i < {step.m}LL && j0 + j < {step.n}LL)", store)


def _combine(w):
    """The block's partial tiles summed in shared memory into `acc` of its first TILE
    threads: thread i * TILE_FEATURES + j ends with the whole tile's element (i, j) at
    acc[i][j]."""
    w.emit(f"for (int q = 0; q < {TILE}; ++q) "
           f"part[q][threadIdx.x] = acc[q / {TILE_FEATURES}][q % {TILE_FEATURES}];")
    w.emit("__syncthreads();")
    w.block("for (unsigned half = blockDim.x / 2; half > 0; half >>= 1)", lambda: (
        w.block("if (threadIdx.x < half)", lambda: w.emit(
            f"for (int q = 0; q < {TILE}; ++q) part[q][threadIdx.x] += "
            "part[q][threadIdx.x + half];")),
        w.emit("__syncthreads();")))
    w.block(f"if (threadIdx.x < {TILE})", lambda: w.emit(
        f"acc[threadIdx.x / {TILE_FEATURES}][threadIdx.x % {TILE_FEATURES}] = "
        "part[threadIdx.x][0];"))
