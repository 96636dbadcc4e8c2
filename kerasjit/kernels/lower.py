"""HLO Module -> KernelProgram: decide fusion, then build each kernel's expressions.

Fusion is decided per (producer, consumer) edge and recorded with its reason:
a producer is inlined into its consumer's expression unless it must be
materialised (a reduction or opaque op, several users of a costly value, a
costly value a broadcast would recompute per output element). Materialised
values of the same shape computed back to back share one loop (multi-output
fusion: an optimizer update is one pass over memory).
"""
import numpy as np

from ..hlo.opcodes import BROADCAST, ELEMENTWISE, OPAQUE, REDUCE
from . import indexing as ix
from .conv_gemm import conv_as_gemm, parse_dim_labels, window_positions
from .storage import assign_storage
from .ir import (S64, Buffer, Const, GemmCall, Index, KernelProgram, Load, LoopKernel, Op,
                 Reduce, ReduceVar, Var)

_CHEAP = {"broadcast", "iota", "reshape", "bitcast", "transpose", "slice", "convert",
          "copy", "reverse", "constant", "parameter", "negate", "get-tuple-element"}
_PHILOX_M = (0xD2511F53, 0xCD9E8D57)
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)


class Unsupported(NotImplementedError):
    """An HLO feature this compiler does not generate code for (the cluster falls back)."""


class _NotInKernel(Exception):
    """A value of the current kernel is needed at another index: start a new kernel."""


def _is_tuple_producer(inst):
    return inst.shape.is_tuple and inst.opcode != "tuple"


def lower(module):
    return _Lowering(module).run()


class _Lowering:
    def __init__(self, module):
        self.comp = module.entry
        self.order = self.comp.post_order()
        self.users = {i: [] for i in self.order}
        for inst in self.order:
            for op in inst.operands:
                self.users[op].append(inst)
        self.buffers, self.buffer_of, self.steps, self.decisions = [], {}, [], []
        self.kernel_values = {}   # instruction -> Expr, for the kernel being built
        self.memo = {}            # (instruction, index ids) -> (index, Expr)
        self.keys = {}            # id(reduce instruction) -> small int key

    # ---------------------------------------------------------------- decisions
    def _must_materialize(self, inst):
        """None if `inst` can be inlined into each user, else the reason."""
        if inst.opcode == "parameter":
            return "parameter"
        if inst.opcode == "constant":
            return None if inst.shape.rank == 0 else "constant array"
        if inst.opcode in ("tuple", "rng-bit-generator") or _is_tuple_producer(inst):
            return None           # virtual: their get-tuple-elements are the values
        if inst.opcode == "get-tuple-element" and inst.operands[0].opcode != "rng-bit-generator":
            return "result of a multi-output reduction"
        kind = inst.kind
        if kind in (REDUCE, OPAQUE):
            return f"{inst.opcode} is a kernel root (its operands fuse into it)"
        users = self.users[inst]
        if inst.shape.rank == 0:
            return None           # scalars: LLVM hoists them out of the loops they feed
        if len(users) > 1 and inst.opcode not in _CHEAP:
            return f"{len(users)} users would each recompute it"
        if users and users[0].kind == BROADCAST and inst.opcode not in _CHEAP \
                and inst.shape.size < users[0].shape.size:
            return "a broadcast would recompute it per output element"
        return None

    def run(self):
        root = self.comp.root
        outputs = list(root.operands) if root.opcode == "tuple" else [root]
        if any(o.shape.is_tuple for o in outputs):
            raise Unsupported("nested tuple outputs")
        materialized = {i: self._must_materialize(i) for i in self.order}
        for inst in self.order:
            for op in inst.operands:
                if op.opcode not in ("parameter", "constant", "tuple"):
                    self.decisions.append((op.name, inst.name, materialized[op] or "fused"))
        params = [self._buffer(p, "param") for p in self.comp.parameters]
        for inst in self.order:
            if inst.opcode == "constant" and materialized[inst]:
                self._buffer(inst, "constant", inst.literal)
        for inst in outputs:
            materialized[inst] = materialized[inst] or "output"
        for inst in self.order:
            if materialized[inst] and inst not in self.buffer_of:
                self._emit(inst, "output" if inst in outputs else "temp")
        out_ids = []
        for inst in outputs:         # parameters, constants and repeats need a copy
            bid = self.buffer_of[inst]
            if self.buffers[bid].role != "output" or bid in out_ids:
                bid = self._copy(inst)
            out_ids.append(bid)
        return assign_storage(KernelProgram(self.buffers, self.steps, params, out_ids,
                                            self.decisions))

    # ------------------------------------------------------------------ kernels
    def _buffer(self, inst, role, data=None):
        buf = Buffer(len(self.buffers), inst.shape.dtype, inst.shape.dims, role, data, inst.name)
        self.buffers.append(buf)
        self.buffer_of[inst] = buf.id
        return buf.id

    def _copy(self, inst):
        buf = Buffer(len(self.buffers), inst.shape.dtype, inst.shape.dims, "output", None,
                     inst.name + ".copy")
        self.buffers.append(buf)
        index = tuple(Index(S64, d) for d in range(inst.shape.rank))
        self.steps.append(LoopKernel(f"copy_{inst.name}", inst.shape.dims,
                                     [(buf.id, self._load_or_expr(inst, index))]))
        return buf.id

    def materialized(self, inst):
        """The buffer holding `inst`, computing it into a temp first if needed."""
        if inst not in self.buffer_of:
            self._emit(inst, "temp")
        return self.buffer_of[inst]

    def temp(self, dtype, dims, name):
        buf = Buffer(len(self.buffers), dtype, tuple(dims), "temp", None, name)
        self.buffers.append(buf)
        return buf.id

    def buffer_for(self, inst, role):
        return self._buffer(inst, role)

    def _emit(self, inst, role):
        if inst.opcode == "convolution" and conv_as_gemm(self, inst, role):
            return
        gemm = self._gemm(inst)
        if gemm is not None:
            bid = self._buffer(inst, role)
            gemm.out = bid
            self.steps.append(gemm)
            return
        last = self.steps[-1] if self.steps else None
        # Reductions keep a kernel to themselves: alone, the renderer can run
        # their rows along contiguous memory; loop outputs share a pass instead.
        if isinstance(last, LoopKernel) and last.dims == inst.shape.dims \
                and not self._is_reduction(inst) and not last.reduction:
            try:                      # multi-output: join the previous loop
                value = self._kernel_expr(inst)
                bid = self._buffer(inst, role)
                last.stores.append((bid, value))
                last.fused.append(inst.name)
                self.kernel_values[inst] = value
                return
            except _NotInKernel:
                pass
        self.kernel_values = {}
        value = self._kernel_expr(inst)
        bid = self._buffer(inst, role)
        self.kernel_values[inst] = value
        self.steps.append(LoopKernel(f"k{len(self.steps)}_{inst.opcode}",
                                     inst.shape.dims, [(bid, value)], [inst.name],
                                     reduction=self._is_reduction(inst)))

    @staticmethod
    def _is_reduction(inst):
        source = inst.operands[0] if inst.opcode == "get-tuple-element" else inst
        return source.kind in (REDUCE, OPAQUE) and source.opcode != "rng-bit-generator"

    def _kernel_expr(self, inst):
        index = tuple(Index(S64, d) for d in range(inst.shape.rank))
        self.loop_index = index
        return self._compute(inst, index)

    def _load_or_expr(self, inst, index):
        if inst in self.kernel_values:
            if index != self.loop_index:
                raise _NotInKernel()
            return self.kernel_values[inst]
        if inst in self.buffer_of:
            buf = self.buffers[self.buffer_of[inst]]
            return Load(buf.dtype, buf.id, tuple(index))
        if inst.opcode == "constant":
            return Const(inst.shape.dtype, inst.literal.item())
        key = (id(inst),) + tuple(map(id, index))
        if key not in self.memo:      # keeps shared subexpressions shared (a DAG, not a tree)
            self.memo[key] = (index, self._compute(inst, index))
        return self.memo[key][1]

    # ----------------------------------------------------------- expressions
    def _compute(self, inst, index):
        impl = _EXPRESSIONS.get(inst.opcode) or (_elementwise if inst.kind == ELEMENTWISE else None)
        if impl is None:
            raise Unsupported(f"the CPU compiler has no code generation for HLO '{inst.opcode}'")
        return impl(self, inst, index)

    def operand(self, inst, i, index):
        return self._load_or_expr(inst.operands[i], tuple(index))

    def key(self, inst, role=""):
        """A small int naming one reduction loop (per instruction and role)."""
        return self.keys.setdefault((id(inst), role), len(self.keys))

    def combiner(self, computation, n):
        """Vars and combined Exprs of a scalar HLO computation of 2n parameters."""
        params = computation.parameters
        names = [f"{computation.name}.{p.parameter_number}" for p in params]
        vars_ = [Var(p.shape.dtype, name) for p, name in zip(params, names)]
        values = {p: v for p, v in zip(params, vars_)}
        for inst in computation.post_order():
            if inst in values:
                continue
            if inst.opcode == "constant":
                values[inst] = Const(inst.shape.dtype, inst.literal.item())
            elif inst.opcode == "tuple":
                values[inst] = tuple(values[o] for o in inst.operands)
            elif inst.opcode == "get-tuple-element":
                values[inst] = values[inst.operands[0]][inst.attrs["index"]]
            elif inst.kind == ELEMENTWISE:
                values[inst] = _op(inst, [values[o] for o in inst.operands])
            else:
                raise Unsupported(f"reduction computation uses '{inst.opcode}'")
        combined = values[computation.root]
        combined = combined if isinstance(combined, tuple) else (combined,)
        return tuple(vars_[:n]), tuple(vars_[n:]), combined

    def _gemm(self, inst):
        """A GemmCall for an f32 rank-2 dot without batch dims, else None."""
        if inst.opcode != "dot" or inst.shape.dtype != "f32":
            return None
        lhs, rhs = inst.operands
        a = inst.attrs
        if a.get("lhs_batch_dims") or a.get("rhs_batch_dims") or lhs.shape.rank != 2 \
                or rhs.shape.rank != 2 or lhs.shape.dtype != "f32" or rhs.shape.dtype != "f32":
            return None
        (lc,), (rc,) = a["lhs_contracting_dims"], a["rhs_contracting_dims"]
        ids = [self.materialized(op) for op in (lhs, rhs)]  # sgemm reads buffers
        m, k = lhs.shape.dims[1 - lc], lhs.shape.dims[lc]
        n = rhs.shape.dims[1 - rc]
        return GemmCall(f"gemm_{inst.name}", None, ids[0], ids[1], m, n, k,
                        lhs_transposed=(lc == 0), rhs_transposed=(rc == 1))


def _op(inst, args):
    attr = inst.attrs.get("direction") if inst.opcode == "compare" else None
    return Op(inst.shape.dtype, inst.opcode, tuple(args), attr)


def _elementwise(lw, inst, index):
    return _op(inst, [lw.operand(inst, i, index) for i in range(len(inst.operands))])


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


def _dynamic_update_slice(lw, inst, index):
    update_dims = inst.operands[1].shape.dims
    inside, inner = None, []
    for d, (i, size) in enumerate(zip(index, update_dims)):
        start = Op(S64, "convert", (lw.operand(inst, d + 2, ()),))
        start = Op(S64, "clamp", (ix.c64(0), start, ix.c64(inst.shape.dims[d] - size)))
        rel = ix.sub(i, start)
        inside = ix.both(inside, Op("pred", "and", (ix.compare(rel, ix.c64(0), "GE"),
                                                    ix.compare(rel, ix.c64(size), "LT"))))
        inner.append(ix.clamp(rel, 0, size - 1))
    return Op(inst.shape.dtype, "select", (inside, lw.operand(inst, 1, inner),
                                           lw.operand(inst, 0, index)))


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
    accs, curs, combined = lw.combiner(inst.attrs["to_apply"], n)
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
    accs, curs, combined = lw.combiner(inst.attrs["to_apply"], n)
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
    if a.get("batch_group_count", 1) != 1:
        raise Unsupported("convolution with batch_group_count > 1")
    lhs_l, rhs_l, out_l = parse_dim_labels(a["dim_labels"])
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
    lhs_index[lhs_l["b"]] = index[out_l["b"]]
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
        return _EXPRESSIONS[source.opcode](lw, source, index, result=i)
    raise Unsupported(f"get-tuple-element of '{source.opcode}'")


def _u32(e):
    return Op("u32", "convert", (e,))


def _philox(counter, key):
    """Philox-4x32-10 on u32 Exprs (4 counter words, 2 key words): 4 u32 words."""
    c, k = list(counter), list(key)
    for _ in range(10):
        products = [Op("u64", "multiply", (Op("u64", "convert", (c[j],)), Const("u64", m)))
                    for j, m in ((0, _PHILOX_M[0]), (2, _PHILOX_M[1]))]
        hi = [_u32(Op("u64", "shift-right-logical", (p, Const("u64", 32)))) for p in products]
        lo = [_u32(p) for p in products]
        c = [Op("u32", "xor", (Op("u32", "xor", (hi[1], c[1])), k[0])), lo[1],
             Op("u32", "xor", (Op("u32", "xor", (hi[0], c[3])), k[1])), lo[0]]
        k = [Op("u32", "add", (k[0], Const("u32", _PHILOX_W[0]))),
             Op("u32", "add", (k[1], Const("u32", _PHILOX_W[1])))]
    return c


def _rng(lw, inst, index, which):
    if inst.attrs.get("algorithm") not in ("rng_philox", "rng_default"):
        raise Unsupported(f"rng-bit-generator algorithm {inst.attrs.get('algorithm')}")
    state = [lw.operand(inst, 0, (ix.c64(i),)) for i in range(3)]
    key, lo, hi = state
    bits_shape = inst.shape.tuple_shapes[1]
    wide = bits_shape.dtype in ("u64", "s64")
    if bits_shape.dtype not in ("u32", "s32", "u64", "s64"):
        raise Unsupported(f"rng-bit-generator producing {bits_shape.dtype}")
    words = bits_shape.size * (2 if wide else 1)
    blocks = -(-words // 4)
    if which == 0:                # new state: counter advanced by the blocks used
        new_lo = Op("u64", "add", (lo, Const("u64", blocks)))
        carry = Op("u64", "convert", (Op("pred", "compare", (new_lo, lo), "LT"),))
        new_hi = Op("u64", "add", (hi, carry))
        i = index[0]
        return Op("u64", "select", (ix.compare(i, ix.c64(0), "EQ"), key, Op(
            "u64", "select", (ix.compare(i, ix.c64(1), "EQ"), new_lo, new_hi))))

    def word(w):
        block = Op("u64", "convert", (ix.div(w, 4),))
        block_lo = Op("u64", "add", (lo, block))
        block_hi = Op("u64", "add", (hi, Op("u64", "convert", (
            Op("pred", "compare", (block_lo, lo), "LT"),))))
        counter = [_u32(block_lo), _u32(Op("u64", "shift-right-logical", (block_lo, Const("u64", 32)))),
                   _u32(block_hi), _u32(Op("u64", "shift-right-logical", (block_hi, Const("u64", 32))))]
        keys = [_u32(key), _u32(Op("u64", "shift-right-logical", (key, Const("u64", 32))))]
        out = _philox(counter, keys)
        lane = ix.mod(w, 4)
        return Op("u32", "select", (ix.compare(lane, ix.c64(0), "EQ"), out[0], Op(
            "u32", "select", (ix.compare(lane, ix.c64(1), "EQ"), out[1], Op(
                "u32", "select", (ix.compare(lane, ix.c64(2), "EQ"), out[2], out[3]))))))
    flat = ix.linearize(index, bits_shape.dims)
    if not wide:
        return Op(bits_shape.dtype, "bitcast-convert", (word(flat),)) \
            if bits_shape.dtype == "s32" else word(flat)
    low = Op("u64", "convert", (word(ix.mul(flat, ix.c64(2))),))
    high = Op("u64", "convert", (word(ix.add(ix.mul(flat, ix.c64(2)), ix.c64(1))),))
    bits = Op("u64", "or", (low, Op("u64", "shift-left", (high, Const("u64", 32)))))
    return Op(bits_shape.dtype, "bitcast-convert", (bits,)) if bits_shape.dtype == "s64" else bits


def _select_and_scatter(lw, inst, index):
    operand, source, init = inst.operands
    window = inst.attrs["window"]
    out_dims = source.shape.dims
    outer = lw.key(inst)
    # The windows that contain this position: window element k of window s
    # covers it when s*stride + k - pad_lo == position.
    starts, covers = [], None
    for d, (i, w) in enumerate(zip(index, window)):
        k = ReduceVar(S64, outer, d)
        num = ix.sub(ix.add(i, ix.c64(w.pad_lo)), k)
        s = ix.div(ix.clamp(num, 0, (out_dims[d] - 1) * w.stride), w.stride)
        ok = Op("pred", "and", (ix.compare(num, ix.c64(0), "GE"),
                                ix.compare(num, ix.c64((out_dims[d] - 1) * w.stride), "LE")))
        if w.stride > 1:
            ok = Op("pred", "and", (ok, ix.compare(ix.mod(ix.clamp(num, 0, (out_dims[d] - 1) * w.stride),
                                                          w.stride), ix.c64(0), "EQ")))
        covers = ix.both(covers, ok)
        starts.append(s)
    # Which element of window `starts` the select computation picks (first wins ties).
    inner = lw.key(inst, "select")
    valid, positions = _window_positions(starts, window, operand.shape.dims, inner)
    value = lw._load_or_expr(operand, tuple(positions))
    flat = ix.linearize([ReduceVar(S64, inner, d) for d in range(len(window))],
                        [w.size for w in window])
    dtype = operand.shape.dtype
    accs = (Var("pred", "sel.has"), Var(dtype, "sel.val"), Var(S64, "sel.pos"))
    curs = (Var("pred", "sel.cur_has"), Var(dtype, "sel.cur_val"), Var(S64, "sel.cur_pos"))
    sel_accs, sel_curs, (keep_acc,) = lw.combiner(inst.attrs["select"], 1)
    keep = _substitute(keep_acc, {sel_accs[0]: accs[1], sel_curs[0]: curs[1]})
    take_acc = Op("pred", "and", (accs[0], Op("pred", "or", (Op("pred", "not", (curs[0],)), keep))))
    combined = tuple(Op(a.dtype, "select", (take_acc, a, c)) for a, c in zip(accs, curs))
    inits = (Const("pred", False), Const(dtype, 0), ix.c64(-1))
    bodies = (valid if valid is not None else Const("pred", True), value, flat)
    chosen = Reduce(S64, inner, tuple(w.size for w in window), accs, curs, combined, inits,
                    bodies, result=2)
    mine = ix.linearize([ReduceVar(S64, outer, d) for d in range(len(window))],
                        [w.size for w in window])
    selected = Op("pred", "and", (covers, ix.compare(chosen, mine, "EQ")))
    src = lw._load_or_expr(source, tuple(starts))
    s_accs, s_curs, (scattered,) = lw.combiner(inst.attrs["scatter"], 1)
    flag = Var("pred", "scatter.flag")
    combined = (Op(dtype, "select", (flag, scattered, s_accs[0])),)
    return Reduce(dtype, outer, tuple(w.size for w in window), (s_accs[0],), (flag, s_curs[0]),
                  combined, (lw.operand(inst, 2, ()),), (selected, src), 0)


def _substitute(expr, mapping):
    """expr with Vars replaced (combiner computations are tiny trees)."""
    if expr in mapping:
        return mapping[expr]
    if isinstance(expr, Op):
        return Op(expr.dtype, expr.opcode, tuple(_substitute(a, mapping) for a in expr.args),
                  expr.attr)
    return expr


_EXPRESSIONS = {
    "broadcast": _broadcast, "reshape": _reshape, "bitcast": _reshape,
    "transpose": _transpose, "slice": _slice, "reverse": _reverse, "iota": _iota,
    "pad": _pad, "concatenate": _concatenate, "dynamic-slice": _dynamic_slice,
    "dynamic-update-slice": _dynamic_update_slice, "reduce": _reduce,
    "reduce-window": _reduce_window, "dot": _dot, "convolution": _convolution,
    "get-tuple-element": _get_tuple_element, "select-and-scatter": _select_and_scatter,
}
