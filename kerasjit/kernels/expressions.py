"""Per-opcode kernel expressions: the value of an HLO instruction at an index.

Each builder gets the lowering (for operands, reduction keys and combiners)
and returns an Expr. Reindexing ops only transform the index; reductions,
dot and convolution become Reduce nodes; rng-bit-generator is Philox in
integer arithmetic; select-and-scatter gathers, for each operand position,
the source values of the windows that selected it (overlapping windows'
selections computed once each, into a buffer of their own).
"""
import numpy as np

from ..errors import Unsupported
from ..hlo.philox import philox4x32
from . import indexing as ix
from .conv_gemm import window_positions
from .ir import S64, Const, Load, Op, Reduce, ReduceVar, Var



def op_of(inst, args):
    if inst.opcode != "compare":
        return Op(inst.shape.dtype, inst.opcode, tuple(args))
    if inst.attrs.get("type", inst.attrs.get("comparison_type")) == "TOTALORDER" \
            and args[0].dtype in _TOTAL_ORDER_KEY:
        args = [_total_order_key(a) for a in args]
    return Op(inst.shape.dtype, "compare", tuple(args), inst.attrs["direction"])


_TOTAL_ORDER_KEY = {"f32": ("s32", 0x7FFFFFFF), "f64": ("s64", 0x7FFFFFFFFFFFFFFF)}


def _total_order_key(x):
    """A float's bits as a signed integer ordered like XLA's TOTALORDER
    (-NaN < -inf < ... < -0 < +0 < ... < inf < NaN): negative floats have
    their magnitude bits flipped."""
    int_type, magnitude = _TOTAL_ORDER_KEY[x.dtype]
    bits = Op(int_type, "bitcast-convert", (x,))
    negative = Op("pred", "compare", (bits, Const(int_type, 0)), "LT")
    flipped = Op(int_type, "xor", (bits, Const(int_type, magnitude)))
    return Op(int_type, "select", (negative, flipped, bits))


def elementwise(lw, inst, index):
    return op_of(inst, [lw.operand(inst, i, index) for i in range(len(inst.operands))])


def _broadcast(lw, inst, index):
    return lw.operand(inst, 0, [index[d] for d in inst.attrs["dimensions"]])


def _reshape(lw, inst, index):
    return lw.operand(inst, 0, ix.reshape_index(index, inst.shape.dims,
                                                 inst.operands[0].shape.dims))


def _transpose(lw, inst, index):
    perm = inst.attrs["dimensions"]
    inner = [None] * len(perm)
    for out_dim, in_dim in enumerate(perm):
        inner[in_dim] = index[out_dim]
    return lw.operand(inst, 0, inner)


def _slice(lw, inst, index):
    return lw.operand(inst, 0, [ix.add(ix.c64(s), ix.mul(i, ix.c64(st)))
                                for i, (s, _, st) in zip(index, inst.attrs["slice"])])


def _reverse(lw, inst, index):
    dims, rev = inst.shape.dims, set(inst.attrs["dimensions"])
    return lw.operand(inst, 0, [ix.sub(ix.c64(dims[d] - 1), i) if d in rev else i
                                for d, i in enumerate(index)])


def _iota(lw, inst, index):
    return Op(inst.shape.dtype, "convert", (index[inst.attrs["iota_dimension"]],))


def _pad(lw, inst, index):
    operand_dims = inst.operands[0].shape.dims
    valid, inner = None, []
    for i, (lo, _, interior), n in zip(index, inst.attrs["padding"], operand_dims):
        pos = ix.sub(i, ix.c64(lo))
        step = interior + 1
        q = ix.div(ix.clamp(pos, 0, (n - 1) * step), step)
        inner.append(q)
        valid = ix.both(valid, ix.compare(pos, ix.c64(0), "GE"))
        valid = ix.both(valid, ix.compare(pos, ix.c64((n - 1) * step), "LE"))
        if interior:
            valid = ix.both(valid, ix.compare(ix.mod(ix.clamp(pos, 0, (n - 1) * step), step),
                                              ix.c64(0), "EQ"))
    value = lw.operand(inst, 0, inner)
    return value if valid is None else Op(inst.shape.dtype, "select",
                                          (valid, value, lw.operand(inst, 1, ())))


def _concatenate(lw, inst, index):
    d = inst.attrs["dimensions"][0]
    offsets = np.cumsum([0] + [op.shape.dims[d] for op in inst.operands])
    result = None
    for i in reversed(range(len(inst.operands))):
        n = inst.operands[i].shape.dims[d]
        local = ix.clamp(ix.sub(index[d], ix.c64(offsets[i])), 0, n - 1)
        value = lw.operand(inst, i, [local if k == d else x for k, x in enumerate(index)])
        result = value if result is None else Op(
            inst.shape.dtype, "select",
            (ix.compare(index[d], ix.c64(offsets[i + 1]), "LT"), value, result))
    return result


def _dynamic_slice(lw, inst, index):
    operand_dims = inst.operands[0].shape.dims
    inner = []
    for d, (i, size) in enumerate(zip(index, inst.shape.dims)):
        start = Op(S64, "convert", (lw.operand(inst, d + 1, ()),))
        start = Op(S64, "clamp", (ix.c64(0), start, ix.c64(operand_dims[d] - size)))
        inner.append(ix.add(start, i))
    return lw.operand(inst, 0, inner)


def _update_starts(lw, inst):
    """Where a dynamic-update-slice's window starts, clamped so it fits (as XLA)."""
    return [Op(S64, "clamp", (ix.c64(0), Op(S64, "convert", (lw.operand(inst, d + 2, ()),)),
                              ix.c64(n - size)))
            for d, (n, size) in enumerate(zip(inst.shape.dims, inst.operands[1].shape.dims))]


def update_window(lw, inst, index):
    """(target, value) of element `index` of a dynamic-update-slice's update:
    where in the result it lands, and its value."""
    target = tuple(ix.add(start, i) for start, i in zip(_update_starts(lw, inst), index))
    return target, lw.operand(inst, 1, index)


def _dynamic_update_slice(lw, inst, index):
    update_dims = inst.operands[1].shape.dims
    inside, inner = None, []
    for i, size, start in zip(index, update_dims, _update_starts(lw, inst)):
        rel = ix.sub(i, start)
        inside = ix.both(inside, Op("pred", "and", (ix.compare(rel, ix.c64(0), "GE"),
                                                    ix.compare(rel, ix.c64(size), "LT"))))
        inner.append(ix.clamp(rel, 0, size - 1))
    return Op(inst.shape.dtype, "select", (inside, lw.operand(inst, 1, inner),
                                           lw.operand(inst, 0, index)))


def _starts(lw, inst, position, rank, index_map, batching):
    """Per operand dimension, where a gather's slice or a scatter's window
    starts: for the dimensions `index_map` names, a component of the index
    vector (indices operand 1 at `position`, the index vector dimension put
    back in); for `batching` ((operand dim, indices dim) pairs), the batch
    coordinate itself; else 0."""
    ivd = inst.attrs["index_vector_dim"]
    starts = [ix.c64(0)] * rank
    for k, d in enumerate(index_map):
        at = position[:ivd] + [ix.c64(k)] + position[ivd:] \
            if ivd < inst.operands[1].shape.rank else position
        starts[d] = Op(S64, "convert", (lw.operand(inst, 1, at),))
    for d, bd in batching:
        starts[d] = position[bd - (bd > ivd)]
    return starts


def _gather(lw, inst, index):
    """XLA's gather: each output element reads the operand at a start read from
    the indices (clamped so the slice fits, as XLA does) plus its offset."""
    a = inst.attrs
    operand_dims = inst.operands[0].shape.dims
    offset_dims = a["offset_dims"]
    operand_batch = a.get("operand_batching_dims", ())
    # The output's other dims walk the indices' dims without the index vector's.
    starts = _starts(lw, inst, [index[d] for d in range(inst.shape.rank) if d not in offset_dims],
                     len(operand_dims), a["start_index_map"],
                     zip(operand_batch, a.get("start_indices_batching_dims", ())))
    dropped = set(a.get("collapsed_slice_dims", ())) | set(operand_batch)
    offsets = iter(index[d] for d in offset_dims)
    inner = []
    for d, (start, size) in enumerate(zip(starts, a["slice_sizes"])):
        start = Op(S64, "clamp", (ix.c64(0), start, ix.c64(operand_dims[d] - size)))
        inner.append(start if d in dropped else ix.add(start, next(offsets)))
    return lw.operand(inst, 0, inner)


def scatter_update(lw, inst, index, out):
    """(target, value, update, fits, adds) of update element `index` of scatter
    `inst` into buffer `out`: where it lands, what to store there (the
    combiner of what is there and the update), the update, whether its window
    fits, whether the combiner is an add. An update whose window does not fit
    is skipped, as in XLA: its target is clamped in range and gets back what
    it holds."""
    if len(inst.operands) != 3:
        raise Unsupported("scatter into several arrays at once")
    a = inst.attrs
    dims, updates = inst.shape.dims, inst.operands[2].shape.dims
    window_dims = a["update_window_dims"]
    batching = a.get("input_batching_dims", ())
    inserted = set(a.get("inserted_window_dims", ())) | set(batching)
    offsets = dict(zip([d for d in range(len(dims)) if d not in inserted],
                       [(index[u], updates[u]) for u in window_dims]))
    starts = _starts(lw, inst, [index[d] for d in range(len(updates)) if d not in window_dims],
                     len(dims), a["scatter_dims_to_operand_dims"],
                     zip(batching, a.get("scatter_indices_batching_dims", ())))
    fits, target = None, []
    for d, (start, n) in enumerate(zip(starts, dims)):
        offset, size = offsets.get(d, (ix.c64(0), 1))
        fits = ix.both(fits, Op("pred", "and", (ix.compare(start, ix.c64(0), "GE"),
                                                ix.compare(start, ix.c64(n - size), "LE"))))
        target.append(ix.clamp(ix.add(start, offset), 0, n - 1))
    current, update = Load(inst.shape.dtype, out, tuple(target)), lw.operand(inst, 2, index)
    accs, curs, (combined,) = lw.combiner(a["to_apply"], 1)
    new = _substitute(combined, {accs[0]: current, curs[0]: update})
    adds = isinstance(combined, Op) and combined.opcode == "add" \
        and set(combined.args) == {accs[0], curs[0]}
    value = Op(inst.shape.dtype, "select", (fits, new, current)) if fits else new
    return tuple(target), value, update, fits, adds


def _reduce(lw, inst, index, result=0):
    n = len(inst.operands) // 2
    reduced = inst.attrs["dimensions"]
    in_dims = inst.operands[0].shape.dims
    key = lw.key(inst)
    kept = iter(index)
    inner = []
    for d in range(len(in_dims)):
        if d in reduced:
            inner.append(ReduceVar(S64, key, reduced.index(d)))
        else:
            inner.append(next(kept))
    # The element is the computation's left operand, the accumulator its right, as
    # TensorFlow's kernels fold: an argmax's NaNs lose to any number (all NaN: index 0).
    curs, accs, combined = lw.combiner(inst.attrs["to_apply"], n)
    return Reduce(accs[result].dtype, key, tuple(in_dims[d] for d in reduced), accs, curs,
                  combined, tuple(lw.operand(inst, n + i, ()) for i in range(n)),
                  tuple(lw.operand(inst, i, inner) for i in range(n)), result)


def _window_positions(index, window, in_dims, key):
    """Operand positions of window element ReduceVar(key, d) and their validity."""
    return window_positions(index, window, in_dims,
                            [ReduceVar(S64, key, d) for d in range(len(window))])


def _reduce_window(lw, inst, index, result=0):
    n = len(inst.operands) // 2
    window = inst.attrs["window"]
    key = lw.key(inst)
    valid, inner = _window_positions(index, window, inst.operands[0].shape.dims, key)
    inits = tuple(lw.operand(inst, n + i, ()) for i in range(n))
    bodies = tuple(Op(inst.operands[i].shape.dtype, "select",
                      (valid, lw.operand(inst, i, inner), inits[i])) if valid is not None
                   else lw.operand(inst, i, inner) for i in range(n))
    curs, accs, combined = lw.combiner(inst.attrs["to_apply"], n)   # (as _reduce)
    return Reduce(accs[result].dtype, key, tuple(w.size for w in window), accs, curs,
                  combined, inits, bodies, result)


def _sum_of_products(dtype, key, extents, lhs, rhs, name):
    acc, cur = Var(dtype, f"{name}.acc"), Var(dtype, f"{name}.cur")
    product = Op(dtype, "multiply", (lhs, rhs))
    return Reduce(dtype, key, extents, (acc,), (cur,), (Op(dtype, "add", (acc, cur)),),
                  (Const(dtype, 0),), (product,))


def _converted(lw, inst, i, index):
    value = lw.operand(inst, i, index)
    return value if value.dtype == inst.shape.dtype else Op(inst.shape.dtype, "convert", (value,))


def _dot(lw, inst, index):
    a = inst.attrs
    lhs, rhs = (op.shape for op in inst.operands)
    lb, rb = a.get("lhs_batch_dims", ()), a.get("rhs_batch_dims", ())
    lc, rc = a["lhs_contracting_dims"], a["rhs_contracting_dims"]
    key = lw.key(inst)
    out = iter(index)
    batch = [next(out) for _ in lb]

    def operand_index(rank, batch_dims, contracting):
        idx, free = [None] * rank, [d for d in range(rank) if d not in batch_dims + contracting]
        for d, b in zip(batch_dims, batch):
            idx[d] = b
        for j, d in enumerate(contracting):
            idx[d] = ReduceVar(S64, key, j)
        for d in free:
            idx[d] = next(out)
        return idx
    lhs_index = operand_index(lhs.rank, lb, lc)
    rhs_index = operand_index(rhs.rank, rb, rc)
    return _sum_of_products(inst.shape.dtype, key, tuple(lhs.dims[d] for d in lc),
                            _converted(lw, inst, 0, lhs_index),
                            _converted(lw, inst, 1, rhs_index), inst.name)


def _convolution(lw, inst, index):
    a = inst.attrs
    batch_groups = a.get("batch_group_count", 1)
    lhs_l, rhs_l, out_l = a["dim_labels"].positions()
    lhs, rhs = (op.shape for op in inst.operands)
    window = a["window"]
    groups = a.get("feature_group_count", 1)
    key = lw.key(inst)
    spatial = len(window)
    in_per_group = lhs.dims[lhs_l["f"]] // groups
    out_per_group = rhs.dims[rhs_l["o"]] // groups
    o = index[out_l["f"]]
    in_feature = ReduceVar(S64, key, spatial)
    lhs_index = [None] * lhs.rank
    # With batch groups (a depthwise filter's gradient), output feature block g
    # reads the lhs batch block g.
    batch = index[out_l["b"]] if batch_groups == 1 else ix.add(ix.mul(
        ix.div(o, rhs.dims[rhs_l["o"]] // batch_groups), ix.c64(inst.shape.dims[out_l["b"]])),
        index[out_l["b"]])
    lhs_index[lhs_l["b"]] = batch
    lhs_index[lhs_l["f"]] = in_feature if groups == 1 else ix.add(
        ix.mul(ix.div(o, out_per_group), ix.c64(in_per_group)), in_feature)
    out_spatial = [index[out_l[d]] for d in range(spatial)]
    in_spatial_dims = [lhs.dims[lhs_l[d]] for d in range(spatial)]
    valid, positions = _window_positions(out_spatial, window, in_spatial_dims, key)
    for d in range(spatial):
        lhs_index[lhs_l[d]] = positions[d]
    rhs_index = [None] * rhs.rank
    rhs_index[rhs_l["i"]] = in_feature
    rhs_index[rhs_l["o"]] = o
    for d in range(spatial):
        rhs_index[rhs_l[d]] = ReduceVar(S64, key, d)
    x = _converted(lw, inst, 0, lhs_index)
    if valid is not None:
        x = Op(x.dtype, "select", (valid, x, Const(x.dtype, 0)))
    extents = tuple(w.size for w in window) + (in_per_group,)
    return _sum_of_products(inst.shape.dtype, key, extents, x,
                            _converted(lw, inst, 1, rhs_index), inst.name)


def _get_tuple_element(lw, inst, index):
    source = inst.operands[0]
    i = inst.attrs["index"]
    if source.opcode == "rng-bit-generator":
        return _rng(lw, source, index, i)
    if source.opcode == "tuple":
        return lw.operand(source, i, index)
    if source.opcode in ("reduce", "reduce-window"):
        return EXPRESSIONS[source.opcode](lw, source, index, result=i)
    raise Unsupported(f"get-tuple-element of '{source.opcode}'")


def _u32(e):
    return Op("u32", "convert", (e,))


def _philox(counter, key):
    """Philox-4x32-10 on u32 Exprs (4 counter words, 2 key words): 4 u32 words."""
    def mul_hi_lo(word, multiplier):
        product = Op("u64", "multiply", (Op("u64", "convert", (word,)), Const("u64", multiplier)))
        return _u32(Op("u64", "shift-right-logical", (product, Const("u64", 32)))), _u32(product)
    return philox4x32(counter, key, mul_hi_lo, lambda a, b: Op("u32", "xor", (a, b)),
                      lambda k, step: Op("u32", "add", (k, Const("u32", step))))


def _high_word(word64):
    return Op("u64", "shift-right-logical", (word64, Const("u64", 32)))


def _rng_state(lw, inst):
    """The (key, counter low, counter high) words of rng-bit-generator `inst`."""
    return [lw.operand(inst, 0, (ix.c64(i),)) for i in range(3)]


def _counter_plus(lo, hi, n):
    """The 128-bit counter (lo, hi) plus u64 `n`, the carry into the high word."""
    new_lo = Op("u64", "add", (lo, n))
    carry = Op("u64", "convert", (Op("pred", "compare", (new_lo, lo), "LT"),))
    return new_lo, Op("u64", "add", (hi, carry))


def _pick(dtype, i, values, first=0):
    """values[i - first] for an s64 Expr `i` in [first, first + len(values)),
    as a chain of selects."""
    if len(values) == 1:
        return values[0]
    return Op(dtype, "select", (ix.compare(i, ix.c64(first), "EQ"), values[0],
                                _pick(dtype, i, values[1:], first + 1)))


def _rng(lw, inst, index, which):
    if inst.attrs.get("algorithm") not in ("rng_philox", "rng_default"):
        raise Unsupported(f"rng-bit-generator algorithm {inst.attrs.get('algorithm')}")
    bits_shape = inst.shape.tuple_shapes[1]
    wide = bits_shape.dtype in ("u64", "s64")
    if bits_shape.dtype not in ("u32", "s32", "u64", "s64"):
        raise Unsupported(f"rng-bit-generator producing {bits_shape.dtype}")
    words = bits_shape.size * (2 if wide else 1)
    blocks = -(-words // 4)
    if which == 0:                # new state: counter advanced by the blocks used
        key, lo, hi = _rng_state(lw, inst)
        return _pick("u64", index[0], [key, *_counter_plus(lo, hi, Const("u64", blocks))])

    def block_words(index):     # at (block, lane): that word of the block's 4
        key, lo, hi = _rng_state(lw, inst)
        block_lo, block_hi = _counter_plus(lo, hi, Op("u64", "convert", (index[0],)))
        return _pick("u32", index[1], _philox(
            [_u32(block_lo), _u32(_high_word(block_lo)), _u32(block_hi), _u32(_high_word(block_hi))],
            [_u32(key), _u32(_high_word(key))]))
    # Each Philox block gives 4 words: computed once, by a kernel of its own
    # whose inner loop over the 4 lanes leaves the rounds loop-invariant.
    words_bid = lw.own_kernel(inst, "philox", "u32", (blocks, 4), block_words)

    def word(w):
        return Load("u32", words_bid, (ix.div(w, 4), ix.mod(w, 4)))
    flat = ix.linearize(index, bits_shape.dims)
    if not wide:
        return Op(bits_shape.dtype, "bitcast-convert", (word(flat),)) \
            if bits_shape.dtype == "s32" else word(flat)
    low = Op("u64", "convert", (word(ix.mul(flat, ix.c64(2))),))
    high = Op("u64", "convert", (word(ix.add(ix.mul(flat, ix.c64(2)), ix.c64(1))),))
    bits = Op("u64", "or", (low, Op("u64", "shift-left", (high, Const("u64", 32)))))
    return Op(bits_shape.dtype, "bitcast-convert", (bits,)) if bits_shape.dtype == "s64" else bits


def disjoint_windows(inst):
    """Whether the windows of select-and-scatter `inst` do not overlap (pooling
    with stride >= size, Keras's default). Then each position lies in at most
    one window, and its window and its offset there follow from the position
    alone, where overlapping windows need a search over every window that
    might contain it (4x the work for a 2x2 pool): an elementwise-like value."""
    return all(w.stride >= w.size and w.pad_lo >= 0 and w.lhs_dilate == w.rhs_dilate == 1
               for w in inst.attrs["window"])


def _select_and_scatter(lw, inst, index):
    operand, source, init = inst.operands
    window = inst.attrs["window"]
    sizes = [w.size for w in window]
    out_dims = source.shape.dims
    disjoint = disjoint_windows(inst)
    starts, offsets, covers = [], [], None
    outer = None if disjoint else lw.key(inst)
    for d, (i, w) in enumerate(zip(index, window)):
        last = (out_dims[d] - 1) * w.stride
        if disjoint:
            num = ix.add(i, ix.c64(w.pad_lo))
            last += w.stride - 1              # (the last position of the last window's stride)
            k = ix.mod(num, w.stride)
            ok = ix.both(ix.compare(k, ix.c64(w.size), "LT"), ix.compare(num, ix.c64(last), "LE"))
            window_start = ix.div(ix.clamp(num, 0, last), w.stride)
        else:
            # Element k of window s covers it where s*stride + k == i + pad_lo: the
            # windows s = (i + pad_lo) // stride - r for r < ceil(size / stride), the
            # last first (k ascending, as the windows' own order), at k < size. (Shifted
            # by whole strides to divide a non-negative number.)
            shift = -(-max(0, -w.pad_lo) // w.stride)
            num = ix.add(i, ix.c64(w.pad_lo + shift * w.stride))
            shifted = ix.sub(ix.div(num, w.stride), ReduceVar(S64, outer, d))
            k = ix.sub(num, ix.mul(shifted, ix.c64(w.stride)))
            ok = ix.both(ix.both(ix.compare(shifted, ix.c64(shift), "GE"),
                                 ix.compare(shifted, ix.c64(shift + out_dims[d] - 1), "LE")),
                         ix.compare(k, ix.c64(w.size), "LT"))
            window_start = ix.clamp(ix.sub(shifted, ix.c64(shift)), 0, out_dims[d] - 1)
        starts.append(window_start)
        offsets.append(k)
        covers = ix.both(covers, ok)
    choice = _selected_offset(lw, inst, starts) if disjoint else \
        Load(OFFSET, _window_selections(lw, inst), tuple(starts))
    selected = ix.both(covers, ix.compare(Op(S64, "convert", (choice,)),
                                          ix.linearize(offsets, sizes), "EQ"))
    src = lw.value_at(source, tuple(starts))
    s_accs, s_curs, (scattered,) = lw.combiner(inst.attrs["scatter"], 1)
    start = lw.operand(inst, 2, ())
    dtype = operand.shape.dtype
    if disjoint:
        return Op(dtype, "select", (selected, _substitute(
            scattered, {s_accs[0]: start, s_curs[0]: src}), start))
    flag = Var("pred", "scatter.flag")
    combined = (Op(dtype, "select", (flag, scattered, s_accs[0])),)
    covering = tuple(-(-w.size // w.stride) for w in window)
    return Reduce(dtype, outer, covering, (s_accs[0],), (flag, s_curs[0]),
                  combined, (start,), (selected, src), 0)


def _window_selections(lw, inst):
    """A buffer of the offset each window selects, written by a kernel of its
    own before the gather: each operand position visits every window that
    may cover it, and would otherwise search each window once per visit."""
    return lw.own_kernel(inst, "window_selections", OFFSET, inst.operands[1].shape.dims,
                         lambda index: _selected_offset(lw, inst, index))


# A window offset's type: 32 bits vectorise twice as wide as 64 alongside f32 values.
OFFSET = "s32"


def _selected_offset(lw, inst, starts):
    """The flat offset (OFFSET), within the window at `starts`, of the element
    the select computation picks (the first wins ties)."""
    operand, window = inst.operands[0], inst.attrs["window"]
    inner = lw.key(inst, "select")
    valid, positions = _window_positions(starts, window, operand.shape.dims, inner)
    value = lw.value_at(operand, tuple(positions))
    flat = Op(OFFSET, "convert", (ix.linearize([ReduceVar(S64, inner, d)
                                                for d in range(len(window))],
                                               [w.size for w in window]),))
    dtype = operand.shape.dtype
    accs = (Var("pred", "sel.has"), Var(dtype, "sel.val"), Var(OFFSET, "sel.pos"))
    curs = (Var("pred", "sel.cur_has"), Var(dtype, "sel.cur_val"), Var(OFFSET, "sel.cur_pos"))
    sel_accs, sel_curs, (keep_acc,) = lw.combiner(inst.attrs["select"], 1)
    keep = _substitute(keep_acc, {sel_accs[0]: accs[1], sel_curs[0]: curs[1]})
    take_acc = Op("pred", "and", (accs[0], Op("pred", "or", (Op("pred", "not", (curs[0],)), keep))))
    combined = tuple(Op(a.dtype, "select", (take_acc, a, c)) for a, c in zip(accs, curs))
    inits = (Const("pred", False), Const(dtype, 0), Const(OFFSET, -1))
    bodies = (valid if valid is not None else Const("pred", True), value, flat)
    return Reduce(OFFSET, inner, tuple(w.size for w in window), accs, curs, combined, inits,
                  bodies, result=2)


def _substitute(expr, mapping):
    """expr with Vars replaced (combiner computations are tiny trees)."""
    if expr in mapping:
        return mapping[expr]
    if isinstance(expr, Op):
        return Op(expr.dtype, expr.opcode, tuple(_substitute(a, mapping) for a in expr.args),
                  expr.attr)
    return expr


EXPRESSIONS = {
    "broadcast": _broadcast, "reshape": _reshape, "bitcast": _reshape,
    "transpose": _transpose, "slice": _slice, "reverse": _reverse, "iota": _iota,
    "pad": _pad, "concatenate": _concatenate, "dynamic-slice": _dynamic_slice,
    "dynamic-update-slice": _dynamic_update_slice, "gather": _gather, "reduce": _reduce,
    "reduce-window": _reduce_window, "dot": _dot, "convolution": _convolution,
    "get-tuple-element": _get_tuple_element, "select-and-scatter": _select_and_scatter,
}
