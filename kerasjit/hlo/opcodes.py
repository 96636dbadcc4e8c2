"""The one opcode table: a record per HLO opcode kerasjit knows.

Passes, fusion and code generation decide by a record's fields, never by
name (XLA's HLO_OPCODE_LIST, TVM's OpPatternKind). An elementwise opcode's
record also carries its numpy reference (the evaluator runs it), its cost
class, the element types it is defined on and where its tests draw inputs;
each backend keeps one rule per elementwise opcode (backends/cpu/ops.py,
backends/gpu/cuda_ops.py) or declares it a fallback. Arity -1 means variadic.
"""
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import elementwise as ref

ELEMENTWISE = "elementwise"   # out[i] = f(a[i], b[i], ...), same shape
BROADCAST = "broadcast"       # replicates its operand along new dims
INJECTIVE = "injective"       # moves elements (reshape, transpose, slice...)
REDUCE = "reduce"             # combines elements with a called computation
OPAQUE = "opaque"             # dot, convolution, gather...: own kernels
STRUCTURAL = "structural"     # parameter, constant, tuple plumbing
CONTROL = "control"           # runs called computations: call, while, conditional

# Cost classes: what fusion and thread splitting weigh.
FREE = "free"                       # recomputed by each user rather than stored
ARITHMETIC = "arithmetic"           # an instruction or a few
TRANSCENDENTAL = "transcendental"   # a math-library call's worth (~16 arithmetic ops)

# Element type classes.
FLOAT, INT, PRED, COMPLEX = "float", "int", "pred", "complex"


@dataclass(frozen=True)
class Opcode:
    name: str
    arity: int
    kind: str
    cost: str = ARITHMETIC
    types: frozenset = frozenset()      # element type classes of an elementwise opcode
    reference: Callable = None          # numpy (inst, *operands) of an elementwise opcode
    result: str = "operand"             # its element type: the operand's, "pred", or "given"
    attributes: tuple = ()              # the attributes its instruction needs
    positive: bool = False              # tests draw its float inputs > 0 (log, sqrt...)

    @property
    def plain(self):
        """An elementwise opcode its tests build from operands alone (one or two
        of one element type), without attributes or a result type of its own."""
        return self.kind == ELEMENTWISE and self.arity in (1, 2) and not self.attributes \
            and self.result != "given" and COMPLEX not in self.types


def _ew(name, arity, types, reference, **fields):
    return Opcode(name, arity, ELEMENTWISE, types=frozenset(types.split()),
                  reference=reference, **fields)


def _unary(name, types, fn, **fields):
    return _ew(name, 1, types, ref.unary(fn), **fields)


def _binary(name, types, fn, **fields):
    return _ew(name, 2, types, ref.binary(fn) if isinstance(fn, np.ufunc) else fn, **fields)


def _table(kind, arity, names, **fields):
    return [Opcode(n, arity, kind, **fields) for n in names.split()]


_T = dict(cost=TRANSCENDENTAL)

_RECORDS = [
    _unary("abs", "float int", np.abs),
    _unary("negate", "float int", np.negative, cost=FREE),
    _unary("exponential", "float", np.exp, **_T),
    _unary("exponential-minus-one", "float", np.expm1, **_T),
    _unary("log", "float", np.log, positive=True, **_T),
    _unary("log-plus-one", "float", np.log1p, positive=True, **_T),
    _unary("sqrt", "float", np.sqrt, positive=True),
    _unary("rsqrt", "float", lambda x: 1 / np.sqrt(x), positive=True),
    _unary("cbrt", "float", np.cbrt, **_T),
    _unary("tanh", "float", np.tanh, **_T),
    _unary("logistic", "float", lambda x: 1 / (1 + np.exp(-x)), **_T),
    _unary("sine", "float", np.sin, **_T),
    _unary("cosine", "float", np.cos, **_T),
    _unary("tan", "float", np.tan, **_T),
    _unary("floor", "float", np.floor),
    _unary("ceil", "float", np.ceil),
    _ew("round-nearest-afz", 1, "float", ref.round_afz),
    _unary("round-nearest-even", "float", np.rint),
    _unary("sign", "float int", lambda x: np.where(x == 0, x, np.sign(x))),  # (-0 stays -0)
    _ew("not", 1, "int pred", ref.logical_not),
    _unary("is-finite", "float", np.isfinite, result="pred"),
    _ew("convert", 1, "float int pred", ref.convert, result="given", cost=FREE),
    _ew("bitcast-convert", 1, "float int", ref.bitcast_convert, result="given"),
    _ew("popcnt", 1, "int", ref.popcnt),
    _ew("count-leading-zeros", 1, "int", ref.count_leading_zeros),
    _unary("real", "complex", np.real),
    _ew("imag", 1, "complex", ref.imag),
    _ew("erf", 1, "float", ref.erf, **_T),
    _ew("copy", 1, "float int pred", lambda inst, x: x.copy(), cost=FREE),
    _ew("reduce-precision", 1, "float", ref.reduce_precision,
        attributes=("mantissa_bits", "exponent_bits")),
    _binary("add", "float int", np.add),
    _binary("subtract", "float int", np.subtract),
    _binary("multiply", "float int", np.multiply),
    _binary("divide", "float int", ref.divide),
    _binary("remainder", "float int", ref.remainder),
    _binary("maximum", "float int", np.maximum),
    _binary("minimum", "float int", np.minimum),
    _binary("power", "float int", ref.power, positive=True, **_T),
    _binary("atan2", "float", np.arctan2, **_T),
    _binary("and", "int pred", np.bitwise_and),
    _binary("or", "int pred", np.bitwise_or),
    _binary("xor", "int pred", np.bitwise_xor),
    _binary("shift-left", "int", ref.shift),
    _binary("shift-right-logical", "int", ref.shift),
    _binary("shift-right-arithmetic", "int", ref.shift),
    _binary("compare", "float int pred", ref.compare, result="pred", attributes=("direction",)),
    _binary("complex", "complex", lambda inst, re, im: re + 1j * im),
    _ew("select", 3, "float int pred", lambda inst, p, t, f: np.where(p, t, f)),
    _ew("clamp", 3, "float int", ref.clamp),
    *_table(BROADCAST, 1, "broadcast", cost=FREE),
    *_table(BROADCAST, 0, "iota", cost=FREE),
    *_table(INJECTIVE, 1, "reshape transpose slice reverse bitcast", cost=FREE),
    *_table(INJECTIVE, 2, "pad set-dimension-size"),
    *_table(INJECTIVE, -1, "concatenate dynamic-slice dynamic-update-slice"),
    *_table(REDUCE, -1, "reduce reduce-window"),
    *_table(OPAQUE, 2, "dot convolution gather"),
    *_table(OPAQUE, 3, "select-and-scatter"),
    *_table(OPAQUE, -1, "scatter sort"),
    *_table(OPAQUE, 1, "rng-bit-generator"),
    *_table(STRUCTURAL, 0, "parameter constant", cost=FREE),
    *_table(STRUCTURAL, 1, "get-tuple-element", cost=FREE),
    *_table(STRUCTURAL, -1, "tuple"),
    *_table(CONTROL, -1, "call conditional"),
    *_table(CONTROL, 1, "while"),
]

OPCODES = {record.name: record for record in _RECORDS}


def opcode(name):
    """The record of `name`; a clear error for an opcode we do not know."""
    try:
        return OPCODES[name]
    except KeyError:
        raise NotImplementedError(f"HLO opcode '{name}' is not supported by kerasjit") from None


def elementwise_opcodes(types=None, arity=None, plain=False):
    """The elementwise records, those defined on type class `types`, of `arity`,
    `plain` (see Opcode.plain) where asked."""
    return [r for r in _RECORDS if r.kind == ELEMENTWISE
            and (types is None or types in r.types) and (arity is None or r.arity == arity)
            and (r.plain or not plain)]
