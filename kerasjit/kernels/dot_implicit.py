"""A dot as an implicit GEMM: the product read by strides from its operands,
as conv_implicit.py reads a convolution's, in the generated register-blocked
code instead of a GEMM call.

On the CPU that code ran the mid-size products of Dense layers and
attention's projections 2-2.5x as fast as OpenBLAS's sgemm (2560x64x64: 62
vs 153 us; reports/tuning-measurements.md), and a Dense layer's product takes
its bias and activation as the GEMM's epilogue (epilogues.py): one pass over
the output where there were three. B's rows must hold the output features
contiguously (the rhs's free dims innermost, in order), or lie at a stride
with the contraction contiguous in both operands (a Dense layer's input
gradient, dY W^T: conv_implicit.reads_strided); else B is first copied with
its features innermost. For an unbatched dot;
narrow products (a side of NARROW or less) stay GEMM calls, which the CPU's
narrow GEMM kernels run as fast or faster.
"""
import math

from ..hlo.shape import row_major_strides
from .conv_implicit import merged_levels, reads_strided
from .ir import ImplicitGemm

NARROW = 16

def dot_as_implicit_gemm(lw, inst, role):
    """Lower f32 dot `inst` to an ImplicitGemm; False where not applicable."""
    a = inst.attrs
    lhs, rhs = inst.operands
    if a.get("lhs_batch_dims") or any(x.shape.dtype != "f32" for x in (inst, lhs, rhs)) \
            or 0 in inst.shape.dims or 0 in lhs.shape.dims or 0 in rhs.shape.dims:
        return False
    lhs_k, rhs_k = tuple(a["lhs_contracting_dims"]), tuple(a["rhs_contracting_dims"])
    lhs_free = [d for d in range(lhs.shape.rank) if d not in lhs_k]
    rhs_free = [d for d in range(rhs.shape.rank) if d not in rhs_k]
    if not rhs_free:
        return False
    s_a, s_c = row_major_strides(lhs.shape.dims), row_major_strides(inst.shape.dims)
    rows = merged_levels(sorted(((lhs.shape.dims[d], s_a[d], s_c[i])     # C: [lhs free...,
                                 for i, d in enumerate(lhs_free)), key=lambda lv: -lv[2])) \
        or [(1, 0, 0)]                                                   # rhs free...]
    n = math.prod(rhs.shape.dims[d] for d in rhs_free)
    if min(n, math.prod(e for e, _, _ in rows)) <= NARROW:
        return False
    b, s_b, feature_stride = lw.in_place(rhs), row_major_strides(rhs.shape.dims), 1
    depth = _depth(lhs, rhs_k, lhs_k, s_a, s_b)
    if rhs_free == list(range(len(rhs_free))) and depth[-1][1:] == (1, 1) and reads_strided(
            lw, math.prod(e for e, _, _ in rows), math.prod(e for e, _, _ in depth),
            depth[-1][0]):
        feature_stride = s_b[rhs_free[-1]]     # (dY W^T read as W lies)
    elif rhs_free != list(range(rhs.shape.rank - len(rhs_free), rhs.shape.rank)):
        b, s_b, rhs_k = _features_innermost(lw, rhs, rhs_k, rhs_free)
        depth = _depth(lhs, rhs_k, lhs_k, s_a, s_b)
    lw.steps.append(ImplicitGemm(f"igemm_{inst.name}", lw.buffer_for(inst, role),
                                 lw.in_place(lhs), b, n, tuple(rows[:-1]), rows[-1],
                                 tuple(depth), b_feature_stride=feature_stride))
    return True


def _depth(lhs, rhs_k, lhs_k, s_a, s_b):
    """The contraction's levels, outermost (largest B stride) first."""
    return merged_levels(sorted(((lhs.shape.dims[dl], s_a[dl], s_b[dr])
                                 for dl, dr in zip(lhs_k, rhs_k)), key=lambda lv: -lv[2])) \
        or [(1, 0, 0)]


def _features_innermost(lw, rhs, rhs_k, rhs_free):
    """A copy of `rhs` laid out [contracting dims..., free dims...]: its buffer,
    strides, and the contracting dims' positions in it."""
    order = list(rhs_k) + rhs_free
    dims = tuple(rhs.shape.dims[d] for d in order)
    position = {d: p for p, d in enumerate(order)}
    copy = lw.own_kernel(rhs, "features_innermost", rhs.shape.dtype, dims, lambda index: (
        lw.value_at(rhs, tuple(index[position[d]] for d in range(rhs.shape.rank)))),
        transposes=len(order) > 1 and order[-2] == rhs.shape.rank - 1)
    return copy, row_major_strides(dims), tuple(range(len(rhs_k)))
