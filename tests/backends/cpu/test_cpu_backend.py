"""The native CPU backend against the reference evaluator, opcode by opcode.

Every generated kernel is checked against the numpy evaluator on random
inputs: elementwise opcodes from the opcode table over hand-written HLO
(with shapes that include size-1 dims and sizes no vector width divides),
and the structured ops (dot, convolution and its gradients, pooling and its
gradient, reductions, indexing) over the HLO TensorFlow's bridge emits.
"""
import dataclasses

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from kerasjit.backends.cpu import BACKEND
from kerasjit.compiler import lower
from kerasjit.hlo import parse_module
from kerasjit.kernels.ir import LoopKernel
from kerasjit.hlo.evaluator import evaluate
from kerasjit.hlo.opcodes import OPCODES
from kerasjit.hlo.shape import DTYPES
from kerasjit.errors import Unsupported

from tests.support.bridge import bridge
from tests.support.cpu_check import check
from tests.support.targets import CPU
from tests.support.dtype_values import values
from tests.support.structured_cases import DOT_CONV_POOL, LOOP_ONLY, rand
from tests.support.elementwise_cases import (FLOAT_BINARY, FLOAT_UNARY, INT_BINARY, INT_UNARY,
                                             elementwise_module, positive, result_type)

pytestmark = pytest.mark.tensorflow_reference

shapes = st.lists(st.sampled_from([1, 2, 3, 7, 17]), min_size=0, max_size=3)


@settings(max_examples=8, deadline=None)
@given(dims=shapes, seed=st.integers(0, 2**16))
@pytest.mark.parametrize("dtype", ["f32", "f64"])
@pytest.mark.parametrize("opcode", FLOAT_UNARY + FLOAT_BINARY)
def test_float_elementwise(opcode, dtype, dims, seed):
    rng = np.random.default_rng(seed)
    arity = OPCODES[opcode].arity
    module = elementwise_module(opcode, dtype, dims, arity, result_type(opcode))
    check(module, [values(dtype, dims, rng, positive(opcode)) for _ in range(arity)], rtol=2e-6)


@settings(max_examples=8, deadline=None)
@given(dims=shapes, seed=st.integers(0, 2**16))
@pytest.mark.parametrize("dtype", ["s32", "s64", "u32", "u8"])
@pytest.mark.parametrize("opcode", INT_UNARY + INT_BINARY)
def test_integer_elementwise(opcode, dtype, dims, seed):
    rng = np.random.default_rng(seed)
    arity = OPCODES[opcode].arity
    module = elementwise_module(opcode, dtype, dims, arity)
    check(module, [values(dtype, dims, rng) for _ in range(arity)])


@settings(max_examples=6, deadline=None)
@given(dims=shapes, seed=st.integers(0, 2**16))
@pytest.mark.parametrize("dtype", ["f32", "s32", "u32"])
@pytest.mark.parametrize("direction", ["EQ", "NE", "LT", "LE", "GT", "GE"])
def test_compare(direction, dtype, dims, seed):
    rng = np.random.default_rng(seed)
    module = elementwise_module("compare", dtype, dims, 2, "pred", f", direction={direction}")
    a = values(dtype, dims, rng)
    b = np.where(rng.random(dims) < 0.3, a, values(dtype, dims, rng))
    if dtype == "f32" and a.size:
        a.reshape(-1)[0] = np.nan
    check(module, [a, b])


@pytest.mark.parametrize("src, dst", [(s, d) for s in ("f32", "f64", "s32", "s64", "u32", "u8",
                                                        "pred")
                                      for d in ("f32", "f64", "s32", "s64", "u32", "u8", "pred")])
def test_convert(src, dst):
    rng = np.random.default_rng(0)
    x = values(src, (5, 7), rng)
    if DTYPES[src].kind == "f":
        x.reshape(-1)[:5] = [np.nan, np.inf, -np.inf, 3e9, -3e9]
    check(elementwise_module("convert", src, (5, 7), 1, dst), [x])


@pytest.mark.parametrize("src, dst", [("f32", "s32"), ("u32", "f32"), ("f64", "u64"),
                                      ("s64", "f64")])
def test_bitcast_convert(src, dst):
    x = values(src, (4, 3), np.random.default_rng(1))
    check(elementwise_module("bitcast-convert", src, (4, 3), 1, dst), [x])


def test_select_and_clamp():
    rng = np.random.default_rng(2)
    text = """HloModule sel
ENTRY %e (p: pred[4,5], a: f32[4,5], b: f32[4,5]) -> (f32[4,5], f32[4,5]) {
  %p = pred[4,5] parameter(0)
  %a = f32[4,5] parameter(1)
  %b = f32[4,5] parameter(2)
  %s = f32[4,5] select(pred[4,5] %p, f32[4,5] %a, f32[4,5] %b)
  %lo = f32[] constant(-0.5)
  %hi = f32[] constant(0.5)
  %blo = f32[4,5] broadcast(f32[] %lo), dimensions={}
  %bhi = f32[4,5] broadcast(f32[] %hi), dimensions={}
  %c = f32[4,5] clamp(f32[4,5] %blo, f32[4,5] %a, f32[4,5] %bhi)
  ROOT %t = (f32[4,5], f32[4,5]) tuple(f32[4,5] %s, f32[4,5] %c)
}
"""
    check(parse_module(text), [rng.random((4, 5)) < 0.5, *(values("f32", (4, 5), rng)
                                                          for _ in range(2))])


STRUCTURED = {**LOOP_ONLY, **DOT_CONV_POOL,
              "one_hot_range": (lambda i: (tf.one_hot(i, 5), tf.range(7) * 2),
                                (np.array([0, 3, 1, 4], np.int32),))}


@pytest.mark.parametrize("name", STRUCTURED)
def test_structured_ops_match_evaluator(name):
    fn, args = STRUCTURED[name]
    check(bridge(fn, *args), [np.asarray(a) for a in args], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["philox_u32", "philox_u64", "philox_u32_carry",
                                  "philox_u64_carry"])
def test_philox_bits_match_tensorflow_exactly(name):
    fn, args = STRUCTURED[name]
    got = BACKEND.compile(bridge(fn, *args))([np.asarray(a) for a in args])[0]
    np.testing.assert_array_equal(got, fn(*[tf.constant(a) for a in args]).numpy())


def test_philox_runs_once_per_block_of_four_words():
    # A uniform sample read by two kernels (its sum, and the samples themselves):
    # one kernel of its own computes each Philox block once, over (blocks, lanes).
    def two_readers(k, c):
        bits = tf.raw_ops.StatelessRandomUniformFullIntV2(shape=[6, 10], key=k, counter=c,
                                                          alg=1, dtype=tf.uint32)
        return bits, tf.reduce_sum(tf.cast(tf.bitwise.right_shift(bits, 28), tf.int32), axis=1)
    args = (np.array([12345], np.uint64), np.array([2**64 - 3, 5], np.uint64))
    module = bridge(two_readers, *args)
    philox = [s for s in lower(module, CPU).steps
              if isinstance(s, LoopKernel) and s.name.endswith("_philox")]
    assert [k.dims for k in philox] == [(15, 4)]
    got = BACKEND.compile(module)(list(args))
    for g, w in zip(got, two_readers(*map(tf.constant, args))):
        np.testing.assert_array_equal(g, w.numpy())


def test_unsupported_opcode_is_named():
    sort = parse_module("""HloModule s
%less (a: f32[], b: f32[]) -> pred[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %lt = pred[] compare(f32[] %a, f32[] %b), direction=LT
}
ENTRY %e (x: f32[6]) -> f32[6] {
  %x = f32[6] parameter(0)
  ROOT %s = f32[6] sort(f32[6] %x), dimensions={0}, to_apply=%less
}
""")
    with pytest.raises(Unsupported, match="no code generation for HLO 'sort'"):
        BACKEND.compile(sort)


@pytest.mark.parametrize("name", ["conv_same_stride1", "conv_valid_stride2", "conv_dilated"])
def test_convolutions_built_in_many_slices(name, monkeypatch, no_compile_cache):
    """A tiny patch budget forces every conv (forward: row slices; filter gradient:
    column slices that accumulate) through its ChunkLoop many times."""
    from kerasjit.backends.cpu import CpuBackend
    backend = CpuBackend()
    backend.target = dataclasses.replace(backend.target, patch_budget_bytes=2048)
    fn, args = STRUCTURED[name]
    module = bridge(fn, *args)
    got = backend.compile(module)([np.asarray(a) for a in args])
    want = evaluate(module, [np.asarray(a) for a in args])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_temporaries_with_disjoint_lifetimes_share_memory():
    def chain(x):
        for _ in range(4):                     # each softmax materialises a few temporaries
            x = tf.nn.softmax(x * 3.0) + tf.reduce_max(x, axis=1, keepdims=True)
        return x
    args = [rand(8, 33)]
    module = bridge(chain, *args)
    executable = BACKEND.compile(module)
    program = executable.program
    temps = [b for b in program.buffers if b.role == "temp"]
    assert len(program.slot_bytes) < len(temps)
    assert sum(program.slot_bytes) < sum(b.nbytes for b in temps)
    np.testing.assert_allclose(executable(args)[0], evaluate(module, args), rtol=1e-5)


def test_denormals_flush_as_in_tensorflow_and_the_caller_keeps_its_mode():
    """Compiled code flushes denormals to zero like TensorFlow's CPU kernels
    (and fast: denormal arithmetic costs ~100 cycles); the calling thread's
    floating-point mode is restored afterwards."""
    import kerasjit
    x = np.array([1e-40, 1.0], np.float32)
    tripled = kerasjit.jit(lambda a: a * 3.0, race=False)(x)
    np.testing.assert_array_equal(tripled, (tf.constant(x) * 3.0).numpy())
    assert tripled[0] == 0.0
    assert x[0] * np.float32(3.0) > 0      # numpy, after the call: denormals intact


def test_threads_of_a_split_kernel_flush_denormals_too():
    n = 1 << 21
    module = parse_module(f"""HloModule m
ENTRY %e (a: f32[{n}], b: f32[{n}]) -> f32[{n}] {{
  %a = f32[{n}] parameter(0)
  %b = f32[{n}] parameter(1)
  ROOT %d = f32[{n}] multiply(f32[{n}] %a, f32[{n}] %b)
}}
""")
    executable = BACKEND.compile(module)
    from kerasjit.backends.cpu import parallel
    split = any("kerasjit_split" in source for _, source in executable.kernels)
    assert split == (parallel.usable_cores() > 1)
    product = executable([np.full(n, 1e-39, np.float32), np.ones(n, np.float32)])[0]
    assert not product.any()


def test_f32_exponential_is_within_an_ulp_and_keeps_expf_edges():
    """f32 exp is generated arithmetic the vectoriser widens, not a libm call."""
    import kerasjit
    exp = kerasjit.jit(lambda a: tf.exp(a), race=False)
    x = np.random.default_rng(1).uniform(-87, 88.7, 1 << 16).astype(np.float32)
    exact = np.exp(x.astype(np.float64))
    ulps = np.abs(exp(x) - exact) / np.spacing(exact.astype(np.float32))
    assert ulps.max() <= 1.0
    edges = np.array([np.inf, -np.inf, np.nan, 88.72283, 88.7229, -87.3365, 0.0, -0.0, -104],
                     np.float32)
    np.testing.assert_array_equal(exp(edges), [np.inf, 0, np.nan, np.exp(np.float32(88.72283)),
                                               np.inf, np.exp(np.float32(-87.3365)), 1, 1, 0])
    assert exp(np.float32([-88.0]))[0] == 0.0       # a denormal result, flushed as in TF
    assert (tf.exp(tf.constant([-88.0])).numpy() == 0.0).all()


def test_f32_tanh_is_within_two_ulps_and_keeps_its_edges():
    """f32 tanh, like exp, is generated arithmetic: a polynomial near 0 and
    exp-based beyond 0.625, one selected without branching."""
    import kerasjit
    tanh = kerasjit.jit(lambda a: tf.tanh(a), race=False)
    for lo, hi in ((-0.7, 0.7), (-20, 20)):
        x = np.random.default_rng(2).uniform(lo, hi, 1 << 16).astype(np.float32)
        exact = np.tanh(x.astype(np.float64))
        ulps = np.abs(tanh(x) - exact) / np.spacing(np.abs(exact).astype(np.float32))
        assert ulps.max() <= 2.0
    edges = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 100, -100, 1e-40], np.float32)
    got = tanh(edges)
    np.testing.assert_array_equal(got, [1, -1, np.nan, 0, 0, 1, -1, 0])
    assert np.signbit(got[4])                        # tanh(-0) = -0
    np.testing.assert_array_equal(got[-1:], tf.tanh(edges[-1:]).numpy())   # a denormal: 0


def test_f32_sigmoid_is_within_three_ulps_and_keeps_its_edges():
    """f32 sigmoid: 1 / (1 + e^-x), e^-x generated arithmetic."""
    import kerasjit
    sigmoid = kerasjit.jit(lambda a: tf.sigmoid(a), race=False)
    x = np.random.default_rng(3).uniform(-30, 30, 1 << 16).astype(np.float32)
    exact = 1 / (1 + np.exp(-x.astype(np.float64)))
    ulps = np.abs(sigmoid(x) - exact) / np.spacing(exact.astype(np.float32))
    assert ulps.max() <= 3.0
    edges = np.array([np.inf, -np.inf, np.nan, 0.0, 100, -100, -88.5, 1e-40], np.float32)
    np.testing.assert_array_equal(sigmoid(edges), [1, 0, np.nan, 0.5, 1, 0, 0, 0.5])


def test_f32_erf_is_within_three_ulps_and_keeps_its_edges():
    """f32 erf (gelu's), like exp, is generated arithmetic: a polynomial below
    0.875 and exp-based above, one selected without branching."""
    import math
    import kerasjit
    erf = kerasjit.jit(lambda a: tf.math.erf(a), race=False)
    for lo, hi in ((-1, 1), (-6, 6)):
        x = np.random.default_rng(4).uniform(lo, hi, 1 << 16).astype(np.float32)
        exact = np.array([math.erf(v) for v in x.astype(np.float64)])
        ulps = np.abs(erf(x) - exact) / np.spacing(np.abs(exact).astype(np.float32))
        assert ulps.max() <= 3.0
    edges = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 10, -10, 1e-20], np.float32)
    got = erf(edges)
    np.testing.assert_array_equal(got[:-1], [1, -1, np.nan, 0, 0, 1, -1])
    assert np.signbit(got[4])                        # erf(-0) = -0
    np.testing.assert_allclose(got[-1], 2 / np.sqrt(np.pi) * 1e-20, rtol=1e-6)


@pytest.mark.parametrize("name, tf_fn, exact_fn, edges, expected", [
    ("log1p", tf.math.log1p, np.log1p, [np.inf, -1, -2, np.nan, 0.0, -0.0],
     [np.inf, -np.inf, np.nan, np.nan, 0, 0]),
    ("expm1", tf.math.expm1, np.expm1, [np.inf, -np.inf, np.nan, 0.0, -0.0, 100, -100],
     [np.inf, -1, np.nan, 0, 0, np.inf, -1])])
def test_f32_log1p_and_expm1_are_within_three_ulps_and_keep_their_edges(name, tf_fn, exact_fn,
                                                                       edges, expected):
    """Generated arithmetic on exp and log (softplus's log1p), the rounding of
    1 + x or e^x undone by a quotient."""
    import kerasjit
    fn = kerasjit.jit(lambda a: tf_fn(a), race=False)
    rng = np.random.default_rng(5)
    for x in (rng.uniform(-1e-3, 1e-3, 1 << 14), rng.uniform(-0.9, 3, 1 << 14),
              rng.uniform(-30, 80, 1 << 14) if name == "expm1" else
              np.exp(rng.uniform(-20, 80, 1 << 14))):
        x = x.astype(np.float32)
        exact = exact_fn(x.astype(np.float64))
        ulps = np.abs(fn(x) - exact) / np.spacing(np.abs(exact).astype(np.float32))
        assert ulps.max() <= 3.0, (name, ulps.max(), x[ulps.argmax()])
    got = fn(np.array(edges, np.float32))
    np.testing.assert_array_equal(got, np.array(expected, np.float32))
    assert np.signbit(got[len(edges) - 1 if name == "log1p" else 4])     # -0 stays -0


def test_f32_log_is_within_an_ulp_and_keeps_its_edges():
    """f32 log, like exp, is generated arithmetic; a denormal operand gets its
    true log (as in TensorFlow) despite the flushed-denormal mode."""
    import kerasjit
    log = kerasjit.jit(lambda a: tf.math.log(a), race=False)
    x = np.exp(np.random.default_rng(3).uniform(-87, 88, 1 << 16)).astype(np.float32)
    denormals = np.random.default_rng(4).integers(1, 1 << 23, 1000).astype(np.int32).view(np.float32)
    for operand in (x, denormals):
        exact = np.log(operand.astype(np.float64))
        ulps = np.abs(log(operand) - exact) / np.spacing(np.abs(exact).astype(np.float32))
        assert ulps.max() <= 1.0
    edges = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, -1.0, -1e-40, 1.0], np.float32)
    np.testing.assert_array_equal(log(edges), [np.inf, np.nan, np.nan, -np.inf, -np.inf,
                                               np.nan, np.nan, 0])
