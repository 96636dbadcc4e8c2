"""In-place updates: a variable's new value written over its old one.

A donated parameter (a variable's value the runtime will not read again)
shares its buffer with the output holding its update when safe: one loop
kernel stores the update, reading the parameter only at the element it
writes, and no later step reads it. That store moves last in its kernel, so
the other stores still read the old value. Saves a fresh array per variable
per step.
"""
from .ir import (Const, GemmCall, ImplicitGemm, Index, Load, LoopKernel, ScatterKernel, WhileLoop,
                 nested_steps, rename_buffer, same_expr, walk)
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
    steps, renames = program.steps, {}
    writers, last_touch = _where_used(steps)
    for p, o in sorted((donate or {}).items()):
        param, out = program.params[p], program.outputs[o]
        pb, ob = program.buffers[param], program.buffers[out]
        if (pb.dtype, tuple(pb.dims)) != (ob.dtype, tuple(ob.dims)) or ob.role != "output" \
                or program.outputs.count(out) != 1 or param in program.outputs:
            continue
        if _store_over(steps, out, param, writers, last_touch, renames):
            program.outputs[o] = param
            program.aliases[o] = p
    rename_buffers(steps, renames)
    return program


def write_over(steps, new, old):
    """Make `steps` write buffer `new` over buffer `old` (same type and shape)
    if safe: one loop kernel writes `new`, reading `old` only at the element
    it writes, and no later step touches `old`. Returns whether it did."""
    renames = {}
    if not _store_over(steps, new, old, *_where_used(steps), renames):
        return False
    rename_buffers(steps, renames)
    return True


def _where_used(steps):
    """{buffer: indices of the steps writing it}, {buffer: index of the last step
    touching it}: computed once, as a program's every variable asks."""
    writers, last_touch = {}, {}
    for i, step in enumerate(steps):
        for b in writes(step):
            writers.setdefault(b, []).append(i)
        for b in touched(step):
            last_touch[b] = i
    return writers, last_touch


def _store_over(steps, new, old, writers, last_touch, renames):
    """write_over's test and its store moved last; the renaming of `new` to
    `old` is added to `renames` (applied by the caller, all in one pass; the
    test reads the kernel's stores by their names after it)."""
    (k, *others) = writers.get(new, [None])
    kernel = steps[k] if k is not None else None
    if others or not isinstance(kernel, LoopKernel):
        return False
    (value,) = [e for b, e in kernel.stores if b == new]
    # Moved last, the store runs after the kernel's others: it may not read what
    # they write (an update already made in place, e.g. an optimizer's
    # accumulator that this update reads as it was).
    stored_before = {renames.get(b, b) for b, _ in kernel.stores if b != new}
    if kernel.reduction or last_touch.get(old, -1) > k \
            or not _reads_only_in_place(kernel, old) \
            or {renames.get(b, b) for b in loaded(value)} & stored_before:
        return False
    kernel.stores = [(b, e) for b, e in kernel.stores if b != new] + [(new, value)]
    renames[new] = old      # later steps read the new value there
    return True


def update_in_place(steps, new, old):
    """Make `steps` build `new` in `old`'s memory where `new` starts as a plain
    copy of `old` (a dynamic-update-slice: the copy, then the window written)
    and `old` is not read once it would change: the copy goes. Before the
    window's kernel, steps may read `old`; that kernel may read it at the
    element it writes (a list's item read, updated and stored back: a
    recurrent layer's gradient accumulated per step); no later step may touch
    it. Returns whether it did."""
    first = next((i for i, s in enumerate(steps) if new in writes(s)), None)
    if first is None or type(steps[first]) is not LoopKernel:
        return False
    copy = steps[first]
    (stored, value), *more = copy.stores
    if more or stored != new or not isinstance(value, Load) or value.buffer != old \
            or not _at_loop_index(value, copy.dims):
        return False
    window = next((i for i in range(first + 1, len(steps)) if new in writes(steps[i])),
                  len(steps))
    for i in range(first + 1, len(steps)):
        step = steps[i]
        if old not in touched(step):
            continue
        if old in writes(step) or i > window or i == window and not (
                isinstance(step, ScatterKernel) and not step.ordered
                and _reads_only_at(step, {old, new})):
            return False
    del steps[first]
    rename_buffers(steps, {new: old})
    return True


def _reads_only_at(window, bids):
    """Whether window kernel `window` loads the buffers `bids` only at the
    element it stores (its target), and its target reads none of them."""
    def loads(exprs):
        return [n for e in exprs for n in walk(e) if isinstance(n, Load) and n.buffer in bids]
    return not loads(window.target) and all(
        same_expr(n.index, window.target) for n in loads(e for _, e in window.stores))


def rename_buffers(steps, renames):
    """Every read and write of a buffer in `renames` ({old: new}) made of its new
    name, in one pass over `steps`."""
    if renames:
        _rename(steps, renames, {})


def _rename(steps, renames, memo):
    def name(b):
        return renames.get(b, b)
    for step in steps:
        if nested_steps(step):
            for steps in nested_steps(step):
                _rename(steps, renames, memo)
            if isinstance(step, WhileLoop):
                step.state = tuple(map(name, step.state))
                step.condition = name(step.condition)
        elif isinstance(step, (GemmCall, ImplicitGemm)):
            step.out, step.lhs, step.rhs = map(name, (step.out, step.lhs, step.rhs))
            if isinstance(step, ImplicitGemm) and step.epilogue is not None:
                step.epilogue = rename_buffer(step.epilogue, renames, memo)
        else:
            step.stores = [(name(b), rename_buffer(e, renames, memo)) for b, e in step.stores]
            if isinstance(step, ScatterKernel):     # (parts of its stored value, same memo)
                step.target = tuple(rename_buffer(e, renames, memo) for e in step.target)
                step.update = step.update and rename_buffer(step.update, renames, memo)
                step.fits = step.fits and rename_buffer(step.fits, renames, memo)
