"""Buffer assignment: temporaries whose lifetimes do not overlap share memory.

Steps run in order; a temporary is live from the step that first writes it
to the last step that reads it (a ChunkLoop or WhileLoop counts as one step,
so what its iterations use stays live across all of them). Greedy first-fit over the
temporaries in order of first write, reusing a freed slot before opening a
new one; a reused slot grows to its largest tenant.
"""
from .ir import (GemmCall, ImplicitGemm, Load, MultiOutputReduction, WhileLoop, kernel_exprs,
                 nested_steps, walk)


def _inside(step, each):
    return set().union(*(each(s) for steps in nested_steps(step) for s in steps))


def writes(step):
    """Buffer ids a step writes."""
    if nested_steps(step):
        return _inside(step, writes)
    if isinstance(step, (GemmCall, ImplicitGemm)):
        return {step.out}
    terms = {bid for bid, _, _ in step.term_stores} if isinstance(step, MultiOutputReduction) \
        else set()
    return {bid for bid, _ in step.stores} | terms


def touched(step):
    """Buffer ids a step reads or writes."""
    if isinstance(step, WhileLoop):
        return _inside(step, touched) | set(step.state) | {step.condition}
    if nested_steps(step):
        return _inside(step, touched)
    if isinstance(step, GemmCall):
        return {step.lhs, step.rhs, step.out}
    if isinstance(step, ImplicitGemm):
        return {step.lhs, step.rhs, step.out} | loaded(step.epilogue)
    return writes(step) | set().union(*map(loaded, kernel_exprs(step)))


def loaded(expr):
    """Buffer ids an expression (or None) loads from."""
    return set() if expr is None else {n.buffer for n in walk(expr) if isinstance(n, Load)}


def assign_storage(program):
    """Fill program.storage (temp buffer id -> slot) and program.slot_bytes."""
    temps = {b.id: b for b in program.buffers if b.role == "temp"}
    first, last = {}, {}
    for i, step in enumerate(program.steps):
        for bid in touched(step) & temps.keys():
            first.setdefault(bid, i)
            last[bid] = i
    slot_bytes, free_after, storage = [], [], {}   # free_after[slot]: last step using it
    for bid in sorted(first, key=first.get):
        need = temps[bid].nbytes
        reusable = [s for s, end in enumerate(free_after) if end < first[bid]]
        # Prefer the smallest slot that already fits, else grow the largest free one.
        fits = [s for s in reusable if slot_bytes[s] >= need]
        slot = min(fits, key=slot_bytes.__getitem__) if fits else (
            max(reusable, key=slot_bytes.__getitem__) if reusable else None)
        if slot is None:
            slot = len(slot_bytes)
            slot_bytes.append(0)
            free_after.append(0)
        slot_bytes[slot] = max(slot_bytes[slot], need)
        free_after[slot] = last[bid]
        storage[bid] = slot
    program.storage, program.slot_bytes = storage, slot_bytes
    return program
