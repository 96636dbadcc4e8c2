"""Dead code elimination: drop what the root does not need.

Mutates and returns the module. Parameters always stay (their numbers are the
computation's signature); computations no longer called from the entry go.
"""


def dce(module):
    for comp in module.computations:
        live = set(comp.post_order())
        comp.instructions = [i for i in comp.instructions
                             if i in live or i.opcode == "parameter"]
    called, stack = set(), [module.entry]
    while stack:
        comp = stack.pop()
        if comp not in called:
            called.add(comp)
            stack.extend(c for inst in comp.instructions for c in inst.called_computations)
    module.computations = [c for c in module.computations if c in called]
    return module
