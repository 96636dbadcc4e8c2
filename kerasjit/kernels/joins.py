"""Multi-output fusion: a materialised value joins the loop that computes its
operands, else a recent loop of its shape, as one more store, where
everything it reads is ready before that loop (an
optimizer's m, v and w updates of one weight are one pass over memory, though
other weights' updates come between them in post-order).
"""
from ..errors import Unsupported
from .fusion import roots_a_kernel
from .ir import Load, LoopKernel, walk
from .storage import writes

# How many steps back a value looks for a loop to join. Each try builds its
# expression again, and a join further back keeps a temporary alive longer;
# the case that matters (a weight's update a few steps after its m and v) is near.
LOOKBACK = 8


class NotInKernel(Exception):
    """The value cannot be computed in this kernel (a value of the kernel is
    needed at another index, or a buffer is written only at or after it)."""


def join_recent_loop(lw, inst, role):
    """Whether `inst` joined a loop of lowering `lw` as one more store: the
    loop that computes one of its operands (an optimizer's update of m and v
    applied under a condition, select(apply, m', m), with m' computed where w
    is), else one of the last LOOKBACK (the latest one valid)."""
    if roots_a_kernel(inst):    # (a reduction keeps its kernel: its rows run along memory)
        return False
    recent = range(len(lw.steps) - 1, max(len(lw.steps) - LOOKBACK, 0) - 1, -1)
    for pos in dict.fromkeys([*_producers(lw, inst), *recent]):
        kernel = lw.steps[pos]
        if isinstance(kernel, LoopKernel) and kernel.dims == inst.shape.dims \
                and not kernel.reduction:
            value = _value_in(lw, inst, pos)
            if value is not None:
                bid = lw.buffer_for(inst, role)
                kernel.stores.append((bid, value))
                kernel.fused.append(inst.name)
                latest = _latest_stores(lw)
                latest[bid] = max(latest.get(bid, pos), pos)
                return True
    return False


def _producers(lw, inst):
    """Positions in lw.steps of the latest loops that store one of `inst`'s
    operands, latest first."""
    latest = _latest_stores(lw)
    return sorted({latest[b] for b in (lw.buffer_of.get(op) for op in inst.operands)
                   if b in latest}, reverse=True)


def _latest_stores(lw):
    """{buffer: position of the latest loop in lw.steps that stores it}, kept
    up to date as steps are appended (lowering only appends them), so that a
    value's producers cost its operands, not a walk back over every step
    (DenseNet121's lowering walked millions)."""
    seen, latest = lw.latest_stores
    for pos in range(seen, len(lw.steps)):
        if isinstance(lw.steps[pos], LoopKernel):
            latest.update((bid, pos) for bid, _ in lw.steps[pos].stores)
    lw.latest_stores = (len(lw.steps), latest)
    return latest


def _value_in(lw, inst, pos):
    """`inst` as an Expr of LoopKernel lw.steps[pos], or None if not valid there.

    Valid when it reads only buffers written before that kernel, and the
    kernel's own values only at its loop index. Appending a store changes
    nothing the kernel or the steps after it read."""
    kernel, steps = lw.steps[pos], len(lw.steps)
    # Kernels built elsewhere (convolution layouts, copies) have no values to share.
    index, values = lw.kernel_state.setdefault(
        id(kernel), (lw.loop_index_of(len(kernel.dims)), {}))
    unready = set().union(*map(writes, lw.steps[pos:]))
    try:
        value = lw.expr_in(inst, index, values, unready, pos)
    except (NotInKernel, Unsupported):   # (e.g. a loop's result, which only a load reads)
        return None
    if len(lw.steps) != steps:  # it materialised something, which runs after the kernel
        return None
    if any(isinstance(n, Load) and n.buffer in unready for n in walk(value)):
        return None
    values[inst] = value
    return value
