"""Helpers shared by the passes: walking a computation while replacing
instructions, making new ones, redirecting and counting uses, the identity of an
instruction's value, and the one value of a uniform constant."""
import numpy as np

from ..hlo.ir import Instruction

# Attributes that annotate an instruction without changing its value.
ANNOTATION_ATTRS = frozenset({"metadata", "frontend_attributes"})


def use_counts(comp):
    """How many operand slots of `comp`'s instructions read each instruction
    (a root's use not counted)."""
    users = {}
    for inst in comp.instructions:
        for op in inst.operands:
            users[op] = users.get(op, 0) + 1
    return users


def rewrite(comp, visit):
    """Walk `comp` in order; `visit(inst, emit)` returns what replaces `inst`
    (an earlier instruction, or a new one it passed to `emit`) or None.

    Operands are redirected as the walk goes, so each visit sees its operands
    already rewritten; replaced instructions are dropped. New instructions are
    emitted just before the one they replace, so def-before-use order holds.
    Mutates `comp`.
    """
    out, replaced = [], {}
    for inst in comp.instructions:
        inst.operands = [replaced.get(op, op) for op in inst.operands]
        new = visit(inst, out.append)
        if new is None or new is inst:
            out.append(inst)
        else:
            replaced[inst] = new
    comp.instructions = out
    comp.root = replaced.get(comp.root, comp.root)


def maker(names, emit):
    """make(opcode, shape, operands, attrs=None, literal=None, name=None): a new
    instruction named by NameUniquer `names` (from `name`, else its opcode),
    passed to `emit` (rewrite's) and returned."""
    def make(opcode, shape, operands, attrs=None, literal=None, name=None):
        made = Instruction(names(name or opcode), opcode, shape, list(operands), attrs or {},
                           literal)
        emit(made)
        return made
    return make


def replace_all_uses(comp, old, new):
    """Point every use of `old` in `comp` (operands and the root) at `new`.

    `new` is inserted just before `old` if it is not in `comp` yet; if it is
    defined after a user of `old`, instructions are reordered (stably) so that
    every operand still comes before its users. `old` stays, dead, for DCE.
    `new` may itself use `old` (replacing x by f(x)).
    """
    if new not in comp.instructions:
        comp.instructions.insert(comp.instructions.index(old), new)
    for inst in comp.instructions:
        if inst is not new:
            inst.operands = [new if op is old else op for op in inst.operands]
    if comp.root is old:
        comp.root = new
    sort_def_before_use(comp)


def sort_def_before_use(comp):
    """Reorder `comp.instructions` so operands precede users, moving as little
    as possible: each instruction keeps its place unless an operand is later."""
    placed, order = set(), []
    for start in comp.instructions:
        stack = [(start, False)]
        while stack:
            inst, expanded = stack.pop()
            if inst in placed:
                continue
            if expanded:
                placed.add(inst)
                order.append(inst)
                continue
            stack.append((inst, True))
            stack.extend((op, False) for op in reversed(inst.operands) if op not in placed)
    comp.instructions = order


def value_key(inst):
    """What decides `inst`'s value besides its operands: equal keys and equal
    operands mean equal values (parameters excepted: their number is not here)."""
    attrs = tuple(sorted((k, v) for k, v in inst.attrs.items() if k not in ANNOTATION_ATTRS))
    literal = None if inst.literal is None else inst.literal.tobytes()   # -0.0 != 0.0
    return inst.opcode, inst.shape, attrs, literal


def uniform_value(inst):
    """The one value all elements of `inst` have, if it is a constant (or a
    broadcast of one) with all elements bitwise equal; else None."""
    while inst.opcode == "broadcast":
        inst = inst.operands[0]
    if inst.opcode != "constant" or inst.literal.size == 0:
        return None
    flat = inst.literal.reshape(-1)
    as_bytes = flat.view(np.uint8).reshape(flat.size, -1)
    return flat[0] if (as_bytes == as_bytes[0]).all() else None
