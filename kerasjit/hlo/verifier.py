"""Structural checks of a Module: what every pass must preserve.

Runs between passes in debug mode; a failure names the instruction and the
broken rule, so a bad pass is caught where it happened.
"""
from .opcodes import ELEMENTWISE, opcode
from ..errors import HloVerifyError


def _check_instruction(comp, inst, defined):
    def fail(message):
        raise HloVerifyError(f"%{inst.name} in %{comp.name}: {message}")

    arity = opcode(inst.opcode).arity
    if arity >= 0 and len(inst.operands) != arity:
        fail(f"{inst.opcode} takes {arity} operands, has {len(inst.operands)}")
    for op in inst.operands:
        if op not in defined:
            fail(f"operand %{op.name} is not defined before its use in this computation")
    if inst.opcode == "constant":
        if inst.literal is None or tuple(inst.literal.shape) != inst.shape.dims:
            fail("constant literal does not match its shape")
    if inst.opcode == "parameter" and inst.parameter_number is None:
        fail("parameter without a number")
    if inst.kind == ELEMENTWISE and inst.opcode not in ("convert", "bitcast-convert"):
        for op in inst.operands:
            if op.shape.dims != inst.shape.dims:
                fail(f"elementwise operand %{op.name} has shape {op.shape}, result {inst.shape}")
    if inst.opcode == "get-tuple-element":
        source = inst.operands[0].shape
        if not source.is_tuple or inst.attrs["index"] >= len(source.tuple_shapes):
            fail("get-tuple-element index out of range")
        if source.tuple_shapes[inst.attrs["index"]] != inst.shape:
            fail("get-tuple-element shape differs from the tuple element")
    if inst.opcode in ("reshape", "bitcast") and inst.shape.size != inst.operands[0].shape.size:
        fail(f"{inst.opcode} changes the element count")


def verify(module):
    """Raise HloVerifyError on the first broken invariant; return the module."""
    names = set()
    known = set()
    for comp in module.computations:
        defined = set()
        numbers = []
        for inst in comp.instructions:
            if inst.name in names:
                raise HloVerifyError(f"instruction name %{inst.name} is used twice")
            names.add(inst.name)
            _check_instruction(comp, inst, defined)
            for callee in inst.called_computations:
                if callee not in known:
                    raise HloVerifyError(f"%{inst.name} calls %{callee.name}, "
                                         "which is not an earlier computation of the module")
            if inst.opcode == "parameter":
                numbers.append(inst.parameter_number)
            defined.add(inst)
        if sorted(numbers) != list(range(len(numbers))):
            raise HloVerifyError(f"%{comp.name}: parameter numbers {sorted(numbers)} "
                                 "are not 0..n-1")
        if comp.root not in defined:
            raise HloVerifyError(f"%{comp.name}: root is not one of its instructions")
        known.add(comp)
    if module.entry not in known:
        raise HloVerifyError("entry computation is not in the module")
    params = module.entry.parameters
    for out, (param, _) in module.input_output_alias.items():
        if param >= len(params):
            raise HloVerifyError(f"alias of output {out} names missing parameter {param}")
    return module
