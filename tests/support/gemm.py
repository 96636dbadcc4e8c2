"""The GemmCall the lowering makes of a dot, from its HLO layout (hlo/gemm.py)."""
import dataclasses

from kerasjit.hlo.gemm import gemm_layout
from kerasjit.kernels.ir import GemmCall


def gemm_call(lhs_dims, rhs_dims, attrs, min_batched_product=0):
    """The GemmCall (buffers unset) of a dot of operands of these dims, or None."""
    layout = gemm_layout(lhs_dims, rhs_dims, attrs, min_batched_product)
    return layout and GemmCall("d", None, None, None, **dataclasses.asdict(layout))
