"""Programs found miscompiled, shrunk (most by the HLO fuzzer, fuzz_hlo.py):
each on the CPU backend and on the GPU backend's kernels built for the host,
against the evaluator."""
import numpy as np
import pytest

from kerasjit.backends.cpu import BACKEND
from kerasjit.hlo import parse_module
from kerasjit.hlo.evaluator import evaluate

from tests.support.cuda_host import tool
from tests.fuzz.fuzz_hlo import GpuHostBackend, outputs_of

EDGES = [-0.0, 0.0, np.nan, -np.nan, np.inf, -np.inf, 1.5, -2.0]

PROGRAMS = {
    # type=TOTALORDER was read as an ordinary float compare: XLA orders
    # -NaN < -inf < ... < -0 < +0 < ... < inf < NaN.
    "total_order_compare": ("""HloModule fuzz
ENTRY %main (p2: f32[2,2,4]) -> pred[2,2,4] {
  %p2 = f32[2,2,4]{2,1,0} parameter(0)
  %negate.0 = f32[2,2,4]{2,1,0} negate(f32[2,2,4]{2,1,0} %p2)
  ROOT %compare.1 = pred[2,2,4]{2,1,0} compare(f32[2,2,4]{2,1,0} %p2, f32[2,2,4]{2,1,0} %negate.0), direction=GT, type=TOTALORDER
}
""", [np.array(EDGES * 2, np.float32).reshape(2, 2, 4)]),
    "total_order_compare_f64": ("""HloModule fuzz
ENTRY %main (p0: f64[8], p1: f64[8]) -> pred[8] {
  %p0 = f64[8]{0} parameter(0)
  %p1 = f64[8]{0} parameter(1)
  ROOT %compare.1 = pred[8]{0} compare(f64[8]{0} %p0, f64[8]{0} %p1), direction=LE, type=TOTALORDER
}
""", [np.array(EDGES), np.array(EDGES[1:] + EDGES[:1])]),
    # The evaluator's sign(-0) was +0 (numpy's); XLA's is -0, as the backends compute.
    "sign_of_negative_zero": ("""HloModule fuzz
ENTRY %main (reverse.0: f32[5,3,5,3]) -> u32[5,3,5,3] {
  %reverse.0 = f32[5,3,5,3]{3,2,1,0} parameter(0)
  %sign.1 = f32[5,3,5,3]{3,2,1,0} sign(f32[5,3,5,3]{3,2,1,0} %reverse.0)
  ROOT %bitcast-convert.17 = u32[5,3,5,3]{3,2,1,0} bitcast-convert(f32[5,3,5,3]{3,2,1,0} %sign.1)
}
""", [np.resize(np.array([-0.0, 0.0, np.inf, -np.inf, 1.5, -2.0], np.float32), (5, 3, 5, 3))]),
    # A scalar constant read by a dot computed as a GEMM (whose operands are
    # buffers) had no buffer: the compiler refused the program.
    "dot_of_a_scalar_constant": ("""HloModule fuzz
ENTRY %main (clamp.35: f32[]) -> f32[] {
  %c.32 = f32[] constant(-0.125)
  %clamp.35 = f32[] parameter(0)
  ROOT %dot.36 = f32[] dot(f32[] %c.32, f32[] %clamp.35), lhs_contracting_dims={}, rhs_contracting_dims={}
}
""", [np.float32(3.5)]),
    # LLVM's loop vectoriser (assertions on, as llvmlite ships it) aborts the
    # process on some loops of 3 to 15 iterations: LLVM runs in compile
    # workers, and a part whose worker died is compiled here without it.
    "short_loop_vectoriser_abort": ("""HloModule fuzz
ENTRY %main (c: pred[1,5], p1: pred[1,5]) -> pred[1,5] {
  %c = pred[1,5]{1,0} parameter(0)
  %p1 = pred[1,5]{1,0} parameter(1)
  %n = pred[1,5]{1,0} not(pred[1,5]{1,0} %c)
  %x = pred[1,5]{1,0} xor(pred[1,5]{1,0} %c, pred[1,5]{1,0} %n)
  ROOT %s = pred[1,5]{1,0} select(pred[1,5]{1,0} %n, pred[1,5]{1,0} %x, pred[1,5]{1,0} %p1)
}
""", [np.array([[True, False, True, False, False]]), np.array([[False, True, True, False, True]])]),
    # A dilated Conv1D's BatchToSpaceND, then Flatten (a Keras model in mixed
    # precision trained on NaNs): the loop over 48 = 6 x 8 was split into
    # (6, 8), and its quotient's own `% 2` was taken for a use of the old index.
    "split_loop_quotient_divided_again": ("""HloModule fuzz
ENTRY %main (p: f32[2,1,3,8]) -> f32[1,48] {
  %p = f32[2,1,3,8]{3,2,1,0} parameter(0)
  %t = f32[1,3,2,8]{3,2,1,0} transpose(f32[2,1,3,8]{3,2,1,0} %p), dimensions={1,2,0,3}
  %r = f32[1,6,8]{2,1,0} reshape(f32[1,3,2,8]{3,2,1,0} %t)
  %n = f32[1,6,8]{2,1,0} negate(f32[1,6,8]{2,1,0} %r)
  ROOT %o = f32[1,48]{1,0} reshape(f32[1,6,8]{2,1,0} %n)
}
""", [np.arange(48, dtype=np.float32).reshape(2, 1, 3, 8)]),
    # A loop's state started as one value twice, a leaf the body changes and
    # one it passes on (a captured value, as TensorFlow's while_loop passes
    # it): the changing leaf took the value's buffer as its own and wrote
    # over the other (a Keras model's predict and evaluate were wrong).
    "loop_state_holding_one_value_twice": ("""HloModule fuzz
%cond (c.p: (s32[], f32[4]{0}, f32[4]{0})) -> pred[] {
  %c.p = (s32[], f32[4]{0}, f32[4]{0}) parameter(0)
  %c.i = s32[] get-tuple-element((s32[], f32[4]{0}, f32[4]{0}) %c.p), index=0
  %c.n = s32[] constant(3)
  ROOT %c.lt = pred[] compare(s32[] %c.i, s32[] %c.n), direction=LT
}

%body (b.p: (s32[], f32[4]{0}, f32[4]{0})) -> (s32[], f32[4]{0}, f32[4]{0}) {
  %b.p = (s32[], f32[4]{0}, f32[4]{0}) parameter(0)
  %b.i = s32[] get-tuple-element((s32[], f32[4]{0}, f32[4]{0}) %b.p), index=0
  %b.v = f32[4]{0} get-tuple-element((s32[], f32[4]{0}, f32[4]{0}) %b.p), index=1
  %b.h = f32[4]{0} get-tuple-element((s32[], f32[4]{0}, f32[4]{0}) %b.p), index=2
  %b.half = f32[] constant(0.5)
  %b.halves = f32[4]{0} broadcast(f32[] %b.half), dimensions={}
  %b.scaled = f32[4]{0} multiply(f32[4]{0} %b.v, f32[4]{0} %b.halves)
  %b.next = f32[4]{0} add(f32[4]{0} %b.scaled, f32[4]{0} %b.h)
  %b.one = s32[] constant(1)
  %b.i2 = s32[] add(s32[] %b.i, s32[] %b.one)
  ROOT %b.t = (s32[], f32[4]{0}, f32[4]{0}) tuple(s32[] %b.i2, f32[4]{0} %b.next, f32[4]{0} %b.h)
}

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %one = f32[] constant(1)
  %ones = f32[4]{0} broadcast(f32[] %one), dimensions={}
  %h = f32[4]{0} add(f32[4]{0} %p, f32[4]{0} %ones)
  %zero = s32[] constant(0)
  %init = (s32[], f32[4]{0}, f32[4]{0}) tuple(s32[] %zero, f32[4]{0} %h, f32[4]{0} %h)
  %loop = (s32[], f32[4]{0}, f32[4]{0}) while((s32[], f32[4]{0}, f32[4]{0}) %init), condition=%cond, body=%body
  ROOT %v = f32[4]{0} get-tuple-element((s32[], f32[4]{0}, f32[4]{0}) %loop), index=1
}
""", [np.array([1, 2, -3, 6], np.float32)]),
    # A dot over an empty contracted dim (tf.matmul(a[:, :0], b[:0])) is zeros,
    # and a convolution over no input features; their kernels read the empty
    # operands' memory as if they had one element.
    "dot_over_an_empty_contraction": ("""HloModule fuzz
ENTRY %main (p: f32[4,0], q: f32[2,0,3], r: f32[0,3], x: f32[1,4,4,0], k: f32[3,3,0,2]) -> (f32[4,3], f32[2,4,3], f32[1,2,2,2]) {
  %p = f32[4,0]{1,0} parameter(0)
  %q = f32[2,0,3]{2,1,0} parameter(1)
  %r = f32[0,3]{1,0} parameter(2)
  %x = f32[1,4,4,0]{3,2,1,0} parameter(3)
  %k = f32[3,3,0,2]{3,2,1,0} parameter(4)
  %b = f32[2,4,0]{2,1,0} broadcast(f32[4,0]{1,0} %p), dimensions={1,2}
  %d = f32[4,3]{1,0} dot(f32[4,0]{1,0} %p, f32[0,3]{1,0} %r), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %e = f32[2,4,3]{2,1,0} dot(f32[2,4,0]{2,1,0} %b, f32[2,0,3]{2,1,0} %q), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  %c = f32[1,2,2,2]{3,2,1,0} convolution(f32[1,4,4,0]{3,2,1,0} %x, f32[3,3,0,2]{3,2,1,0} %k), window={size=3x3}, dim_labels=b01f_01io->b01f
  ROOT %t = (f32[4,3]{1,0}, f32[2,4,3]{2,1,0}, f32[1,2,2,2]{3,2,1,0}) tuple(f32[4,3]{1,0} %d, f32[2,4,3]{2,1,0} %e, f32[1,2,2,2]{3,2,1,0} %c)
}
""", [np.zeros((4, 0), np.float32), np.zeros((2, 0, 3), np.float32),
      np.zeros((0, 3), np.float32), np.zeros((1, 4, 4, 0), np.float32),
      np.zeros((3, 3, 0, 2), np.float32)]),
    # A reduce of no elements (a sum over an empty slice) is its init value;
    # the CPU kernels read the empty operand's memory (found by the fuzzer
    # once its dots, concatenations and reduces met empty operands).
    "reduce_of_no_elements": ("""HloModule fuzz
%add.s8 (add.s8.x: s8[], add.s8.y: s8[]) -> s8[] {
  %add.s8.x = s8[] parameter(0)
  %add.s8.y = s8[] parameter(1)
  ROOT %add.s8.r = s8[] add(s8[] %add.s8.x, s8[] %add.s8.y)
}

%max.f64 (max.f64.x: f64[], max.f64.y: f64[]) -> f64[] {
  %max.f64.x = f64[] parameter(0)
  %max.f64.y = f64[] parameter(1)
  ROOT %max.f64.r = f64[] maximum(f64[] %max.f64.x, f64[] %max.f64.y)
}

ENTRY %main (p: s8[3,5,0], q: f64[2,0]) -> (s8[3,5], f64[2]) {
  %p = s8[3,5,0]{2,1,0} parameter(0)
  %q = f64[2,0]{1,0} parameter(1)
  %zero = s8[] constant(0)
  %low = f64[] constant(-inf)
  %s = s8[3,5]{1,0} reduce(s8[3,5,0]{2,1,0} %p, s8[] %zero), dimensions={2}, to_apply=%add.s8
  %m = f64[2]{0} reduce(f64[2,0]{1,0} %q, f64[] %low), dimensions={1}, to_apply=%max.f64
  ROOT %t = (s8[3,5]{1,0}, f64[2]{0}) tuple(s8[3,5]{1,0} %s, f64[2]{0} %m)
}
""", [np.zeros((3, 5, 0), np.int8), np.zeros((2, 0))]),
}


def check(got, text, args):
    assert not isinstance(got, Exception), got
    want = outputs_of(evaluate(parse_module(text), args))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("name", PROGRAMS)
def test_cpu_backend(name):
    text, args = PROGRAMS[name]
    check(BACKEND.compile(parse_module(text))(args), text, args)


def test_gpu_kernels_on_the_host():
    tool("g++")
    cases = list(PROGRAMS.values())
    for (text, args), got in zip(cases, GpuHostBackend().run(cases)):
        check(got, text, args)
