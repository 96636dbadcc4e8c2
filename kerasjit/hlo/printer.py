"""Printer for XLA's HLO text format; `parse_module(print_module(m))` == m."""
import numpy as np

from .attributes import COMPUTATION_ATTRS, COMPUTATION_LIST_ATTRS, INT_ATTRS, INT_LIST_ATTRS


def _format_scalar(value, dtype):
    if dtype == "pred":
        return "true" if value else "false"
    if dtype.startswith(("s", "u")):
        return str(int(value))
    return str(np.float32(value)) if dtype in ("f32", "f16", "bf16") else repr(float(value))


def format_literal(array, dtype, elide_over=None):
    if elide_over is not None and array.size > elide_over:
        return "{...}"
    if array.ndim == 0:
        return _format_scalar(array.item(), dtype)

    def nested(a):
        if a.ndim == 1:
            return "{" + ", ".join(_format_scalar(v, dtype) for v in a.tolist()) + "}"
        return "{ " + ", ".join(nested(sub) for sub in a) + " }"
    return nested(array)


def _format_padding(dims, separator="_"):
    parts = []
    for lo, hi, *interior in dims:
        fields = [lo, hi] + [i for i in interior if i]
        parts.append(separator.join(str(f) for f in fields))
    return "x".join(parts)


def _format_window(window):
    if not window:
        return "{}"
    fields = [f"size={'x'.join(str(w.size) for w in window)}"]
    for key in ("stride", "lhs_dilate", "rhs_dilate"):
        values = [getattr(w, key) for w in window]
        if any(v != 1 for v in values):
            fields.append(f"{key}={'x'.join(map(str, values))}")
        if key == "stride" and any(w.pad_lo or w.pad_hi for w in window):
            fields.append("pad=" + _format_padding([(w.pad_lo, w.pad_hi) for w in window]))
    if any(w.rhs_reversal for w in window):
        fields.append("rhs_reversal=" + "x".join(str(int(w.rhs_reversal)) for w in window))
    return "{" + " ".join(fields) + "}"


def format_attr(key, value):
    if key in COMPUTATION_ATTRS:
        return f"%{value.name}"
    if key in COMPUTATION_LIST_ATTRS:
        return "{" + ", ".join(f"%{c.name}" for c in value) + "}"
    if key in INT_LIST_ATTRS:
        return "{" + ",".join(map(str, value)) + "}"
    if key in INT_ATTRS:
        return str(value)
    if key == "slice":
        return "{" + ", ".join(f"[{a}:{b}]" if s == 1 else f"[{a}:{b}:{s}]"
                               for a, b, s in value) + "}"
    if key == "padding":
        return _format_padding(value)
    if key == "window":
        return _format_window(value)
    return str(value)       # (raw text, or a typed value that prints as its text: DimLabels)


def print_instruction(inst, is_root=False, elide_constants_over=None):
    if inst.opcode == "constant":
        args = format_literal(inst.literal, inst.shape.dtype, elide_constants_over)
    elif inst.opcode == "parameter":
        args = str(inst.parameter_number)
    else:
        args = ", ".join(f"{op.shape.with_layout()} %{op.name}" for op in inst.operands)
    attrs = "".join(f", {k}={format_attr(k, v)}" for k, v in inst.attrs.items())
    root = "ROOT " if is_root else ""
    return f"  {root}%{inst.name} = {inst.shape.with_layout()} {inst.opcode}({args}){attrs}"


def print_computation(comp, is_entry=False, elide_constants_over=None):
    params = ", ".join(f"{p.name}: {p.shape}" for p in comp.parameters)
    head = f"{'ENTRY ' if is_entry else ''}%{comp.name} ({params}) -> {comp.root.shape} {{"
    body = [print_instruction(i, i is comp.root, elide_constants_over) for i in comp.instructions]
    return "\n".join([head, *body, "}"])


def print_module(module, elide_constants_over=None):
    """Module -> HLO text. `elide_constants_over=N` prints big constants as `{...}`."""
    header = [f"HloModule {module.name}"]
    if module.input_output_alias:
        items = ", ".join(
            f"{{{','.join(map(str, out))}}}: ({param}, {{{','.join(map(str, idx))}}}, may-alias)"
            for out, (param, idx) in module.input_output_alias.items())
        header.append(f"input_output_alias={{ {items} }}")
    entry = module.entry
    layout = ", ".join(p.shape.with_layout() for p in entry.parameters)
    header.append(f"entry_computation_layout={{({layout})->{entry.root.shape.with_layout()}}}")
    header.extend(f"{k}={v}" for k, v in module.header_attrs.items())
    parts = [", ".join(header)]
    parts += [print_computation(c, c is entry, elide_constants_over) for c in module.computations]
    return "\n\n".join(parts) + "\n"
