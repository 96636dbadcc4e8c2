"""A kernel's identity: what it computes, as a digest, whatever its buffers are called.

Two steps with the same identity are one function: the same expressions over
buffers of the same types and shapes taken in the same argument order
(ResNet's blocks of one stage repeat the same kernels over other buffers).
Buffer ids become argument positions, and a reduction's key and its
variables' names become the order in which they first appear.
"""
import hashlib
from dataclasses import fields

from .ir import Expr, Load, Reduce, ReduceVar, Var


def identity(step, buffers, args, extra=()):
    """The digest of `step` (a loop kernel, implicit GEMM: any dataclass of
    expressions and plain values) taking the buffers `args` (ids, in order);
    `extra`: whatever else its function depends on (how it is split)."""
    position = {bid: i for i, bid in enumerate(args)}
    numbers, renamed, rows = {}, {}, []

    def named(kind, value):
        return renamed.setdefault((kind, value), len(renamed))

    def plain(value):
        """A field's value with expressions as their numbers (numbered already)."""
        if isinstance(value, Expr):
            return ("#", numbers[id(value)])
        if isinstance(value, (tuple, list)):
            return tuple(plain(v) for v in value)
        return value

    def number(expr):
        # Depth first without recursion: fused expressions can be thousands deep.
        stack = [(expr, False)]
        while stack:
            node, ready = stack.pop()
            if id(node) in numbers:
                continue
            if not ready:
                stack.append((node, True))
                stack.extend((e, False) for e in reversed(_operands(node))
                             if id(e) not in numbers)
                continue
            row = [type(node).__name__]
            for f in fields(node):
                value = getattr(node, f.name)
                if isinstance(node, Load) and f.name == "buffer":
                    value = ("arg", position[value])
                elif isinstance(node, Reduce) and f.name == "key" \
                        or isinstance(node, ReduceVar) and f.name == "owner":
                    value = ("reduce", named("reduce", value))
                elif isinstance(node, Var) and f.name == "name":
                    value = ("var", named("var", value))
                else:
                    value = plain(value)
                row.append(value)
            numbers[id(node)] = len(rows)
            rows.append(tuple(row))

    described = [type(step).__name__]
    for f in fields(step):
        if f.name in ("name", "fused"):         # (what it is called, not what it does)
            continue
        value = getattr(step, f.name)
        for e in _expressions(value):
            number(e)
        if f.name in ("out", "lhs", "rhs"):
            value = ("arg", position[value])
        elif f.name == "stores":
            value = tuple((("arg", position[b]), plain(e)) for b, e in value)
        else:
            value = plain(value)
        described.append((f.name, value))
    types = tuple((buffers[b].dtype, tuple(buffers[b].dims)) for b in args)
    text = repr((described, rows, types, extra))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _expressions(value):
    if isinstance(value, Expr):
        return [value]
    if isinstance(value, (tuple, list)):
        return [e for v in value for e in _expressions(v)]
    return []


def _operands(node):
    """Every expression a node's fields hold (a Reduce's combiners too)."""
    return [e for f in fields(node) for e in _expressions(getattr(node, f.name))]
