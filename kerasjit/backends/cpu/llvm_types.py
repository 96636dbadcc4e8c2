"""HLO element types as LLVM types (registers and memory)."""
from llvmlite import ir

from ...kernels.lower import Unsupported

_REGISTER = {"pred": ir.IntType(1), "s8": ir.IntType(8), "u8": ir.IntType(8),
             "s16": ir.IntType(16), "u16": ir.IntType(16), "s32": ir.IntType(32),
             "u32": ir.IntType(32), "s64": ir.IntType(64), "u64": ir.IntType(64),
             "f32": ir.FloatType(), "f64": ir.DoubleType()}


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


def is_signed(dtype):
    return dtype.startswith("s")


def bits(dtype):
    return register_type(dtype).width if not is_float(dtype) else (32 if dtype == "f32" else 64)
