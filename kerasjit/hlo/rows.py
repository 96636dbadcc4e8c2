"""Whether a module computes each output row from the same input row alone.

A batch's rows are samples: where every output's row i depends on row i of
the row inputs alone, a program compiled for N rows serves any number of
rows, padded up to N or N at a time (a predict step over batch sizes).

Each value gets a row state:
- `Rows(d, g)`: dim d holds the rows, g elements each (a batch of
  sequences flattened for a matmul: g positions a row); its element i
  along d depends on row i // g of the row inputs and on no other row
  (g None: on no row at all, a value the same along d, any grouping);
- `Free(u)`: it depends on no row input, and is the same along the dims in
  `u` (a weight, a broadcast scalar; an iota is not, along its dim);
- `MIXED`: rows meet (a sum over them, a slice of them, a row-shaped
  constant) or the rules cannot tell.

The rules read the module alongside the bridge's module of the same graph
for another row count: it must be the same program but for the extents that
are the row count, and an extent that is the row count is a row dim (no
constant made of the batch size, such as a mean's 1/N; no sum over it).
"""
import math
from dataclasses import dataclass

import numpy as np

from .opcodes import ELEMENTWISE


@dataclass(frozen=True)
class Rows:
    dim: int
    group: int = 1          # elements per row along `dim`; None: any

    def moved(self, dim):
        return Rows(dim, self.group)


@dataclass(frozen=True)
class Free:
    uniform: frozenset


MIXED = None


def _free(shape, uniform=()):
    """Free, uniform along `uniform` and along every dim of extent 1."""
    return Free(frozenset(uniform) | {d for d, n in enumerate(shape.dims) if n == 1})


def _join(states, shape):
    """The state of an elementwise result of operands in `states` (same shape)."""
    if any(s is MIXED for s in states):
        return MIXED
    rows = {s.dim for s in states if isinstance(s, Rows)}
    groups = {s.group for s in states if isinstance(s, Rows)} - {None}
    free = [s.uniform for s in states if isinstance(s, Free)]
    if len(rows) > 1 or len(groups) > 1:
        return MIXED
    if rows:
        (d,) = rows
        # A free operand must be the same for every row, else row i meets its position.
        return Rows(d, min(groups, default=None)) if all(d in u for u in free) else MIXED
    return _free(shape, frozenset.intersection(*free))


def _moved(state, shape, dim_map):
    """`state` through an op that moves operand dim d to output dim dim_map[d]
    (or drops it: None), otherwise elementwise."""
    if isinstance(state, Rows):
        d = dim_map.get(state.dim)
        return MIXED if d is None else state.moved(d)
    if isinstance(state, Free):
        return _free(shape, {dim_map[d] for d in state.uniform if dim_map.get(d) is not None})
    return MIXED


def _trivial(window_dim):
    w = window_dim
    return (w.size, w.stride, w.pad_lo, w.pad_hi, w.lhs_dilate, w.rhs_dilate) == (1, 1, 0, 0, 1, 1)


def _reshape(inst, state):
    """Rows survive a reshape to a dim with as many elements before it whose
    elements each lie within one row: (N, 5, 6) -> (5N, 6) is rows of 5,
    and back."""
    if isinstance(state, Free):
        return _free(inst.shape)
    if state is MIXED:
        return MIXED
    src, out = inst.operands[0].shape.dims, inst.shape.dims
    before = math.prod(src[:state.dim])
    row_span = (state.group or 1) * math.prod(src[state.dim + 1:])    # elements a row holds
    for d in range(len(out)):
        element = math.prod(out[d + 1:])
        if math.prod(out[:d]) == before and row_span % element == 0:
            return Rows(d, row_span // element)
    return MIXED


def _dot(inst, lhs, rhs):
    a = inst.attrs
    lb, lc = a.get("lhs_batch_dims", ()), a.get("lhs_contracting_dims", ())
    rb, rc = a.get("rhs_batch_dims", ()), a.get("rhs_contracting_dims", ())
    lfree = [d for d in range(inst.operands[0].shape.rank) if d not in lb and d not in lc]
    rfree = [d for d in range(inst.operands[1].shape.rank) if d not in rb and d not in rc]
    if lhs is MIXED or rhs is MIXED:
        return MIXED
    if isinstance(lhs, Rows) and isinstance(rhs, Rows):
        # Rows meet only row by row: both operands' row dims are one batch dim.
        same = lhs.dim in lb and rhs.dim in rb and lb.index(lhs.dim) == rb.index(rhs.dim)
        joined = _join([lhs.moved(0), rhs.moved(0)], None) if same else MIXED
        return joined and joined.moved(lb.index(lhs.dim))
    for rows, other, batch, other_batch, free, offset in (
            (lhs, rhs, lb, rb, lfree, len(lb)), (rhs, lhs, rb, lb, rfree, len(lb) + len(lfree))):
        if isinstance(rows, Rows):
            if rows.dim in free:
                return rows.moved(offset + free.index(rows.dim))
            if rows.dim in batch and other_batch[batch.index(rows.dim)] in other.uniform:
                return rows.moved(batch.index(rows.dim))
            return MIXED
    return _free(inst.shape)


def _convolution(inst, lhs, rhs):
    if isinstance(lhs, Free) and isinstance(rhs, Free):
        return _free(inst.shape)
    lhs_dims, _, out_dims = inst.attrs["dim_labels"].positions()
    if isinstance(lhs, Rows) and isinstance(rhs, Free) and lhs.dim == lhs_dims["b"] \
            and inst.attrs.get("batch_group_count", 1) == 1:
        return lhs.moved(out_dims["b"])
    return MIXED


def _gather(inst, operand, indices):
    a = inst.attrs
    if isinstance(operand, Free) and isinstance(indices, Free):
        return _free(inst.shape)
    if not (isinstance(operand, Free) and isinstance(indices, Rows)) \
            or a.get("operand_batching_dims") or indices.dim == a["index_vector_dim"]:
        return MIXED
    # The output's dims that are not offset dims follow the indices' other dims.
    batch_out = [d for d in range(inst.shape.rank) if d not in a["offset_dims"]]
    batch_in = [d for d in range(inst.operands[1].shape.rank) if d != a["index_vector_dim"]]
    return indices.moved(batch_out[batch_in.index(indices.dim)])


def _reduce(inst, states, window=None):
    """reduce (dims `dimensions` dropped) or reduce-window (`window` per dim)."""
    k = len(states) // 2
    inputs, inits = states[:k], states[k:]
    if any(not isinstance(s, Free) for s in inits):
        return MIXED
    shape = inst.shape.tuple_shapes[0] if inst.shape.is_tuple else inst.shape
    joined = _join(inputs, inst.operands[0].shape)
    if window is not None:
        kept = {d: d for d, w in enumerate(window) if _trivial(w)}
    else:
        dropped = inst.attrs["dimensions"]
        kept = {d: d - sum(r < d for r in dropped)
                for d in range(inst.operands[0].shape.rank) if d not in dropped}
    state = _moved(joined, shape, kept)
    return (state,) * k if inst.shape.is_tuple else state


def _rule(inst, states):
    """The row state of `inst` from its operands' states."""
    op, shape, a = inst.opcode, inst.shape, inst.attrs
    if inst.kind == ELEMENTWISE:
        # (a scalar operand of clamp is the same everywhere)
        return _join([_free(shape, range(shape.rank)) if o.shape.rank == 0 and s is not MIXED
                      else s for o, s in zip(inst.operands, states)], shape)
    if op == "constant":
        lit = np.asarray(inst.literal)
        return _free(shape, {d for d in range(lit.ndim)
                             if (lit == lit.take([0], axis=d)).all()} if lit.size else ())
    if op == "iota":
        return _free(shape, set(range(shape.rank)) - {a["iota_dimension"]})
    if op == "broadcast":
        new_dims = set(range(shape.rank)) - set(a["dimensions"])     # (the same along them)
        moved = _moved(states[0], shape, dict(enumerate(a["dimensions"])))
        return Free(moved.uniform | new_dims) if isinstance(moved, Free) else moved
    if op in ("reshape", "bitcast"):
        return _reshape(inst, states[0])
    if op == "transpose":
        return _moved(states[0], shape, {d: i for i, d in enumerate(a["dimensions"])})
    if op in ("slice", "pad", "reverse"):
        rank = shape.rank
        whole = {"slice": lambda d: a["slice"][d] == (0, inst.operands[0].shape.dims[d], 1),
                 "pad": lambda d: tuple(a["padding"][d]) == (0, 0, 0),
                 "reverse": lambda d: d not in a["dimensions"]}[op]
        if op == "pad" and not isinstance(states[1], Free):
            return MIXED
        return _moved(states[0], shape, {d: d for d in range(rank) if whole(d)})
    if op == "concatenate":
        (c,) = a["dimensions"]
        joined = _join(states, inst.operands[0].shape)
        return _moved(joined, shape, {d: d for d in range(shape.rank) if d != c})
    if op == "dot":
        return _dot(inst, *states)
    if op == "convolution":
        return _convolution(inst, *states)
    if op == "gather":
        return _gather(inst, *states)
    if op == "reduce":
        return _reduce(inst, states)
    if op == "reduce-window":
        return _reduce(inst, states, a["window"])
    if op == "tuple":
        return tuple(states)
    if op == "get-tuple-element":
        return states[0][a["index"]] if isinstance(states[0], tuple) else MIXED
    # Anything else (a loop, a scatter, a sort, random bits): rows that reach it mix.
    if all(isinstance(s, Free) for s in states):
        return tuple(_free(s) for s in shape.tuple_shapes) if shape.is_tuple else _free(shape)
    return MIXED


def _differing(shape, shape2):
    """The dims where two shapes' extents differ (per element of a tuple), or
    None where they differ otherwise."""
    if shape.is_tuple or shape2.is_tuple:
        if not (shape.is_tuple and shape2.is_tuple) \
                or len(shape.tuple_shapes) != len(shape2.tuple_shapes):
            return None
        parts = tuple(map(_differing, shape.tuple_shapes, shape2.tuple_shapes))
        return None if None in parts else parts
    if shape.dtype != shape2.dtype or shape.rank != shape2.rank:
        return None
    return frozenset(d for d, (n, n2) in enumerate(zip(shape.dims, shape2.dims)) if n != n2)


def _as_rows(state, differing):
    """`state` where the dims in `differing` have the row count as extent: a
    value the same along its one such dim is row-wise there too (each row
    depends on none); a value not row-wise along it mixes rows (a sum over
    an extent that is the row count is the row count's doing)."""
    if isinstance(differing, tuple):
        return tuple(map(_as_rows, state, differing)) if isinstance(state, tuple) \
            and len(state) == len(differing) else MIXED
    if isinstance(state, tuple):
        return MIXED
    if not differing:
        return MIXED if isinstance(state, Rows) else state
    if len(differing) > 1 or state is MIXED:
        return MIXED
    (d,) = differing
    if isinstance(state, Rows):
        return state if state.dim == d else MIXED
    return Rows(d, None) if d in state.uniform else MIXED


def _states(module, other, row_parameters):
    """{instruction: row state} over `module`'s entry, read alongside
    `other`, or None where the two are not the same program but for their
    extents."""
    if len(module.computations) != len(other.computations):
        return None
    number, number2 = _numbering(module.computations), _numbering(other.computations)
    states = {}
    for comp, comp2 in zip(module.computations, other.computations):
        if len(comp.instructions) != len(comp2.instructions) \
                or comp.instructions.index(comp.root) != comp2.instructions.index(comp2.root):
            return None
        entry = comp is module.entry
        index, index2 = _numbering(comp.instructions), _numbering(comp2.instructions)
        for inst, inst2 in zip(comp.instructions, comp2.instructions):
            differing = _differing(inst.shape, inst2.shape)
            if differing is None or not entry and differing or not _same_instruction(
                    (inst, index, number), (inst2, index2, number2)):
                return None
            if not entry:
                continue
            if inst.opcode == "parameter":
                state = Rows(0) if inst.parameter_number in row_parameters else _free(inst.shape)
            else:
                state = _rule(inst, [states[o] for o in inst.operands])
            states[inst] = _as_rows(state, differing)
    return states


def _all_rows_pass(inst, states):
    """Whether scalar `inst` is an AND of per-row (or row-free) predicates
    over all their elements (kerasjit's index checks): then the AND of its
    values over a batch's splits is its value over the batch, and padding
    with copies of real rows changes nothing. A condition of the batch as a
    whole (a user's assert on its sum) is not."""
    op, operands = inst.opcode, inst.operands
    if isinstance(states[inst], Free):
        return True
    if inst.shape.dtype != "pred":
        return False            # (an `and` of integers is bitwise)
    if op == "and":
        return all(_all_rows_pass(o, states) for o in operands)
    if op in ("reshape", "convert", "copy", "bitcast") and inst.shape.size == 1:
        return _all_rows_pass(operands[0], states)
    if op == "reduce" and len(operands) == 2 and inst.shape.size == 1:
        reducer = inst.attrs["to_apply"]
        init = operands[1]
        while init.opcode in ("convert", "reshape", "copy"):
            init = init.operands[0]
        return reducer.root.opcode == "and" and operands[0].shape.dtype == "pred" \
            and sorted(o.parameter_number for o in reducer.root.operands) == [0, 1] \
            and init.opcode == "constant" and bool(np.all(init.literal)) \
            and isinstance(states[operands[0]], (Rows, Free))
    return False


def rows_independent(module, other, row_parameters, verdict=None):
    """Whether every output of `module` has its rows along its first dim, row
    i made from row i of the parameters numbered in `row_parameters` alone
    (their first dim), where `other` is the bridge's module of the same graph
    for another row count: it must be the same program with only the row
    extents changed (no constant made of the row count, no sum over an
    extent that is the row count). Proved both ways, each module read
    alongside the other (a rule that holds at one row count but not the
    other: a slice whole at one, rows of extent 1 uniform at one). Output
    number `verdict` (an input-check verdict) must instead be an AND of
    per-row predicates."""
    root, root2 = module.entry.root, other.entry.root
    for states, root in ((_states(module, other, row_parameters), root),
                         (_states(other, module, row_parameters), root2)):
        if states is None:
            return False
        outputs = list(root.operands) if root.opcode == "tuple" else [root]
        for i, out in enumerate(outputs):
            state = states[out]
            if not (_all_rows_pass(out, states) if i == verdict else isinstance(state, Rows)
                    and state.dim == 0 and state.group in (1, None)):
                return False
    return True


def same_program(module, other, verdict=None):
    """Whether two modules compute the same outputs by the same program,
    extents and all, but output number `verdict` and what only it needs:
    traced for any batch size, a step checks its inputs' shapes too (folded
    by kerasjit's passes to `and`s of constants), so the verdicts differ.
    (The modules compared are optimized: the passes keep what they compute.)"""
    kept, kept2 = _needed(module, verdict), _needed(other, verdict)
    if len(kept) != len(kept2):
        return False
    index, index2 = _numbering(kept), _numbering(kept2)
    if _outputs(module, index, verdict) != _outputs(other, index2, verdict):
        return False
    return all(inst.shape == inst2.shape and _same_instruction((inst, index, _callee),
                                                               (inst2, index2, _callee))
               for inst, inst2 in zip(kept, kept2))


def _outputs(module, index, verdict):
    root = module.entry.root
    outputs = root.operands if root.opcode == "tuple" else [root]
    return [index(o) for i, o in enumerate(outputs) if i != verdict]


def _needed(module, verdict):
    """The entry's instructions its outputs (but `verdict`) need, in order."""
    root = module.entry.root
    outputs = root.operands if root.opcode == "tuple" else [root]
    needed, stack = set(), [o for i, o in enumerate(outputs) if i != verdict]
    while stack:
        inst = stack.pop()
        if inst not in needed:
            needed.add(inst)
            stack.extend(inst.operands)
    return [inst for inst in module.entry.instructions if inst in needed]


def _numbering(items):
    """Each of `items` (instructions, computations) by its position: how
    the two modules' operands and called computations are paired."""
    position = {id(item): k for k, item in enumerate(items)}
    return lambda item: position[id(item)]


def _callee(computation):
    """A called computation (a reducer) as its instructions' opcodes, shapes,
    operands and attributes."""
    index = _numbering(computation.instructions)
    return (index(computation.root),) + tuple((inst.opcode, inst.shape, inst.parameter_number,
                  tuple(map(index, inst.operands)),
                  None if inst.literal is None else np.asarray(inst.literal).tobytes(),
                  repr(sorted(_compared(inst, _callee).items())))
                 for inst in computation.instructions)


def _same_instruction(first, second):
    """The same instruction (each with its computation's instruction index and
    how to name a called computation) but maybe for its extents."""
    (inst, index, name), (inst2, index2, name2) = first, second
    if inst.opcode != inst2.opcode or inst.parameter_number != inst2.parameter_number \
            or list(map(index, inst.operands)) != list(map(index2, inst2.operands)):
        return False
    if inst.literal is not None and not _same_literal(inst.literal, inst2.literal):
        return False
    attrs, attrs2 = _compared(inst, name), _compared(inst2, name2)
    if inst.opcode == "slice":
        # (a dim sliced whole in both ends at its extent in each)
        attrs["slice"], attrs2["slice"] = (
            [None if (start, stride) == (0, 1) and limit == x.operands[0].shape.dims[d]
             else (start, limit, stride) for d, (start, limit, stride) in enumerate(x.attrs["slice"])]
            for x in (inst, inst2))
    return attrs == attrs2


def _same_literal(lit, lit2):
    """Equal constants, or equal but for their extent along dims where each
    is the same throughout (a mask broadcast along the rows, folded)."""
    lit, lit2 = np.asarray(lit), np.asarray(lit2)
    if lit.shape != lit2.shape and lit.ndim == lit2.ndim:
        for d in np.flatnonzero(np.not_equal(lit.shape, lit2.shape)):
            first, first2 = lit.take([0], axis=d), lit2.take([0], axis=d)
            if not ((lit == first).all() and (lit2 == first2).all()):
                return False
            lit, lit2 = first, first2
    # (bit for bit: -0.0 is not 0.0)
    return lit.dtype == lit2.dtype and lit.shape == lit2.shape and lit.tobytes() == lit2.tobytes()


def _compared(inst, name):
    """Its attributes, called computations as `name(computation)` says."""
    def value(v):
        if hasattr(v, "instructions"):
            return ("computation", name(v))
        if isinstance(v, (list, tuple)) and v and hasattr(v[0], "instructions"):
            return tuple(value(c) for c in v)
        return v
    return {k: value(v) for k, v in inst.attrs.items() if k != "metadata"}
