"""Algebraic simplification of the bridge's noise.

Every rewrite but the last is exact (bit for bit, -0.0 and NaN included: no
float reassociation) and keeps the value's shape, so the entry's parameters and root
tuple layout never change:

  reshape(x) to x's shape -> x          reshape(reshape(x)) -> reshape(x)
  transpose(x), identity perm -> x      transpose(transpose(x)) -> transpose(x)
  broadcast(x) to x's shape, identity dims -> x
  broadcast(broadcast(x)) -> broadcast(x)
  convert(x) to x's type -> x           copy(x) -> x
  slice(x) of all of x -> x             concatenate(x) -> x
  get-tuple-element(tuple(...)) -> the element
  x * 1 -> x (ints and floats)          x + 0 -> x, x - 0 -> x (ints)
  x + (-0.0) -> x, x - (+0.0) -> x (floats: the only exact zeros;
                                    x + 0.0 turns -0.0 into +0.0)
  select(constant p, a, b) -> a or b
  set-dimension-size(x, its static size) -> x (EnsureShape, top_k: no dynamic size)
  reshape/transpose/slice/reverse of a scalar broadcast -> a scalar broadcast
  elementwise op of scalar broadcasts -> broadcast of the scalar op
      (computes the op once; lets constant folding see scalar constants)
  x + dynamic-update-slice(zeros, u, i) -> dynamic-update-slice(x, x[i] + u, i)
      (not bit-exact: outside the window a -0.0 of x stays -0.0 where
      x + 0.0 made it +0.0)
  dot or convolution with an empty operand -> a broadcast zero
  reduce of no elements -> its init values, broadcast
  power(x, 2) -> x * x (exact), power(x, 3) -> x * x * x, power(x, 4) -> (x * x) * (x * x)
      (floats; within an ulp or two of pow, which is itself not correctly
      rounded: a multiply vectorises where a pow call per element does not,
      as in tanh-approximated gelu's x^3)

Mutates and returns the module; replaced instructions are removed.
"""
import math

import numpy as np

from ..hlo.ir import Instruction, NameUniquer
from ..hlo.opcodes import ELEMENTWISE, INJECTIVE
from ..hlo.shape import DTYPES, Shape
from .util import rewrite, uniform_value


def simplify(module):
    names = NameUniquer(module)

    def visit(inst, emit):
        def make(opcode, shape, operands, attrs, literal=None):
            """A new instruction, itself simplified; emitted unless replaced."""
            new = Instruction(names(opcode), opcode, shape, list(operands), dict(attrs), literal)
            better = _simplify(new, make)
            if better is not None:
                return better
            emit(new)
            return new
        return _simplify(inst, make)

    for comp in module.computations:
        rewrite(comp, visit)
    return module


def _simplify(inst, make):
    """What replaces `inst` (an operand, or an instruction from `make`), or None."""
    rule = _RULES.get(inst.opcode)
    result = rule(inst, *inst.operands) if rule else None
    if result is not None:
        return result if isinstance(result, Instruction) else make(*result)
    if inst.opcode in _BUILDING_RULES:
        built = _BUILDING_RULES[inst.opcode](inst, make)
        if built is not None:
            return built
    if inst.kind == INJECTIVE and len(inst.operands) == 1 and _scalar_broadcast(inst.operands[0]):
        return make("broadcast", inst.shape, inst.operands[0].operands, {"dimensions": ()})
    if (inst.kind == ELEMENTWISE and inst.shape.rank > 0 and all(
            _scalar_broadcast(op) and op.shape.dims == inst.shape.dims for op in inst.operands)):
        scalar = make(inst.opcode, Shape.array(inst.shape.dtype, ()),
                      [op.operands[0] for op in inst.operands], inst.attrs)
        return make("broadcast", inst.shape, [scalar], {"dimensions": ()})
    return None


def _add_into_window(inst, make):
    """x + dynamic-update-slice(zeros, u, starts) -> the same update of x with
    x's window plus u: a loop's gradient added into one step's slot of a list
    then touches that slot only, not the whole list on every iteration."""
    for x, update in (inst.operands, inst.operands[::-1]):
        if update.opcode == "dynamic-update-slice" and uniform_value(update.operands[0]) == 0:
            u, starts = update.operands[1], update.operands[2:]
            window = make("dynamic-slice", u.shape, [x, *starts],
                          {"dynamic_slice_sizes": u.shape.dims})
            summed = make("add", u.shape, [window, u], {})
            return make("dynamic-update-slice", inst.shape, [x, summed, *starts], {})
    return None


# Rules: (inst, *operands) -> an existing instruction, or the (opcode, shape,
# operands, attrs) of a new one, or None.

def _reshape(inst, x):
    if x.shape == inst.shape:
        return x
    if x.opcode == "reshape":
        return "reshape", inst.shape, x.operands, inst.attrs
    return None


def _transpose(inst, x):
    perm = inst.attrs["dimensions"]
    if perm == tuple(range(len(perm))):
        return x
    if x.opcode == "transpose":
        inner = x.attrs["dimensions"]
        return "transpose", inst.shape, x.operands, {"dimensions": tuple(inner[p] for p in perm)}
    return None


def _broadcast(inst, x):
    dims = inst.attrs["dimensions"]
    if x.shape == inst.shape and dims == tuple(range(x.shape.rank)):
        return x
    if x.opcode == "broadcast":     # x's operand dim d lands on dims[inner[d]]
        inner = x.attrs["dimensions"]
        return "broadcast", inst.shape, x.operands, {"dimensions": tuple(dims[d] for d in inner)}
    return None


def _convert(inst, x):
    return x if x.shape == inst.shape else None


def _same_shape(inst, x):
    # slice: the same shape means start 0, limit = size, stride 1 in every dim.
    return x if x.shape == inst.shape else None


def _concatenate(inst, *xs):
    return xs[0] if len(xs) == 1 else None


def _get_tuple_element(inst, t):
    return t.operands[inst.attrs["index"]] if t.opcode == "tuple" else None


def _multiply(inst, a, b):
    if _numeric(inst) and uniform_value(b) == 1:
        return a
    if _numeric(inst) and uniform_value(a) == 1:
        return b
    return None


def _add(inst, a, b):
    if _is_zero(b, negative=True):
        return a
    if _is_zero(a, negative=True):
        return b
    return None


def _subtract(inst, a, b):
    return a if _is_zero(b, negative=False) else None


def _power(inst, make):
    """power(x, 2, 3 or 4) on floats as multiplies."""
    x, exponent = inst.operands
    n = uniform_value(exponent)
    if inst.shape.dtype[0] not in "fb" or n not in (2, 3, 4):
        return None
    square = make("multiply", inst.shape, [x, x], {})
    return square if n == 2 else make("multiply", inst.shape,
                                      [square, x if n == 3 else square], {})


def _select(inst, p, a, b):
    taken = uniform_value(p)
    if taken is None:
        return None
    return a if taken else b


def _set_dimension_size(inst, x, size):
    (d,) = inst.attrs["dimensions"]
    return x if uniform_value(size) == x.shape.dims[d] and inst.shape == x.shape else None


_RULES = {"reshape": _reshape, "transpose": _transpose, "broadcast": _broadcast,
          "convert": _convert, "copy": lambda inst, x: x, "slice": _same_shape,
          "concatenate": _concatenate, "get-tuple-element": _get_tuple_element,
          "multiply": _multiply, "add": _add, "subtract": _subtract, "select": _select,
          "set-dimension-size": _set_dimension_size}


def _no_products(inst, make):
    """A dot or convolution with an operand of no elements: zeros (a sum of no
    products where its contracted dims are empty), where kernels would read
    the empty operand's memory."""
    if all(op.shape.size for op in inst.operands):
        return None
    zero = make("constant", Shape.array(inst.shape.dtype, ()), [], {},
                np.zeros((), DTYPES[inst.shape.dtype]))
    return make("broadcast", inst.shape, [zero], {"dimensions": ()})


def _empty_reduce(inst, make):
    """A reduce of no elements: its init values, where kernels would read the
    empty operands' memory."""
    n = len(inst.operands) // 2
    if inst.operands[0].shape.size != 0:
        return None
    shapes = inst.shape.tuple_shapes if inst.shape.is_tuple else [inst.shape]
    inits = [make("broadcast", shape, [init], {"dimensions": ()})
             for shape, init in zip(shapes, inst.operands[n:])]
    return make("tuple", inst.shape, inits, {}) if inst.shape.is_tuple else inits[0]


# Rules that build several instructions: (inst, make) -> the replacement, or None.
_BUILDING_RULES = {"add": _add_into_window, "power": _power, "dot": _no_products,
                   "convolution": _no_products, "reduce": _empty_reduce}


def _scalar_broadcast(inst):
    return inst.opcode == "broadcast" and inst.operands[0].shape.rank == 0


def _numeric(inst):
    return inst.shape.dtype[0] in "suf" or inst.shape.dtype == "bf16"


def _is_zero(inst, negative):
    """Is `inst` the zero that x + zero (negative=True) or x - zero leaves
    x unchanged by: any 0 for ints; -0.0 for add and +0.0 for subtract on floats."""
    v = uniform_value(inst)
    if v is None or not _numeric(inst) or v != 0:
        return False
    if inst.shape.dtype[0] in "su":
        return True
    return (math.copysign(1.0, float(v)) < 0) == negative
