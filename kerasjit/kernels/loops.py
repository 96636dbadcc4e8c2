"""HLO while loops as WhileLoop steps, and the tuples around them.

A loop's state is a (nested) tuple; the lowering keeps tuples symbolic: a
tuple-shaped value is a nested tuple of its leaves, each an array-shaped
instruction or, once it has memory, a buffer id. Each leaf of the state gets
a buffer for the whole loop: one the body passes on unchanged (a weight, the
input sequence) is read where it already is; any other is copied in once,
and the body's last steps write its next value over it: in place where one
kernel reads each element only where it writes it (a step counter, an
accumulated sum; aliasing.write_over) or where the value is the state with
a window written (a list of per-step values: only the window is written),
else by a copy. The condition and the
body are lowered like the entry, into the same buffers.
"""
from ..errors import Unsupported
from .aliasing import update_in_place, write_over
from .ir import S64, Index, Load, LoopKernel, WhileLoop


def parts(inst, bound):
    """The elements of `inst` as far as they are known from `bound` (tuple-shaped
    instruction -> its parts) and the tuples and get-tuple-elements between:
    nested tuples of instructions or buffer ids; `inst` itself if unknown."""
    if inst in bound:
        return bound[inst]
    if inst.opcode == "tuple":
        return tuple(parts(op, bound) for op in inst.operands)
    if inst.opcode == "get-tuple-element":
        whole = parts(inst.operands[0], bound)
        if isinstance(whole, tuple):
            return whole[inst.attrs["index"]]
    return inst


def leaves(value):
    """The leaves of a nested tuple, in order."""
    if not isinstance(value, tuple):
        return [value]
    return [leaf for part in value for leaf in leaves(part)]


def rebuild(like, flat):
    """`flat`'s items nested as `like`'s leaves are."""
    items = iter(flat)

    def build(part):
        return tuple(build(p) for p in part) if isinstance(part, tuple) else next(items)
    return build(like)


def numbered(shape, start=0):
    """A nested tuple of leaf numbers with `shape`'s structure."""
    if not shape.is_tuple:
        return start
    out = []
    for s in shape.tuple_shapes:
        out.append(numbered(s, start))
        start += len(leaves(out[-1]))
    return tuple(out)


def passed_on(body):
    """Per leaf of a loop's state: whether `body` passes it on unchanged."""
    (param,) = body.parameters
    marks = numbered(param.shape)
    nexts = leaves(parts(body.root, {param: marks}))
    return [isinstance(nxt, int) and nxt == k for k, nxt in enumerate(nexts)]


def copy_kernel(buffers, src, dst):
    buf = buffers[dst]
    index = tuple(Index(S64, d) for d in range(len(buf.dims)))
    return LoopKernel(f"copy_{buf.name}", buf.dims, [(dst, Load(buf.dtype, src, index))])


def lower_while(lw, inst, lower_called):
    """Append `inst`'s WhileLoop (and the copies of its initial state) to
    lowering `lw`'s steps; its result's parts are the state buffers.
    lower_called(computation, bound) -> (steps, buffer ids of the result's leaves)."""
    condition, body = inst.attrs["condition"], inst.attrs["body"]
    structure = parts(inst.operands[0], lw.bound)
    if any(getattr(leaf, "shape", None) is not None and leaf.shape.is_tuple
           for leaf in leaves(structure)):
        raise Unsupported(f"while %{inst.name}: a state element is a tuple made by an op")
    initial = [leaf if isinstance(leaf, int) else lw.materialized(leaf)
               for leaf in leaves(structure)]
    state = []
    for leaf, bid, unchanged in zip(leaves(structure), initial, passed_on(body)):
        # A value passed on unchanged, or made only to start this loop as this
        # leaf alone (not also another leaf, which the loop may pass on), is
        # state where it is; any other is copied in (the loop overwrites it).
        if unchanged or (lw.buffers[bid].role == "temp" and initial.count(bid) == 1
                         and not isinstance(leaf, int) and _feeds_only(lw, leaf, inst)):
            state.append(bid)
            continue
        buf = lw.buffers[bid]
        state.append(lw.temp(buf.dtype, buf.dims, f"{inst.name}.state{len(state)}"))
        lw.steps.append(copy_kernel(lw.buffers, bid, state[-1]))
    bound = rebuild(structure, state)
    test, (flag,) = lower_called(condition, bound)
    steps, nexts = lower_called(body, bound)
    steps += _write_back(lw, steps, state, nexts)
    lw.steps.append(WhileLoop(f"while_{inst.name}", test, flag, steps, tuple(state)))
    return bound


def _feeds_only(lw, value, loop):
    """Whether `value` is read by `loop` alone (through the tuples of its state)."""
    users = lw.users.get(value, [])
    return bool(users) and all(u is loop or (u.opcode == "tuple" and _feeds_only(lw, u, loop))
                               for u in users)


def _write_back(lw, steps, state, nexts):
    """The steps after `steps` that leave each next value in its state buffer:
    none where the body already wrote it there (in place). A state buffer that
    is another leaf's next value (the body permutes the state) is copied aside
    first and never written in place, so it is read before it changes."""
    moved = {n for k, n in enumerate(nexts) if n in state and n != state[k]}
    after = []
    for k, nxt in enumerate(nexts):
        if nxt in moved:
            buf = lw.buffers[nxt]
            nexts[k] = lw.temp(buf.dtype, buf.dims, f"{buf.name}.moved")
            after.append(copy_kernel(lw.buffers, nxt, nexts[k]))
    for k, (old, new) in enumerate(zip(state, nexts)):
        if new == old:
            continue
        if old in moved or new in state or not (update_in_place(steps, new, old)
                                                or write_over(steps, new, old)):
            after.append(copy_kernel(lw.buffers, new, old))
            continue
        lw.buffers[new].role = "unused"                  # (its value lives in `old` now)
        nexts[k + 1:] = [old if n == new else n for n in nexts[k + 1:]]
    return after
