"""A backend's code for one elementwise opcode: a rule per element type class.

Each backend keeps a dict of Rules keyed by opcode (its RULES) and the opcodes
it leaves to TensorFlow (its FALLBACK); a test holds every record of
hlo/opcodes.py to one or the other, type class by type class.
"""
from dataclasses import dataclass
from typing import Callable

from ..errors import Unsupported
from ..hlo.opcodes import FLOAT, INT, PRED


@dataclass(frozen=True)
class Rule:
    float: Callable = None      # for f32 and f64 operands
    int: Callable = None        # for integer and pred operands

    @property
    def types(self):
        """The type classes this rule covers."""
        return ({FLOAT} if self.float else set()) | ({INT, PRED} if self.int else set())


def any_type(fn):
    """One rule for every element type (select, convert...)."""
    return Rule(float=fn, int=fn)


def rule_for(rules, compiler, opcode, is_float):
    """The function of `opcode`'s rule for float or other operands; Unsupported
    (the cluster falls back to TensorFlow) where `compiler` has none."""
    rule = rules.get(opcode)
    fn = rule and (rule.float if is_float else rule.int)
    if fn is None:
        raise Unsupported(f"the {compiler} compiler has no "
                          f"{'float' if is_float else 'integer'} '{opcode}'")
    return fn
