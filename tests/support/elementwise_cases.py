"""The elementwise opcodes every backend is checked on (from their records in
hlo/opcodes.py), and a one-op module for each."""
from kerasjit.backends.cpu.ops import FALLBACK as CPU_FALLBACK
from kerasjit.backends.gpu.cuda_ops import FALLBACK as CUDA_FALLBACK
from kerasjit.hlo import parse_module
from kerasjit.hlo.opcodes import FLOAT, INT, OPCODES, elementwise_opcodes

BACKEND_FALLBACKS = (CPU_FALLBACK, CUDA_FALLBACK)


def compiled(types, arity):
    """The plain elementwise opcodes (hlo/opcodes.py) of `arity` that every
    backend compiles for type class `types`."""
    return [r.name for r in elementwise_opcodes(types, arity, plain=True)
            if all(fallback.get(r.name) != types for fallback in BACKEND_FALLBACKS)]


FLOAT_UNARY, FLOAT_BINARY = compiled(FLOAT, 1), compiled(FLOAT, 2)
INT_UNARY, INT_BINARY = compiled(INT, 1), compiled(INT, 2)


def positive(opcode):
    """Whether tests draw the opcode's float inputs above 0 (log, sqrt...)."""
    return OPCODES[opcode].positive


def result_type(opcode):
    """The element type of a plain opcode's result where it is not its operands'."""
    return "pred" if OPCODES[opcode].result == "pred" else None


def elementwise_module(opcode, dtype, dims, arity, out_dtype=None, attrs=""):
    shape = f"{dtype}[{','.join(map(str, dims))}]"
    out = f"{out_dtype or dtype}[{','.join(map(str, dims))}]"
    params = "\n".join(f"  %p{i} = {shape} parameter({i})" for i in range(arity))
    operands = ", ".join(f"{shape} %p{i}" for i in range(arity))
    return parse_module(f"""HloModule {opcode.replace('-', '_')}
ENTRY %e ({', '.join(f'p{i}: {shape}' for i in range(arity))}) -> {out} {{
{params}
  ROOT %r = {out} {opcode}({operands}){attrs}
}}
""")
