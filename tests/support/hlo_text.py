"""hlo: HLO module text from an entry computation's body (and called computations)."""

# A scalar f32 sum, for reductions (its names are its own: a module's are unique).
SUM = """%sum (sum.a: f32[], sum.b: f32[]) -> f32[] {
  %sum.a = f32[] parameter(0)
  %sum.b = f32[] parameter(1)
  ROOT %sum.s = f32[] add(%sum.a, %sum.b)
}"""


def hlo(body, callees=""):
    return f"HloModule test\n\n{callees}\n\nENTRY %main {{\n{body}\n}}\n"
