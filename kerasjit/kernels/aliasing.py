"""In-place updates: a variable's new value written over its old one.

A donated parameter (a variable's value the runtime will not read again)
shares its buffer with the output holding its update when safe: one loop
kernel stores the update, reading the parameter only at the element it
writes, and no later step reads it. That store moves last in its kernel, so
the other stores still read the old value. Saves a fresh array per variable
per step.
"""
from .ir import (Const, GemmCall, ImplicitGemm, Index, Load, LoopKernel, ScatterKernel, WhileLoop,
                 nested_steps, rename_buffer, walk)
from .storage import loaded, touched, writes


def _at_loop_index(node, dims):
    def same(i, d):
        return (isinstance(i, Index) and i.dim == d) or (
            dims[d] == 1 and isinstance(i, Const) and i.value == 0)
    return len(node.index) == len(dims) and all(same(i, d) for d, i in enumerate(node.index))


def _reads_only_in_place(kernel, bid):
    """Whether every load of `bid` in `kernel` is at the element the kernel writes."""
    return all(_at_loop_index(node, kernel.dims) for _, expr in kernel.stores
               for node in walk(expr) if isinstance(node, Load) and node.buffer == bid)


def alias_donated(program, donate):
    """Let outputs share donated parameters' buffers where safe.

    donate: {parameter index: output index}. Fills program.aliases
    ({output index: parameter index}) with the pairs it applied."""
    for p, o in sorted((donate or {}).items()):
        param, out = program.params[p], program.outputs[o]
        pb, ob = program.buffers[param], program.buffers[out]
        if (pb.dtype, tuple(pb.dims)) != (ob.dtype, tuple(ob.dims)) or ob.role != "output" \
                or program.outputs.count(out) != 1 or param in program.outputs:
            continue
        if write_over(program.steps, out, param):
            program.outputs[o] = param
            program.aliases[o] = p
    return program


def write_over(steps, new, old):
    """Make `steps` write buffer `new` over buffer `old` (same type and shape)
    if safe: one loop kernel writes `new`, reading `old` only at the element
    it writes, and no later step touches `old`. Returns whether it did."""
    writer = [i for i, s in enumerate(steps)
              if isinstance(s, LoopKernel) and any(b == new for b, _ in s.stores)]
    if len(writer) != 1 or any(new in writes(s) for s in steps if s is not steps[writer[0]]):
        return False
    k = writer[0]
    kernel = steps[k]
    (value,) = [e for b, e in kernel.stores if b == new]
    # Moved last, the store runs after the kernel's others: it may not read what
    # they write (an update already made in place, e.g. an optimizer's
    # accumulator that this update reads as it was).
    if kernel.reduction or any(old in touched(s) for s in steps[k + 1:]) \
            or not _reads_only_in_place(kernel, old) \
            or loaded(value) & {b for b, _ in kernel.stores if b != new}:
        return False
    kernel.stores = [(b, e) for b, e in kernel.stores if b != new] + [(new, value)]
    _rename(steps, new, old, {})    # later steps read the new value there
    return True


def update_in_place(steps, new, old):
    """Make `steps` build `new` in `old`'s memory where `new` starts as a plain
    copy of `old` (a dynamic-update-slice: the copy, then the window written)
    and no step after the copy touches `old`: the copy goes. Returns whether it did."""
    first = next((i for i, s in enumerate(steps) if new in writes(s)), None)
    if first is None or type(steps[first]) is not LoopKernel:
        return False
    copy = steps[first]
    (stored, value), *more = copy.stores
    if more or stored != new or not isinstance(value, Load) or value.buffer != old \
            or not _at_loop_index(value, copy.dims) \
            or any(old in touched(s) for s in steps[first + 1:]):
        return False
    del steps[first]
    _rename(steps, new, old, {})
    return True


def _rename(steps, old, new, memo):
    for step in steps:
        if nested_steps(step):
            for steps in nested_steps(step):
                _rename(steps, old, new, memo)
            if isinstance(step, WhileLoop):
                step.state = tuple(new if b == old else b for b in step.state)
                step.condition = new if step.condition == old else step.condition
        elif isinstance(step, (GemmCall, ImplicitGemm)):
            step.out, step.lhs, step.rhs = (new if b == old else b
                                            for b in (step.out, step.lhs, step.rhs))
            if isinstance(step, ImplicitGemm) and step.epilogue is not None:
                step.epilogue = rename_buffer(step.epilogue, old, new, memo)
        else:
            step.stores = [(new if b == old else b, rename_buffer(e, old, new, memo))
                           for b, e in step.stores]
            if isinstance(step, ScatterKernel):     # (parts of its stored value, same memo)
                step.target = tuple(rename_buffer(e, old, new, memo) for e in step.target)
                step.update = step.update and rename_buffer(step.update, old, new, memo)
                step.fits = step.fits and rename_buffer(step.fits, old, new, memo)
