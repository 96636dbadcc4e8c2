"""Called computations made part of their caller.

inline_calls (XLA's CallInliner): each `call` is replaced by a copy of the
computation it calls, its parameters by the call's operands, so the passes
and fusion see one computation (the bridge wraps a while loop's condition,
and nested tf.functions, in calls).

conditional_to_select (XLA's ConditionalToSelect): each `conditional` runs
all its branches, inlined, and selects the result of the one its pred or
index picks (an index out of range: the last branch). HLO has no side
effects, so only the work of the branches not taken is lost; a branch in a
training step is small (the frontend if-converts the step's own; these are
the ones inside loops). Callees left unused go with DCE.
"""
import dataclasses

import numpy as np

from ..hlo.ir import NameUniquer
from ..hlo.shape import Shape
from .util import maker, rewrite


def inline_calls(module):
    return _rewrite_all(module, lambda inst, names, emit: inline(
        inst.attrs["to_apply"], inst.operands, names, emit) if inst.opcode == "call" else None)


def conditional_to_select(module):
    return _rewrite_all(module, _select_branch)


def _rewrite_all(module, replace):
    names = NameUniquer(module)
    for comp in module.computations:          # callees before callers
        rewrite(comp, lambda inst, emit: replace(inst, names, emit))
    return module


def inline(callee, args, names, emit):
    """Copies of `callee`'s instructions on `args` (emitted); its root's copy."""
    copies = {p: args[p.parameter_number] for p in callee.parameters}
    for original in callee.instructions:       # (callees came first: none is left inside)
        if original not in copies:
            copies[original] = dataclasses.replace(
                original, name=names(original.opcode),
                operands=[copies[op] for op in original.operands], attrs=dict(original.attrs))
            emit(copies[original])
    return copies[callee.root]


def _select_branch(inst, names, emit):
    if inst.opcode != "conditional":
        return None
    selector, operands = inst.operands[0], inst.operands[1:]
    if "branch_computations" in inst.attrs:
        branches = inst.attrs["branch_computations"]
    else:
        branches = (inst.attrs["true_computation"], inst.attrs["false_computation"])
    results = [inline(branch, [operand], names, emit)
               for branch, operand in zip(branches, operands)]

    make = maker(names, emit)
    conditions = []
    for k in range(len(branches) - 1):
        if selector.shape.dtype == "pred":
            conditions.append(selector)
            continue
        index = make("constant", selector.shape, [],
                     literal=np.asarray(k, selector.shape.numpy_dtype))
        conditions.append(make("compare", Shape.array("pred", ()), [selector, index],
                               {"direction": "EQ"}))

    def pick(values, shape):
        if shape.is_tuple:
            parts = [pick([make("get-tuple-element", s, [v], {"index": i}) for v in values], s)
                     for i, s in enumerate(shape.tuple_shapes)]
            return make("tuple", shape, parts)
        chosen = values[-1]
        for k in reversed(range(len(values) - 1)):
            taken = make("broadcast", Shape.array("pred", shape.dims), [conditions[k]],
                         {"dimensions": ()})
            chosen = make("select", shape, [taken, values[k], chosen])
        return chosen
    return pick(results, inst.shape)
