"""A dot as an implicit GEMM: the product read by strides from its operands,
as conv_implicit.py reads a convolution's, in the generated register-blocked
code instead of a GEMM call.

On the CPU that code ran the mid-size products of Dense layers and
attention's projections 2-2.5x as fast as OpenBLAS's sgemm (2560x64x64: 62
vs 153 us; reports/tuning-measurements.md), and a Dense layer's product takes
its bias and activation as the GEMM's epilogue (epilogues.py): one pass over
the output where there were three. Taken where B's rows hold the output
features contiguously (the rhs's free dims innermost, in order), for an
unbatched dot; narrow products (a side of NARROW or less) stay GEMM calls,
which the CPU's narrow GEMM kernels run as fast or faster.
"""
import math

from ..hlo.shape import row_major_strides
from .conv_implicit import merged_levels
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
    if not rhs_free or rhs_free != list(range(rhs.shape.rank - len(rhs_free), rhs.shape.rank)):
        return False            # (B's features would not be contiguous)
    s_a, s_b = row_major_strides(lhs.shape.dims), row_major_strides(rhs.shape.dims)
    s_c = row_major_strides(inst.shape.dims)        # [lhs free..., rhs free...]
    rows = merged_levels(sorted(((lhs.shape.dims[d], s_a[d], s_c[i])
                                 for i, d in enumerate(lhs_free)), key=lambda lv: -lv[2])) \
        or [(1, 0, 0)]
    depth = merged_levels(sorted(((lhs.shape.dims[dl], s_a[dl], s_b[dr])
                                  for dl, dr in zip(lhs_k, rhs_k)), key=lambda lv: -lv[2])) \
        or [(1, 0, 0)]
    n = math.prod(rhs.shape.dims[d] for d in rhs_free)
    if min(n, math.prod(e for e, _, _ in rows)) <= NARROW:
        return False
    lw.steps.append(ImplicitGemm(f"igemm_{inst.name}", lw.buffer_for(inst, role),
                                 lw.in_place(lhs), lw.in_place(rhs), n, tuple(rows[:-1]),
                                 rows[-1], tuple(depth)))
    return True
