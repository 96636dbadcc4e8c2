"""Stores nothing reads: a temporary whose every reader came to compute it in the
writer's own loop (an optimizer's m' both updating w and, under the step's
condition, m itself: select(apply, m', m) joins the loop that computes m') is not
written at all, and a loop left with no stores is dropped."""
from .ir import LoopKernel, kernel_exprs
from .storage import loaded, touched


def _plain(step):
    """A loop of elementwise stores (no reduction, no scatter, no compound step)."""
    return type(step) is LoopKernel and not step.reduction


def drop_unread_stores(program):
    # (a compound step or any other step counts as reading all it touches)
    read = set(program.outputs).union(*(
        set().union(*map(loaded, kernel_exprs(s))) if _plain(s) else touched(s)
        for s in program.steps))
    unread = {b.id for b in program.buffers if b.role == "temp" and b.id not in read}
    if not unread:
        return program
    for step in filter(_plain, program.steps):
        step.stores[:] = [(bid, e) for bid, e in step.stores if bid not in unread]
    program.steps = [s for s in program.steps if not (_plain(s) and not s.stores)]
    for bid in unread:
        program.buffers[bid].role = "unused"
    return program
