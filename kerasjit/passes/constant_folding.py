"""Constant folding: an instruction whose operands are all constants becomes
a constant, computed by the reference evaluator (one semantics, not two).

Not folded, on purpose:
  - broadcast and iota: cheap to generate, and folding them would turn a
    scalar into a large literal (memory, and unreadable dumps);
  - results over MAX_ELEMENTS elements, for the same reason;
  - tuple-shaped results (a constant holds one array), which includes
    rng-bit-generator: the dropout RNG stays visible in dumps;
  - anything the evaluator does not implement.
Mutates and returns the module; the old operands are left for DCE.
"""
import numpy as np

from ..hlo.evaluator import evaluate_computation
from ..hlo.ir import Computation, Instruction
from .util import rewrite

MAX_ELEMENTS = 1 << 16
NEVER_FOLDED = frozenset({"parameter", "constant", "broadcast", "iota"})


def constant_folding(module):
    for comp in module.computations:
        rewrite(comp, _fold)
    return module


def _fold(inst, emit):
    if (inst.opcode in NEVER_FOLDED or inst.shape.is_tuple or inst.shape.size > MAX_ELEMENTS
            or not all(op.opcode == "constant" for op in inst.operands)):
        return None
    try:
        value = evaluate_computation(Computation("fold", [*inst.operands, inst], inst), [])
    except NotImplementedError:
        return None
    # The folded constant takes the name of the instruction it replaces.
    literal = np.array(value, dtype=inst.shape.numpy_dtype).reshape(inst.shape.dims)
    constant = Instruction(inst.name, "constant", inst.shape, literal=literal)
    emit(constant)
    return constant
