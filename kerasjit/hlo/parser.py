"""Parser for XLA's HLO text format (what `HloModule::ToString()` prints).

    module      := 'HloModule' name (',' attr)* computation*
    computation := ['ENTRY'] '%'name signature '{' instruction* '}'
    instruction := ['ROOT'] '%'name '=' shape opcode '(' operands ')' (',' attr)*

Layouts are read and dropped: kerasjit's IR is logical (row-major) and every
opcode's value is independent of layout, except `bitcast`, which is refused
when a non-default layout is involved. (The bridge gives transposes a
permuted layout; the logical transpose is the same.) Constants that the printer elided as `{...}` are taken from
`constants` (name -> ndarray), usually read from the serialized module.
"""
import re

import numpy as np

from .attributes import (COMPUTATION_ATTRS, COMPUTATION_LIST_ATTRS, INT_ATTRS, INT_LIST_ATTRS,
                         DimLabels)
from .ir import Computation, Instruction, Module, WindowDim
from .shape import DTYPES, Shape
from ..errors import HloParseError


_NAME = re.compile(r"%?([A-Za-z_][\w.\-]*)")
_TOKEN = re.compile(r"[\w.\-+]+")
_BLANK = re.compile(r"\s+|/\*.*?\*/|//[^\n]*", re.S)     # whitespace and comments
_BRACE_OR_QUOTE = re.compile(r'[{}"]')
_QUOTED_REST = re.compile(r'(?:[^"\\]|\\.)*"', re.S)    # after an opening quote


class _Cursor:
    def __init__(self, text):
        self.text, self.pos = text, 0
        self.physical_layouts = False     # a non-default layout seen in this instruction

    def error(self, message):
        line = self.text.count("\n", 0, self.pos) + 1
        start = self.text.rfind("\n", 0, self.pos) + 1
        end = self.text.find("\n", self.pos)
        snippet = self.text[start:end if end >= 0 else None].strip()
        raise HloParseError(f"HLO text line {line}: {message}\n  {snippet[:200]}")

    def skip(self):
        while True:
            m = _BLANK.match(self.text, self.pos)
            if not m or m.end() == self.pos:
                return
            self.pos = m.end()

    def peek(self, s):
        self.skip()
        return self.text.startswith(s, self.pos)

    def accept(self, s):
        if self.peek(s):
            self.pos += len(s)
            return True
        return False

    def expect(self, s):
        if not self.accept(s):
            self.error(f"expected '{s}'")

    def match(self, pattern, what):
        self.skip()
        m = pattern.match(self.text, self.pos)
        if not m:
            self.error(f"expected {what}")
        self.pos = m.end()
        return m.group(1) if m.groups() else m.group(0)

    def name(self):
        return self.match(_NAME, "a name")

    def balanced(self):
        """Raw text of a `{...}` group (quotes respected), braces included."""
        self.skip()
        depth, i, text = 0, self.pos, self.text
        while (m := _BRACE_OR_QUOTE.search(text, i)) is not None:
            i = m.end()
            if m.group() == '"':     # skip a quoted string, escapes included
                quoted = _QUOTED_REST.match(text, i)
                if quoted is None:
                    break
                i = quoted.end()
            elif m.group() == "{":
                depth += 1
            else:
                depth -= 1
                if depth == 0:
                    raw, self.pos = text[self.pos:i], i
                    return raw
        self.error("unbalanced '{'")


_ARRAY_SHAPE = re.compile(r"([a-z]+\d*)\[([\d,]*)\]")
_ELEMENT_TYPE = re.compile(r"[a-z]+\d*")
_DIM = re.compile(r"\d+")


def _dims(cur):
    """`[2, 3]` dim by dim (spaces, or the error for a dynamic dim)."""
    cur.expect("[")
    dims = []
    while not cur.accept("]"):
        if cur.peek("<=") or cur.peek("?"):
            cur.error("dynamic dimensions are not supported")
        dims.append(int(cur.match(_DIM, "a dimension")))
        cur.accept(",")
    return tuple(dims)


def parse_shape(cur):
    if cur.accept("("):
        shapes = []
        while not cur.accept(")"):
            shapes.append(parse_shape(cur))
            cur.accept(",")
        return Shape.tuple(shapes)
    cur.skip()
    whole = _ARRAY_SHAPE.match(cur.text, cur.pos)     # (the common case in one match)
    if whole:
        dtype, dims = whole.group(1), tuple(int(d) for d in whole.group(2).split(",") if d)
        cur.pos = whole.end()
    else:
        dtype, dims = cur.match(_ELEMENT_TYPE, "an element type"), _dims(cur)
    if dtype not in DTYPES:
        cur.error(f"unknown element type '{dtype}'")
    shape = Shape(dtype, dims)
    if cur.text.startswith("{", cur.pos):      # a layout touches the ']'
        layout = cur.balanced()[1:-1].split(":")[0]
        minor_to_major = [int(d) for d in layout.split(",") if d.strip()]
        if minor_to_major and minor_to_major != list(reversed(range(len(dims)))):
            cur.physical_layouts = True
    return shape


def _ints(raw):
    return tuple(int(v) for v in raw.strip("{}").replace(" ", "").split(",") if v)


def _padding_dims(raw):
    """`0_0x1_1_2` -> ((0, 0, 0), (1, 1, 2))."""
    dims = []
    for part in raw.split("x") if raw else []:
        lo, hi, *interior = (int(v) for v in part.split("_"))
        dims.append((lo, hi, interior[0] if interior else 0))
    return tuple(dims)


def _slice(raw):
    out = []
    for part in re.findall(r"\[([^\]]*)\]", raw):
        start, limit, *stride = (int(v) for v in part.split(":"))
        out.append((start, limit, stride[0] if stride else 1))
    return tuple(out)


def _window(raw):
    fields = dict(item.split("=") for item in raw.strip("{}").split())
    rank = len(fields["size"].split("x")) if "size" in fields else 0

    def per_dim(key, default):
        return [int(v) for v in fields[key].split("x")] if key in fields else [default] * rank
    pads = _padding_dims(fields.get("pad", "")) or ((0, 0, 0),) * rank
    return tuple(
        WindowDim(size=s, stride=st, pad_lo=p[0], pad_hi=p[1], lhs_dilate=ld, rhs_dilate=rd,
                  rhs_reversal=bool(rv))
        for s, st, p, ld, rd, rv in zip(per_dim("size", 1), per_dim("stride", 1), pads,
                                        per_dim("lhs_dilate", 1), per_dim("rhs_dilate", 1),
                                        per_dim("rhs_reversal", 0)))


def parse_literal(raw, shape):
    """Literal text (`1.5`, `{ {1,2}, {3,4} }`, `true`) -> ndarray of `shape`;
    comments (`{ /*i0=0*/ {1,2}, ...`, as XLA prints a large array's rows) aside."""
    words = re.findall(r"[^\s{},()]+", re.sub(r"/\*.*?\*/", " ", raw, flags=re.S))
    dtype = shape.numpy_dtype
    if shape.dtype == "pred":
        values = [w == "true" or w == "1" for w in words]
    elif dtype.kind in "iu":
        values = [int(w) for w in words]
    else:
        values = [float(w) for w in words]
    if len(values) != shape.size:
        raise HloParseError(f"constant of shape {shape} has {len(values)} values")
    return np.array(values, dtype=dtype).reshape(shape.dims)


def _typed_attr(cur, key, computations):
    def computation():
        name = cur.name()
        if name not in computations:
            cur.error(f"unknown computation '%{name}'")
        return computations[name]
    if key in COMPUTATION_ATTRS:
        return computation()
    if key in COMPUTATION_LIST_ATTRS:
        cur.expect("{")
        called = [computation()]
        while cur.accept(","):
            called.append(computation())
        cur.expect("}")
        return tuple(called)
    raw = cur.balanced() if cur.peek("{") else cur.match(
        re.compile(r'"(?:[^"\\]|\\.)*"|[^,\s]+'), "an attribute value")
    if key in INT_LIST_ATTRS:
        return _ints(raw)
    if key in INT_ATTRS:
        return int(raw)
    if key == "slice":
        return _slice(raw)
    if key == "padding":
        return _padding_dims(raw)
    if key == "window":
        return _window(raw)
    if key == "dim_labels":
        return DimLabels.parse(raw)
    return raw


def _parse_instruction(cur, scope, computations, constants):
    is_root = cur.accept("ROOT ")
    cur.physical_layouts = False
    name = cur.name()
    cur.expect("=")
    shape = parse_shape(cur)
    op = cur.match(re.compile(r"[a-z][a-z0-9\-]*"), "an opcode")
    cur.expect("(")
    operands, literal, param_number = [], None, None
    if op == "constant":
        cur.skip()
        start = cur.pos
        raw = cur.balanced() if cur.peek("{") else cur.match(_TOKEN, "a literal")
        if raw == "{...}":
            if name not in constants:
                cur.pos = start
                cur.error(f"constant %{name} was elided ('{{...}}') and no value was given")
            literal = np.asarray(constants[name], dtype=shape.numpy_dtype).reshape(shape.dims)
        else:
            literal = parse_literal(raw, shape)
        cur.expect(")")
    elif op == "parameter":
        param_number = int(cur.match(re.compile(r"\d+"), "a parameter number"))
        cur.expect(")")
    else:
        while not cur.accept(")"):
            if not cur.peek("%"):      # operands are printed with their shape first
                parse_shape(cur)
            operand = cur.name()
            if operand not in scope:
                cur.error(f"operand %{operand} is used before it is defined")
            operands.append(scope[operand])
            cur.accept(",")
    if op == "bitcast" and cur.physical_layouts:
        cur.error("bitcast with a non-default layout reinterprets memory; not supported")
    attrs = {}
    while cur.accept(","):
        key = cur.match(re.compile(r"[a-z_]+"), "an attribute name")
        cur.expect("=")
        attrs[key] = _typed_attr(cur, key, computations)
    try:
        inst = Instruction(name, op, shape, operands, attrs, literal, param_number)
    except NotImplementedError as e:
        cur.error(str(e))
    scope[name] = inst
    return inst, is_root


def _parse_computation(cur, computations, constants):
    is_entry = cur.accept("ENTRY")
    name = cur.name()
    if cur.accept("("):                # signature: repeated by the parameters
        depth = 1
        while depth:
            c = cur.text[cur.pos]
            depth += {"(": 1, ")": -1}.get(c, 0)
            cur.pos += 1
        cur.expect("->")
        parse_shape(cur)
    cur.expect("{")
    scope, instructions, root = {}, [], None
    while not cur.accept("}"):
        inst, is_root = _parse_instruction(cur, scope, computations, constants)
        instructions.append(inst)
        if is_root:
            root = inst
    if not instructions:
        cur.error(f"computation %{name} is empty")
    return Computation(name, instructions, root or instructions[-1]), is_entry


def _parse_alias(raw):
    """`{ {2}: (2, {}, may-alias), ... }` -> {(2,): (2, ())}."""
    alias = {}
    for out, param, index in re.findall(r"\{([\d,\s]*)\}:\s*\((\d+),\s*\{([\d,\s]*)\}", raw):
        alias[_ints(out)] = (int(param), _ints(index))
    return alias


def parse_module(text, constants=None):
    """HLO text -> Module. `constants` fills constants printed as `{...}`."""
    cur = _Cursor(text)
    cur.expect("HloModule")
    name = cur.name()
    header = {}
    while cur.accept(","):
        key = cur.match(re.compile(r"[a-z_]+"), "a module attribute")
        cur.expect("=")
        header[key] = cur.balanced() if cur.peek("{") else cur.match(_TOKEN, "a value")
    alias = _parse_alias(header.pop("input_output_alias", ""))
    header.pop("entry_computation_layout", None)       # the printer derives it
    computations, ordered, entry = {}, [], None
    while True:
        cur.skip()
        if cur.pos >= len(cur.text):
            break
        comp, is_entry = _parse_computation(cur, computations, constants or {})
        computations[comp.name] = comp
        ordered.append(comp)
        if is_entry:
            entry = comp
    if not ordered:
        cur.error("module has no computations")
    return Module(name, ordered, entry or ordered[-1], alias, header)
