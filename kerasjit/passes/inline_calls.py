"""Call inlining (XLA's CallInliner): each `call` is replaced by a copy of the
computation it calls, its parameters by the call's operands, so the passes
and fusion see one computation (the bridge wraps a while loop's condition,
and nested tf.functions, in calls). Mutates and returns the module; callees
no longer called are left for DCE."""
import dataclasses

from ..hlo.ir import NameUniquer
from .util import rewrite


def inline_calls(module):
    names = NameUniquer(module)

    def visit(inst, emit):
        if inst.opcode != "call":
            return None
        callee = inst.attrs["to_apply"]
        copies = {p: inst.operands[p.parameter_number] for p in callee.parameters}
        for original in callee.instructions:       # (callees came first: no calls left)
            if original in copies:
                continue
            copy = dataclasses.replace(original, name=names(original.opcode),
                                       operands=[copies[op] for op in original.operands],
                                       attrs=dict(original.attrs))
            emit(copy)
            copies[original] = copy
        return copies[callee.root]

    for comp in module.computations:          # callees before callers
        rewrite(comp, visit)
    return module
