"""LLVM IR for HLO elementwise opcodes, with XLA's semantics at the edges.

Integer division by zero, shifts past the bit width, float-to-int overflow
and NaN follow XLA (and the evaluator) rather than C, whose behaviour there
is undefined.
"""
from dataclasses import dataclass

from llvmlite import ir

from ...errors import Unsupported
from ...hlo.opcodes import COMPLEX, FLOAT
from ..rules import Rule, any_type, rule_for
from .llvm_types import I32, bits, is_float, is_signed, register_type

_FCMP = {"EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}


def _f32(value):
    return ir.Constant(ir.FloatType(), value)


def _multiply_add(b, x, y, z):
    """x * y + z, one fused multiply-add where the CPU has them (llvm.fmuladd:
    half the instructions of a polynomial's steps, and rounded once)."""
    ty = x.type
    name = f"llvm.fmuladd.{'f32' if isinstance(ty, ir.FloatType) else 'f64'}"
    fn = b.module.globals.get(name) or ir.Function(b.module, ir.FunctionType(ty, [ty] * 3), name)
    return b.call(fn, [x, y, z])


def _horner(b, x, coefficients):
    """The polynomial with these coefficients (highest power first) at x."""
    p = _f32(coefficients[0])
    for coefficient in coefficients[1:]:
        p = _multiply_add(b, p, x, _f32(coefficient))
    return p


class OpEmitter:
    """Emits elementwise opcodes into one LLVM module by RULES (below)."""

    def __init__(self, module):
        self.module = module

    def emit(self, b, opcode, attr, out_dtype, in_dtypes, args):
        dtype = in_dtypes[0] if in_dtypes else out_dtype
        site = Site(self, b, opcode, dtype, out_dtype, in_dtypes, attr)
        return rule_for(RULES, "CPU", opcode, is_float(dtype))(site, *args)

    def function(self, name, ty, n):
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ty, [ty] * n), name)
        return fn

    def intrinsic(self, b, name, *args):
        ty = args[0].type
        suffix = "f32" if isinstance(ty, ir.FloatType) else "f64"
        return b.call(self.function(f"{name}.{suffix}", ty, len(args)), args)

    def libm(self, b, name, *args):
        """A C math library call (the f32 one for f32 operands)."""
        ty = args[0].type
        return b.call(self.function(name + ("f" if isinstance(ty, ir.FloatType) else ""),
                                    ty, len(args)), args)

    def compare(self, b, direction, dtype, x, y):
        if is_float(dtype):
            return b.fcmp_unordered("!=", x, y) if direction == "NE" else \
                b.fcmp_ordered(_FCMP[direction], x, y)
        op = b.icmp_signed if is_signed(dtype) else b.icmp_unsigned
        return op(_FCMP[direction], x, y)

    def exp(self, b, x):
        """e^x. For f32, arithmetic the loop vectoriser can widen (a libm call
        per element it cannot; 1M elements took 4.3 ms that way): x = n ln2 + r
        with |r| <= ln2/2 (Cody-Waite, ln2 in two parts), e^r by Cephes' expf
        polynomial, times 2^n built in the exponent bits. Within 1 ulp; NaN,
        +-inf and overflow as expf; below 2^-126 the result is 0, as the
        flushed denormals (codegen._flush_denormals) make it anyway."""
        if not isinstance(x.type, ir.FloatType):
            return self.intrinsic(b, "llvm.exp", x)
        f32, i32, c = x.type, ir.IntType(32), _f32
        hi, lo = 88.72283935546875, -87.33654475     # e^hi < 2^128, e^lo ~ 2^-126
        inside = self.intrinsic(b, "llvm.minnum", self.intrinsic(b, "llvm.maxnum", x, c(lo)),
                                c(hi))          # (NaN -> lo: no poison)
        n = self.intrinsic(b, "llvm.roundeven", b.fmul(inside, c(1.4426950408889634)))
        r = _multiply_add(b, n, c(2.12194440e-4), _multiply_add(b, n, c(-0.693359375), inside))
        p = _horner(b, r, (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3,
                           4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1))
        p = b.fadd(_multiply_add(b, b.fmul(p, r), r, r), c(1.0))
        # n reaches 128 just below `hi`: 2^n as 2^min(n, 127) times 1 or 2.
        top = b.fcmp_ordered(">", n, c(127.0))
        exponent = b.fptosi(b.select(top, c(127.0), n), i32)
        scale = b.bitcast(b.shl(b.add(exponent, ir.Constant(i32, 127)), ir.Constant(i32, 23)), f32)
        y = b.fmul(b.fmul(p, scale), b.select(top, c(2.0), c(1.0)))
        y = b.select(b.fcmp_ordered(">", x, c(hi)), c(float("inf")), y)
        y = b.select(b.fcmp_ordered("<", x, c(lo)), c(0.0), y)
        return b.select(b.fcmp_unordered("uno", x, x), x, y)

    def tanh_f32(self, b, x):
        """tanh as vectorisable arithmetic (see exp): Cephes' tanhf, an odd
        polynomial below |x| = 0.625 and 1 - 2 / (e^2|x| + 1) above, with
        x's sign; both are computed and one selected, so the loop stays
        branch-free. Within 1.3 ulp; NaN stays NaN, +-inf gives +-1."""
        c = _f32
        z = b.fmul(x, x)
        p = _horner(b, z, (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2,
                           1.33314422036e-1, -3.33332819422e-1))
        small = _multiply_add(b, b.fmul(p, z), x, x)
        magnitude = self.intrinsic(b, "llvm.fabs", x)
        large = b.fsub(c(1.0), b.fdiv(c(2.0), b.fadd(self.exp(b, b.fadd(magnitude, magnitude)),
                                                      c(1.0))))
        chosen = b.select(b.fcmp_ordered("<", magnitude, c(0.625)), small, large)
        return self.intrinsic(b, "llvm.copysign", chosen, x)     # (tanh(-0) = -0)

    def erf_f32(self, b, x):
        """erf as vectorisable arithmetic (see exp; a libm call per element was
        a GPT decoder's gelu's largest cost): for |x| < 0.875, x P(x^2); above,
        1 - e^-x^2 Q(1 / (1 + |x| / 2)), with |x| at most 4 (erf(4) is 1 in
        f32), x's sign. P and Q: least-squares fits of erf(x) / x and
        erfc(x) e^x^2, made for kerasjit. Within 3 ulp; NaN stays NaN,
        +-inf gives +-1."""
        c = _f32
        magnitude = self.intrinsic(b, "llvm.fabs", x)
        small = b.fmul(magnitude, _horner(b, b.fmul(x, x), (
            8.671001705806702e-05, -0.000821008812636137, 0.005206658970564604,
            -0.02686154842376709, 0.11283732205629349, -0.37612634897232056,
            1.128379225730896)))
        bounded = self.intrinsic(b, "llvm.minnum", magnitude, c(4.0))
        t = b.fdiv(c(1.0), _multiply_add(b, bounded, c(0.5), c(1.0)))
        tail = _horner(b, t, (
            -0.03912227600812912, 0.2940271198749542, -0.8105903267860413, 0.9380528926849365,
            -0.36089083552360535, 0.4602329432964325, 0.22914262115955353,
            0.28962987661361694, -0.0004712996305897832))
        large = b.fsub(c(1.0), b.fmul(self.exp(b, b.fneg(b.fmul(bounded, bounded))), tail))
        chosen = b.select(b.fcmp_ordered("<", magnitude, c(0.875)), small, large)
        result = self.intrinsic(b, "llvm.copysign", chosen, x)
        return b.select(b.fcmp_unordered("uno", x, x), x, result)

    def log1p_f32(self, b, x):
        """log(1 + x) as vectorisable arithmetic (a libm call per element was
        ~18 ns; softplus is one): u = 1 + x rounded, then log(u) x / (u - 1),
        whose quotient undoes u's rounding (Goldberg), or x where u is 1.
        Within 3 ulp; +inf and NaN themselves, -1 gives -inf."""
        c = _f32
        u = b.fadd(c(1.0), x)
        y = b.fmul(self.log_f32(b, u), b.fdiv(x, b.fsub(u, c(1.0))))
        y = b.select(b.fcmp_ordered("==", u, c(float("inf"))), u, y)
        return b.select(b.fcmp_ordered("==", u, c(1.0)), x, y)

    def expm1_f32(self, b, x):
        """e^x - 1 as vectorisable arithmetic (see log1p): u = e^x, then
        (u - 1) x / log(u), the quotient undoing u's rounding (Kahan), or x
        where u is 1, -1 where u - 1 is. Within 3 ulp; +inf and NaN
        themselves, -inf gives -1."""
        c = _f32
        u = self.exp(b, x)
        less = b.fsub(u, c(1.0))
        y = b.fdiv(b.fmul(less, x), self.log_f32(b, u))
        y = b.select(b.fcmp_ordered("==", less, c(-1.0)), less, y)
        y = b.select(b.fcmp_ordered("==", u, c(float("inf"))), u, y)
        return b.select(b.fcmp_ordered("==", u, c(1.0)), x, y)

    def log_f32(self, b, x):
        """log as vectorisable arithmetic (see exp): Cephes' logf. x = m 2^e
        from the bits, m in [sqrt(1/2), sqrt(2)), log(1 + (m - 1)) by a
        polynomial, plus e ln2 in two parts. Within 1 ulp. The tests on x are
        made on its bits: the flushed-denormal mode (codegen._flush_denormals)
        reads a denormal operand of float arithmetic as 0, and TensorFlow's log
        of a denormal is its true log (a denormal is rescaled from its integer
        mantissa here). 0 gives -inf, negatives NaN, +inf and NaN themselves."""
        f32, i32, c = x.type, ir.IntType(32), _f32

        def i(value):
            return ir.Constant(i32, value)
        raw = b.bitcast(x, i32)
        magnitude = b.and_(raw, i(0x7fffffff))
        denormal = b.and_(b.icmp_signed(">", raw, i(0)), b.icmp_signed("<", raw, i(0x00800000)))
        # A denormal is its mantissa (an integer, exact as a float) times 2^-149.
        bits = b.select(denormal, b.bitcast(b.sitofp(raw, f32), i32), raw)
        e = b.sitofp(b.sub(b.lshr(bits, i(23)), i(126)), f32)         # x = m 2^e, m in [1/2, 1)
        e = b.select(denormal, b.fsub(e, c(149.0)), e)
        m = b.bitcast(b.or_(b.and_(bits, i(0x007fffff)), i(0x3f000000)), f32)
        low = b.fcmp_ordered("<", m, c(0.707106781186547524))
        e = b.select(low, b.fsub(e, c(1.0)), e)
        m = b.fsub(b.select(low, b.fadd(m, m), m), c(1.0))              # now in [-0.29, 0.41)
        z = b.fmul(m, m)
        p = _horner(b, m, (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1,
                           -1.2420140846e-1, 1.4249322787e-1, -1.6668057665e-1,
                           2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1))
        y = _multiply_add(b, b.fmul(p, m), z, b.fmul(e, c(-2.12194440e-4)))
        y = _multiply_add(b, z, c(-0.5), y)
        y = _multiply_add(b, e, c(0.693359375), b.fadd(m, y))
        y = b.select(b.icmp_signed(">=", magnitude, i(0x7f800000)), x, y)   # +inf, NaN
        y = b.select(b.icmp_signed("<", raw, i(0)), c(float("nan")), y)   # negative
        return b.select(b.icmp_signed("==", magnitude, i(0)), c(float("-inf")), y)

    def divide(self, b, opcode, signed, x, y):
        ty = x.type
        zero, ones = ir.Constant(ty, 0), ir.Constant(ty, -1)
        by_zero = b.icmp_unsigned("==", y, zero)
        bad = by_zero
        if signed:              # INT_MIN / -1 overflows: XLA gives INT_MIN (and 0 remainder)
            int_min = ir.Constant(ty, -(1 << (ty.width - 1)))
            overflow = b.and_(b.icmp_signed("==", x, int_min), b.icmp_signed("==", y, ones))
            bad = b.or_(by_zero, overflow)
        safe = b.select(bad, ir.Constant(ty, 1), y)
        if opcode == "divide":
            q = (b.sdiv if signed else b.udiv)(x, safe)
            return b.select(by_zero, ones, q)
        r = (b.srem if signed else b.urem)(x, safe)
        return b.select(by_zero, x, b.select(bad, zero, r) if signed else r)

    def convert(self, b, x, src, dst):
        to = register_type(dst)
        if src == dst:
            return x
        if src in ("f16", "bf16"):       # (exactly, to f32 first)
            return self.convert(b, _widened(b, x, src), "f32", dst)
        if dst in ("f16", "bf16"):
            wide = x if is_float(src) else self.convert(b, x, src, "f32")
            if dst == "f16":
                return b.fptrunc(wide, to)
            return _bf16(b, b.fptrunc(wide, ir.FloatType()) if src == "f64" else wide)
        if dst == "pred":
            return b.fcmp_unordered("!=", x, ir.Constant(x.type, 0.0)) if is_float(src) \
                else b.icmp_unsigned("!=", x, ir.Constant(x.type, 0))
        if is_float(src) and is_float(dst):
            return b.fpext(x, to) if bits(dst) > bits(src) else b.fptrunc(x, to)
        if is_float(dst):
            return b.sitofp(x, to) if is_signed(src) else b.uitofp(x, to)
        if is_float(src):       # saturating, NaN -> 0: XLA's float-to-int
            name = f"llvm.fpto{'s' if is_signed(dst) else 'u'}i.sat.i{to.width}." \
                   f"{'f32' if src == 'f32' else 'f64'}"
            fn = self.module.globals.get(name) or ir.Function(
                self.module, ir.FunctionType(to, [x.type]), name)
            return b.call(fn, [x])
        if to.width < x.type.width:
            return b.trunc(x, to)
        if to.width > x.type.width:
            return b.sext(x, to) if is_signed(src) else b.zext(x, to)
        return x


def _widened(b, x, dtype):
    """A 16-bit float register as f32."""
    if dtype == "f16":
        return b.fpext(x, ir.FloatType())
    return b.bitcast(b.shl(b.zext(x, I32), ir.Constant(I32, 16)), ir.FloatType())


def _bf16(b, x):
    """f32 -> bf16 bits, rounded to nearest even; a NaN stays a (quiet) NaN."""
    word = b.bitcast(x, I32)
    odd = b.and_(b.lshr(word, ir.Constant(I32, 16)), ir.Constant(I32, 1))
    rounded = b.lshr(b.add(word, b.add(odd, ir.Constant(I32, 0x7FFF))), ir.Constant(I32, 16))
    quiet = b.or_(b.lshr(word, ir.Constant(I32, 16)), ir.Constant(I32, 0x40))
    nan = b.fcmp_unordered("uno", x, x)
    return b.trunc(b.select(nan, quiet, rounded), ir.IntType(16))


@dataclass
class Site:
    """One opcode being emitted: where, and on which element types."""
    em: OpEmitter
    b: ir.IRBuilder
    opcode: str
    dtype: str          # the first operand's (or, without operands, the result's)
    out: str
    in_dtypes: list
    attr: object

    def intrinsic(self, name, *args):
        return self.em.intrinsic(self.b, name, *args)

    def libm(self, name, *args):
        return self.em.libm(self.b, name, *args)

    def zero(self, x):
        return ir.Constant(x.type, 0.0 if is_float(self.dtype) else 0)

    def one(self, x):
        return ir.Constant(x.type, 1.0 if is_float(self.dtype) else 1)


def _builder(method):
    """The rule that is one IRBuilder instruction on the operands."""
    return lambda s, *args: getattr(s.b, method)(*args)


def _intrinsic(name):
    return lambda s, *args: s.intrinsic(name, *args)


def _libm(name):
    return lambda s, *args: s.libm(name, *args)


def _f32_code(f32, f64):
    """Generated vectorisable f32 code (OpEmitter.exp's kind), `f64` for f64."""
    return lambda s, x: f32(s.em, s.b, x) if isinstance(x.type, ir.FloatType) else f64(s, x)


def _select_by(compare):
    """Integer maximum or minimum."""
    def rule(s, x, y):
        op = s.b.icmp_signed if is_signed(s.dtype) else s.b.icmp_unsigned
        return s.b.select(op(compare, x, y), x, y)
    return rule


def _shift(s, x, n):
    width = x.type.width
    too_far = s.b.icmp_unsigned(">=", n, ir.Constant(x.type, width))
    if s.opcode == "shift-left":
        return s.b.select(too_far, s.zero(x), s.b.shl(x, n))
    if s.opcode == "shift-right-logical":
        return s.b.select(too_far, s.zero(x), s.b.lshr(x, n))
    return s.b.ashr(x, s.b.select(too_far, ir.Constant(x.type, width - 1), n))


def _float_sign(s, x):
    one, zero = s.one(x), s.zero(x)
    return s.b.select(s.b.fcmp_ordered(">", x, zero), one,
                      s.b.select(s.b.fcmp_ordered("<", x, zero), s.b.fneg(one), x))


def _int_sign(s, x):
    zero, ones = s.zero(x), ir.Constant(x.type, -1)
    if not is_signed(s.dtype):
        return s.b.zext(s.b.icmp_unsigned("!=", x, zero), x.type)
    return s.b.select(s.b.icmp_signed("<", x, zero), ones,
                      s.b.zext(s.b.icmp_signed("!=", x, zero), x.type))


def _int_abs(s, x):
    if not is_signed(s.dtype):
        return x
    return s.b.select(s.b.icmp_signed("<", x, s.zero(x)), s.b.sub(s.zero(x), x), x)


def _count_leading_zeros(s, x):
    name = f"llvm.ctlz.i{x.type.width}"
    fn = s.em.module.globals.get(name) or ir.Function(
        s.em.module, ir.FunctionType(x.type, [x.type, ir.IntType(1)]), name)
    return s.b.call(fn, [x, ir.Constant(ir.IntType(1), 0)])


def _bitcast_convert(s, x):
    if bits(s.dtype) != bits(s.out) or "pred" in (s.dtype, s.out):
        raise Unsupported("bitcast-convert between different widths")
    return s.b.bitcast(x, register_type(s.out))


def _clamp(s, lo, x, hi):
    t = s.in_dtypes[1]
    x = s.b.select(s.em.compare(s.b, "LT", t, x, lo), lo, x)
    return s.b.select(s.em.compare(s.b, "GT", t, x, hi), hi, x)


def _int_power(s, x, n):
    """x^n wrapping, by squaring over every bit of n; a negative n gives 1/x
    truncated: 1 for 1, +-1 for -1 (by n's parity), else 0."""
    b, one, zero = s.b, s.one(x), s.zero(x)
    signed = is_signed(s.dtype)
    e = b.select(b.icmp_signed("<", n, zero), zero, n) if signed else n
    result, base = one, x
    for _ in range(x.type.width - signed):
        result = b.select(b.trunc(e, ir.IntType(1)), b.mul(result, base), result)
        base, e = b.mul(base, base), b.lshr(e, one)
    if not signed:
        return result
    minus_one = ir.Constant(x.type, -1)
    reciprocal = b.select(b.icmp_signed("==", x, one), one, b.select(
        b.icmp_signed("==", x, minus_one),
        b.select(b.trunc(n, ir.IntType(1)), minus_one, one), zero))
    return b.select(b.icmp_signed("<", n, zero), reciprocal, result)


def _divide(s, x, y):
    return s.em.divide(s.b, s.opcode, is_signed(s.dtype), x, y)


# Opcode -> its LLVM IR, per type class (backends/rules.py).
RULES = {
    "add": Rule(_builder("fadd"), _builder("add")),
    "subtract": Rule(_builder("fsub"), _builder("sub")),
    "multiply": Rule(_builder("fmul"), _builder("mul")),
    "divide": Rule(_builder("fdiv"), _divide),
    "remainder": Rule(_builder("frem"), _divide),
    "maximum": Rule(_intrinsic("llvm.maximum"), _select_by(">")),
    "minimum": Rule(_intrinsic("llvm.minimum"), _select_by("<")),
    "power": Rule(_intrinsic("llvm.pow"), _int_power),
    "atan2": Rule(float=_libm("atan2")),
    "and": Rule(int=_builder("and_")),
    "or": Rule(int=_builder("or_")),
    "xor": Rule(int=_builder("xor")),
    "shift-left": Rule(int=_shift),
    "shift-right-logical": Rule(int=_shift),
    "shift-right-arithmetic": Rule(int=_shift),
    "abs": Rule(_intrinsic("llvm.fabs"), _int_abs),
    "negate": Rule(_builder("fneg"), lambda s, x: s.b.sub(s.zero(x), x)),
    "sign": Rule(_float_sign, _int_sign),
    "not": Rule(int=lambda s, x: s.b.xor(x, ir.Constant(x.type, -1))),
    "popcnt": Rule(int=lambda s, x: s.b.call(
        s.em.function(f"llvm.ctpop.i{x.type.width}", x.type, 1), [x])),
    "count-leading-zeros": Rule(int=_count_leading_zeros),
    "exponential": Rule(float=lambda s, x: s.em.exp(s.b, x)),
    "log": Rule(float=_f32_code(OpEmitter.log_f32, _intrinsic("llvm.log"))),
    "tanh": Rule(float=_f32_code(OpEmitter.tanh_f32, _libm("tanh"))),
    "logistic": Rule(float=lambda s, x: s.b.fdiv(
        s.one(x), s.b.fadd(s.one(x), s.em.exp(s.b, s.b.fneg(x))))),
    "exponential-minus-one": Rule(float=_f32_code(OpEmitter.expm1_f32, _libm("expm1"))),
    "log-plus-one": Rule(float=_f32_code(OpEmitter.log1p_f32, _libm("log1p"))),
    "sqrt": Rule(float=_intrinsic("llvm.sqrt")),
    "rsqrt": Rule(float=lambda s, x: s.b.fdiv(s.one(x), s.intrinsic("llvm.sqrt", x))),
    "cbrt": Rule(float=_libm("cbrt")),
    "erf": Rule(float=_f32_code(OpEmitter.erf_f32, _libm("erf"))),
    "sine": Rule(float=_intrinsic("llvm.sin")),
    "cosine": Rule(float=_intrinsic("llvm.cos")),
    "tan": Rule(float=_libm("tan")),
    "floor": Rule(float=_intrinsic("llvm.floor")),
    "ceil": Rule(float=_intrinsic("llvm.ceil")),
    "round-nearest-afz": Rule(float=_intrinsic("llvm.round")),
    "round-nearest-even": Rule(float=_intrinsic("llvm.roundeven")),
    "is-finite": Rule(float=lambda s, x: s.b.fcmp_ordered(
        "<", s.intrinsic("llvm.fabs", x), ir.Constant(x.type, float("inf")))),
    "convert": any_type(lambda s, x: s.em.convert(s.b, x, s.dtype, s.out)),
    "bitcast-convert": any_type(_bitcast_convert),
    "copy": any_type(lambda s, x: x),
    "select": any_type(lambda s, p, x, y: s.b.select(p, x, y)),
    "compare": any_type(lambda s, x, y: s.em.compare(s.b, s.attr, s.in_dtypes[0], x, y)),
    "clamp": any_type(_clamp),
}
# Left to TensorFlow, by opcode and type class: complex numbers, precision
# emulation, integer powers.
FALLBACK = {"real": COMPLEX, "imag": COMPLEX, "complex": COMPLEX, "reduce-precision": FLOAT}
