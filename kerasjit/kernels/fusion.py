"""Fusion decisions: which HLO values are inlined into their users' kernels
and which are materialised in a buffer, each with its reason (explain()
lists them)."""
from ..hlo.opcodes import ARITHMETIC, BROADCAST, ELEMENTWISE, FREE, OPAQUE, OPCODES, REDUCE
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


def _stored_reads(inst, materialized):
    """How many elements `inst` reads from stored values where it computes
    nothing (a stored value itself, or free ops of stored values: a
    broadcast of a row), else None."""
    if materialized.get(inst) or inst.opcode in ("parameter", "constant"):
        return inst.shape.size
    if OPCODES[inst.opcode].cost != FREE:
        return None
    reads = [_stored_reads(op, materialized) for op in inst.operands]
    return None if None in reads else sum(reads)


def recomputing_pays(inst, users, materialized):
    """Whether each of `users` may compute arithmetic elementwise `inst` for
    itself rather than read it stored: its operands are stored values (so no
    other work is repeated), and reading them in every user moves no more
    memory than storing `inst` once and reading it in every user
    (BatchNormalization's x - mean, read by the variance and by the gradient:
    x and a row, not a second tensor of x's size written and read again)."""
    if inst.kind != ELEMENTWISE or OPCODES[inst.opcode].cost != ARITHMETIC:
        return False
    reads = [_stored_reads(op, materialized) for op in inst.operands]
    if None in reads:
        return False
    size = inst.shape.size
    operands = sum(min(r, size) for r in reads)
    return len(users) * operands <= operands + (len(users) + 1) * size


def materialize_reason(inst, users, materialized):
    """None if `inst` can be inlined into each of its `users`, else why not
    (`materialized`: the reasons of the instructions before it, None where
    inlined)."""
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
    users = list(dict.fromkeys(users))      # (x * x: one user)
    if len(users) > 1 and recomputed and not recomputing_pays(inst, users, materialized):
        return f"{len(users)} users would each recompute it"
    if recomputed and any(u.kind == BROADCAST and inst.shape.size < u.shape.size
                          for u in users):
        return "a broadcast would recompute it per output element"
    return None


def materialize_reasons(order, users):
    """{instruction: materialize_reason} for the instructions in `order`
    (operands first), with their `users`."""
    materialized = {}
    for inst in order:
        materialized[inst] = materialize_reason(inst, users[inst], materialized)
    return materialized


def fusion_decisions(order, materialized):
    """A FusionDecision per edge of the instructions in `order` (parameters,
    constants and tuples aside), given each one's materialize_reason."""
    return [FusionDecision(op.name, inst.name, materialized[op] or "fused")
            for inst in order for op in inst.operands
            if op.opcode not in ("parameter", "constant", "tuple")]
