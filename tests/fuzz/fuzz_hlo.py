"""Random HLO programs through every backend, checked against the evaluator, with shrinking.

    python tests/fuzz/fuzz_hlo.py --seed 0 --programs 10000 [--seconds N] [--backends cpu,gpu-host]

Program i of a run with seed s is generated from np.random.default_rng([s, i])
(`--start i --programs 1` replays it alone). Its arguments are drawn per
parameter name, so a shrunk program keeps the values of the parameters it keeps.

The generator tracks what it knows of each value, so that a correct backend
can differ from the evaluator only where XLA lets rounding differ:
  - exact: made by correctly rounded IEEE operations only (and integer ones):
    the same bits in every backend. Discontinuous ops (compare, floor, convert
    to an integer, argmax...) take only exact operands, where a last-bit
    difference would flip them.
  - bound and grid: |value| <= bound, and value a multiple of 2**-grid. Float
    arguments are multiples of 1/8, so their sums are exact in any order (while
    bound * 2**grid fits the mantissa): such reductions, dots and convolutions
    stay exact; others are compared with a tolerance.
Operands are guarded into each op's domain: log and sqrt of abs(x) + 0.5,
integer divisors never 0, shift amounts masked to the width, exp of a clamped x.
"""
import argparse
import itertools
import math
import os
import pickle
import select
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))    # the repository: tests.support
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from kerasjit.hlo import Instruction, Shape, parse_module, print_module, verify  # noqa: E402
from kerasjit.hlo.evaluator import evaluate  # noqa: E402
from kerasjit.hlo.shape import DTYPES  # noqa: E402
from kerasjit.errors import Unsupported  # noqa: E402

FLOATS = ("f32", "f64")
INTS = ("s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64")
DTYPE_WEIGHTS = {"f32": 10, "f64": 2, "s32": 4, "s64": 1, "u32": 1, "u64": 1, "s8": 1,
                 "u8": 1, "s16": 1, "u16": 1, "pred": 1}
MANTISSA_BITS = {"f32": 24, "f64": 53}
MAX_ELEMENTS = 256
ARG_BOUND, ARG_GRID = 4, 3          # float arguments: multiples of 1/8 in [-4, 4]
# Inexact floats are clamped to this before use: far from overflow, where a
# last-bit difference becomes inf against a finite number.
INEXACT_LIMIT = 1e6

# ------------------------------------------------------------ opcode tables

ANY, EXACT, POSITIVE, NONZERO, SHIFT = "any", "exact", "positive", "nonzero", "shift"


def _grid_max(*grids):
    return None if None in grids else max(grids)


def _on_integers(*grids):
    return 0


def _no_grid(*grids):
    return None


def _largest(*bounds):
    return max(bounds)


@dataclass(frozen=True)
class FloatOp:
    """How the generator uses a float opcode: what each operand must be (ANY,
    EXACT, POSITIVE: abs(x) + 0.5, NONZERO, or ("range", r): clamped into
    [-r, r]), whether the result is correctly rounded (the same bits in every
    backend), and its bound and grid from its operands'."""
    operands: tuple
    rounded: bool = True
    bound: callable = _largest
    grid: callable = _grid_max
    zero_sign: bool = True      # False: max(-0, +0) may be either zero


def _unit(*bounds):
    return 1.0


FLOAT_OPS = {
    "abs": FloatOp((ANY,)), "negate": FloatOp((ANY,)), "copy": FloatOp((ANY,)),
    "floor": FloatOp((EXACT,), bound=lambda b: b + 1, grid=_on_integers),
    "ceil": FloatOp((EXACT,), bound=lambda b: b + 1, grid=_on_integers),
    "round-nearest-afz": FloatOp((EXACT,), bound=lambda b: b + 1, grid=_on_integers),
    "round-nearest-even": FloatOp((EXACT,), bound=lambda b: b + 1, grid=_on_integers),
    "sign": FloatOp((EXACT,), bound=_unit, grid=_on_integers),
    "is-finite": FloatOp((ANY,), bound=_unit, grid=_on_integers),
    "sqrt": FloatOp((POSITIVE,), bound=math.sqrt, grid=_no_grid),
    "rsqrt": FloatOp((POSITIVE,), False, lambda b: 1.5, _no_grid),
    "cbrt": FloatOp((POSITIVE,), False, lambda b: b ** (1 / 3), _no_grid),
    "log": FloatOp((POSITIVE,), False, lambda b: max(math.log(b), 0.7), _no_grid),
    "log-plus-one": FloatOp((POSITIVE,), False, math.log1p, _no_grid),
    "exponential": FloatOp((("range", 20),), False, math.exp, _no_grid),
    "exponential-minus-one": FloatOp((("range", 20),), False, math.exp, _no_grid),
    "tanh": FloatOp((ANY,), False, _unit, _no_grid),
    "logistic": FloatOp((ANY,), False, _unit, _no_grid),
    "erf": FloatOp((ANY,), False, _unit, _no_grid),
    "sine": FloatOp((("range", 32),), False, _unit, _no_grid),
    "cosine": FloatOp((("range", 32),), False, _unit, _no_grid),
    "tan": FloatOp((("range", 1.2),), False, lambda b: 2.6, _no_grid),   # away from the poles
    "add": FloatOp((ANY, ANY), bound=lambda a, b: a + b),
    "subtract": FloatOp((ANY, ANY), bound=lambda a, b: a + b),
    "multiply": FloatOp((ANY, ANY), bound=lambda a, b: a * b,
                        grid=lambda a, b: None if None in (a, b) else a + b),
    "divide": FloatOp((ANY, NONZERO), bound=lambda a, b: math.inf, grid=_no_grid),
    "remainder": FloatOp((EXACT, NONZERO), bound=lambda a, b: a),
    "maximum": FloatOp((ANY, ANY), zero_sign=False),
    "minimum": FloatOp((ANY, ANY), zero_sign=False),
    "power": FloatOp((POSITIVE, ("range", 3)), False, lambda a, b: (a + 1) ** 3, _no_grid),
    "atan2": FloatOp((ANY, POSITIVE), False, lambda a, b: 3.2, _no_grid),
}
INT_OPS = {
    **{op: (ANY,) for op in ("abs", "negate", "sign", "not", "popcnt", "count-leading-zeros",
                             "copy")},
    **{op: (ANY, ANY) for op in ("add", "subtract", "multiply", "maximum", "minimum", "and",
                                 "or", "xor")},
    "divide": (ANY, NONZERO), "remainder": (ANY, NONZERO),
    **{op: (ANY, SHIFT) for op in ("shift-left", "shift-right-logical",
                                   "shift-right-arithmetic")},
}
PRED_OPS = {"not": (ANY,), "copy": (ANY,), "and": (ANY, ANY), "or": (ANY, ANY),
            "xor": (ANY, ANY)}
# Elementwise opcodes with generators of their own.
SPECIAL_OPS = {"compare", "select", "clamp", "convert", "bitcast-convert"}
# Elementwise opcodes (and uses) never generated, and why.
NOT_GENERATED = {
    "real": "complex numbers: no backend compiles them",
    "imag": "complex numbers: no backend compiles them",
    "complex": "complex numbers: no backend compiles them",
    "reduce-precision": "the backends leave it to TensorFlow (Unsupported)",
    # Also not generated: integer power (no backend generates it: Unsupported),
    # and bitcast-convert from an integer to a float, whose arbitrary bits
    # include denormals: the CPU backend flushes them, as TensorFlow does.
}

# --------------------------------------------------------------- values


def shape_text(dtype, dims):
    return f"{dtype}[{','.join(map(str, dims))}]"


def type_bound(dtype):
    if dtype == "pred":
        return 1
    if dtype in FLOATS:
        return math.inf
    info = np.iinfo(DTYPES[dtype])
    return max(-int(info.min), int(info.max))


def on_grid(dtype, bound, grid):
    """`grid` if multiples of 2**-grid up to `bound` are all exact in `dtype`, else None."""
    if grid is None or dtype not in FLOATS:
        return grid
    return grid if bound * 2.0 ** grid < 2.0 ** MANTISSA_BITS[dtype] else None


@dataclass(frozen=True)
class Value:
    """An HLO value of the program being built, and what is known of it (see
    the module's docstring)."""
    name: str
    dtype: str
    dims: tuple
    exact: bool = True
    bound: float = math.inf
    grid: int = 0
    zero_sign: bool = True      # a zero's sign is the same everywhere (not after max/min/sums)
    tuple_shape: str = None     # (a tuple-shaped instruction: dtype and dims unused)

    @property
    def shape(self):
        return self.tuple_shape or shape_text(self.dtype, self.dims)

    @property
    def size(self):
        return math.prod(self.dims)


def literal_text(dtype, value):
    if dtype == "pred":
        return "true" if value else "false"
    return repr(float(value)) if dtype in FLOATS else str(int(value))


class Builder:
    """HLO text of one entry computation (and the scalar computations it calls),
    with the facts known about each value."""

    def __init__(self, rng):
        self.rng = rng
        self.lines, self.computations, self.params = [], {}, []
        self.names = itertools.count()
        self.used = set()       # names of values some instruction reads
        self.definitions = {}   # name -> its line (emitted instructions)

    def emit(self, opcode, dtype, dims, operands=(), attrs="", **facts):
        """Facts not given are those of data movement: exact if every operand
        is, the largest bound, the coarsest grid."""
        dims = tuple(int(d) for d in dims)
        name = f"{opcode}.{next(self.names)}"
        args = self._args(operands)
        self.lines.append(f"  %{name} = {shape_text(dtype, dims)} {opcode}({args}){attrs}")
        self.definitions[name] = self.lines[-1]
        grid = _grid_max(*(v.grid for v in operands)) if operands else 0
        known = dict(exact=all(v.exact for v in operands),
                     bound=max((v.bound for v in operands), default=0.0), grid=grid,
                     zero_sign=all(v.zero_sign for v in operands))
        known.update(facts)
        known["bound"] = min(known["bound"], type_bound(dtype))
        known["grid"] = on_grid(dtype, known["bound"], known["grid"])
        return Value(name, dtype, dims, **known)

    def tuple_op(self, shape, opcode, operands, attrs):
        name = f"{opcode}.{next(self.names)}"
        self.lines.append(f"  %{name} = {shape} {opcode}({self._args(operands)}){attrs}")
        return Value(name, None, (), tuple_shape=shape)

    def _args(self, operands):
        self.used.update(v.name for v in operands)
        return ", ".join(f"{v.shape} %{v.name}" for v in operands)

    def parameter(self, dtype, dims):
        number, name = len(self.params), f"p{len(self.params)}"
        self.params.append(name)
        self.lines.append(f"  %{name} = {shape_text(dtype, dims)} parameter({number})")
        float_ = dtype in FLOATS
        return Value(name, dtype, tuple(dims), True, ARG_BOUND if float_ else type_bound(dtype),
                     ARG_GRID if float_ else 0)

    def constant(self, dtype, value):
        name = f"c.{next(self.names)}"
        self.lines.append(f"  %{name} = {dtype}[] constant({literal_text(dtype, value)})")
        grid = next((g for g in range(12) if float(value) * 2 ** g == int(float(value) * 2 ** g)),
                    None) if math.isfinite(value) else None
        return Value(name, dtype, (), True, abs(float(value)), grid)

    def full(self, dtype, dims, value):
        scalar = self.constant(dtype, value)
        return self.broadcast(scalar, dims, ()) if dims else scalar

    def broadcast(self, x, dims, kept):
        return self.emit("broadcast", x.dtype, dims, [x], f", dimensions={{{_ints(kept)}}}")

    def reshape(self, x, dims):
        return x if tuple(dims) == x.dims else self.emit("reshape", x.dtype, dims, [x])

    def computation(self, name, text):
        self.computations.setdefault(name, text)
        return name

    def module_text(self, outputs):
        body = list(self.lines)
        if len(outputs) == 1:
            at = next(i for i, line in enumerate(body) if line.startswith(f"  %{outputs[0].name} "))
            body[at] = "  ROOT" + body[at][1:]
        else:
            shapes = ", ".join(v.shape for v in outputs)
            args = ", ".join(f"{v.shape} %{v.name}" for v in outputs)
            body.append(f"  ROOT %root = ({shapes}) tuple({args})")
        return "\n".join(["HloModule fuzz", "", *self.computations.values(),
                          "ENTRY %main {", *body, "}", ""])


def _ints(values):
    return ",".join(map(str, values))


def _size_ok(dims):
    return math.prod(dims) <= MAX_ELEMENTS


# -------------------------------------------------------------- choices


def choice(rng, items, weights=None):
    items = list(items)
    if weights is not None:
        weights = np.asarray(weights, dtype=float)
        weights = weights / weights.sum()
    return items[rng.choice(len(items), p=weights)]


def random_dtype(rng, allowed=None):
    types = [t for t in DTYPE_WEIGHTS if allowed is None or t in allowed]
    return choice(rng, types, [DTYPE_WEIGHTS[t] for t in types])


def random_dims(rng):
    while True:
        rank = int(rng.choice(5, p=[0.06, 0.24, 0.36, 0.24, 0.1]))
        dims = tuple(int(d) for d in rng.choice([1, 1, 2, 3, 4, 5, 6, 7, 8], size=rank))
        if _size_ok(dims):
            return dims


def factorization(rng, size):
    """Random dims whose product is `size`."""
    rank = int(rng.integers(1, 5))
    dims = [1] * rank
    n, p = size, 2
    while n > 1:
        while n % p:
            p += 1
        dims[rng.integers(rank)] *= p
        n //= p
    return tuple(dims) if rng.random() < 0.9 or size > 1 else ()


def pick(rng, pool, accept=lambda v: True):
    """A pool value, later ones likelier (chains more than fans)."""
    candidates = [(i, v) for i, v in enumerate(pool) if accept(v)]
    if not candidates:
        return None
    weights = [(1 + i) ** 2 for i, _ in candidates]
    return choice(rng, [v for _, v in candidates], weights)


# ------------------------------------------------------------ operands


def fresh(b, dtype, dims):
    """A new value: a parameter, a constant or an iota."""
    r = b.rng.random()
    if r < 0.75:
        return b.parameter(dtype, dims)
    if r < 0.85 or not dims or dtype == "pred":
        return b.full(dtype, dims, random_scalar(b.rng, dtype))
    return iota(b, dtype, dims)


def random_scalar(rng, dtype):
    if dtype == "pred":
        return bool(rng.random() < 0.5)
    if dtype in FLOATS:
        return int(rng.integers(-16, 17)) / 8
    info = np.iinfo(DTYPES[dtype])
    if rng.random() < 0.1:
        return int(choice(rng, [info.min, info.max]))
    return int(rng.integers(max(info.min, -20), min(info.max, 20), endpoint=True))


def iota(b, dtype, dims):
    d = int(b.rng.integers(len(dims)))
    return b.emit("iota", dtype, dims, attrs=f", iota_dimension={d}", bound=dims[d], grid=0)


def convertible(v, dtype):
    """Whether v converts to `dtype` the same way everywhere (floats to integers
    or pred only when exact)."""
    return v.dtype == dtype or v.exact or v.dtype not in FLOATS or dtype in FLOATS


def convert(b, x, dtype):
    if x.dtype == dtype:
        return x
    if dtype in FLOATS:
        bound, grid = (1, 0) if x.dtype == "pred" else (x.bound, x.grid)
        return b.emit("convert", dtype, x.dims, [x], bound=bound, grid=grid)
    return b.emit("convert", dtype, x.dims, [x], bound=type_bound(dtype), grid=0)


def fit(b, v, dtype, dims):
    """v converted and reshaped, sliced, padded or broadcast to `dtype` and `dims`."""
    v = convert(b, v, dtype)
    dims, n = tuple(dims), math.prod(dims)
    if v.dims == dims:
        return v
    if v.size == n:
        return b.reshape(v, dims)
    if n == 0:              # (an empty slice, as tf.matmul(a[:, :0], b[:0]) reads)
        flat = b.reshape(v, (v.size,))
        return b.reshape(b.emit("slice", dtype, (0,), [flat], ", slice={[0:0:1]}"), dims)
    if v.size == 1:
        return b.broadcast(b.reshape(v, ()), dims, ())
    flat = b.reshape(v, (v.size,))
    if n - v.size in range(1, v.size // 4 + 1):
        value = b.constant(dtype, random_scalar(b.rng, dtype))
        return b.reshape(b.emit("pad", dtype, (n,), [flat, value], f", padding=0_{n - v.size}"),
                         dims)
    if v.size < n:          # repeated: [copies, size] -> [copies * size]
        copies = -(-n // v.size)
        flat = b.reshape(b.broadcast(flat, (copies, v.size), (1,)), (copies * v.size,))
    stride = int(b.rng.integers(1, flat.size // n + 1))
    flat = b.emit("slice", dtype, (n,), [flat], f", slice={{[0:{(n - 1) * stride + 1}:{stride}]}}")
    return b.reshape(flat, dims)


def operand(b, pool, dtype, dims, exact=False):
    """A value of `dtype` and `dims`: from the pool as it is or fitted, or fresh."""
    dims = tuple(dims)
    usable = [v for v in pool if (v.exact or not exact) and convertible(v, dtype)]
    same = [v for v in usable if v.dtype == dtype and v.dims == dims]
    r = b.rng.random()
    if same and r < 0.6:
        return pick(b.rng, same)
    if usable and r < 0.9:
        return fit(b, pick(b.rng, usable), dtype, dims)
    return fresh(b, dtype, dims)


# ------------------------------------------------------------- guards


def clamped(b, x, limit):
    if x.bound <= limit or x.dtype not in FLOATS:
        return x
    lo, hi = b.full(x.dtype, x.dims, -limit), b.full(x.dtype, x.dims, limit)
    return b.emit("clamp", x.dtype, x.dims, [lo, x, hi], bound=limit, grid=x.grid)


def guarded(b, x, guard):
    """x moved into the domain `guard` names (see FloatOp)."""
    if guard == POSITIVE:
        magnitude = b.emit("abs", x.dtype, x.dims, [x])
        half = b.full(x.dtype, x.dims, 0.5)
        return b.emit("add", x.dtype, x.dims, [magnitude, half], bound=x.bound + 0.5)
    if guard == NONZERO:
        if x.dtype in FLOATS and not x.exact:
            return guarded(b, x, POSITIVE)
        zero = b.emit("compare", "pred", x.dims, [x, b.full(x.dtype, x.dims, 0)],
                      ", direction=EQ", bound=1, grid=0)
        return b.emit("select", x.dtype, x.dims, [zero, b.full(x.dtype, x.dims, 1), x])
    if guard == SHIFT:
        width = b.full(x.dtype, x.dims, DTYPES[x.dtype].itemsize * 8 - 1)
        return b.emit("and", x.dtype, x.dims, [x, width], bound=type_bound(x.dtype))
    if isinstance(guard, tuple):
        return clamped(b, x, guard[1])
    return x


# --------------------------------------------------------- elementwise


def elementwise(b, opcode, operands):
    """`opcode` on guarded operands of one dtype and shape, with its facts."""
    x = operands[0]
    if x.dtype in FLOATS:
        op = FLOAT_OPS[opcode]
        inexact = not op.rounded or not all(v.exact for v in operands)
        if inexact:       # (an exact value may be huge: inexact arithmetic stays far from inf)
            operands = [clamped(b, v, INEXACT_LIMIT) for v in operands]
        operands = [guarded(b, v, g) for v, g in zip(operands, op.operands)]
        dtype = "pred" if opcode == "is-finite" else x.dtype
        # (inexact values stay far from overflow: finite in every backend)
        return b.emit(opcode, dtype, x.dims, operands, exact=not inexact or dtype == "pred",
                      bound=op.bound(*(v.bound for v in operands)),
                      grid=op.grid(*(v.grid for v in operands)),
                      zero_sign=op.zero_sign and all(v.zero_sign for v in operands))
    guards = (PRED_OPS if x.dtype == "pred" else INT_OPS)[opcode]
    operands = [guarded(b, v, g) for v, g in zip(operands, guards)]
    moves = opcode in ("copy", "maximum", "minimum")
    return b.emit(opcode, x.dtype, x.dims, operands,
                  **({} if moves else dict(bound=type_bound(x.dtype), grid=0)))


def _usable_ops(x, arity):
    if x.dtype in FLOATS:
        return [o for o, op in FLOAT_OPS.items() if len(op.operands) == arity
                and (x.exact or EXACT not in op.operands)]
    table = PRED_OPS if x.dtype == "pred" else INT_OPS
    return [o for o, g in table.items() if len(g) == arity]


def gen_unary(b, pool):
    x = pick(b.rng, pool)
    return elementwise(b, choice(b.rng, _usable_ops(x, 1)), [x])


def gen_binary(b, pool):
    x = pick(b.rng, pool)
    opcode = choice(b.rng, _usable_ops(x, 2))
    needs_exact = x.dtype in FLOATS and EXACT in FLOAT_OPS[opcode].operands
    y = operand(b, pool, x.dtype, x.dims, exact=needs_exact)
    return elementwise(b, opcode, [x, y] if b.rng.random() < 0.5 or needs_exact else [y, x])


def gen_compare(b, pool):
    x = pick(b.rng, pool, lambda v: v.exact)
    if x is None:
        return None
    if b.rng.random() < 0.3 and x.dtype != "pred":      # ties everywhere, -0 against +0
        y = b.emit("negate", x.dtype, x.dims, [x], bound=x.bound)
    else:
        y = operand(b, pool, x.dtype, x.dims, exact=True)
    direction = choice(b.rng, ["EQ", "NE", "LT", "LE", "GT", "GE"])
    # (TOTALORDER tells -0 from +0: only zeros whose sign is certain.)
    total = ", type=TOTALORDER" if x.dtype in FLOATS and x.zero_sign and y.zero_sign \
        and b.rng.random() < 0.3 else ""
    return b.emit("compare", "pred", x.dims, [x, y], f", direction={direction}{total}",
                  bound=1, grid=0)


def gen_select(b, pool):
    x = pick(b.rng, pool)
    predicate = operand(b, pool, "pred", x.dims, exact=True)
    y = operand(b, pool, x.dtype, x.dims)
    return b.emit("select", x.dtype, x.dims, [predicate, x, y])


def gen_clamp(b, pool):
    x = pick(b.rng, pool, lambda v: v.dtype != "pred")
    if x is None:
        return None
    lo, hi = (operand(b, pool, x.dtype, x.dims) for _ in range(2))
    # (NaN bounds: clamp in the backends ignores them, XLA's propagates them; no
    # generated value is NaN.)
    if x.dtype in FLOATS and not all(v.exact for v in (lo, x, hi)):
        lo, x, hi = (clamped(b, v, INEXACT_LIMIT) for v in (lo, x, hi))
    return b.emit("clamp", x.dtype, x.dims, [lo, x, hi], bound=max(lo.bound, hi.bound),
                  zero_sign=x.dtype not in FLOATS)


def gen_convert(b, pool):
    x = pick(b.rng, pool)
    allowed = [t for t in (DTYPE_WEIGHTS if x.exact or x.dtype not in FLOATS else FLOATS)
               if t != x.dtype]
    return convert(b, x, random_dtype(b.rng, allowed))


SAME_WIDTH = {"s8": "u8", "u8": "s8", "s16": "u16", "u16": "s16", "s32": "u32", "u32": "s32",
              "s64": "u64", "u64": "s64", "f32": "s32", "f64": "u64"}


def gen_bitcast_convert(b, pool):
    x = pick(b.rng, pool, lambda v: v.dtype in SAME_WIDTH and v.exact and v.zero_sign)
    if x is None:
        return None
    to = SAME_WIDTH[x.dtype]
    if x.dtype in FLOATS and b.rng.random() < 0.5:
        to = to.replace("s", "u") if to.startswith("s") else to.replace("u", "s")
    return b.emit("bitcast-convert", to, x.dims, [x], bound=type_bound(to), grid=0)


# ------------------------------------------------------- data movement


def gen_broadcast(b, pool):
    x = pick(b.rng, pool)
    dims = list(x.dims)
    kept = list(range(len(dims)))
    for _ in range(int(b.rng.integers(1, 3))):
        if len(dims) == 5:
            break
        at = int(b.rng.integers(len(dims) + 1))
        dims.insert(at, int(b.rng.integers(1, 5)))
        kept = [k + (k >= at) for k in kept]
    if not _size_ok(dims):
        return None
    return b.broadcast(x, dims, kept)


def gen_reshape(b, pool):
    x = pick(b.rng, pool)
    return b.emit("reshape", x.dtype, factorization(b.rng, x.size), [x])


def gen_transpose(b, pool):
    x = pick(b.rng, pool, lambda v: len(v.dims) > 1)
    if x is None:
        return None
    perm = [int(p) for p in b.rng.permutation(len(x.dims))]
    return b.emit("transpose", x.dtype, [x.dims[p] for p in perm], [x],
                  f", dimensions={{{_ints(perm)}}}")


def gen_regroup(b, pool):
    """Runs of 8 regrouped as TensorFlow's SpaceToBatchND and BatchToSpaceND
    regroup a dilated convolution's rows: split into (..., 8), the outer dims
    transposed, then merged back a pair of dims at a time, an op between
    merges: a read may divide a loop's index, then its quotient again."""
    x = pick(b.rng, pool, lambda v: v.size % 16 == 0)
    if x is None:
        return None
    outer = factorization(b.rng, x.size // 8) or (x.size // 8,)
    perm = [int(p) for p in b.rng.permutation(len(outer))] + [len(outer)]
    split = b.reshape(x, (*outer, 8))
    value = b.emit("transpose", x.dtype, [split.dims[p] for p in perm], [split],
                   f", dimensions={{{_ints(perm)}}}")
    for _ in range(int(b.rng.integers(1, len(perm)))):
        d, dims = int(b.rng.integers(len(value.dims) - 1)), value.dims
        merged = (*dims[:d], dims[d] * dims[d + 1], *dims[d + 2:])
        value = elementwise(b, "not" if value.dtype == "pred" else "negate",
                            [b.reshape(value, merged)])
    return value


def gen_slice(b, pool):
    x = pick(b.rng, pool, lambda v: v.dims)
    if x is None:
        return None
    parts, dims = [], []
    for n in x.dims:
        start = int(b.rng.integers(n))
        limit = int(b.rng.integers(start + 1, n + 1))
        stride = int(b.rng.integers(1, 4))
        parts.append(f"[{start}:{limit}:{stride}]" if stride > 1 else f"[{start}:{limit}]")
        dims.append(-(-(limit - start) // stride))
    return b.emit("slice", x.dtype, dims, [x], f", slice={{{', '.join(parts)}}}")


def gen_pad(b, pool):
    x = pick(b.rng, pool, lambda v: v.dims)
    if x is None:
        return None
    for _ in range(10):
        padding = [tuple(int(v) for v in (b.rng.integers(-2, 4), b.rng.integers(-2, 4),
                                          b.rng.choice([0, 0, 1, 2]))) for _ in x.dims]
        dims = [lo + hi + n + (n - 1) * interior for n, (lo, hi, interior) in zip(x.dims, padding)]
        if min(dims) >= 1 and _size_ok(dims):
            break
    else:
        return None
    value = operand(b, pool, x.dtype, ()) if b.rng.random() < 0.3 else b.constant(
        x.dtype, random_scalar(b.rng, x.dtype))
    text = "x".join("_".join(map(str, p if p[2] else p[:2])) for p in padding)
    return b.emit("pad", x.dtype, dims, [x, value], f", padding={text}")


def gen_concatenate(b, pool):
    x = pick(b.rng, pool, lambda v: v.dims)
    if x is None:
        return None
    d = int(b.rng.integers(len(x.dims)))
    parts = [x]
    for _ in range(int(b.rng.integers(1, 3))):
        dims = list(x.dims)
        dims[d] = int(b.rng.integers(0 if b.rng.random() < 0.1 else 1, 5))
        parts.append(operand(b, pool, x.dtype, dims))
    b.rng.shuffle(parts)
    dims = list(x.dims)
    dims[d] = sum(p.dims[d] for p in parts)
    if not _size_ok(dims):
        return None
    return b.emit("concatenate", x.dtype, dims, parts, f", dimensions={{{d}}}")


def gen_reverse(b, pool):
    x = pick(b.rng, pool, lambda v: v.dims)
    if x is None:
        return None
    dims = sorted(int(d) for d in b.rng.choice(len(x.dims), int(b.rng.integers(1, len(x.dims) + 1)),
                                               replace=False))
    return b.emit("reverse", x.dtype, x.dims, [x], f", dimensions={{{_ints(dims)}}}")


def gen_iota(b, pool):
    return iota(b, random_dtype(b.rng, INTS + FLOATS), random_dims(b.rng) or (5,))


def gen_dynamic_slice(b, pool):
    x = pick(b.rng, pool, lambda v: v.dims)
    if x is None:
        return None
    sizes = [int(b.rng.integers(1, n + 1)) for n in x.dims]
    return b.emit("dynamic-slice", x.dtype, sizes, [x, *start_indices(b, pool, x.dims)],
                  f", dynamic_slice_sizes={{{_ints(sizes)}}}")


def start_indices(b, pool, dims):
    """Scalar starts of one integer type, constants or computed; out-of-range
    ones are clamped (XLA)."""
    index_type = choice(b.rng, ["s32", "s64", "u32"])
    starts = []
    for n in dims:
        if b.rng.random() < 0.6:
            low = -2 if index_type[0] == "s" else 0
            starts.append(b.constant(index_type, int(b.rng.integers(low, n + 3))))
        else:
            starts.append(b.reshape(operand(b, pool, index_type, (1,), exact=True), ()))
    return starts


def gen_dynamic_update_slice(b, pool):
    x = pick(b.rng, pool, lambda v: v.dims)
    if x is None:
        return None
    update = operand(b, pool, x.dtype, [int(b.rng.integers(1, n + 1)) for n in x.dims])
    return b.emit("dynamic-update-slice", x.dtype, x.dims,
                  [x, update, *start_indices(b, pool, x.dims)])


def gen_duplicate(b, pool):
    """An instruction again under another name (CSE merges the two)."""
    x = pick(b.rng, pool, lambda v: v.name in b.definitions)
    if x is None:
        return None
    name = f"again.{next(b.names)}"
    b.lines.append(b.definitions[x.name].replace(f"%{x.name} =", f"%{name} =", 1))
    b.definitions[name] = b.lines[-1]
    return replace(x, name=name)


# ----------------------------------------------------------- reductions

REDUCERS = {"add": 0, "maximum": -math.inf, "minimum": math.inf}


def reducer(b, opcode, dtype):
    name = f"{opcode}.{dtype}"
    s = f"{dtype}[]"
    return b.computation(name, f"""%{name} {{
  %{name}.x = {s} parameter(0)
  %{name}.y = {s} parameter(1)
  ROOT %{name}.r = {s} {opcode}({s} %{name}.x, {s} %{name}.y)
}}
""")


def identity(opcode, dtype):
    """The init value of a reduction with `opcode`."""
    if dtype == "pred":
        return opcode == "and"
    value = REDUCERS[opcode]
    if dtype in FLOATS or value == 0:
        return value
    info = np.iinfo(DTYPES[dtype])
    return int(info.min if value < 0 else info.max)


def _reduced_dims(b, x):
    count = int(b.rng.integers(0 if b.rng.random() < 0.05 else 1, len(x.dims) + 1))
    return sorted(int(d) for d in b.rng.choice(len(x.dims), count, replace=False))


def _sum_facts(b, x, length):
    """(x, facts) for a sum of `length` elements of x: exact on a grid, else
    inexact and x clamped (a reassociated sum is kept far from overflow)."""
    grid = on_grid(x.dtype, x.bound * length, x.grid)
    exact = x.exact and (grid is not None or x.dtype not in FLOATS)
    if not exact:
        x = clamped(b, x, INEXACT_LIMIT)
    return x, dict(bound=x.bound * length, grid=grid, exact=exact)


def reduce(b, x, opcode, dims):
    kept = [n for d, n in enumerate(x.dims) if d not in dims]
    facts = dict(bound=x.bound, zero_sign=x.dtype not in FLOATS)     # (not the init's bound)
    if opcode == "add":
        x, facts = _sum_facts(b, x, math.prod(x.dims[d] for d in dims))
        facts["zero_sign"] = x.dtype not in FLOATS
    init = b.constant(x.dtype, identity(opcode, x.dtype))
    return b.emit("reduce", x.dtype, kept, [x, init],
                  f", dimensions={{{_ints(dims)}}}, to_apply=%{reducer(b, opcode, x.dtype)}",
                  **facts)


def gen_reduce(b, pool):
    x = pick(b.rng, pool, lambda v: v.dims)
    if x is None:
        return None
    opcode = choice(b.rng, ["and", "or"] if x.dtype == "pred" else list(REDUCERS))
    dims = _reduced_dims(b, x)
    if dims and b.rng.random() < 0.05:         # (over an empty dim: the init value)
        empty = list(x.dims)
        empty[dims[0]] = 0
        x = fit(b, x, x.dtype, empty)
    return reduce(b, x, opcode, dims)


def gen_softmax(b, pool):
    """exp(x - max(x)) / sum(exp(x - max(x))) over some dims: reductions broadcast
    back into the elementwise ops around them, as in softmax and normalisations."""
    x = pick(b.rng, pool, lambda v: v.dims and v.dtype in FLOATS)
    if x is None:
        return None
    dims = _reduced_dims(b, x)
    kept = [d for d in range(len(x.dims)) if d not in dims]
    top = b.broadcast(reduce(b, x, "maximum", dims), x.dims, kept)
    exp = elementwise(b, "exponential", [elementwise(b, "subtract", [x, top])])
    total = b.broadcast(reduce(b, exp, "add", dims), x.dims, kept)
    return elementwise(b, "divide", [exp, total])


def gen_reduce_window(b, pool):
    x = pick(b.rng, pool, lambda v: v.dims and v.dtype != "pred")
    if x is None:
        return None
    opcode = choice(b.rng, list(REDUCERS))
    # (An empty window's max is -inf, and -inf * 0 a NaN.)
    window = random_window(b.rng, x.dims, sizes=(1, 4), pads=(0, 2), reversal=False,
                           empty=False)
    if window is None:
        return None
    window, dims = window
    facts = dict(bound=x.bound)
    if opcode == "add":
        x, facts = _sum_facts(b, x, math.prod(w[0] for w in window))
    facts["zero_sign"] = x.dtype not in FLOATS
    init = b.constant(x.dtype, identity(opcode, x.dtype))
    return b.emit("reduce-window", x.dtype, dims, [x, init],
                  f", window={window_text(window)}, to_apply=%{reducer(b, opcode, x.dtype)}",
                  **facts)


def random_window(rng, in_sizes, sizes, pads, reversal=True, empty=True):
    """([(size, stride, pad lo, pad hi, lhs dilate, rhs dilate, reversal)] per
    dim, the output sizes), or None if a window does not fit (or, unless
    `empty`, one covers only padding and holes)."""
    window, out = [], []
    for n in in_sizes:
        size = int(rng.integers(*sizes))
        stride, lhs_dilate, rhs_dilate = (int(rng.choice([1, 1, 2, 3])) for _ in range(3))
        lo, hi = (int(rng.integers(*pads)) for _ in range(2))
        padded = (n - 1) * lhs_dilate + 1 + lo + hi
        extent = (size - 1) * rhs_dilate + 1
        if padded < extent:
            return None
        out.append((padded - extent) // stride + 1)
        if not empty and not all(
                any(0 <= at <= (n - 1) * lhs_dilate and at % lhs_dilate == 0
                    for at in range(o * stride - lo, o * stride - lo + extent, rhs_dilate))
                for o in range(out[-1])):
            return None
        window.append((size, stride, lo, hi, lhs_dilate, rhs_dilate,
                       int(reversal and rng.random() < 0.2)))
    return window, out


def window_text(window):
    def field_(key, k, default):
        values = [str(w[k]) for w in window]
        return [] if all(v == default for v in values) else [f"{key}={'x'.join(values)}"]
    return "{" + " ".join(field_("size", 0, None) + field_("stride", 1, "1")
                          + ["pad=" + "x".join(f"{w[2]}_{w[3]}" for w in window)]
                          + field_("lhs_dilate", 4, "1") + field_("rhs_dilate", 5, "1")
                          + field_("rhs_reversal", 6, "0")) + "}"


def gen_argmax(b, pool):
    """TensorFlow's argmax/argmin: a variadic reduce of (value, index) pairs,
    ties to the smaller index, of exact values (never NaN: an argmax of NaNs
    follows TensorFlow's kernels, not this computation)."""
    x = pick(b.rng, pool, lambda v: v.dims and v.exact and v.dtype != "pred")
    if x is None:
        return None
    d = int(b.rng.integers(len(x.dims)))
    index_type = choice(b.rng, ["s32", "s64"])
    direction = choice(b.rng, ["GE", "LE"])
    name = f"arg{direction}.{x.dtype}.{index_type}"
    v, i = f"{x.dtype}[]", f"{index_type}[]"
    b.computation(name, f"""%{name} {{
  %{name}.a = {v} parameter(0)
  %{name}.ai = {i} parameter(1)
  %{name}.b = {v} parameter(2)
  %{name}.bi = {i} parameter(3)
  %{name}.wins = pred[] compare({v} %{name}.a, {v} %{name}.b), direction={direction}
  %{name}.value = {v} select(pred[] %{name}.wins, {v} %{name}.a, {v} %{name}.b)
  %{name}.tie = pred[] compare({v} %{name}.a, {v} %{name}.b), direction=EQ
  %{name}.least = {i} minimum({i} %{name}.ai, {i} %{name}.bi)
  %{name}.chosen = {i} select(pred[] %{name}.wins, {i} %{name}.ai, {i} %{name}.bi)
  %{name}.index = {i} select(pred[] %{name}.tie, {i} %{name}.least, {i} %{name}.chosen)
  ROOT %{name}.r = ({v}, {i}) tuple({v} %{name}.value, {i} %{name}.index)
}}
""")
    indices = b.emit("iota", index_type, x.dims, attrs=f", iota_dimension={d}")
    init = b.constant(x.dtype, identity("maximum" if direction == "GE" else "minimum", x.dtype))
    zero = b.constant(index_type, 0)
    kept = [n for k, n in enumerate(x.dims) if k != d]
    pair = b.tuple_op(f"({shape_text(x.dtype, kept)}, {shape_text(index_type, kept)})",
                      "reduce", [x, indices, init, zero], f", dimensions={{{d}}}, to_apply=%{name}")
    if b.rng.random() < 0.2:
        return b.emit("get-tuple-element", x.dtype, kept, [pair], ", index=0", exact=True,
                      bound=x.bound, grid=x.grid, zero_sign=x.dtype not in FLOATS)
    return b.emit("get-tuple-element", index_type, kept, [pair], ", index=1", exact=True,
                  bound=x.dims[d], grid=0)


# ----------------------------------------------------- gather and scatter


def start_index_values(b, pool, dims):
    """Start indices of `dims` (s32 or s64) in [-1, 6]: mostly in range of the
    small dims the generator makes, some past either end (a gather clamps
    them, a scatter skips their windows)."""
    index_type = choice(b.rng, ["s32", "s64"])
    raw = operand(b, pool, index_type, dims, exact=True)
    low = b.emit("and", index_type, dims, [raw, b.full(index_type, dims, 7)], bound=7, grid=0)
    return b.emit("subtract", index_type, dims, [low, b.full(index_type, dims, 1)], bound=7,
                  grid=0)


@dataclass
class IndexedWindows:
    """What a gather and a scatter share: the operand dims the index vector
    maps to, each operand dim's window size, the indices' batch dims, the
    batching pairs (operand dim, indices dim), where the index vector dim is
    (`implicit`: past the indices' dims, one start each), and the operand
    dims dropped from the window (of size 1)."""
    mapped: list
    sizes: list
    batch: list
    batching: list
    vector_dim: int
    implicit: bool
    dropped: list

    @property
    def indices_dims(self):
        v = self.vector_dim
        return list(self.batch) if self.implicit else self.batch[:v] + [len(self.mapped)] \
            + self.batch[v:]

    def window_sizes(self):
        operand_batching = [d for d, _ in self.batching]
        return [n for d, n in enumerate(self.sizes)
                if d not in self.dropped and d not in operand_batching]

    def spread(self, window_positions):
        """Dims of the windowed side (a gather's output, a scatter's updates):
        the window sizes at `window_positions`, the batch dims in order
        between them."""
        windows, batch = iter(self.window_sizes()), iter(self.batch)
        rank = len(self.batch) + len(self.window_sizes())
        return [next(windows) if d in window_positions else next(batch) for d in range(rank)]


def indexed_windows(rng, dims):
    """Random IndexedWindows over an operand of `dims` (none of them 0)."""
    rank = len(dims)
    mapped = [int(d) for d in rng.permutation(rank)[:int(rng.integers(1, rank + 1))]]
    sizes = [int(rng.integers(1, n + 1)) for n in dims]
    batch = [int(rng.integers(1, 4)) for _ in range(int(rng.integers(0, 3)))]
    batching = []
    free = [d for d in range(rank) if d not in mapped]
    if free and rng.random() < 0.15:      # (one slice per batch element, at its coordinate)
        d = int(choice(rng, free))
        sizes[d] = 1
        at = int(rng.integers(len(batch) + 1))
        batch.insert(at, dims[d])
        batching.append((d, at))
    implicit = len(mapped) == 1 and rng.random() < 0.3
    vector_dim = len(batch) if implicit else int(rng.integers(len(batch) + 1))
    batching = [(d, at + (at >= vector_dim)) for d, at in batching]
    dropped = sorted(d for d in range(rank) if sizes[d] == 1 and d not in dict(batching)
                     and rng.random() < 0.6)
    return IndexedWindows(mapped, sizes, batch, batching, vector_dim, implicit, dropped)


def _positions(rng, rank, count):
    return sorted(int(d) for d in rng.choice(rank, count, replace=False))


def _indexed(b, pool, accept):
    """For a gather or a scatter: an operand from the pool (no dim of 0) that
    `accept`s, random IndexedWindows over it, the positions of the window
    dims on the windowed side, that side's dims, and the start indices; None
    where nothing fits."""
    x = pick(b.rng, pool, lambda v: v.dims and all(v.dims) and v.tuple_shape is None
             and accept(v))
    if x is None:
        return None
    w = indexed_windows(b.rng, x.dims)
    windows = w.window_sizes()
    positions = _positions(b.rng, len(w.batch) + len(windows), len(windows))
    dims = w.spread(positions)
    if not (_size_ok(dims) and _size_ok(w.indices_dims)):
        return None
    return x, w, positions, dims, start_index_values(b, pool, w.indices_dims)


def _batching_attrs(w, operand_key, indices_key):
    if not w.batching:
        return ""
    return (f", {operand_key}={{{_ints(d for d, _ in w.batching)}}}"
            f", {indices_key}={{{_ints(i for _, i in w.batching)}}}")


def gen_gather(b, pool):
    """XLA's gather, as TensorFlow writes embeddings, gather_nd and resizes:
    slices at indexed starts (clamped so they fit), size-1 dims collapsed,
    the window dims anywhere among the output's; sometimes batching dims."""
    chosen = _indexed(b, pool, lambda v: True)
    if chosen is None:
        return None
    x, w, offset_dims, dims, indices = chosen
    attrs = (f", offset_dims={{{_ints(offset_dims)}}}, collapsed_slice_dims={{{_ints(w.dropped)}}}"
             f", start_index_map={{{_ints(w.mapped)}}}, index_vector_dim={w.vector_dim}"
             f", slice_sizes={{{_ints(w.sizes)}}}"
             + _batching_attrs(w, "operand_batching_dims", "start_indices_batching_dims"))
    # (the indices' facts are an integer's: they leave the values' bound and grid alone)
    return b.emit("gather", x.dtype, dims, [x, indices], attrs, exact=x.exact, bound=x.bound,
                  grid=x.grid, zero_sign=x.zero_sign)


def gen_scatter(b, pool):
    """XLA's scatter, as the gradients of gathers write it: update windows
    combined (add, maximum, minimum) into indexed places, a window that does
    not fit skipped; sometimes batching dims."""
    chosen = _indexed(b, pool, lambda v: v.dtype != "pred")
    if chosen is None:
        return None
    x, w, window_dims, update_dims, indices = chosen
    opcode = choice(b.rng, ["add", "add", "maximum", "minimum"])
    updates = operand(b, pool, x.dtype, update_dims)
    facts = dict(bound=max(x.bound, updates.bound), zero_sign=x.dtype not in FLOATS)
    if opcode == "add":        # (each element: itself and at most one update per start)
        terms = math.prod(w.batch) + 1
        exact = x.exact and updates.exact
        bound = max(x.bound, updates.bound) * terms
        grid = on_grid(x.dtype, bound, _grid_max(x.grid, updates.grid))
        if x.dtype in FLOATS and not (exact and grid is not None):
            x, updates = clamped(b, x, INEXACT_LIMIT), clamped(b, updates, INEXACT_LIMIT)
            exact, bound = False, INEXACT_LIMIT * terms
        facts.update(exact=exact, bound=bound, grid=grid)
    attrs = (f", update_window_dims={{{_ints(window_dims)}}}"
             f", inserted_window_dims={{{_ints(w.dropped)}}}"
             f", scatter_dims_to_operand_dims={{{_ints(w.mapped)}}}"
             f", index_vector_dim={w.vector_dim}"
             + _batching_attrs(w, "input_batching_dims", "scatter_indices_batching_dims"))
    attrs += f", to_apply=%{reducer(b, opcode, x.dtype)}"
    return b.emit("scatter", x.dtype, x.dims, [x, indices, updates], attrs, **facts)


# ----------------------------------------------------------- loops

LOOP_OPS = ("add", "subtract", "maximum", "minimum")


def gen_while(b, pool):
    """A counted while loop over a state of 2 to 4 values of one shape, a value
    often in it twice (TensorFlow passes a captured value beside the carried
    one it starts): each iteration passes a leaf on, or makes it of itself and
    another leaf (a sum, a difference, a max, a min), or another leaf's value
    (the state permuted). One leaf after the loop is the result."""
    x = pick(b.rng, pool, lambda v: v.tuple_shape is None and v.dtype != "pred")
    if x is None:
        return None
    if x.dtype in FLOATS and not x.exact:
        x = clamped(b, x, INEXACT_LIMIT)
    if b.rng.random() < 0.5:      # (a value made for the loop alone, which it may start in place)
        x = elementwise(b, "negate", [x])
    alike = [v for v in pool if v.tuple_shape is None and v.dtype == x.dtype and v.dims == x.dims
             and (v.exact or x.dtype not in FLOATS)] + [x, b.parameter(x.dtype, x.dims)]
    leaves = [x, *(pick(b.rng, alike) for _ in range(int(b.rng.integers(1, 4))))]
    turns, n = int(b.rng.integers(1, 4)), len(leaves)
    t, state = shape_text(x.dtype, x.dims), f"(s32[], {', '.join([shape_text(x.dtype, x.dims)] * n)})"
    k = next(b.names)
    body, cond = f"loop_body.{k}", f"loop_cond.{k}"
    lines = [f"%{body} ({body}.p: {state}) -> {state} {{", f"  %{body}.p = {state} parameter(0)",
             f"  %{body}.i = s32[] get-tuple-element({state} %{body}.p), index=0"]
    lines += [f"  %{body}.l{j} = {t} get-tuple-element({state} %{body}.p), index={j + 1}"
              for j in range(n)]
    nexts, combined = [], False
    for j in range(n):
        kind, other = choice(b.rng, ["pass", "combine", "take"], [4, 4, 2]), int(b.rng.integers(n))
        if kind == "combine":
            lines.append(f"  %{body}.n{j} = {t} {choice(b.rng, LOOP_OPS)}({t} %{body}.l{j}, "
                         f"{t} %{body}.l{other})")
            nexts.append(f"%{body}.n{j}")
            combined = True
        else:
            nexts.append(f"%{body}.l{other if kind == 'take' else j}")
    lines += [f"  %{body}.one = s32[] constant(1)",
              f"  %{body}.i2 = s32[] add(s32[] %{body}.i, s32[] %{body}.one)",
              f"  ROOT %{body}.t = {state} tuple(s32[] %{body}.i2, "
              + ", ".join(f"{t} {v}" for v in nexts) + ")", "}", ""]
    b.computation(body, "\n".join(lines))
    b.computation(cond, f"""%{cond} ({cond}.p: {state}) -> pred[] {{
  %{cond}.p = {state} parameter(0)
  %{cond}.i = s32[] get-tuple-element({state} %{cond}.p), index=0
  %{cond}.n = s32[] constant({turns})
  ROOT %{cond}.lt = pred[] compare(s32[] %{cond}.i, s32[] %{cond}.n), direction=LT
}}
""")
    init = b.tuple_op(state, "tuple", [b.constant("s32", 0), *leaves], "")
    loop = b.tuple_op(state, "while", [init], f", condition=%{cond}, body=%{body}")
    # (each turn at most doubles a leaf: a sum of two)
    bound = max(v.bound for v in leaves) * (2 ** turns if combined else 1)
    grid = _grid_max(*(v.grid for v in leaves))
    exact = all(v.exact for v in leaves) and on_grid(x.dtype, bound, grid) is not None
    return b.emit("get-tuple-element", x.dtype, x.dims, [loop],
                  f", index={int(b.rng.integers(1, n + 1))}", exact=exact, bound=bound,
                  grid=grid, zero_sign=not combined and all(v.zero_sign for v in leaves))


# ----------------------------------------------------- dot and convolution


def gen_dot(b, pool):
    dtype = random_dtype(b.rng, FLOATS + ("s32", "s64", "u8", "s16"))
    rng = b.rng
    sizes = {kind: [int(rng.integers(1, 6)) for _ in range(int(rng.integers(0, 3)))]
             for kind in ("batch", "contract", "lhs", "rhs")}
    if sizes["contract"] and rng.random() < 0.1:        # (a sum of no products: zeros)
        sizes["contract"][int(rng.integers(len(sizes["contract"])))] = 0
    if not _size_ok(sizes["batch"] + sizes["lhs"] + sizes["rhs"]):
        return None
    canonical = rng.random() < 0.5        # [batch, rows, depth] x [batch, depth, columns]

    def side(free):
        """An operand's dims (in a random or the canonical order), where its
        batch and contracting dims went, and the order of its free dims."""
        middle, last = [("contract", i) for i in range(len(sizes["contract"]))], \
            [(free, i) for i in range(len(sizes[free]))]
        kinds = [("batch", i) for i in range(len(sizes["batch"]))] + (
            last + middle if free == "lhs" else middle + last)
        order = kinds if canonical else [kinds[k] for k in rng.permutation(len(kinds))]
        dims = [sizes[kind][i] for kind, i in order]
        where = {kind: [order.index((kind, i)) for i in range(len(sizes[kind]))]
                 for kind in ("batch", "contract")}
        free_order = [i for kind, i in order if kind == free]
        return dims, where, free_order

    (ldims, lwhere, lfree), (rdims, rwhere, rfree) = side("lhs"), side("rhs")
    if not (_size_ok(ldims) and _size_ok(rdims)):
        return None
    out = sizes["batch"] + [sizes["lhs"][i] for i in lfree] + [sizes["rhs"][i] for i in rfree]
    lhs, rhs = operand(b, pool, dtype, ldims), operand(b, pool, dtype, rdims)
    attrs = ""
    if sizes["batch"]:
        attrs += (f", lhs_batch_dims={{{_ints(lwhere['batch'])}}}"
                  f", rhs_batch_dims={{{_ints(rwhere['batch'])}}}")
    attrs += (f", lhs_contracting_dims={{{_ints(lwhere['contract'])}}}"
              f", rhs_contracting_dims={{{_ints(rwhere['contract'])}}}")
    return _sum_of_products(b, "dot", dtype, out, [lhs, rhs], attrs,
                            math.prod(sizes["contract"]))


def _sum_of_products(b, opcode, dtype, dims, operands, attrs, length):
    """A dot or convolution with its facts: exact when its products and sums are."""
    lhs, rhs = operands
    bound = lhs.bound * rhs.bound * length
    grid = on_grid(dtype, bound, None if None in (lhs.grid, rhs.grid) else lhs.grid + rhs.grid)
    exact = lhs.exact and rhs.exact and (grid is not None or dtype not in FLOATS)
    if dtype in FLOATS and not exact:
        operands = [clamped(b, v, 1e3) for v in operands]
        bound = min(bound, 1e6 * length)
    return b.emit(opcode, dtype, dims, operands, attrs, exact=exact, bound=bound, grid=grid,
                  zero_sign=dtype not in FLOATS)


def gen_convolution(b, pool):
    rng = b.rng
    dtype = random_dtype(b.rng, FLOATS + ("s32",))
    spatial = int(rng.choice([1, 2, 2, 3]))
    groups, batch_groups = int(rng.choice([1, 1, 1, 2, 3])), 1
    if groups == 1 and rng.random() < 0.2:
        batch_groups = int(rng.choice([2, 3]))
    batch = batch_groups * int(rng.integers(1, 3))
    features = groups * int(rng.integers(1, 4))
    outputs = groups * batch_groups * int(rng.integers(1, 3))
    in_sizes = [int(rng.integers(1, 7)) for _ in range(spatial)]
    window = random_window(rng, in_sizes, sizes=(1, 4), pads=(-1, 3))
    if window is None:
        return None
    window, out_sizes = window
    digits = [str(d) for d in range(spatial)]

    def labels(first, second):
        return "".join(rng.permutation([first, second] + digits))
    if rng.random() < 0.5:      # TensorFlow's: b01f_01io->b01f
        lhs_l, rhs_l, out_l = (f"b{''.join(digits)}f", f"{''.join(digits)}io",
                               f"b{''.join(digits)}f")
    else:
        lhs_l, rhs_l, out_l = labels("b", "f"), labels("i", "o"), labels("b", "f")
    lhs_dims = [{"b": batch, "f": features}.get(c) or in_sizes[int(c)] for c in lhs_l]
    kernel = [w[0] for w in window]
    rhs_dims = [{"i": features // groups, "o": outputs}.get(c) or kernel[int(c)] for c in rhs_l]
    out_dims = [{"b": batch // batch_groups, "f": outputs}.get(c) or out_sizes[int(c)]
                for c in out_l]
    if not all(_size_ok(d) for d in (lhs_dims, rhs_dims, out_dims)):
        return None
    attrs = f", window={window_text(window)}, dim_labels={lhs_l}_{rhs_l}->{out_l}"
    if groups > 1:
        attrs += f", feature_group_count={groups}"
    if batch_groups > 1:
        attrs += f", batch_group_count={batch_groups}"
    lhs, rhs = operand(b, pool, dtype, lhs_dims), operand(b, pool, dtype, rhs_dims)
    return _sum_of_products(b, "convolution", dtype, out_dims, [lhs, rhs], attrs,
                            math.prod(kernel) * (features // groups))


GENERATORS = {
    gen_unary: 3, gen_binary: 4, gen_compare: 1.5, gen_select: 1.5, gen_clamp: 0.7,
    gen_convert: 1, gen_bitcast_convert: 0.3, gen_broadcast: 1, gen_reshape: 1,
    gen_transpose: 1, gen_regroup: 0.5, gen_slice: 1, gen_pad: 1, gen_concatenate: 1,
    gen_reverse: 0.7, gen_iota: 0.3, gen_dynamic_slice: 0.6, gen_dynamic_update_slice: 0.4,
    gen_reduce: 2, gen_reduce_window: 0.5, gen_argmax: 0.8, gen_softmax: 0.4, gen_dot: 1,
    gen_convolution: 0.8, gen_duplicate: 0.3, gen_while: 0.4, gen_gather: 0.6, gen_scatter: 0.5,
}


def generate(seed, index):
    """The HLO text of program `index` of the run with `seed`."""
    rng = np.random.default_rng([seed, index])
    b = Builder(rng)
    pool = [b.parameter(random_dtype(rng), random_dims(rng)) for _ in range(rng.integers(1, 4))]
    steps = int(rng.integers(2, 25))
    made = []
    while len(made) < steps:
        value = choice(rng, GENERATORS, list(GENERATORS.values()))(b, pool)
        if value is not None:
            pool.append(value)
            made.append(value)
    outputs = [made[-1]]
    unused = [v for v in dict.fromkeys(made) if v.name not in b.used | set(b.params)
              and v != made[-1]]
    if unused and rng.random() < 0.8:     # (more of the program is live)
        outputs += unused[-int(rng.integers(1, 4)):]
    return b.module_text(outputs)


# ------------------------------------------------------------ arguments


def argument(seed, index, name, shape):
    """The value of parameter `name` (by name: shrinking renumbers parameters)."""
    rng = np.random.default_rng([seed, index, zlib.crc32(name.encode())])
    dtype, dims = shape.dtype, shape.dims
    if dtype == "pred":
        return rng.random(dims) < 0.5
    if dtype in FLOATS:
        x = rng.integers(-ARG_BOUND * 8, ARG_BOUND * 8 + 1, dims) / 8
        zeros = rng.choice([0.0, -0.0], dims)       # (ties, and both signs of zero)
        return np.where((x == 0) | (rng.random(dims) < 0.1), zeros, x).astype(DTYPES[dtype])
    info = np.iinfo(DTYPES[dtype])
    x = rng.integers(max(info.min, -100), min(info.max, 100), dims, endpoint=True)
    edges = np.array([info.min, info.max], DTYPES[dtype])[rng.integers(0, 2, dims)]
    return np.where(rng.random(dims) < 0.05, edges, x.astype(DTYPES[dtype]))


def arguments(module, seed, index):
    return [argument(seed, index, p.name, p.shape) for p in module.entry.parameters]


# ------------------------------------------------------------- checking


def outputs_of(result):
    return list(result) if isinstance(result, tuple) else [result]


def _longest_reduction(module):
    """Most terms any one reduction, dot or convolution adds into an element."""
    longest = 1
    for inst in module.entry.instructions:
        if inst.opcode == "reduce":
            dims = inst.operands[0].shape.dims
            longest = max(longest, math.prod(dims[d] for d in inst.attrs["dimensions"]))
        elif inst.opcode == "reduce-window":
            longest = max(longest, math.prod(w.size for w in inst.attrs["window"]))
        elif inst.opcode == "dot":
            dims = inst.operands[0].shape.dims
            longest = max(longest, math.prod(dims[d] for d in inst.attrs["lhs_contracting_dims"]))
        elif inst.opcode == "convolution":      # window elements times input features
            kernel = inst.operands[1].shape
            outputs = kernel.dims[inst.attrs["dim_labels"].rhs.index("o")]
            longest = max(longest, kernel.size // outputs)
        elif inst.opcode == "scatter":          # each update, and the element itself
            updates = inst.operands[2].shape
            longest = max(longest, updates.size // math.prod(
                updates.dims[d] for d in inst.attrs["update_window_dims"]) + 1)
    return longest


def widened(text):
    """The module with every f32 computed in f64 (a float bitcast-convert gets
    its f32 back first): the evaluator on it tells how far f32 rounding
    alone moves the outputs."""
    module = parse_module(text)
    for comp in module.computations:
        for inst in list(comp.instructions):
            if inst.opcode == "bitcast-convert" and inst.operands[0].shape.dtype == "f32":
                narrow = Instruction(inst.name + ".f32", "convert", inst.operands[0].shape,
                                     [inst.operands[0]])
                comp.instructions.insert(comp.instructions.index(inst), narrow)
                inst.operands = [narrow]
            else:
                inst.shape = _wide(inst.shape)
                if inst.literal is not None and inst.literal.dtype == np.float32:
                    inst.literal = inst.literal.astype(np.float64)
    return module


def _wide(shape):
    if shape.is_tuple:
        return Shape.tuple([_wide(s) for s in shape.tuple_shapes])
    return Shape("f64", shape.dims) if shape.dtype == "f32" else shape


def mismatch(got, want, text, args):
    """A description of how `got` differs from the evaluator's `want`, or None.

    Floats: NaN and infinities where the evaluator has them; other elements
    within rtol 1e-4 (times the square root of the longest reduction, for
    reassociated sums) of the array's magnitude, or, failing that, within
    that tolerance plus 16 times the evaluator's own f32 rounding (from the
    module evaluated in f64), which ill-conditioned sums and differences grow."""
    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    rtol = 1e-4 * math.sqrt(_longest_reduction(parse_module(text)))
    wide = None
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {k}: {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}"
        if w.dtype.kind != "f":
            bad = g != w
        else:
            finite = np.isfinite(w)
            scale = max(1.0, float(np.max(np.abs(w[finite]), initial=0)))
            with np.errstate(invalid="ignore"):
                error = np.abs(g.astype(np.float64) - w)
            same = (g == w) | (np.isnan(g) & np.isnan(w))
            bad = np.where(finite, ~(error <= rtol * scale), ~same)
            if bad.any() and wide is None:
                with np.errstate(all="ignore"):
                    wide = outputs_of(evaluate(widened(text), args))
            if bad.any():
                w64 = np.asarray(wide[k], np.float64)
                own = np.abs(w - w64)
                bad &= ~(finite & (np.abs(g - w64) <= rtol * scale + 16 * own))
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            return (f"output {k} at {list(at)}: got {g[at]!r}, expected {w[at]!r} "
                    f"({int(bad.sum())} of {bad.size} elements differ)")
    return None


@dataclass
class Failure:
    backend: str
    kind: str           # "mismatch", or "crash: <exception type>"
    message: str

    def same_as(self, other):
        return other is not None and (self.backend, self.kind) == (other.backend, other.kind)


def expected(text, args):
    """The evaluator's outputs, or None when it rejects the program."""
    try:
        with np.errstate(all="ignore"):
            return outputs_of(evaluate(parse_module(text), args))
    except NotImplementedError:
        return None


class CpuBackend:
    name, batch = "cpu", 1

    def __init__(self):
        from kerasjit.backends.cpu import CpuBackend as Backend
        self.backend = Backend()

    def run(self, cases):
        """[(text, args)] -> per case its outputs, or the exception it raised."""
        results = []
        for text, args in cases:
            try:
                results.append(self.backend.compile(parse_module(text))(args))
            except Exception as e:      # (a crash of the compiler is a finding)
                results.append(e)
        return results


class GpuHostBackend:
    """The GPU backend's kernels built by g++ for the host (tests/support/cuda_host.py):
    a batch of programs to one build (one build each, if that one fails)."""
    name, batch = "gpu-host", 50

    def run(self, cases):
        from tests.support.cuda_host import HostDevice
        from kerasjit.backends.gpu import GpuBackend
        from kerasjit.compiler import lower
        from kerasjit.backends.gpu.cuda_ops import PRELUDE
        from kerasjit.backends.gpu.cuda_render import kernel_names, render_program
        from kerasjit.backends.gpu.executable import GpuExecutable
        from kerasjit.passes import optimize
        results, sources = [None] * len(cases), {}
        for i, (text, _) in enumerate(cases):
            try:
                module = parse_module(text)
                optimize(module)
                program = lower(module, GpuBackend.target)
                sources[i] = (program, [s for _, s in render_program(program, f"p{i}")[1]])
            except Exception as e:
                results[i] = e
        with tempfile.TemporaryDirectory(prefix="fuzz_gpu_host_") as tmp:
            libraries = _libraries(PRELUDE, {i: kernels for i, (_, kernels) in sources.items()},
                                   Path(tmp))
            for i, (program, _) in sources.items():
                try:
                    if isinstance(libraries[i], Exception):
                        raise libraries[i]
                    kernels = {id(step): (libraries[i], n)
                               for n, step in kernel_names(program, f"p{i}")}
                    results[i] = [np.asarray(o) for o in GpuExecutable(
                        program, HostDevice(Path(tmp)), kernels, [])(cases[i][1])]
                except Exception as e:
                    results[i] = e
        return results


def _libraries(prelude, kernels, tmp):
    """Program number -> the Library with its kernels (or the build's error)."""
    from tests.support.cuda_host import Library
    try:
        library = Library("\n".join([prelude] + [s for k in kernels.values() for s in k]), tmp)
        return {i: library for i in kernels}
    except RuntimeError:
        out = {}
        for i, sources in kernels.items():
            try:
                out[i] = Library("\n".join([prelude] + sources), tmp)
            except RuntimeError as e:
                out[i] = e
        return out


BACKENDS = {"cpu": CpuBackend, "gpu-host": GpuHostBackend}


class Raised(Exception):
    """An exception of a backend, as its failure kind and first line (picklable)."""

    def __init__(self, kind, message):
        super().__init__(kind, message)
        self.kind, self.message = kind, message

    @staticmethod
    def of(e):
        if isinstance(e, Raised):
            return e
        kind = "unsupported" if isinstance(e, Unsupported) else f"crash: {type(e).__name__}"
        lines = str(e).strip().splitlines()
        return Raised(kind, lines[0][:300] if lines else "")


class Isolated:
    """A backend in a child process (`--serve NAME`): a program that kills the
    process (an LLVM assertion, a fault in generated code) or hangs fails
    alone, and the run goes on with a new child."""

    def __init__(self, name, timeout=120):
        self.name, self.batch, self.timeout = name, BACKENDS[name].batch, timeout
        self.child = None

    def run(self, cases):
        results = self._ask(cases)
        if results is not None:
            return results
        if len(cases) == 1:
            return [self.died]
        return [r for case in cases for r in self.run([case])]     # which one was it?

    def _ask(self, cases):
        if self.child is None:
            self.stderr = tempfile.TemporaryFile()
            self.child = subprocess.Popen([sys.executable, __file__, "--serve", self.name],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=self.stderr)
        try:
            pickle.dump(cases, self.child.stdin)
            self.child.stdin.flush()
            if select.select([self.child.stdout], [], [], self.timeout)[0]:
                return pickle.load(self.child.stdout)
            self.child.kill()
            self.died = Raised("crash: timeout", f"no answer in {self.timeout} s")
        except (EOFError, BrokenPipeError, pickle.UnpicklingError):
            self.child.wait()
            self.stderr.seek(0)
            last = self.stderr.read().decode(errors="replace").strip().splitlines()[-1:]
            self.died = Raised(f"crash: process died ({self.child.returncode})",
                               last[0][:300] if last else "")
        self.child.wait()
        self.child = None
        return None

    def close(self):
        if self.child is not None:
            self.child.stdin.close()
            self.child.wait()
            self.child = None


def serve(name):
    """The child of Isolated: pickled case lists in on stdin, result lists out."""
    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)               # (anything printed must not corrupt the channel)
    backend = BACKENDS[name]()
    while True:
        try:
            cases = pickle.load(sys.stdin.buffer)
        except EOFError:
            return 0
        results = [Raised.of(r) if isinstance(r, Exception) else r for r in backend.run(cases)]
        pickle.dump(results, channel)
        channel.flush()


def failure_of(backend, result, want, text, args):
    if isinstance(result, Exception):
        raised = Raised.of(result)
        return Failure(backend.name, raised.kind, raised.message)
    problem = mismatch(result, want, text, args)
    return problem and Failure(backend.name, "mismatch", problem)


def check(backend, cases):
    """[(text, args, want)] -> per case its Failure on `backend`, or None."""
    results = backend.run([(text, args) for text, args, _ in cases])
    return [failure_of(backend, r, want, text, args)
            for r, (text, args, want) in zip(results, cases)]


# ------------------------------------------------------------- shrinking


def _without_dead(module):
    """Drop what the root does not use (computations too); number the
    parameters left 0..n-1."""
    entry = module.entry
    live = set(entry.post_order())
    entry.instructions = [i for i in entry.instructions if i in live]
    for n, p in enumerate(sorted(entry.parameters, key=lambda p: p.parameter_number)):
        p.parameter_number = n
    called = {c for i in entry.instructions for c in i.called_computations}
    module.computations = [c for c in module.computations if c in called or c is entry]
    return module


def _replace(module, old, new):
    entry = module.entry
    for inst in entry.instructions:
        inst.operands = [new if op is old else op for op in inst.operands]
    if entry.root is old:
        entry.root = new
    return module


def candidates(text):
    """Smaller variants of the program: outputs dropped, an instruction made
    the output, and each instruction replaced by a parameter, an operand of
    its shape or a constant."""
    root = parse_module(text).entry.root
    if root.opcode == "tuple":
        for k in range(len(root.operands)):
            module = parse_module(text)
            root = module.entry.root
            kept = [op for j, op in enumerate(root.operands) if j != k]
            if len(kept) == 1:
                module.entry.root = kept[0]
            else:
                root.operands = kept
                root.shape = Shape.tuple([op.shape for op in kept])
            yield module
    names = [i.name for i in parse_module(text).entry.instructions
             if i.opcode not in ("parameter", "constant") and not i.shape.is_tuple]
    for name in reversed(names):
        module = parse_module(text)
        module.entry.root = next(i for i in module.entry.instructions if i.name == name)
        yield module
    for name in reversed(names):        # (from the root: whole subgraphs go at once)
        for how in ("parameter", "operand", "constant"):
            module = parse_module(text)
            entry = module.entry
            old = next(i for i in entry.instructions if i.name == name)
            at = entry.instructions.index(old)
            if how == "operand":
                same = [op for op in old.operands if op.shape == old.shape]
                if not same:
                    continue
                new = same[0]
            elif how == "parameter":       # (named as `old`, so its argument stays the same)
                new = Instruction(name, "parameter", old.shape,
                                  parameter_number=len(entry.parameters))
                entry.instructions.insert(at, new)
            else:
                new = Instruction(name + ".zero", "constant", Shape(old.shape.dtype, ()),
                                  literal=np.zeros((), old.shape.numpy_dtype))
                entry.instructions.insert(at, new)
                if old.shape.dims:
                    new = Instruction(name + ".zeros", "broadcast", old.shape, [new],
                                      {"dimensions": ()})
                    entry.instructions.insert(at + 1, new)
            yield _replace(module, old, new)


def _size(module):
    """What shrinking decreases: instructions that compute, then the others,
    then the text."""
    computed = sum(i.opcode not in ("parameter", "constant") for i in module.entry.instructions)
    return computed, len(module.entry.instructions), len(print_module(module))


def shrink(text, seed, index, backend, failure, log=print):
    """The smallest program found that still fails like `failure` on `backend`."""
    current = text
    while True:
        batch, found, size = [], None, _size(parse_module(current))
        for module in candidates(current):
            try:
                _without_dead(module)
                verify(module)
                if _size(module) >= size:
                    continue
                smaller = print_module(module)
                args = arguments(parse_module(smaller), seed, index)
                want = expected(smaller, args)
            except Exception:       # (not a valid program: the next variant)
                continue
            if want is not None:
                batch.append((smaller, args, want))
            if len(batch) == backend.batch:
                found = _first_failing(backend, batch, failure)
                batch = []
                if found:
                    break
        if not found and batch:
            found = _first_failing(backend, batch, failure)
        if not found:
            return current
        current = found
        log(f"  shrunk to {len(parse_module(current).entry.instructions)} instructions")


def _first_failing(backend, batch, failure):
    for (smaller, _, _), f in zip(batch, check(backend, batch)):
        if failure.same_as(f):
            return smaller
    return None


# ------------------------------------------------------------------ runs


@dataclass
class Report:
    ran: dict = field(default_factory=dict)           # backend -> programs run
    failures: list = field(default_factory=list)      # (seed, index, Failure, shrunk text)

    def summary(self):
        return "; ".join(f"{name}: {n} programs, "
                         f"{sum(f[2].backend == name for f in self.failures)} failures"
                         for name, n in self.ran.items())


def fuzz(seed, programs, backends, start=0, seconds=None, shrink_failures=True, log=print):
    """Run programs start.. start+programs-1 of `seed` through `backends`
    (objects as CpuBackend), in batches; stop early after `seconds`.
    Refusing a program (Unsupported) is a failure too: the generator makes
    only what every backend compiles."""
    report = Report(ran={b.name: 0 for b in backends})
    deadline = None if seconds is None else time.monotonic() + seconds
    chunk = max(b.batch for b in backends)
    for first in range(start, start + programs, chunk):
        if deadline is not None and time.monotonic() > deadline:
            break
        indices = range(first, min(first + chunk, start + programs))
        cases = [_case(seed, index) for index in indices]
        for backend in backends:
            for at in range(0, len(cases), backend.batch):
                part = cases[at:at + backend.batch]
                for index, case, failure in zip(indices[at:], part, check(backend, part)):
                    report.ran[backend.name] += 1
                    if failure is None:
                        continue
                    log(f"FAIL seed={seed} index={index} {failure.backend} {failure.kind}: "
                        f"{failure.message}")
                    small = shrink(case[0], seed, index, backend, failure, log) \
                        if shrink_failures else case[0]
                    log(f"smallest failing program (seed={seed} index={index}):\n{small}")
                    report.failures.append((seed, index, failure, small))
        if (first - start) // 500 != (indices[-1] + 1 - start) // 500:
            log(f"... {indices[-1] + 1 - start} programs: {report.summary()}")
    return report


def _case(seed, index):
    """(text, arguments, the evaluator's outputs) of one program."""
    text = generate(seed, index)
    module = parse_module(text)
    verify(module)
    args = arguments(module, seed, index)
    want = expected(text, args)
    if want is None:
        raise AssertionError(f"seed {seed} index {index}: the evaluator rejects the generated "
                             f"program\n{text}")
    return text, args, want


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--programs", type=int, default=1000)
    parser.add_argument("--start", type=int, default=0, help="index of the first program")
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long")
    parser.add_argument("--backends", default="cpu", help="comma-separated: cpu,gpu-host")
    parser.add_argument("--no-shrink", action="store_true")
    parser.add_argument("--in-process", action="store_true",
                        help="run the backends in this process (a crash ends the run)")
    parser.add_argument("--print", action="store_true", help="print the programs, run nothing")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    a = parser.parse_args(argv)
    os.environ.setdefault("KERASJIT_CACHE_DIR", "")
    if a.serve:
        return serve(a.serve)
    if a.print:
        for index in range(a.start, a.start + a.programs):
            print(f"// seed={a.seed} index={index}\n{generate(a.seed, index)}")
        return 0
    backends = [BACKENDS[name]() if a.in_process else Isolated(name)
                for name in a.backends.split(",")]
    try:
        report = fuzz(a.seed, a.programs, backends, a.start, a.seconds, not a.no_shrink,
                      log=lambda s: print(s, flush=True))
    finally:
        for backend in backends:
            getattr(backend, "close", lambda: None)()
    print(report.summary(), flush=True)
    return 1 if report.failures else 0


if __name__ == "__main__":
    # Through the importable module, so that what a child pickles (Raised)
    # names a module the parent can import, not __main__.
    from tests.fuzz import fuzz_hlo
    sys.exit(fuzz_hlo.main())
