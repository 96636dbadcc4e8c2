"""Fusion decisions: which HLO values are inlined into their users' kernels
and which are materialised in a buffer, each with its reason (explain()
lists them)."""
from ..hlo.opcodes import BROADCAST, FREE, OPAQUE, OPCODES, REDUCE
from .ir import FusionDecision


def is_tuple_producer(inst):
    return inst.shape.is_tuple and inst.opcode != "tuple"


def roots_a_kernel(inst):
    """Whether `inst` roots a kernel of its own: a reduction or an opaque op,
    but not a pooling gradient (elementwise-like: each position gathers from
    the few windows that cover it, their selections found beforehand where
    windows overlap; it fuses into its consumer, the activation's gradient)
    nor random bits."""
    source = inst.operands[0] if inst.opcode == "get-tuple-element" else inst
    return source.kind in (REDUCE, OPAQUE) and source.opcode not in ("rng-bit-generator",
                                                                      "select-and-scatter")


def materialize_reason(inst, users):
    """None if `inst` can be inlined into each of its `users`, else why not."""
    if inst.opcode == "parameter":
        return "parameter"
    if inst.opcode == "constant":
        return None if inst.shape.rank == 0 else "constant array"
    if inst.opcode == "while":
        return "a loop"
    if inst.opcode in ("tuple", "rng-bit-generator") or is_tuple_producer(inst):
        return None           # virtual: their get-tuple-elements are the values
    if inst.opcode == "get-tuple-element" and inst.operands[0].opcode in ("reduce",
                                                                         "reduce-window"):
        return "result of a multi-output reduction"
    if inst.opcode == "get-tuple-element" and inst.operands[0].opcode != "rng-bit-generator":
        return "an element of a loop's state"
    if roots_a_kernel(inst):
        return f"{inst.opcode} is a kernel root (its operands fuse into it)"
    if inst.shape.rank == 0:
        return None           # scalars: LLVM hoists them out of the loops they feed
    recomputed = OPCODES[inst.opcode].cost != FREE
    if len(users) > 1 and recomputed:
        return f"{len(users)} users would each recompute it"
    if users and users[0].kind == BROADCAST and recomputed \
            and inst.shape.size < users[0].shape.size:
        return "a broadcast would recompute it per output element"
    return None


def fusion_decisions(order, materialized):
    """A FusionDecision per edge of the instructions in `order` (parameters,
    constants and tuples aside), given each one's materialize_reason."""
    return [FusionDecision(op.name, inst.name, materialized[op] or "fused")
            for inst in order for op in inst.operands
            if op.opcode not in ("parameter", "constant", "tuple")]
