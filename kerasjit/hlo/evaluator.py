"""Reference evaluator: runs an HLO module with numpy, following XLA's
operation semantics. Clarity over speed; it is the oracle that compiled code is
checked against.

`evaluate(module, args)` runs the entry computation; `evaluate_computation`
runs any computation (called ones: reduce's `to_apply`, sort's comparator...).
Arrays are numpy arrays of the HLO element type; tuples are Python tuples.
This module holds the structured opcodes; the elementwise ones are their
records' references (opcodes.py, elementwise.py), rng-bit-generator is rng.py.

Called scalar computations made only of elementwise ops are "lifted": they run
once on whole arrays instead of once per element (reduce, reduce-window,
select-and-scatter, sort); a single recognised binary op becomes a numpy ufunc.
"""
import functools

import numpy as np

from .elementwise import out_dtype
from .ir import WindowDim
from .opcodes import CONTROL, ELEMENTWISE, OPCODES, STRUCTURAL
from .rng import rng_bit_generator
from .shape import DTYPES


def evaluate(module, args):
    """Run the entry computation on `args` (arrays, in parameter order)."""
    return evaluate_computation(module.entry, args)


def evaluate_computation(comp, args):
    """Run `comp` on `args`; elementwise-only computations also accept arrays
    where their parameters are scalars (see _apply)."""
    values = {}
    with np.errstate(all="ignore"):
        for inst in comp.post_order():
            if inst.opcode == "parameter":
                values[inst] = _argument(inst, args[inst.parameter_number])
            else:
                values[inst] = _run(inst, [values[op] for op in inst.operands])
    return values[comp.root]


def _argument(inst, arg):
    return arg if inst.shape.is_tuple else np.asarray(arg, dtype=inst.shape.numpy_dtype)


def _run(inst, operands):
    try:
        impl = _OPS[inst.opcode]
    except KeyError:
        raise NotImplementedError(f"evaluator: opcode '{inst.opcode}'") from None
    result = impl(inst, *operands)
    if inst.shape.is_tuple:
        return tuple(result)
    result = np.asarray(result, dtype=inst.shape.numpy_dtype)
    # Lifted scalar computations run elementwise ops on arrays: no shape check.
    if inst.kind not in (ELEMENTWISE, STRUCTURAL, CONTROL) and result.shape != inst.shape.dims:
        raise AssertionError(f"evaluator: {inst.opcode} %{inst.name} produced shape "
                             f"{result.shape}, expected {inst.shape}")
    return result


# ------------------------------------------------------------ data movement

def _broadcast(inst, x):
    dims = inst.attrs.get("dimensions", ())
    order = np.argsort(dims)
    x = np.transpose(x, order)
    shape = [1] * inst.shape.rank
    for i in order:
        shape[dims[i]] = inst.shape.dims[dims[i]]
    return np.broadcast_to(x.reshape(shape), inst.shape.dims)


def _iota(inst):
    dim = inst.attrs["iota_dimension"]
    shape = [1] * inst.shape.rank
    shape[dim] = inst.shape.dims[dim]
    return np.broadcast_to(np.arange(inst.shape.dims[dim]).reshape(shape), inst.shape.dims)


def _reshape(inst, x):
    return x.reshape(inst.shape.dims)


def _bitcast(inst, x):
    if x.dtype != out_dtype(inst):
        raise NotImplementedError("evaluator: bitcast that changes the element type")
    return x.reshape(inst.shape.dims)


def _slice(inst, x):
    return x[tuple(slice(s, e, st) for s, e, st in inst.attrs["slice"])]


def _pad_array(x, value, padding):
    """Pad with (lo, hi, interior) per dim; negative lo/hi crop."""
    sizes = [max(n + (n - 1) * i, 0) + max(lo, 0) + max(hi, 0)
             for n, (lo, hi, i) in zip(x.shape, padding)]
    out = np.full(sizes, value, dtype=x.dtype)
    out[tuple(slice(max(lo, 0), max(lo, 0) + max(n + (n - 1) * i, 0), i + 1)
              for n, (lo, hi, i) in zip(x.shape, padding))] = x
    return out[tuple(slice(max(-lo, 0), size - max(-hi, 0))
                     for size, (lo, hi, _) in zip(sizes, padding))]


def _pad(inst, x, value):
    return _pad_array(x, value, inst.attrs["padding"])


def _concatenate(inst, *xs):
    return np.concatenate(xs, axis=inst.attrs["dimensions"][0])


def _reverse(inst, x):
    return np.flip(x, axis=inst.attrs["dimensions"])


def _clamped_starts(starts, shape, sizes):
    return [int(np.clip(s, 0, n - k)) for s, n, k in zip(starts, shape, sizes)]


def _dynamic_slice(inst, x, *starts):
    sizes = inst.attrs["dynamic_slice_sizes"]
    starts = _clamped_starts(starts, x.shape, sizes)
    return x[tuple(slice(s, s + k) for s, k in zip(starts, sizes))]


def _dynamic_update_slice(inst, x, update, *starts):
    starts = _clamped_starts(starts, x.shape, update.shape)
    out = x.copy()
    out[tuple(slice(s, s + k) for s, k in zip(starts, update.shape))] = update
    return out


def _transpose(inst, x):
    return np.transpose(x, inst.attrs["dimensions"])


# ------------------------------------------------------ called computations

_REDUCERS = {"add": np.add, "multiply": np.multiply, "maximum": np.maximum,
             "minimum": np.minimum, "and": np.bitwise_and, "or": np.bitwise_or,
             "xor": np.bitwise_xor}


def _as_ufunc(comp):
    """The ufunc when `comp` is one recognised binary op of its two parameters."""
    root = comp.root
    params = set(comp.parameters)
    if (root.opcode in _REDUCERS and len(params) == 2 and len(comp.instructions) == 3
            and set(root.operands) == params):
        return _REDUCERS[root.opcode]
    return None


def _liftable(comp):
    """Only elementwise ops: it may run on arrays instead of scalars."""
    return all(i.kind == ELEMENTWISE or i.opcode in ("parameter", "constant", "tuple",
                                                     "get-tuple-element")
               for i in comp.instructions)


def _apply(comp, args):
    """`comp` applied elementwise over (broadcast) arrays `args`: a tuple of arrays."""
    shape = np.broadcast_shapes(*(np.shape(a) for a in args))
    if _liftable(comp):
        out = evaluate_computation(comp, args)
        return tuple(np.broadcast_to(o, shape) for o in (out if isinstance(out, tuple)
                                                         else (out,)))
    root = comp.root.shape
    outs = [np.empty(shape, s.numpy_dtype) for s in (root.tuple_shapes or (root,))]
    args = [np.broadcast_to(a, shape) for a in args]
    for i in np.ndindex(shape):
        out = evaluate_computation(comp, [a[i] for a in args])
        for o, v in zip(outs, out if isinstance(out, tuple) else (out,)):
            o[i] = v
    return tuple(outs)


def _fold(comp, inits, xs, mask=None):
    """Reduce the last axis of each `xs` with `comp`, starting from `inits`,
    in index order, as comp(element, accumulator) (kernels/expressions.py's
    _reduce); elements where `mask` is False are skipped."""
    lead = xs[0].shape[:-1]
    ufunc = _as_ufunc(comp) if len(xs) == 1 else None
    if ufunc is not None:
        x = xs[0]
        where = True if mask is None else mask
        return (ufunc.reduce(x, axis=-1, initial=inits[0][()], where=where, dtype=x.dtype),)
    accs = [np.broadcast_to(np.asarray(i), lead) for i in inits]
    for k in range(xs[0].shape[-1]):
        new = _apply(comp, [x[..., k] for x in xs] + accs)
        keep = True if mask is None else mask[..., k]
        accs = [np.where(keep, n, a).astype(a.dtype) for n, a in zip(new, accs)]
    return tuple(accs)


def _reduce(inst, *operands):
    n = len(operands) // 2
    xs, inits = operands[:n], operands[n:]
    dims = inst.attrs["dimensions"]
    kept = [d for d in range(xs[0].ndim) if d not in dims]
    lead = tuple(xs[0].shape[d] for d in kept)
    size = int(np.prod([xs[0].shape[d] for d in dims], dtype=np.int64))
    flat = [np.transpose(x, kept + list(dims)).reshape(lead + (size,)) for x in xs]
    out = _fold(inst.attrs["to_apply"], inits, flat)
    return out if n > 1 else out[0]


def _windows(x, window, pad_value):
    """Windows of `x` as an array [out dims..., window dims...] and a matching
    validity mask (False on padding and base-dilation holes)."""
    padding = [(w.pad_lo, w.pad_hi, w.lhs_dilate - 1) for w in window]
    padded = _pad_array(x, pad_value, padding)
    valid = _pad_array(np.ones(x.shape, dtype=bool), False, padding)
    extents = [(w.size - 1) * w.rhs_dilate + 1 for w in window]
    if any(e > n for e, n in zip(extents, padded.shape)):   # no complete window
        out = [0 if e > n else (n - e) // w.stride + 1
               for e, n, w in zip(extents, padded.shape, window)]
        empty = np.zeros(out + [w.size for w in window], dtype=x.dtype)
        return empty, empty.astype(bool)
    pick = tuple(slice(None, None, w.stride) for w in window) + tuple(
        slice(None, None, w.rhs_dilate) for w in window)

    def view(a):
        return np.lib.stride_tricks.sliding_window_view(a, extents)[pick]
    return view(padded), view(valid)


def _window_size(window):
    return int(np.prod([w.size for w in window], dtype=np.int64))


def _reduce_window(inst, *operands):
    n = len(operands) // 2
    xs, inits = operands[:n], operands[n:]
    window = inst.attrs["window"]
    wins = [_windows(x, window, i) for x, i in zip(xs, inits)]
    out_shape = wins[0][0].shape[:len(window)] + (_window_size(window),)
    flat = [w.reshape(out_shape) for w, _ in wins]
    mask = wins[0][1].reshape(out_shape)
    out = _fold(inst.attrs["to_apply"], inits, flat, mask)
    return out if n > 1 else out[0]


def _select_and_scatter(inst, operand, source, init):
    window = inst.attrs["window"]
    positions = np.arange(operand.size).reshape(operand.shape)
    values, valid = _windows(operand, window, 0)
    where, _ = _windows(positions, window, -1)
    out_shape = values.shape[:len(window)] + (_window_size(window),)
    values, valid, where = (a.reshape(out_shape) for a in (values, valid, where))
    # Walk each window in order; keep the current pick while select(pick, x) holds.
    best_v, best_i, have = values[..., 0], where[..., 0], valid[..., 0]
    for k in range(1, values.shape[-1]):
        keep = _apply(inst.attrs["select"], [best_v, values[..., k]])[0]
        take = valid[..., k] & (~have | ~keep)
        best_v = np.where(take, values[..., k], best_v)
        best_i = np.where(take, where[..., k], best_i)
        have = have | valid[..., k]
    out = np.full(operand.size, init, dtype=operand.dtype)
    _scatter_into([out], best_i[have], [source[have]], inst.attrs["scatter"])
    return out.reshape(operand.shape)


def _scatter_into(outs, flat_index, updates, comp):
    """outs[i][flat_index[j]] = comp(outs[i][...], updates[i][j]), j in order."""
    ufunc = _as_ufunc(comp) if len(outs) == 1 else None
    root = comp.root
    if ufunc is not None:
        ufunc.at(outs[0], flat_index, updates[0])
    elif root.opcode == "parameter" and root.parameter_number == 1 and len(outs) == 1:
        for j, i in enumerate(flat_index):      # plain overwrite, last one wins
            outs[0][i] = updates[0][j]
    else:
        for j, i in enumerate(flat_index):
            new = _apply(comp, [o[i] for o in outs] + [u[j] for u in updates])
            for o, v in zip(outs, new):
                o[i] = v


# ------------------------------------------------------------ dot and conv

def _accumulator(inst):
    """Compute dtype: the result type, but f32 for f16/bf16 results."""
    dtype = out_dtype(inst)
    narrow_float = dtype == DTYPES["bf16"] or (dtype.kind == "f" and dtype.itemsize < 4)
    return np.dtype(np.float32) if narrow_float else dtype


def _dot(inst, lhs, rhs):
    a = inst.attrs
    lb, lc = a.get("lhs_batch_dims", ()), a.get("lhs_contracting_dims", ())
    rb, rc = a.get("rhs_batch_dims", ()), a.get("rhs_contracting_dims", ())
    lf = [d for d in range(lhs.ndim) if d not in lb + lc]
    rf = [d for d in range(rhs.ndim) if d not in rb + rc]
    acc = _accumulator(inst)
    batch = [lhs.shape[d] for d in lb]
    free_l, free_r = [lhs.shape[d] for d in lf], [rhs.shape[d] for d in rf]
    k = int(np.prod([lhs.shape[d] for d in lc], dtype=np.int64))
    x = np.transpose(lhs, list(lb) + lf + list(lc)).astype(acc).reshape(
        batch + [int(np.prod(free_l, dtype=np.int64)), k])
    y = np.transpose(rhs, list(rb) + list(rc) + rf).astype(acc).reshape(
        batch + [k, int(np.prod(free_r, dtype=np.int64))])
    return np.matmul(x, y).reshape(batch + free_l + free_r)


def _conv_dims(labels):
    """Per operand: (outer dim, inner dim, spatial dims in order) of DimLabels."""
    return tuple((p[outer], p[inner], [p[d] for d in range(len(p) - 2)])
                 for p, (outer, inner) in zip(labels.positions(), (("b", "f"), ("o", "i"),
                                                                    ("b", "f"))))


def _convolution(inst, lhs, rhs):
    (lb, lf, ls), (ko, ki, ks), (ob, of, os_) = _conv_dims(inst.attrs["dim_labels"])
    window = inst.attrs.get("window") or ()
    groups = inst.attrs.get("feature_group_count", 1)
    batch_groups = inst.attrs.get("batch_group_count", 1)
    if groups > 1 and batch_groups > 1:
        raise NotImplementedError("evaluator: convolution with both feature_group_count "
                                  "and batch_group_count > 1")
    acc = _accumulator(inst)
    x = np.transpose(lhs, [lb, lf] + ls).astype(acc)          # [B, C, spatial...]
    w = np.transpose(rhs, [ko, ki] + ks).astype(acc)          # [O, I, kernel...]
    flip = [2 + d for d, wd in enumerate(window) if wd.rhs_reversal]
    w = np.flip(w, axis=flip) if flip else w
    # Patches [B, C, out..., kernel...]: windows over the spatial dims only.
    n = len(window)
    patches, _ = _windows(x, [WindowDim(), WindowDim()] + list(window), 0)
    patches = patches.reshape(patches.shape[:2 + n] + patches.shape[4 + n:])
    sp, kp = "".join(chr(ord("p") + i) for i in range(n)), "".join(
        chr(ord("h") + i) for i in range(n))
    B, C, O = x.shape[0], x.shape[1], w.shape[0]
    if batch_groups > 1:        # batch block g meets output-feature block g
        p = patches.reshape((batch_groups, B // batch_groups) + patches.shape[1:])
        k = w.reshape((batch_groups, O // batch_groups) + w.shape[1:])
        out = np.einsum(f"gbc{sp}{kp},goc{kp}->bgo{sp}", p, k, optimize=True)
    else:                       # feature group g: input block g -> output block g
        p = patches.reshape((B, groups, C // groups) + patches.shape[2:])
        k = w.reshape((groups, O // groups) + w.shape[1:])
        out = np.einsum(f"bgc{sp}{kp},goc{kp}->bgo{sp}", p, k, optimize=True)
    out = out.reshape((out.shape[0], O) + out.shape[3:])
    perm = [0] * out.ndim
    for src, dst in enumerate([ob, of] + os_):
        perm[dst] = src
    return np.transpose(out, perm)


# -------------------------------------------------------- gather / scatter

def _index_vectors(indices, index_vector_dim):
    """Indices with the index vector moved last (added when implicit)."""
    if index_vector_dim == indices.ndim:
        indices = indices[..., None]
    return np.moveaxis(indices, index_vector_dim, -1).astype(np.int64)


def _batch_coords(batch_shape, index_vector_dim, dims):
    """Coordinates along index dims `dims` (numbered with the index vector dim)."""
    grid = np.indices(batch_shape, dtype=np.int64)
    return [grid[d - (d > index_vector_dim)] for d in dims]


def _gather(inst, operand, indices):
    a = inst.attrs
    ivd = a["index_vector_dim"]
    idx = _index_vectors(indices, ivd)
    batch_shape = idx.shape[:-1]
    sizes = a["slice_sizes"]
    starts = [np.zeros(batch_shape, dtype=np.int64) for _ in range(operand.ndim)]
    for k, d in enumerate(a["start_index_map"]):
        starts[d] = idx[..., k]
    op_batch = a.get("operand_batching_dims", ())
    for d, c in zip(op_batch, _batch_coords(batch_shape, ivd,
                                            a.get("start_indices_batching_dims", ()))):
        starts[d] = c
    nb = len(batch_shape)
    index = []
    for d in range(operand.ndim):
        s = np.clip(starts[d], 0, operand.shape[d] - sizes[d])
        offs = np.arange(sizes[d]).reshape((1,) * nb + tuple(
            -1 if e == d else 1 for e in range(operand.ndim)))
        index.append(s.reshape(batch_shape + (1,) * operand.ndim) + offs)
    picked = operand[tuple(index)]                      # batch + slice_sizes
    dropped = set(a.get("collapsed_slice_dims", ())) | set(op_batch)
    picked = picked.reshape(batch_shape + tuple(
        sizes[d] for d in range(operand.ndim) if d not in dropped))
    offset_dims = a["offset_dims"]
    batch_out = [d for d in range(inst.shape.rank) if d not in offset_dims]
    perm = [0] * inst.shape.rank
    for src, dst in enumerate(batch_out + list(offset_dims)):
        perm[dst] = src
    return np.transpose(picked, perm)


def _scatter(inst, *operands):
    n = (len(operands) - 1) // 2
    targets, indices, updates = operands[:n], operands[n], operands[n + 1:]
    a = inst.attrs
    ivd = a["index_vector_dim"]
    idx = _index_vectors(indices, ivd)
    window_dims = a["update_window_dims"]
    scatter_dims = [d for d in range(updates[0].ndim) if d not in window_dims]
    shape = targets[0].shape
    inserted = set(a.get("inserted_window_dims", ())) | set(a.get("input_batching_dims", ()))
    window_operand_dims = [d for d in range(len(shape)) if d not in inserted]
    window_size = [1] * len(shape)
    for u, d in zip(window_dims, window_operand_dims):
        window_size[d] = updates[0].shape[u]
    starts = [np.zeros(idx.shape[:-1], dtype=np.int64) for _ in shape]
    for k, d in enumerate(a["scatter_dims_to_operand_dims"]):
        starts[d] = idx[..., k]
    for d, c in zip(a.get("input_batching_dims", ()),
                    _batch_coords(idx.shape[:-1], ivd,
                                  a.get("scatter_indices_batching_dims", ()))):
        starts[d] = c
    # Each update element: its scatter index and its offset inside the window.
    uidx = np.indices(updates[0].shape, dtype=np.int64)
    scatter_pos = tuple(uidx[d] for d in scatter_dims)
    full = [np.broadcast_to(s[scatter_pos], updates[0].shape) for s in starts]
    in_bounds = np.ones(updates[0].shape, dtype=bool)
    for d in range(len(shape)):
        in_bounds &= (full[d] >= 0) & (full[d] <= shape[d] - window_size[d])
    for u, d in zip(window_dims, window_operand_dims):
        full[d] = full[d] + uidx[u]
    coords = [f[in_bounds] for f in full]
    flat_index = np.ravel_multi_index(coords, shape) if shape else \
        np.zeros(int(in_bounds.sum()), dtype=np.int64)
    outs = [t.copy().reshape(-1) for t in targets]
    _scatter_into(outs, flat_index, [u[in_bounds] for u in updates], a["to_apply"])
    outs = [o.reshape(shape) for o in outs]
    return tuple(outs) if n > 1 else outs[0]


# -------------------------------------------------------------------- sort

_PAIRWISE_SORT_LIMIT = 2048     # rows up to this long precompute comparator tables


def _set_dimension_size(inst, x, size):
    """Only the static size itself: kerasjit has no dynamic shapes."""
    (d,) = inst.attrs["dimensions"]
    if int(size) != x.shape[d]:
        raise NotImplementedError(f"evaluator: set-dimension-size to {int(size)} of a "
                                  f"dimension of {x.shape[d]} (a dynamic shape)")
    return x


def _sort(inst, *xs):
    dim = inst.attrs["dimensions"][0]
    comp = inst.attrs["to_apply"]
    moved = [np.moveaxis(x, dim, -1) for x in xs]
    lead, length = moved[0].shape[:-1], moved[0].shape[-1]
    rows = [m.reshape(-1, length) for m in moved]
    order = np.empty((rows[0].shape[0], length), dtype=np.int64)
    for r in range(rows[0].shape[0]):
        if length <= _PAIRWISE_SORT_LIMIT:     # comparator on all pairs of the row at once
            pairs = []
            for row in rows:
                pairs += [row[r][:, None], row[r][None, :]]
            table = _apply(comp, pairs)[0]

            def less(i, j):
                return table[i, j]
        else:
            def less(i, j):
                return _apply(comp, [x for row in rows for x in (row[r, i], row[r, j])])[0]
        cmp = functools.cmp_to_key(lambda i, j: -1 if less(i, j) else (1 if less(j, i) else 0))
        order[r] = sorted(range(length), key=cmp)      # Python's sort is stable
    outs = [np.take_along_axis(row, order, axis=1).reshape(lead + (length,))
            for row in rows]
    outs = [np.moveaxis(o, -1, dim) for o in outs]
    return tuple(outs) if len(outs) > 1 else outs[0]


# ----------------------------------------------------------- control flow

def _while(inst, state):
    condition, body = inst.attrs["condition"], inst.attrs["body"]
    while evaluate_computation(condition, [state]):
        state = evaluate_computation(body, [state])
    return state


def _conditional(inst, selector, *operands):
    """The branch `selector` picks (a pred: true first; an index out of range:
    the last branch) applied to its own operand."""
    if "branch_computations" in inst.attrs:
        branches = inst.attrs["branch_computations"]
        n = int(selector)
        n = n if 0 <= n < len(branches) else len(branches) - 1
    else:
        branches = (inst.attrs["true_computation"], inst.attrs["false_computation"])
        n = 0 if bool(selector) else 1
    return evaluate_computation(branches[n], [operands[n]])


# -------------------------------------------------------------- structure

# Opcode -> implementation(inst, *operand values); parameters are bound by
# evaluate_computation.
_OPS = {
    **{name: record.reference for name, record in OPCODES.items() if record.reference},
    "broadcast": _broadcast, "iota": _iota,
    "reshape": _reshape, "transpose": _transpose, "slice": _slice, "reverse": _reverse,
    "bitcast": _bitcast, "pad": _pad, "concatenate": _concatenate,
    "dynamic-slice": _dynamic_slice, "dynamic-update-slice": _dynamic_update_slice,
    "reduce": _reduce, "reduce-window": _reduce_window,
    "dot": _dot, "convolution": _convolution, "select-and-scatter": _select_and_scatter,
    "gather": _gather, "scatter": _scatter, "sort": _sort,
    "set-dimension-size": _set_dimension_size,
    "rng-bit-generator": rng_bit_generator,
    "constant": lambda inst: inst.literal,
    "tuple": lambda inst, *xs: tuple(xs),
    "get-tuple-element": lambda inst, t: t[inst.attrs["index"]],
    "call": lambda inst, *xs: evaluate_computation(inst.attrs["to_apply"], list(xs)),
    "while": _while, "conditional": _conditional,
}
