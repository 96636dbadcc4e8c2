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


def tiles(step):
    """Threads a launch of ImplicitGemm `step` wants: one per tile."""
    return math.ceil(step.m / TILE_ROWS) * math.ceil(step.n / TILE_FEATURES)


def render(program, step, name, writer_class):
    """CUDA C source of ImplicitGemm `step` (needs the prelude before it)."""
    out = program.buffers[step.out]
    epilogue = LoopKernel(step.name, out.dims, [(step.out, step.epilogue)] if step.epilogue
                          else [])
    w = writer_class(program, epilogue)
    w.declare_buffers({step.out}, {step.lhs, step.rhs} | loaded(step.epilogue))
    feature_tiles = math.ceil(step.n / TILE_FEATURES)
    w.block(f"for (s64 tile = (s64)blockIdx.x * blockDim.x + threadIdx.x; tile < {tiles(step)}LL; "
            f"tile += (s64)blockDim.x * gridDim.x)",
            lambda: _tile(w, step, feature_tiles, epilogue))
    return w.source(name)


def _tile(w, step, feature_tiles, epilogue):
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
    depth(0, [], [f"{step.b_offset}LL"])

    def store():
        w.emit(f"{c}[c_row[i] + j0 + j] = acc[i][j];")
        if epilogue.stores:       # over the element just stored, in place
            w.emit("const s64 flat = c_row[i] + j0 + j;")
            w.element(epilogue.dims)
    w.block(f"for (int i = 0; i < {TILE_ROWS}; ++i) for (int j = 0; j < {TILE_FEATURES}; ++j) "
            f"if (r0 + i < {step.m}LL && j0 + j < {step.n}LL)", store)
