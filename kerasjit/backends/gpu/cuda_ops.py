"""CUDA C for HLO element types, constants and elementwise opcodes, with XLA's semantics.

The same edges as the CPU backend's ops.py (and the evaluator): integer
division by zero, INT_MIN / -1, shifts past the bit width, saturating
float-to-int with NaN -> 0, NaN-propagating maximum/minimum. C leaves those
undefined or different, so they go through the small helpers in PRELUDE;
integer add/subtract/multiply wrap through unsigned arithmetic for the same
reason (signed overflow is undefined in C++, two's complement in XLA).
"""
import math

import numpy as np

from ...hlo.shape import DTYPES
from ...kernels.lower import Unsupported

CTYPE = {"pred": "bool", "s8": "s8", "u8": "u8", "s16": "s16", "u16": "u16", "s32": "s32",
         "u32": "u32", "s64": "s64", "u64": "u64", "f32": "float", "f64": "double"}

PRELUDE = r"""// kerasjit CUDA prelude: element types and XLA-semantics helpers.
typedef signed char s8;
typedef unsigned char u8;
typedef short s16;
typedef unsigned short u16;
typedef int s32;
typedef unsigned int u32;
typedef long long s64;
typedef unsigned long long u64;

// Per integer type: same-width unsigned and signed types, an unsigned type
// at least as wide as int (so u8/u16 arithmetic does not promote to signed
// int and overflow), and the range.
template <typename T> struct kj_int;
#define KJ_INT(T, U, S, W, LO, HI) template <> struct kj_int<T> { \
    typedef U u; typedef S s; typedef W w; \
    __device__ static T lo() { return LO; } __device__ static T hi() { return HI; } };
KJ_INT(s8, u8, s8, u32, -128, 127)
KJ_INT(u8, u8, s8, u32, 0, 255)
KJ_INT(s16, u16, s16, u32, -32768, 32767)
KJ_INT(u16, u16, s16, u32, 0, 65535)
KJ_INT(s32, u32, s32, u32, -2147483647 - 1, 2147483647)
KJ_INT(u32, u32, s32, u32, 0u, 4294967295u)
KJ_INT(s64, u64, s64, u64, -9223372036854775807LL - 1, 9223372036854775807LL)
KJ_INT(u64, u64, s64, u64, 0ull, 18446744073709551615ull)
#undef KJ_INT

template <typename To, typename From> __device__ __forceinline__ To kj_bitcast(From x) {
    To y;
    memcpy(&y, &x, sizeof y);
    return y;
}

template <typename T> __device__ __forceinline__ T kj_add(T a, T b) {
    typedef typename kj_int<T>::w W;
    return (T)((W)a + (W)b);
}
template <typename T> __device__ __forceinline__ T kj_sub(T a, T b) {
    typedef typename kj_int<T>::w W;
    return (T)((W)a - (W)b);
}
template <typename T> __device__ __forceinline__ T kj_mul(T a, T b) {
    typedef typename kj_int<T>::w W;
    return (T)((W)a * (W)b);
}

// x / 0 = -1 (all ones); INT_MIN / -1 = INT_MIN.
template <typename T> __device__ __forceinline__ T kj_div(T x, T y) {
    if (y == 0) return (T)~(T)0;
    if (kj_int<T>::lo() != 0 && y == (T)~(T)0) return kj_sub((T)0, x);
    return (T)(x / y);
}
// x % 0 = x; INT_MIN % -1 = 0.
template <typename T> __device__ __forceinline__ T kj_rem(T x, T y) {
    if (y == 0) return x;
    if (kj_int<T>::lo() != 0 && y == (T)~(T)0) return (T)0;
    return (T)(x % y);
}

// Shift amounts are compared unsigned: negative ones are past the width too.
template <typename T> __device__ __forceinline__ T kj_shl(T x, T n) {
    typedef typename kj_int<T>::u U;
    typedef typename kj_int<T>::w W;
    return (U)n >= 8 * sizeof(T) ? (T)0 : (T)((W)(U)x << (U)n);
}
template <typename T> __device__ __forceinline__ T kj_shr_logical(T x, T n) {
    typedef typename kj_int<T>::u U;
    return (U)n >= 8 * sizeof(T) ? (T)0 : (T)((U)x >> (U)n);
}
// Arithmetic even for unsigned types (the sign bit is copied), as in LLVM's ashr.
template <typename T> __device__ __forceinline__ T kj_shr_arithmetic(T x, T n) {
    typedef typename kj_int<T>::u U;
    typedef typename kj_int<T>::s S;
    const U bits = 8 * sizeof(T);
    return (T)((S)x >> ((U)n >= bits ? bits - 1 : (U)n));
}

// Saturating, NaN -> 0. (F)hi() may round up to 2^bits-ish: then x >= it saturates.
template <typename T, typename F> __device__ __forceinline__ T kj_to_int(F x) {
    if (x != x) return (T)0;
    if (x <= (F)kj_int<T>::lo()) return kj_int<T>::lo();
    if (x >= (F)kj_int<T>::hi()) return kj_int<T>::hi();
    return (T)x;
}

// NaN-propagating (fmaxf/fminf return the other operand).
#define KJ_NAN_PROPAGATING(F, name, f) \
    __device__ __forceinline__ F name(F a, F b) { return a != a || b != b ? a + b : f(a, b); }
KJ_NAN_PROPAGATING(float, kj_max, fmaxf)
KJ_NAN_PROPAGATING(float, kj_min, fminf)
KJ_NAN_PROPAGATING(double, kj_max, fmax)
KJ_NAN_PROPAGATING(double, kj_min, fmin)
#undef KJ_NAN_PROPAGATING
template <typename T> __device__ __forceinline__ T kj_max(T a, T b) { return a > b ? a : b; }
template <typename T> __device__ __forceinline__ T kj_min(T a, T b) { return a < b ? a : b; }

template <typename T> __device__ __forceinline__ T kj_clamp(T lo, T x, T hi) {
    x = x < lo ? lo : x;
    return x > hi ? hi : x;
}
// 0 and NaN map to themselves.
template <typename T> __device__ __forceinline__ T kj_sign(T x) {
    return x > (T)0 ? (T)1 : x < (T)0 ? (T)-1 : x;
}
template <typename T> __device__ __forceinline__ bool kj_is_finite(T x) { return x - x == (T)0; }
__device__ __forceinline__ float kj_logistic(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ double kj_logistic(double x) { return 1.0 / (1.0 + exp(-x)); }
"""

_FLOAT_CALL = {  # opcode -> C function for double; f32 appends "f"
    "exponential": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "sine": "sin",
    "cosine": "cos", "tan": "tan", "tanh": "tanh", "exponential-minus-one": "expm1",
    "log-plus-one": "log1p", "cbrt": "cbrt", "erf": "erf", "floor": "floor", "ceil": "ceil",
    "round-nearest-afz": "round", "round-nearest-even": "rint", "abs": "fabs",
    "remainder": "fmod", "power": "pow", "atan2": "atan2"}
_HELPER = {"maximum": "kj_max", "minimum": "kj_min", "logistic": "kj_logistic",
           "sign": "kj_sign", "is-finite": "kj_is_finite", "clamp": "kj_clamp"}
_INT_HELPER = {"add": "kj_add", "subtract": "kj_sub", "multiply": "kj_mul",
               "divide": "kj_div", "remainder": "kj_rem", "shift-left": "kj_shl",
               "shift-right-logical": "kj_shr_logical",
               "shift-right-arithmetic": "kj_shr_arithmetic"}
_INFIX = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/", "and": "&", "or": "|",
          "xor": "^"}
_COMPARE = {"EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}
_SUFFIX = {"s32": "", "u32": "u", "s64": "LL", "u64": "ull"}


def ctype(dtype):
    try:
        return CTYPE[dtype]
    except KeyError:
        raise Unsupported(f"the CUDA compiler does not support element type {dtype}") from None


def memory_ctype(dtype):
    """pred lives in memory as one byte (numpy's bool)."""
    return "u8" if dtype == "pred" else ctype(dtype)


def is_float(dtype):
    return dtype in ("f32", "f64")


def bits(dtype):
    return DTYPES[dtype].itemsize * 8


def literal(dtype, value):
    """A C constant of exactly type `dtype`."""
    if dtype == "pred":
        return "true" if value else "false"
    if is_float(dtype):
        x = DTYPES[dtype].type(value)
        if not math.isfinite(x):      # no portable literal: build it from its bits
            int_type = "u32" if dtype == "f32" else "u64"
            raw = int(np.array(x).view(DTYPES[int_type]))
            return f"kj_bitcast<{ctype(dtype)}>({literal(int_type, raw)})"
        # numpy's shortest repr of the value in its own type reads back exactly.
        return str(x) + ("f" if dtype == "f32" else "")
    value = int(value)
    c = ctype(dtype)
    if dtype not in _SUFFIX:
        return f"(({c}){value})"
    if value == np.iinfo(DTYPES[dtype]).min and value < 0:   # -MIN does not fit
        return f"({value + 1}{_SUFFIX[dtype]} - 1)"
    return f"({value}{_SUFFIX[dtype]})" if value < 0 else f"{value}{_SUFFIX[dtype]}"


def expression(opcode, attr, out_dtype, in_dtypes, args):
    """C expression (of type out_dtype) for one elementwise opcode on C operand expressions."""
    dtype = in_dtypes[0] if in_dtypes else out_dtype
    if opcode == "convert":
        return _convert(args[0], dtype, out_dtype)
    if opcode == "bitcast-convert":
        if bits(dtype) != bits(out_dtype) or "pred" in (dtype, out_dtype):
            raise Unsupported("bitcast-convert between different widths")
        return f"kj_bitcast<{ctype(out_dtype)}>({args[0]})"
    if opcode == "copy":
        return args[0]
    if opcode == "select":
        return f"({args[0]} ? {args[1]} : {args[2]})"
    if opcode == "compare":     # C's != is unordered and the others ordered, as in XLA
        return f"({args[0]} {_COMPARE[attr]} {args[1]})"
    if opcode in _HELPER and (opcode not in ("sign", "is-finite") or is_float(dtype)):
        return f"{_HELPER[opcode]}({', '.join(args)})"
    if is_float(dtype):
        return _float(opcode, dtype, args)
    return _integer(opcode, dtype, args)


def _float(opcode, dtype, args):
    if opcode in _INFIX and opcode not in ("and", "or", "xor"):
        return f"({args[0]} {_INFIX[opcode]} {args[1]})"
    if opcode == "negate":
        return f"(-{args[0]})"
    if opcode in _FLOAT_CALL:
        return f"{_FLOAT_CALL[opcode]}{'f' if dtype == 'f32' else ''}({', '.join(args)})"
    raise Unsupported(f"the CUDA compiler has no float '{opcode}'")


def _integer(opcode, dtype, args):
    c = ctype(dtype)
    x = args[0]
    if dtype == "pred":          # bool: ~true is -2, still true
        if opcode == "not":
            return f"(!{x})"
        if opcode in ("and", "or", "xor"):
            return f"(({args[0]} {_INFIX[opcode]} {args[1]}) != 0)"
        raise Unsupported(f"the CUDA compiler has no pred '{opcode}'")
    signed = dtype.startswith("s")
    if opcode in _INT_HELPER:
        return f"{_INT_HELPER[opcode]}({', '.join(args)})"
    if opcode in ("and", "or", "xor"):
        return f"(({c})({args[0]} {_INFIX[opcode]} {args[1]}))"
    if opcode == "not":
        return f"(({c})~{x})"
    if opcode == "negate":
        return f"kj_sub(({c})0, {x})"
    if opcode == "abs":
        return f"({x} < 0 ? kj_sub(({c})0, {x}) : {x})" if signed else x
    if opcode == "sign":
        return f"(({c})({x} < 0 ? -1 : {x} != 0))" if signed else f"(({c})({x} != 0))"
    if opcode == "popcnt":
        return f"(({c})__popcll((u64){x}))" if bits(dtype) == 64 else \
            f"(({c})__popc((u32)(u{bits(dtype)}){x}))"
    if opcode == "count-leading-zeros":
        if bits(dtype) == 64:
            return f"(({c})__clzll((s64){x}))"
        return f"(({c})(__clz((s32)(u32)(u{bits(dtype)}){x}) - {32 - bits(dtype)}))"
    raise Unsupported(f"the CUDA compiler has no integer '{opcode}'")


def _convert(x, src, dst):
    if src == dst:
        return x
    if dst == "pred":            # != is unordered: NaN converts to true
        return f"({x} != 0)"
    if is_float(src) and not is_float(dst):
        return f"kj_to_int<{ctype(dst)}>({x})"
    return f"(({ctype(dst)}){x})"
