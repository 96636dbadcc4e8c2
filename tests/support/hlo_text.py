"""hlo: HLO module text from an entry computation's body (and called computations)."""


def hlo(body, callees=""):
    return f"HloModule test\n\n{callees}\n\nENTRY %main {{\n{body}\n}}\n"
