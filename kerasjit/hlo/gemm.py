"""A dot as a (batched, strided) GEMM: the layout in which BLAS reads each
operand in place as a matrix, where there is one.

A dot is one GemmCall per batch index when, in each operand, the free dims
merge into one matrix dim, the contracting dims into another, and one of the
two is contiguous (the other's stride is BLAS's leading dimension): Dense on
sequences, batched matmuls, attention's einsums. Other layouts keep the loop kernel.
"""
import math
from dataclasses import dataclass

from .shape import row_major_strides

@dataclass(frozen=True)
class GemmLayout:
    """C[M,N] = op(A) @ op(B) once per batch index: A [M, K] unless
    transposed ([K, M]), B [K, N] unless transposed ([N, K]); rows `lda`
    and `ldb` elements apart (0: packed); `batch` the batch levels, outermost
    first, each (extent, A step, B step, C step)."""
    m: int
    n: int
    k: int
    lhs_transposed: bool
    rhs_transposed: bool
    lda: int = 0
    ldb: int = 0
    batch: tuple = ()


def _merged(dims, strides, group):
    """(extent, stride) of `group` (dims, outermost first) read as one dim, or
    None where their strides do not nest. Unit dims are left out."""
    group = [g for g in group if dims[g] != 1]
    for outer, inner in zip(group, group[1:]):
        if strides[outer] != dims[inner] * strides[inner]:
            return None
    return math.prod(dims[g] for g in group), strides[group[-1]] if group else 0


def _matrix(free, contracting, prefer_free_major):
    """(free major, leading dimension) of an operand read as a matrix: stored
    [free, contracting] (free major: its contracting elements contiguous) or
    [contracting, free]; None if neither is contiguous. free and contracting
    are (extent, stride) of the merged dims. Where both hold (a unit dim,
    whose stride is anything), the preferred one: BLAS's usual layout."""
    (rows, row_stride), (depth, depth_stride) = free, contracting
    free_major = (max(row_stride if rows > 1 else depth, depth, 1)
                  if depth <= 1 or depth_stride == 1 else None)
    contracting_major = (max(depth_stride if depth > 1 else rows, rows, 1)
                         if rows <= 1 or row_stride == 1 else None)
    options = [(True, free_major), (False, contracting_major)]
    if not prefer_free_major:
        options.reverse()
    return next(((major, lead) for major, lead in options if lead is not None), None)


def _merged_levels(levels):
    """Batch levels with each pair that nests in all three operands (a
    [batch, heads] pair laid out together) merged into one: fewer, longer
    runs (one strided-batched cuBLAS call per index of the outer levels)."""
    merged = []
    for extent, *steps in levels:
        if merged and all(outer == extent * inner for outer, inner in zip(merged[-1][1:], steps)):
            merged[-1] = (merged[-1][0] * extent, *steps)
        else:
            merged.append((extent, *steps))
    return tuple(merged)


def gemm_layout(lhs_dims, rhs_dims, attrs, min_batched_product=0):
    """The GemmLayout of a dot of operands of these dims (attrs: its dimension
    numbers) read in place, or None (also for a batched product smaller than
    min_batched_product, M*N*K, or with a side of 1)."""
    lhs_batch, rhs_batch = attrs.get("lhs_batch_dims", []), attrs.get("rhs_batch_dims", [])
    lhs_k, rhs_k = attrs["lhs_contracting_dims"], attrs["rhs_contracting_dims"]
    if 0 in lhs_dims or 0 in rhs_dims:
        return None                 # (the loop kernel writes the zeros or nothing)
    lhs_strides, rhs_strides = row_major_strides(lhs_dims), row_major_strides(rhs_dims)
    lhs_free = [d for d in range(len(lhs_dims)) if d not in lhs_batch and d not in lhs_k]
    rhs_free = [d for d in range(len(rhs_dims)) if d not in rhs_batch and d not in rhs_k]
    m = _merged(lhs_dims, lhs_strides, lhs_free)
    n = _merged(rhs_dims, rhs_strides, rhs_free)
    for order in (list(range(len(lhs_k))), list(range(len(lhs_k)))[::-1]):
        k_lhs = _merged(lhs_dims, lhs_strides, [lhs_k[i] for i in order])
        k_rhs = _merged(rhs_dims, rhs_strides, [rhs_k[i] for i in order])
        if k_lhs and k_rhs:
            break
    if not (m and n and k_lhs and k_rhs):
        return None
    a, b = _matrix(m, k_lhs, True), _matrix(n, k_rhs, False)   # A [M, K], B [K, N]
    if a is None or b is None:
        return None
    out_dims = [lhs_dims[d] for d in lhs_batch] + [m[0], n[0]]
    out_strides = row_major_strides(out_dims)
    batch = _merged_levels([(lhs_dims[ld], lhs_strides[ld], rhs_strides[rd], out_strides[i])
                            for i, (ld, rd) in enumerate(zip(lhs_batch, rhs_batch))
                            if lhs_dims[ld] != 1])
    if batch and (m[0] * n[0] * k_lhs[0] < min_batched_product or min(m[0], n[0]) == 1):
        return None
    # GemmCall's A is [M, K] unless transposed, its B [K, N] unless transposed.
    lhs_transposed, rhs_transposed = not a[0], b[0]
    packed_a = m[0] if lhs_transposed else k_lhs[0]
    packed_b = k_lhs[0] if rhs_transposed else n[0]
    return GemmLayout(m[0], n[0], k_lhs[0], lhs_transposed, rhs_transposed,
                      lda=0 if a[1] == max(packed_a, 1) else a[1],
                      ldb=0 if b[1] == max(packed_b, 1) else b[1], batch=batch)


def dot_layout(inst, min_batched_product):
    """The GemmLayout of HLO dot `inst` if it is an f32 product BLAS reads in
    place and worth a BLAS call per batch index, else None (a loop kernel
    computes it)."""
    if inst.opcode != "dot" or any(v.shape.dtype != "f32" for v in (inst, *inst.operands)):
        return None
    lhs, rhs = inst.operands
    return gemm_layout(lhs.shape.dims, rhs.shape.dims, inst.attrs, min_batched_product)
