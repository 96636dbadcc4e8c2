"""HLO element types as LLVM types (registers and memory), and the loops
every code generator builds on."""
import numbers
import re

import ml_dtypes
import numpy as np
from llvmlite import ir

from ...errors import Unsupported

_REGISTER = {"pred": ir.IntType(1), "s8": ir.IntType(8), "u8": ir.IntType(8),
             "s16": ir.IntType(16), "u16": ir.IntType(16), "s32": ir.IntType(32),
             "u32": ir.IntType(32), "s64": ir.IntType(64), "u64": ir.IntType(64),
             "f32": ir.FloatType(), "f64": ir.DoubleType(),
             # 16-bit floats are only stored, loaded and converted (passes/widen_floats.py);
             # bf16, which llvmlite has no type for, as its bits.
             "f16": ir.HalfType(), "bf16": ir.IntType(16)}


def register_type(dtype):
    try:
        return _REGISTER[dtype]
    except KeyError:
        raise Unsupported(f"the CPU compiler does not support element type {dtype}") from None


def memory_type(dtype):
    """pred lives in memory as one byte (numpy's bool)."""
    return ir.IntType(8) if dtype == "pred" else register_type(dtype)


def is_float(dtype):
    return dtype in ("f32", "f64")


def constant(dtype, value):
    """An LLVM constant of element type `dtype`."""
    if dtype == "bf16":
        return ir.Constant(I16, int(np.asarray(value, ml_dtypes.bfloat16).view(np.uint16)))
    if dtype in ("f16", "f32", "f64"):
        return ir.Constant(register_type(dtype), float(value))
    return ir.Constant(register_type(dtype), int(value))


def is_signed(dtype):
    return dtype.startswith("s")


def bits(dtype):
    return {"f16": 16, "f32": 32, "f64": 64}.get(dtype) or register_type(dtype).width


I1, I16, I32, I64 = ir.IntType(1), ir.IntType(16), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()


# llvmlite builds no self-referential metadata node, which loop metadata must
# be: a loop's node names itself by this string, made a self-reference in the
# module's text (self_referential_loops).
_LOOP_SELF = "kerasjit.loop.self"


def counted_loop(b, fn, extent, body, unroll=True):
    """for (i = 0; i < extent; ++i) body(i), at the builder's position; without
    `unroll`, LLVM leaves the loop as it is (hand-blocked code, whose body is
    already a block of FMAs: unrolling it costs compile time, no speed)."""
    pre = b.block
    head = fn.append_basic_block("loop")
    done = fn.append_basic_block("after")
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64)
    i.add_incoming(ir.Constant(I64, 0), pre)
    body(i)
    nxt = b.add(i, ir.Constant(I64, 1))
    i.add_incoming(nxt, b.block)
    latch = b.cbranch(b.icmp_signed("<", nxt, ir.Constant(I64, extent)), head, done)
    if not unroll:
        _no_unroll(latch)
    b.position_at_end(done)


def while_loop(b, fn, test, body):
    """while (test()) body(), at the builder's position: `test` emits code that
    returns an i1."""
    head, loop, done = (fn.append_basic_block(s) for s in ("while", "do", "end"))
    b.branch(head)
    b.position_at_end(head)
    b.cbranch(test(), loop, done)
    b.position_at_end(loop)
    body()
    b.branch(head)
    b.position_at_end(done)


def _no_unroll(latch):
    """Loop metadata on a loop's latch branch: LLVM does not unroll it."""
    module = latch.function.module
    latch.set_metadata("llvm.loop", module.add_metadata([
        ir.MetaDataString(module, _LOOP_SELF),
        module.add_metadata([ir.MetaDataString(module, "llvm.loop.unroll.disable")])]))


def self_referential_loops(text):
    """Module text with each loop metadata node (counted_loop) naming itself."""
    return re.sub(r'^(!\d+) = !\{ !"' + re.escape(_LOOP_SELF) + '"', r"\1 = distinct !{ \1",
                  text, flags=re.M)


def run_time_loop(b, fn, lo, hi, body, unroll=True):
    """for (i = lo; i < hi; ++i) body(i), bounds known only at run time
    (a split kernel's outermost loop: its part of the rows); `unroll` as for
    counted_loop."""
    pre = b.block
    head, loop, done = (fn.append_basic_block(s) for s in ("for", "body", "done"))
    b.branch(head)
    b.position_at_end(head)
    i = b.phi(I64)
    i.add_incoming(lo, pre)
    b.cbranch(b.icmp_signed("<", i, hi), loop, done)
    b.position_at_end(loop)
    body(i)
    i.add_incoming(b.add(i, ir.Constant(I64, 1)), b.block)
    latch = b.branch(head)
    if not unroll:
        _no_unroll(latch)
    b.position_at_end(done)


def linear(b, *terms):
    """The i64 sum of `terms`: (i64 value, int scale) products, i64 values
    and ints. No instruction for a zero term or a unit scale, constants added
    once (every instruction is printed and parsed again on each compile: the
    address arithmetic was a seventh of a module's instructions adding 0 or
    multiplying by 1)."""
    total, constant = None, 0
    for term in terms:
        value, scale = term if isinstance(term, tuple) else (term, 1)
        if isinstance(value, numbers.Integral):
            constant += int(value) * scale
            continue
        if isinstance(value, ir.Constant) and isinstance(value.type, ir.IntType) \
                and isinstance(value.constant, int):
            constant += value.constant * scale
            continue
        if scale == 0:
            continue
        if scale != 1:
            value = b.mul(value, ir.Constant(I64, scale))
        total = value if total is None else b.add(total, value)
    if total is None:
        return ir.Constant(I64, constant)
    return b.add(total, ir.Constant(I64, constant)) if constant else total


def unflatten(b, flat, extents):
    """The row-major indices (i64 values) of position `flat` in a box of
    `extents`; the outermost index is not reduced (flat may run past the box)."""
    out = []
    for extent in reversed(extents[1:]):
        out.append(b.urem(flat, ir.Constant(I64, extent)))
        flat = b.udiv(flat, ir.Constant(I64, extent))
    return [flat] + out[::-1] if extents else []
