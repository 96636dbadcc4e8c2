"""The one opcode table: every HLO opcode kerasjit knows, with its kind.

Passes, fusion and code generation decide by kind, never by name (XLA's
HLO_OPCODE_LIST, TVM's OpPatternKind). Arity -1 means variadic.
"""
from dataclasses import dataclass

ELEMENTWISE = "elementwise"   # out[i] = f(a[i], b[i], ...), same shape
BROADCAST = "broadcast"       # replicates its operand along new dims
INJECTIVE = "injective"       # moves elements (reshape, transpose, slice...)
REDUCE = "reduce"             # combines elements with a called computation
OPAQUE = "opaque"             # dot, convolution, gather...: own kernels
STRUCTURAL = "structural"     # parameter, constant, tuple plumbing


@dataclass(frozen=True)
class Opcode:
    name: str
    arity: int
    kind: str


def _table(kind, arity, names):
    return {n: Opcode(n, arity, kind) for n in names.split()}


UNARY = ("abs negate exponential exponential-minus-one log log-plus-one sqrt rsqrt cbrt "
         "tanh logistic sine cosine tan floor ceil round-nearest-afz round-nearest-even "
         "sign not is-finite convert bitcast-convert popcnt count-leading-zeros "
         "real imag erf copy reduce-precision")
BINARY = ("add subtract multiply divide remainder maximum minimum power atan2 and or xor "
          "shift-left shift-right-logical shift-right-arithmetic compare complex")

OPCODES = {
    **_table(ELEMENTWISE, 1, UNARY),
    **_table(ELEMENTWISE, 2, BINARY),
    **_table(ELEMENTWISE, 3, "select clamp"),
    **_table(BROADCAST, 1, "broadcast"),
    **_table(BROADCAST, 0, "iota"),
    **_table(INJECTIVE, 1, "reshape transpose slice reverse bitcast"),
    **_table(INJECTIVE, 2, "pad set-dimension-size"),
    **_table(INJECTIVE, -1, "concatenate dynamic-slice dynamic-update-slice"),
    **_table(REDUCE, -1, "reduce reduce-window"),
    **_table(OPAQUE, 2, "dot"),
    **_table(OPAQUE, 2, "convolution"),
    **_table(OPAQUE, 3, "select-and-scatter"),
    **_table(OPAQUE, 2, "gather"),
    **_table(OPAQUE, -1, "scatter sort"),
    **_table(OPAQUE, 1, "rng-bit-generator"),
    **_table(STRUCTURAL, 0, "parameter constant"),
    **_table(STRUCTURAL, -1, "tuple"),
    **_table(STRUCTURAL, 1, "get-tuple-element"),
    **_table(STRUCTURAL, -1, "call"),
}


def opcode(name):
    """The table entry for `name`; a clear error for an opcode we do not know."""
    try:
        return OPCODES[name]
    except KeyError:
        raise NotImplementedError(f"HLO opcode '{name}' is not supported by kerasjit") from None
