"""Common subexpression elimination.

Two instructions with the same opcode, shape, operands (by identity, after
earlier merges), value-relevant attributes and literal compute the same value:
the later one is replaced by the earlier. Metadata is ignored; parameters are
never merged. Every HLO op is a pure function of its operands (rng-bit-generator
included: its state is an operand), so any such pair may merge.

Called computations that are identical instruction by instruction (XLA's bridge
emits one `add` region per reduce) are merged too, so the reduces using them
can merge. Mutates and returns the module; the duplicates are left for DCE.
"""
from ..hlo.attributes import COMPUTATION_ATTRS, COMPUTATION_LIST_ATTRS
from .util import rewrite, value_key


def cse(module):
    same_as = {}                    # duplicate computation -> the one kept
    kept = {}                       # computation_key -> computation
    for comp in module.computations:          # callees come before callers
        for inst in comp.instructions:
            for k, v in inst.attrs.items():
                if k in COMPUTATION_ATTRS:
                    inst.attrs[k] = same_as.get(v, v)
                elif k in COMPUTATION_LIST_ATTRS:
                    inst.attrs[k] = tuple(same_as.get(c, c) for c in v)
        _cse_computation(comp)
        if comp is not module.entry:
            first = kept.setdefault(_computation_key(comp), comp)
            if first is not comp:
                same_as[comp] = first
    return module


def _cse_computation(comp):
    seen = {}

    def visit(inst, emit):
        if inst.opcode == "parameter":
            return None
        return seen.setdefault((value_key(inst), tuple(inst.operands)), inst)
    rewrite(comp, visit)


def _computation_key(comp):
    index = {inst: n for n, inst in enumerate(comp.instructions)}
    body = tuple((value_key(i), i.parameter_number, tuple(index[op] for op in i.operands))
                 for i in comp.instructions)
    return body, index[comp.root]
