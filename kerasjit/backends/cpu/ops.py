"""LLVM IR for HLO elementwise opcodes, with XLA's semantics at the edges.

Integer division by zero, shifts past the bit width, float-to-int overflow
and NaN follow XLA (and the evaluator) rather than C, whose behaviour there
is undefined.
"""
from llvmlite import ir

from ...kernels.lower import Unsupported
from .llvm_types import bits, is_float, is_signed, register_type

_FCMP = {"EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}
# C math library functions for opcodes LLVM has no intrinsic for.
_LIBM = {"tanh": "tanh", "exponential-minus-one": "expm1", "log-plus-one": "log1p",
         "cbrt": "cbrt", "erf": "erf", "tan": "tan", "atan2": "atan2"}
_INTRINSIC = {"log": "llvm.log", "sqrt": "llvm.sqrt",
              "sine": "llvm.sin", "cosine": "llvm.cos", "floor": "llvm.floor",
              "ceil": "llvm.ceil", "round-nearest-afz": "llvm.round",
              "round-nearest-even": "llvm.roundeven", "abs": "llvm.fabs",
              "maximum": "llvm.maximum", "minimum": "llvm.minimum", "power": "llvm.pow"}


def _f32(value):
    return ir.Constant(ir.FloatType(), value)


def _horner(b, x, coefficients):
    """The polynomial with these coefficients (highest power first) at x."""
    p = _f32(coefficients[0])
    for coefficient in coefficients[1:]:
        p = b.fadd(b.fmul(p, x), _f32(coefficient))
    return p


class OpEmitter:
    def __init__(self, module):
        self.module = module

    def _function(self, name, ty, n):
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(ty, [ty] * n), name)
        return fn

    def _intrinsic(self, b, name, args):
        ty = args[0].type
        suffix = "f32" if isinstance(ty, ir.FloatType) else "f64"
        return b.call(self._function(f"{name}.{suffix}", ty, len(args)), args)

    def _libm(self, b, name, args):
        ty = args[0].type
        return b.call(self._function(name + ("f" if isinstance(ty, ir.FloatType) else ""),
                                     ty, len(args)), args)

    def emit(self, b, opcode, attr, out_dtype, in_dtypes, args):
        dtype = in_dtypes[0] if in_dtypes else out_dtype
        if opcode == "convert":
            return self.convert(b, args[0], dtype, out_dtype)
        if opcode == "bitcast-convert":
            if bits(dtype) != bits(out_dtype) or "pred" in (dtype, out_dtype):
                raise Unsupported("bitcast-convert between different widths")
            return b.bitcast(args[0], register_type(out_dtype))
        if opcode == "copy":
            return args[0]
        if opcode == "select":
            return b.select(*args)
        if opcode == "compare":
            return self.compare(b, attr, in_dtypes[0], *args)
        if opcode == "clamp":
            lo, x, hi = args
            t = in_dtypes[1]
            x = b.select(self.compare(b, "LT", t, x, lo), lo, x)
            return b.select(self.compare(b, "GT", t, x, hi), hi, x)
        if is_float(dtype):
            return self.float_op(b, opcode, args)
        return self.int_op(b, opcode, dtype, args)

    def compare(self, b, direction, dtype, x, y):
        if is_float(dtype):
            return b.fcmp_unordered("!=", x, y) if direction == "NE" else \
                b.fcmp_ordered(_FCMP[direction], x, y)
        op = b.icmp_signed if is_signed(dtype) else b.icmp_unsigned
        return op(_FCMP[direction], x, y)

    def float_op(self, b, opcode, args):
        simple = {"add": b.fadd, "subtract": b.fsub, "multiply": b.fmul, "divide": b.fdiv,
                  "remainder": b.frem}
        if opcode in simple:
            return simple[opcode](*args)
        if opcode == "exponential":
            return self.exp(b, args[0])
        if opcode == "tanh" and isinstance(args[0].type, ir.FloatType):
            return self.tanh_f32(b, args[0])
        if opcode == "log" and isinstance(args[0].type, ir.FloatType):
            return self.log_f32(b, args[0])
        if opcode in _INTRINSIC:
            return self._intrinsic(b, _INTRINSIC[opcode], args)
        if opcode in _LIBM:
            return self._libm(b, _LIBM[opcode], args)
        x = args[0]
        one = ir.Constant(x.type, 1.0)
        zero = ir.Constant(x.type, 0.0)
        if opcode == "negate":
            return b.fneg(x)
        if opcode == "rsqrt":
            return b.fdiv(one, self._intrinsic(b, "llvm.sqrt", [x]))
        if opcode == "logistic":
            return b.fdiv(one, b.fadd(one, self.exp(b, b.fneg(x))))
        if opcode == "sign":
            return b.select(b.fcmp_ordered(">", x, zero), one,
                            b.select(b.fcmp_ordered("<", x, zero), b.fneg(one), x))
        if opcode == "is-finite":
            return b.fcmp_ordered("<", self._intrinsic(b, "llvm.fabs", [x]),
                                  ir.Constant(x.type, float("inf")))
        raise Unsupported(f"the CPU compiler has no float '{opcode}'")

    def exp(self, b, x):
        """e^x. For f32, arithmetic the loop vectoriser can widen (a libm call
        per element it cannot; 1M elements took 4.3 ms that way): x = n ln2 + r
        with |r| <= ln2/2 (Cody-Waite, ln2 in two parts), e^r by Cephes' expf
        polynomial, times 2^n built in the exponent bits. Within 1 ulp; NaN,
        +-inf and overflow as expf; below 2^-126 the result is 0, as the
        flushed denormals (codegen._flush_denormals) make it anyway."""
        if not isinstance(x.type, ir.FloatType):
            return self._intrinsic(b, "llvm.exp", [x])
        f32, i32, c = x.type, ir.IntType(32), _f32
        hi, lo = 88.72283935546875, -87.33654475     # e^hi < 2^128, e^lo ~ 2^-126
        inside = self._intrinsic(b, "llvm.minnum", [self._intrinsic(b, "llvm.maxnum", [x, c(lo)]),
                                                    c(hi)])          # (NaN -> lo: no poison)
        n = self._intrinsic(b, "llvm.roundeven", [b.fmul(inside, c(1.4426950408889634))])
        r = b.fsub(b.fsub(inside, b.fmul(n, c(0.693359375))), b.fmul(n, c(-2.12194440e-4)))
        p = _horner(b, r, (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3,
                           4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1))
        p = b.fadd(b.fadd(b.fmul(b.fmul(p, r), r), r), c(1.0))
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
        small = b.fadd(b.fmul(b.fmul(p, z), x), x)
        magnitude = self._intrinsic(b, "llvm.fabs", [x])
        large = b.fsub(c(1.0), b.fdiv(c(2.0), b.fadd(self.exp(b, b.fadd(magnitude, magnitude)),
                                                      c(1.0))))
        chosen = b.select(b.fcmp_ordered("<", magnitude, c(0.625)), small, large)
        return self._intrinsic(b, "llvm.copysign", [chosen, x])     # (tanh(-0) = -0)

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
        y = b.fmul(b.fmul(p, m), z)
        y = b.fadd(y, b.fmul(e, c(-2.12194440e-4)))
        y = b.fsub(y, b.fmul(z, c(0.5)))
        y = b.fadd(b.fadd(m, y), b.fmul(e, c(0.693359375)))
        y = b.select(b.icmp_signed(">=", magnitude, i(0x7f800000)), x, y)   # +inf, NaN
        y = b.select(b.icmp_signed("<", raw, i(0)), c(float("nan")), y)   # negative
        return b.select(b.icmp_signed("==", magnitude, i(0)), c(float("-inf")), y)

    def int_op(self, b, opcode, dtype, args):
        signed = is_signed(dtype)
        ty = args[0].type
        width = ty.width
        simple = {"add": b.add, "subtract": b.sub, "multiply": b.mul, "and": b.and_,
                  "or": b.or_, "xor": b.xor}
        if opcode in simple:
            return simple[opcode](*args)
        zero, ones = ir.Constant(ty, 0), ir.Constant(ty, -1)
        if opcode in ("maximum", "minimum"):
            x, y = args
            cmp = b.icmp_signed if signed else b.icmp_unsigned
            return b.select(cmp(">" if opcode == "maximum" else "<", x, y), x, y)
        if opcode in ("divide", "remainder"):
            return self._divide(b, opcode, signed, *args)
        if opcode in ("shift-left", "shift-right-logical", "shift-right-arithmetic"):
            x, n = args
            too_far = b.icmp_unsigned(">=", n, ir.Constant(ty, width))
            if opcode == "shift-left":
                return b.select(too_far, zero, b.shl(x, n))
            if opcode == "shift-right-logical":
                return b.select(too_far, zero, b.lshr(x, n))
            return b.ashr(x, b.select(too_far, ir.Constant(ty, width - 1), n))
        x = args[0]
        if opcode == "not":
            return b.xor(x, ones)
        if opcode == "negate":
            return b.sub(zero, x)
        if opcode == "abs":
            return b.select(b.icmp_signed("<", x, zero), b.sub(zero, x), x) if signed else x
        if opcode == "sign":
            if not signed:
                return b.zext(b.icmp_unsigned("!=", x, zero), ty)
            return b.select(b.icmp_signed("<", x, zero), ones,
                            b.zext(b.icmp_signed("!=", x, zero), ty))
        if opcode == "popcnt":
            return b.call(self._function(f"llvm.ctpop.i{width}", ty, 1), [x])
        if opcode == "count-leading-zeros":
            fn = self.module.globals.get(f"llvm.ctlz.i{width}") or ir.Function(
                self.module, ir.FunctionType(ty, [ty, ir.IntType(1)]), f"llvm.ctlz.i{width}")
            return b.call(fn, [x, ir.Constant(ir.IntType(1), 0)])
        raise Unsupported(f"the CPU compiler has no integer '{opcode}'")

    def _divide(self, b, opcode, signed, x, y):
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
