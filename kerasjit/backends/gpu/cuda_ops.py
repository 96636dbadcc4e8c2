"""CUDA C for HLO element types, constants and elementwise opcodes, with XLA's semantics.

The same edges as the CPU backend's ops.py (and the evaluator): integer
division by zero, INT_MIN / -1, shifts past the bit width, saturating
float-to-int with NaN -> 0, NaN-propagating maximum/minimum. C leaves those
undefined or different, so they go through the small helpers in PRELUDE;
integer add/subtract/multiply wrap through unsigned arithmetic for the same
reason (signed overflow is undefined in C++, two's complement in XLA).
"""
import math
from dataclasses import dataclass

import numpy as np

from ...hlo.shape import DTYPES
from ...errors import Unsupported
from ...hlo.opcodes import COMPLEX, FLOAT
from ..rules import Rule, any_type, rule_for

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

// x^n wrapping, by squaring; a negative n gives 1/x truncated (1, +-1 or 0).
template <typename T> __device__ __forceinline__ T kj_pow(T x, T n) {
    typedef typename kj_int<T>::u U;
    if (n < 0) return x == 1 ? (T)1 : x == (T)~(T)0 ? ((n & 1) ? x : (T)1) : (T)0;
    T result = 1;
    for (U e = (U)n; e != 0; e >>= 1) {
        if (e & 1) result = kj_mul(result, x);
        x = kj_mul(x, x);
    }
    return result;
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
    return rule_for(RULES, "CUDA", opcode, is_float(dtype))(Site(opcode, dtype, out_dtype, attr),
                                                             *args)


@dataclass(frozen=True)
class Site:
    """One opcode being written: its operand and result element types."""
    opcode: str
    dtype: str          # the first operand's (or, without operands, the result's)
    out: str
    attr: object


def _call(name):
    """A CUDA math function: the f32 one (name + "f") for f32."""
    return lambda s, *args: f"{name}{'f' if s.dtype == 'f32' else ''}({', '.join(args)})"


def _helper(name):
    """A PRELUDE helper (overloaded or a template on the element type)."""
    return lambda s, *args: f"{name}({', '.join(args)})"


def _infix(op):
    return lambda s, x, y: f"({x} {op} {y})"


def _bitwise(op):
    """pred is bool: the result of & | ^ is an int, made bool again."""
    def rule(s, x, y):
        if s.dtype == "pred":
            return f"(({x} {op} {y}) != 0)"
        return f"(({ctype(s.dtype)})({x} {op} {y}))"
    return rule


def _not(s, x):
    return f"(!{x})" if s.dtype == "pred" else f"(({ctype(s.dtype)})~{x})"   # (~true is true)


def _int_abs(s, x):
    return f"({x} < 0 ? kj_sub(({ctype(s.dtype)})0, {x}) : {x})" if _signed(s.dtype) else x


def _int_sign(s, x):
    c = ctype(s.dtype)
    return f"(({c})({x} < 0 ? -1 : {x} != 0))" if _signed(s.dtype) else f"(({c})({x} != 0))"


def _popcnt(s, x):
    c, width = ctype(s.dtype), bits(s.dtype)
    return f"(({c})__popcll((u64){x}))" if width == 64 else f"(({c})__popc((u32)(u{width}){x}))"


def _count_leading_zeros(s, x):
    c, width = ctype(s.dtype), bits(s.dtype)
    if width == 64:
        return f"(({c})__clzll((s64){x}))"
    return f"(({c})(__clz((s32)(u32)(u{width}){x}) - {32 - width}))"


def _bitcast_convert(s, x):
    if bits(s.dtype) != bits(s.out) or "pred" in (s.dtype, s.out):
        raise Unsupported("bitcast-convert between different widths")
    return f"kj_bitcast<{ctype(s.out)}>({x})"


def _signed(dtype):
    return dtype.startswith("s")


# Opcode -> its C expression, per type class (backends/rules.py). Integer
# arithmetic goes through PRELUDE's helpers (wrapping, XLA's edges).
RULES = {
    "add": Rule(_infix("+"), _helper("kj_add")),
    "subtract": Rule(_infix("-"), _helper("kj_sub")),
    "multiply": Rule(_infix("*"), _helper("kj_mul")),
    "divide": Rule(_infix("/"), _helper("kj_div")),
    "remainder": Rule(_call("fmod"), _helper("kj_rem")),
    "maximum": any_type(_helper("kj_max")),
    "minimum": any_type(_helper("kj_min")),
    "power": Rule(_call("pow"), _helper("kj_pow")),
    "atan2": Rule(float=_call("atan2")),
    "and": Rule(int=_bitwise("&")),
    "or": Rule(int=_bitwise("|")),
    "xor": Rule(int=_bitwise("^")),
    "shift-left": Rule(int=_helper("kj_shl")),
    "shift-right-logical": Rule(int=_helper("kj_shr_logical")),
    "shift-right-arithmetic": Rule(int=_helper("kj_shr_arithmetic")),
    "abs": Rule(_call("fabs"), _int_abs),
    "negate": Rule(lambda s, x: f"(-{x})", lambda s, x: f"kj_sub(({ctype(s.dtype)})0, {x})"),
    "sign": Rule(_helper("kj_sign"), _int_sign),
    "not": Rule(int=_not),
    "popcnt": Rule(int=_popcnt),
    "count-leading-zeros": Rule(int=_count_leading_zeros),
    "exponential": Rule(float=_call("exp")),
    "log": Rule(float=_call("log")),
    "tanh": Rule(float=_call("tanh")),
    "logistic": Rule(float=_helper("kj_logistic")),
    "exponential-minus-one": Rule(float=_call("expm1")),
    "log-plus-one": Rule(float=_call("log1p")),
    "sqrt": Rule(float=_call("sqrt")),
    "rsqrt": Rule(float=_call("rsqrt")),
    "cbrt": Rule(float=_call("cbrt")),
    "erf": Rule(float=_call("erf")),
    "sine": Rule(float=_call("sin")),
    "cosine": Rule(float=_call("cos")),
    "tan": Rule(float=_call("tan")),
    "floor": Rule(float=_call("floor")),
    "ceil": Rule(float=_call("ceil")),
    "round-nearest-afz": Rule(float=_call("round")),
    "round-nearest-even": Rule(float=_call("rint")),
    "is-finite": Rule(float=_helper("kj_is_finite")),
    "convert": any_type(lambda s, x: _convert(x, s.dtype, s.out)),
    "bitcast-convert": any_type(_bitcast_convert),
    "copy": any_type(lambda s, x: x),
    "select": any_type(lambda s, p, x, y: f"({p} ? {x} : {y})"),
    # C's != is unordered and the others ordered, as in XLA.
    "compare": any_type(lambda s, x, y: f"({x} {_COMPARE[s.attr]} {y})"),
    "clamp": any_type(_helper("kj_clamp")),
}
# Left to TensorFlow, by opcode and type class: complex numbers, precision
# emulation, integer powers.
FALLBACK = {"real": COMPLEX, "imag": COMPLEX, "complex": COMPLEX, "reduce-precision": FLOAT}


def _convert(x, src, dst):
    if src == dst:
        return x
    if dst == "pred":            # != is unordered: NaN converts to true
        return f"({x} != 0)"
    if is_float(src) and not is_float(dst):
        return f"kj_to_int<{ctype(dst)}>({x})"
    return f"(({ctype(dst)}){x})"
