"""Every elementwise opcode of hlo/opcodes.py has, in each backend, a rule for
each element type class it is defined on, or is declared a fallback there."""
import pytest

from kerasjit.backends.cpu import ops
from kerasjit.backends.gpu import cuda_ops
from kerasjit.hlo.opcodes import OPCODES, elementwise_opcodes

BACKENDS = {"cpu": ops, "cuda": cuda_ops}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_each_opcode_has_a_rule_or_is_a_fallback(backend):
    module = BACKENDS[backend]
    missing, both = [], []
    for record in elementwise_opcodes():
        rule = module.RULES.get(record.name)
        for types in record.types:
            covered = rule is not None and types in rule.types
            declared = module.FALLBACK.get(record.name) == types
            if not covered and not declared:
                missing.append(f"{record.name} ({types})")
            if covered and declared:
                both.append(f"{record.name} ({types})")
    assert not missing, f"{backend}: no rule and no fallback for {missing}"
    assert not both, f"{backend}: a rule and a fallback for {both}"
    assert set(module.RULES) | set(module.FALLBACK) <= set(OPCODES)

