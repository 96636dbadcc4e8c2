"""The elementwise opcodes every backend is checked on, and a one-op module for each."""
from kerasjit.hlo import parse_module

FLOAT_UNARY = ["abs", "negate", "exponential", "exponential-minus-one", "log", "log-plus-one",
               "sqrt", "rsqrt", "cbrt", "tanh", "logistic", "sine", "cosine", "tan", "floor",
               "ceil", "round-nearest-afz", "round-nearest-even", "sign", "is-finite", "erf",
               "copy"]
FLOAT_BINARY = ["add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum",
                "power", "atan2"]
INT_UNARY = ["abs", "negate", "sign", "not", "popcnt", "count-leading-zeros", "copy"]
INT_BINARY = ["add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "and",
              "or", "xor", "shift-left", "shift-right-logical", "shift-right-arithmetic"]


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
