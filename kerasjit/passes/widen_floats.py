"""16-bit floats computed in f32, stored in 16 bits (XLA's float normalization).

TensorFlow's CPU kernels compute an op on f16 or bf16 in f32 and round its
result back to 16 bits. Here every instruction that computes on f16 or bf16
(elementwise ops, reductions, dots, convolutions...) becomes the same
instruction on f32, its 16-bit operands converted up and its result
converted back down; the computations it calls are f32 copies. So a backend
only loads, stores and converts 16-bit values, and each op's result is
rounded where TensorFlow rounds it, also inside a fused kernel. Dots,
convolutions and reductions accumulate in f32, as XLA's do.
"""
import dataclasses

import numpy as np

from ..hlo.attributes import COMPUTATION_ATTRS
from ..hlo.ir import Computation, Instruction, NameUniquer
from ..hlo.opcodes import ELEMENTWISE, OPAQUE, REDUCE
from ..hlo.shape import Shape
from .util import rewrite

NARROW = frozenset({"f16", "bf16"})
_KEPT = frozenset({"convert", "bitcast-convert", "copy"})   # exact on 16-bit values


def widen_floats(module):
    names = NameUniquer(module)
    wide_copies = {}             # computation -> its f32 copy

    def wide_computation(comp):
        if comp not in wide_copies:
            copies = {}
            for inst in comp.instructions:
                copies[inst] = dataclasses.replace(
                    inst, name=names(inst.name), shape=_wide(inst.shape),
                    operands=[copies[op] for op in inst.operands],
                    literal=None if inst.literal is None else _wide_literal(inst),
                    attrs={k: wide_computation(v) if k in COMPUTATION_ATTRS else v
                           for k, v in inst.attrs.items()})
            wide_copies[comp] = Computation(names(comp.name), list(copies.values()),
                                            copies[comp.root])
            made.append(wide_copies[comp])
        return wide_copies[comp]

    def visit(inst, emit):
        if not _computes_on_narrow(inst):
            return None
        operands = [_converted(op, _wide(op.shape), names, emit) if _narrow(op.shape) else op
                    for op in inst.operands]
        attrs = {k: wide_computation(v) if k in COMPUTATION_ATTRS else v
                 for k, v in inst.attrs.items()}
        wide = Instruction(names(inst.opcode), inst.opcode, _wide(inst.shape), operands, attrs)
        emit(wide)
        return _converted(wide, inst.shape, names, emit)

    computations = []
    for comp in module.computations:
        made = []
        rewrite(comp, visit)
        computations += made + [comp]       # (a copy before its first caller)
    module.computations = computations
    return module


def _narrow(shape):
    if shape.is_tuple:
        return any(_narrow(s) for s in shape.tuple_shapes)
    return shape.dtype in NARROW


def _wide(shape):
    if shape.is_tuple:
        return Shape.tuple([_wide(s) for s in shape.tuple_shapes])
    return Shape.array("f32", shape.dims) if shape.dtype in NARROW else shape


def _wide_literal(inst):
    return inst.literal.astype(np.float32) if inst.shape.dtype in NARROW else inst.literal


def _computes_on_narrow(inst):
    return inst.kind in (ELEMENTWISE, REDUCE, OPAQUE) and inst.opcode not in _KEPT \
        and (_narrow(inst.shape) or any(_narrow(op.shape) for op in inst.operands))


def _converted(value, shape, names, emit):
    """`value` as `shape` (its types, element by element; tuples taken apart)."""
    if value.shape == shape:
        return value
    if not shape.is_tuple:
        made = Instruction(names("convert"), "convert", shape, [value])
        emit(made)
        return made
    parts = []
    for i, part in enumerate(shape.tuple_shapes):
        element = Instruction(names("get-tuple-element"), "get-tuple-element",
                              value.shape.tuple_shapes[i], [value], {"index": i})
        emit(element)
        parts.append(_converted(element, part, names, emit))
    made = Instruction(names("tuple"), "tuple", shape, parts)
    emit(made)
    return made
