"""numpy references of the elementwise opcodes, with XLA's semantics at the
edges (integer division by zero, shifts past the width, saturating
float-to-int conversion, TOTALORDER compares, -0's sign). Each takes the
instruction and its operand arrays; hlo/opcodes.py names each opcode's."""
import math

import ml_dtypes
import numpy as np

from .shape import DTYPES

UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_SINT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}

def out_dtype(inst):
    return inst.shape.numpy_dtype


def is_float(x):
    return x.dtype.kind == "f" or x.dtype == DTYPES["bf16"]


def unary(fn):
    """A float function; f16/bf16 are computed in f32 (numpy lacks some loops)."""
    def impl(inst, x):
        if x.dtype.itemsize < 4 and is_float(x):
            x = x.astype(np.float32)
        return fn(x)
    return impl


def binary(ufunc):
    return lambda inst, a, b: ufunc(a, b)


def _safe_divisor(a, b):
    """Integer divisor with 0 and (INT_MIN / -1) replaced by 1; XLA defines both."""
    bad = b == 0
    if a.dtype.kind == "i":
        bad = bad | ((a == np.iinfo(a.dtype).min) & (b == -1))
    return np.where(bad, np.ones_like(b), b)


def divide(inst, a, b):
    if a.dtype.kind not in "iu":
        return np.divide(a, b)
    d = _safe_divisor(a, b)
    q = np.floor_divide(a, d)
    # floor -> truncation toward zero, as in C.
    q = q + ((np.remainder(a, d) != 0) & ((a < 0) != (d < 0))).astype(q.dtype)
    return np.where(b == 0, np.array(-1).astype(a.dtype), q)   # x/0 is all ones


def remainder(inst, a, b):
    if a.dtype.kind not in "iu":
        return np.fmod(a, b)
    return np.where(b == 0, a, np.fmod(a, _safe_divisor(a, b)))


def power(inst, a, b):
    if a.dtype.kind not in "iu":
        return np.power(a, b)
    # Exponentiation by squaring, wrapping; negative exponents give 1/a truncated.
    result, base = np.ones_like(a), a.copy()
    e = np.where(b < 0, 0, b).astype(np.uint64)
    while np.any(e):
        result = np.where(e & 1, result * base, result)
        base, e = base * base, e >> np.uint64(1)
    if a.dtype.kind == "i":
        neg = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0))
        result = np.where(b < 0, neg.astype(a.dtype), result)
    return result


def as_unsigned(x):
    return x.view(UINT[x.dtype.itemsize])


def shift(inst, a, b):
    bits = a.dtype.itemsize * 8
    amount = as_unsigned(np.asarray(b, dtype=a.dtype))   # negative amounts are huge
    too_far = amount >= bits
    amount = np.where(too_far, 0, amount).astype(a.dtype)
    if inst.opcode == "shift-left":
        return np.where(too_far, 0, np.left_shift(a, amount)).astype(a.dtype)
    if inst.opcode == "shift-right-logical":
        ua = as_unsigned(a)
        out = np.right_shift(ua, as_unsigned(amount)).astype(ua.dtype)
        return np.where(too_far, 0, out).astype(ua.dtype).view(a.dtype)
    sa = a.view(_SINT[a.dtype.itemsize])
    out = np.right_shift(sa, amount.view(sa.dtype)).astype(sa.dtype)
    fill = np.right_shift(sa, bits - 1)
    return np.where(too_far, fill, out).astype(sa.dtype).view(a.dtype)


def _total_order_key(x):
    """Floats -> signed ints ordered like XLA's TOTALORDER (-NaN < -inf < ... < NaN)."""
    i = x.view(_SINT[x.dtype.itemsize])
    return np.where(i < 0, i ^ np.iinfo(i.dtype).max, i)


_COMPARE = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
            "GT": np.greater, "GE": np.greater_equal}


def compare(inst, a, b):
    kind = inst.attrs.get("type", inst.attrs.get("comparison_type"))   # XLA prints `type=`
    if kind == "TOTALORDER" and is_float(a):
        a, b = _total_order_key(a), _total_order_key(b)
    return _COMPARE[inst.attrs["direction"]](a, b)


def round_afz(inst, x):
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)


def logical_not(inst, x):
    return np.logical_not(x) if x.dtype == np.bool_ else np.invert(x)


def convert(inst, x):
    to = out_dtype(inst)
    if to == np.bool_:
        return x != 0
    if np.iscomplexobj(x) and to.kind != "c":
        x = np.real(x)
    if to.kind in "iu" and is_float(x):
        # Truncate toward zero, saturate at the type's range, NaN -> 0 (XLA).
        t = np.trunc(x.astype(np.float64))
        lo, hi = np.iinfo(to).min, np.iinfo(to).max
        inside = (t > lo) & (t < hi)
        out = np.where(inside, t, 0).astype(to)
        out = np.where(t <= lo, to.type(lo), out)
        out = np.where(t >= hi, to.type(hi), out)
        return np.where(np.isnan(t), to.type(0), out)
    return x.astype(to)


def bitcast_convert(inst, x):
    """Reinterpret bits; between widths the narrower side has an extra last dim."""
    to, x = out_dtype(inst), np.array(x, order="C")   # keeps 0-d arrays 0-d
    if to.itemsize > x.dtype.itemsize:
        return x.view(to)[..., 0]
    return x[..., None].view(to) if to.itemsize < x.dtype.itemsize else x.view(to)


def popcnt(inst, x):
    return np.bitwise_count(as_unsigned(x))


def count_leading_zeros(inst, x):
    u = as_unsigned(x)
    bits = u.dtype.itemsize * 8
    length = sum((u >> u.dtype.type(b)) != 0 for b in range(bits))   # bit length
    return bits - np.asarray(length)


def erf(inst, x):
    return np.frompyfunc(math.erf, 1, 1)(x.astype(np.float64))


def imag(inst, x):
    return np.imag(x) if np.iscomplexobj(x) else np.zeros_like(x)


def reduce_precision(inst, x):
    """Round to `mantissa_bits` (nearest even) and clamp to `exponent_bits` range,
    by bit manipulation as XLA does; NaN stays NaN."""
    finfo = ml_dtypes.finfo(x.dtype)
    src_m, src_e = finfo.nmant, finfo.nexp
    m, e = inst.attrs["mantissa_bits"], inst.attrs["exponent_bits"]
    u = as_unsigned(x)
    t = u.dtype.type
    if m < src_m:
        shift = src_m - m
        last_bit = t(1) << t(shift)
        bias = ((u & last_bit) >> t(shift)) + (last_bit >> t(1)) - t(1)
        u = (u + bias) & ~(last_bit - t(1))
    if e < src_e:
        sign = t(1) << t(x.dtype.itemsize * 8 - 1)
        exp_mask = ((t(1) << t(src_e)) - t(1)) << t(src_m)
        src_bias, bias = (1 << (src_e - 1)) - 1, (1 << (e - 1)) - 1
        exp = u & exp_mask
        zero = u & sign
        u = np.where(exp > t(src_bias + bias) << t(src_m), zero | exp_mask, u)
        u = np.where(exp <= t(src_bias - bias) << t(src_m), zero, u)
    return np.where(np.isnan(x), x, u.view(x.dtype))


def clamp(inst, lo, x, hi):
    return np.minimum(np.maximum(x, lo), hi)
