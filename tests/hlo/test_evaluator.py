"""The numpy HLO evaluator against TensorFlow (eager, or XLA where XLA's
semantics differ from TF's kernels) and against hand-built IR."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings, strategies as st

from kerasjit.frontend.bridge import hlo_module
from tensorflow.compiler.tf2xla.python import xla
from kerasjit.hlo import evaluator
from kerasjit.hlo.attributes import DimLabels
from kerasjit.hlo.ir import Computation, Instruction, Module, WindowDim
from kerasjit.hlo.opcodes import OPCODES
from kerasjit.hlo.shape import Shape

pytestmark = pytest.mark.tensorflow_reference

RNG = np.random.RandomState(0)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def randint(lo, hi, *shape, dtype=np.int32):
    return RNG.randint(lo, hi, size=shape).astype(dtype)


def check(fn, *args, rtol=1e-5, atol=1e-6, reference="eager"):
    """Evaluate fn's HLO on args and compare with TF running fn (eagerly, or
    compiled by XLA when `reference == "jit"`), or running `reference`, a
    function computing the same another way."""
    def positional(*xs):        # tf.function binds TF ops' keyword defaults otherwise
        return fn(*xs)
    tensors = [tf.constant(a) for a in args]
    run = reference if callable(reference) else fn if reference == "eager" \
        else tf.function(positional, jit_compile=True)
    expected = [np.asarray(e) for e in tf.nest.flatten(run(*tensors))]
    module = hlo_module(positional, *tensors)
    got = evaluator.evaluate(module, [np.asarray(a) for a in args])
    got = list(got) if isinstance(got, tuple) else [got]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype, (g.shape, g.dtype, e.shape, e.dtype)
        if e.dtype in (tf.bfloat16.as_numpy_dtype, np.float16):
            g, e = g.astype(np.float32), e.astype(np.float32)
        if e.dtype.kind in "fc":
            finite = np.abs(e[np.isfinite(e)])
            scale = max(1.0, float(finite.max())) if finite.size else 1.0
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol * scale)
        else:
            np.testing.assert_array_equal(g, e)


def test_every_opcode_has_an_implementation():
    assert set(OPCODES) - {"parameter"} <= set(evaluator._OPS)


# ------------------------------------------------------------ dot and conv

@pytest.mark.parametrize("fn, shapes", [
    (tf.matmul, [(3, 4), (4, 5)]),
    (lambda a, b: tf.matmul(a, b, transpose_b=True), [(2, 3, 4), (2, 5, 4)]),
    (lambda a, b: tf.einsum("abc,cd->abd", a, b), [(2, 3, 4), (4, 5)]),
    (lambda a, b: tf.einsum("bij,bkj->bki", a, b), [(2, 3, 4), (2, 5, 4)]),
    (lambda a, b: tf.tensordot(a, b, [[0, 2], [1, 0]]), [(3, 2, 4), (4, 3, 6)]),
])
def test_dot(fn, shapes):
    check(fn, *[randn(*s) for s in shapes], rtol=1e-4, atol=1e-5)


def test_integer_dot_wraps_exactly():
    a = randint(-2**20, 2**20, 3, 4)
    b = randint(-2**20, 2**20, 4, 2)
    check(tf.matmul, a, b)


def _conv_and_grads(conv):
    def fn(x, k, up):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([x, k])
            y = conv(x, k)
            loss = tf.reduce_sum(y * up)
        return y, tape.gradient(loss, x), tape.gradient(loss, k)
    return fn


@pytest.mark.parametrize("stride, padding, dilation", [
    (1, "SAME", 1), (2, "SAME", 1), (1, "VALID", 1), (2, "VALID", 1), (1, "SAME", 2),
    (1, "VALID", 2),
])
def test_conv2d_forward_and_gradients(stride, padding, dilation):
    def conv(x, k):
        return tf.nn.conv2d(x, k, stride, padding, dilations=dilation)

    def undilated(x, k):    # (TensorFlow's kernels without oneDNN have no dilated gradient)
        return tf.nn.conv2d(x, _spread(k, dilation), stride, padding)
    x, k = randn(2, 7, 6, 3), randn(3, 3, 3, 4)
    up = randn(*conv(x, k).shape)
    check(_conv_and_grads(conv), x, k, up, rtol=1e-4, atol=1e-5,
          reference=_conv_and_grads(undilated))


def _spread(k, rate):
    """Kernel `k` with rate - 1 zeros between its taps: a convolution with it is
    the one with `k` dilated by `rate`."""
    for axis in (0, 1):
        taps = tf.unstack(k, axis=axis)
        gap = [tf.zeros_like(taps[0])] * (rate - 1)
        k = tf.stack([t for tap in taps for t in [tap, *gap]][:len(taps) * rate - rate + 1],
                     axis=axis)
    return k


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_conv_forward_and_gradients(stride):
    def conv(x, k):
        return tf.nn.depthwise_conv2d(x, k, [1, stride, stride, 1], "SAME")
    x, k = randn(2, 6, 6, 3), randn(3, 3, 3, 2)
    up = randn(*conv(x, k).shape)
    check(_conv_and_grads(conv), x, k, up, rtol=1e-4, atol=1e-5)


def test_conv1d_and_conv3d():
    check(lambda x, k: tf.nn.conv1d(x, k, 2, "SAME"), randn(2, 9, 3), randn(3, 3, 5),
          rtol=1e-4, atol=1e-5)
    check(lambda x, k: tf.nn.conv3d(x, k, [1, 1, 2, 1, 1], "VALID"), randn(1, 4, 5, 4, 2),
          randn(2, 2, 2, 2, 3), rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------- pooling / windows

def _pool_and_grad(pool):
    def fn(x, up):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = pool(x)
        return y, tape.gradient(y, x, output_gradients=up)
    return fn


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("size, stride, padding", [
    (2, 2, "VALID"), (2, 2, "SAME"), (3, 2, "SAME"), (3, 1, "VALID"), (3, 2, "VALID"),
])
def test_pooling_forward_and_gradient(kind, size, stride, padding):
    op = tf.nn.max_pool2d if kind == "max" else tf.nn.avg_pool2d

    def pool(x):
        return op(x, size, stride, padding)
    x = randn(2, 7, 6, 3)
    check(_pool_and_grad(pool), x, randn(*pool(x).shape), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fn", [
    lambda x: tf.cumsum(x, axis=1),
    lambda x: tf.cumsum(x, axis=0, exclusive=True, reverse=True),
    lambda x: tf.math.cumprod(x, axis=1),
])
def test_cumulative_ops(fn):
    check(fn, randn(4, 5), rtol=1e-5, atol=1e-6)


# -------------------------------------------------------------- reductions

@pytest.mark.parametrize("fn", [
    lambda x: tf.reduce_sum(x), lambda x: tf.reduce_sum(x, axis=[0, 2]),
    lambda x: tf.reduce_max(x, axis=1), lambda x: tf.reduce_min(x, axis=-1),
    lambda x: tf.reduce_mean(x, axis=[1, 2]), lambda x: tf.reduce_prod(x, axis=0),
    lambda x: tf.math.argmax(x, axis=1), lambda x: tf.math.argmin(x, axis=2),
    lambda x: tf.reduce_logsumexp(x, axis=1),
    lambda x: (tf.reduce_any(x > 1, axis=0), tf.reduce_all(x > -2, axis=2)),
    lambda x: tf.nn.softmax(x, axis=-1), lambda x: tf.nn.log_softmax(x, axis=1),
    lambda x: tf.math.reduce_variance(x, axis=0),
])
def test_reductions(fn):
    check(fn, randn(3, 4, 5))


def test_argmax_picks_first_of_ties():
    check(lambda x: tf.math.argmax(x, axis=1), np.array([[1, 3, 3, 0], [2, 2, 2, 2]],
                                                         np.float32))


def test_argmax_and_argmin_pass_over_nan_as_tensorflow_does():
    """NaN loses to any number; an all-NaN row gives index 0 (XLA's CPU code
    would give the last: HLO leaves the fold's order open)."""
    nan = np.nan
    x = np.array([[nan, nan, nan], [1, nan, 3], [nan, 5, 5], [2, 1, nan]], np.float32)
    check(lambda x: (tf.math.argmax(x, axis=1), tf.math.argmin(x, axis=1),
                     tf.math.argmax(x, axis=0)), x)


def test_softmax_cross_entropy_and_gradient():
    def fn(logits, labels, sparse):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            dense = tf.nn.softmax_cross_entropy_with_logits(labels, logits)
            loss = tf.reduce_mean(dense) + tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(sparse, logits))
        return dense, loss, tape.gradient(loss, logits)
    labels = tf.nn.softmax(randn(6, 5)).numpy()
    check(fn, randn(6, 5) * 3, labels, randint(0, 5, 6))


# --------------------------------------------------------- gather / scatter

@pytest.mark.parametrize("fn, args", [
    (lambda x, i: tf.gather(x, i, axis=1), [randn(3, 5, 2), randint(0, 5, 4)]),
    (lambda x, i: tf.gather(x, i), [randn(6, 3), randint(0, 6, 2, 3)]),
    (lambda x, i: tf.gather(x, i, axis=1, batch_dims=1), [randn(3, 5, 2),
                                                          randint(0, 5, 3, 4)]),
    (tf.gather_nd, [randn(4, 5, 3), randint(0, 4, 6, 2)]),
    (tf.gather_nd, [randn(4, 5, 3), randint(0, 3, 2, 3, 3)]),
    (lambda x, i: tf.experimental.numpy.take_along_axis(x, i, axis=1),
     [randn(3, 5), randint(0, 5, 3, 2)]),
])
def test_gather(fn, args):
    check(fn, *args)


@pytest.mark.parametrize("fn", [
    tf.tensor_scatter_nd_add, tf.tensor_scatter_nd_max, tf.tensor_scatter_nd_min,
])
def test_scatter_combining_duplicates(fn):
    idx = np.array([[0, 1], [2, 2], [0, 1], [3, 0]], np.int32)     # a duplicate
    check(fn, randn(4, 3, 2), idx, randn(4, 2))


def test_scatter_update_and_slices():
    check(tf.tensor_scatter_nd_update, randn(5, 3), np.array([[4], [1]], np.int32),
          randn(2, 3))
    check(lambda x, i, u: tf.tensor_scatter_nd_add(x, i, u), randint(0, 9, 6),
          np.array([[1], [1], [5]], np.int32), randint(0, 9, 3))


def test_segment_sum_and_unsorted():
    check(lambda x, s: tf.math.unsorted_segment_sum(x, s, 4), randn(6, 2),
          randint(0, 4, 6), rtol=1e-5)


# -------------------------------------------------------------------- sort

def test_sort():
    x = np.round(randn(4, 6) * 2).astype(np.float32)      # ties, and -0.0 vs 0.0
    x[0, :2] = [-0.0, 0.0]
    check(lambda x: (xla.sort(x), xla.sort(-x)), x, reference="jit")
    keys = RNG.permutation(24).reshape(4, 6).astype(np.float32)    # XLA's sort is unstable
    check(lambda k, v: xla.key_value_sort(k, v), keys, randint(0, 9, 4, 6), reference="jit")
    # tf.sort and top_k: a sort, then set-dimension-size to the static size.
    check(lambda k: (*tf.math.top_k(k, 3), tf.sort(k)), keys, reference="jit")


# ------------------------------------------------------------- elementwise

@pytest.mark.parametrize("fn", [
    tf.exp, tf.math.expm1, tf.math.log1p, tf.tanh, tf.sigmoid, tf.math.erf, tf.sin,
    tf.cos, tf.floor, tf.math.ceil, tf.round, tf.sign, tf.abs, tf.math.softplus,
    tf.nn.relu, tf.nn.gelu, lambda x: tf.math.rsqrt(tf.abs(x) + 1),
    lambda x: tf.sqrt(tf.abs(x)), lambda x: tf.math.log(tf.abs(x) + 0.1),
    lambda x: tf.clip_by_value(x, -0.5, 0.7), lambda x: tf.math.is_finite(x / (x - x)),
    lambda x: tf.where(x > 0, x, 2 * x), lambda x: tf.pow(tf.abs(x), 1.5),
    lambda x: tf.math.atan2(x, x[::-1]), lambda x: tf.math.floormod(x, 0.7),
    lambda x: tf.truncatemod(x, -0.7), lambda x: tf.math.floordiv(x, 0.3),
    lambda x: tf.math.tan(x / 2), lambda x: tf.math.reciprocal(x),
])
def test_float_elementwise(fn):
    check(fn, np.append(randn(20) * 3, [0.5, -0.5, 1.5, -2.5, 0.0]).astype(np.float32))


def test_round_half_away_from_zero():
    x = np.array([0.5, -0.5, 1.5, -2.5, 2.4999998, 0.49999997, -0.49999997, 3.0],
                 np.float32)
    module = _elementwise_module("round-nearest-afz", "f32", x.shape)
    np.testing.assert_array_equal(evaluator.evaluate(module, [x]),
                                  [1, -1, 2, -3, 2, 0, -0, 3])


def test_integer_division_and_modulo_with_negatives():
    a = np.array([7, -7, 7, -7, 0, 5, -2**31, 13], np.int32)
    b = np.array([2, 2, -2, -2, 3, 7, 3, -5], np.int32)
    check(lambda a, b: (tf.math.floordiv(a, b), tf.math.floormod(a, b),
                        tf.truncatediv(a, b), tf.truncatemod(a, b)), a, b)


def test_integer_overflow_wraps_and_int_pow():
    a = np.array([2**31 - 1, -2**31, 12345, -3], np.int32)
    check(lambda a: (a + 1, a * 65537, -a, tf.abs(a)), a)
    check(lambda a, b: tf.pow(a, b), np.array([3, -2, 5, 7], np.int32),
          np.array([4, 3, 0, 20], np.int32))


@pytest.mark.parametrize("dtype", [np.int32, np.uint32])
def test_bit_ops(dtype):
    a = np.array([0x7FFFFFFF, 0x80000001, 12345, 0xF0F0F0F0, 1, 0], np.uint32).view(dtype)
    b = np.array([1, 7, 0xFF00FF, 3, 31, 5], np.uint32).view(dtype)
    check(lambda a, b: (tf.bitwise.bitwise_and(a, b), tf.bitwise.bitwise_or(a, b),
                        tf.bitwise.bitwise_xor(a, b), tf.bitwise.invert(a),
                        tf.bitwise.left_shift(a, b % 32), tf.bitwise.right_shift(a, b % 32),
                        tf.raw_ops.PopulationCount(x=a)), a, b)


@pytest.mark.parametrize("dtype", [np.int32, np.uint32])
def test_shift_counts_past_the_bit_width(dtype):
    # TF's kernels clamp the count; XLA gives 0 (or the sign) -- compare with XLA.
    a = np.array([-5, 5, -1, 0x40000000, 7, -8], np.int32).view(dtype)
    b = np.array([32, 33, 40, 31, 100, 32], np.int32).view(dtype)
    check(lambda a, b: (tf.bitwise.left_shift(a, b), tf.bitwise.right_shift(a, b)), a, b,
          reference="jit")


def test_casts_saturate_and_map_nan_to_zero():
    x = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 2.7, -2.7, 255.9, -0.9, 1e20],
                 np.float32)
    check(lambda x: (tf.cast(x, tf.int32), tf.cast(x, tf.int64), tf.cast(x, tf.uint8),
                     tf.cast(x, tf.int8), tf.cast(x, tf.uint32), tf.cast(x, tf.bool),
                     tf.cast(x, tf.float16), tf.cast(x, tf.bfloat16)), x, reference="jit")
    i = np.array([2**31 - 1, -2**31, 16777217, -3, 0], np.int32)
    check(lambda i: (tf.cast(i, tf.float32), tf.cast(i, tf.int8), tf.cast(i, tf.uint16),
                     tf.cast(i, tf.bool), tf.cast(i, tf.float64)), i)


def test_bitcasts():
    x = randn(3, 4)
    check(lambda x: (tf.bitcast(x, tf.int32), tf.bitcast(x, tf.uint16), tf.bitcast(
        tf.bitcast(x, tf.uint8), tf.float32)), x)


def test_logical_and_complex_ops():
    a, b = randn(6) > 0, randn(6) > 0
    check(lambda a, b: (tf.logical_and(a, b), tf.logical_or(a, b), tf.logical_not(a),
                        tf.math.logical_xor(a, b), tf.cast(a, tf.float32)), a, b)
    check(lambda x, y: (tf.math.real(tf.complex(x, y) * tf.complex(y, x)),
                        tf.math.imag(tf.complex(x, y) * tf.complex(y, x)),
                        tf.abs(tf.complex(x, y))), randn(5), randn(5))


# --------------------------------------------------------- data movement

@pytest.mark.parametrize("fn", [
    lambda x: tf.pad(x, [[1, 2], [0, 3]]), lambda x: tf.pad(x, [[1, 2], [2, 1]], "REFLECT"),
    lambda x: tf.pad(x, [[1, 0], [2, 1]], "SYMMETRIC", constant_values=0),
    lambda x: tf.reverse(x, [0, 1]), lambda x: tf.concat([x, 2 * x], axis=1),
    lambda x: x[::-1, 1::2], lambda x: x[4:0:-2, ::-3], lambda x: x[:, None, 2],
    lambda x: tf.transpose(x), lambda x: tf.reshape(x, [2, -1, 3]),
    lambda x: tf.tile(x, [2, 1]), lambda x: tf.broadcast_to(x[:, :1], [5, 6]),
    lambda x: tf.range(6, dtype=tf.float32) * x, lambda x: tf.linalg.band_part(x, 1, 2),
    lambda x: tf.image.resize(x[None, :, :, None], [7, 9])[0, ..., 0],
    lambda x: tf.split(x, 3, axis=1), lambda x: tf.unstack(x, axis=0)[3],
])
def test_data_movement(fn):
    check(fn, randn(5, 6))


def test_one_hot_and_range():
    check(lambda i: (tf.one_hot(i, 5), tf.range(3, 20, 4) * i[0]), randint(-1, 6, 7))


def test_dynamic_slice_and_update_clamp_start_indices():
    check(lambda x, b: xla.dynamic_slice(x, b, [2, 3]), randn(5, 6),
          np.array([4, -1], np.int32), reference="jit")
    check(lambda x, u, i: xla.dynamic_update_slice(x, u, i), randn(5, 6), randn(2, 3),
          np.array([-1, 5], np.int32), reference="jit")


# ------------------------------------------------------------------ random

@pytest.mark.parametrize("shape", [[3], [5, 7], [2, 3, 5], [1], [4], []])
@pytest.mark.parametrize("dtype", [tf.uint32, tf.uint64, tf.int32])
def test_philox_bits_match_tensorflow_exactly(shape, dtype):
    def fn(key, counter):
        return tf.raw_ops.StatelessRandomUniformFullIntV2(
            shape=shape, key=key, counter=counter, alg=1, dtype=dtype)
    key = np.array([12345], np.uint64)
    counter = np.array([2**64 - 3, 9], np.uint64)     # low word carries into high
    check(fn, key, counter)
    check(fn, key, np.array([7, 0], np.uint64))


@pytest.mark.parametrize("shape", [[5], [2, 3], [3, 5], [2, 3, 5], [1], [4, 1], [3, 1, 5], []])
@pytest.mark.parametrize("dtype", [tf.uint32, tf.uint64])
def test_threefry_bits_match_xla_exactly(shape, dtype):
    # TF's own kernels have no ThreeFry: compare with XLA.
    def fn(key, counter):
        return tf.raw_ops.StatelessRandomUniformFullIntV2(
            shape=shape, key=key, counter=counter, alg=2, dtype=dtype)
    check(fn, np.array([2**40 + 12345], np.uint64), np.array([2**64 - 2, 0], np.uint64),
          reference="jit")


def test_rng_known_values_and_counter_advance():
    state = np.array([12345, 7, 0], np.uint64)
    new_state, bits = evaluator.evaluate(_rng_module("u32", [5, 7]), [state])
    assert list(bits.ravel()[:6]) == [2667469288, 1132955194, 352380175, 2594486496,
                                      1646164935, 2053434220]
    np.testing.assert_array_equal(new_state, [12345, 7 + 9, 0])     # 35 words: 9 blocks
    new_state, _ = evaluator.evaluate(_rng_module("u64", [3]),
                                      [np.array([1, 2**64 - 1, 4], np.uint64)])
    np.testing.assert_array_equal(new_state, [1, 1, 5])             # 6 words: 2 blocks
    new_state, _ = evaluator.evaluate(_rng_module("u32", [3, 5], "rng_three_fry", 2),
                                      [np.array([1, 2**64 - 1], np.uint64)])
    np.testing.assert_array_equal(new_state, [1, 8])                # 9 blocks of pairs


@pytest.mark.parametrize("alg", ["auto_select", "philox", "threefry"])
def test_stateless_random_ops(alg):
    # The default algorithm differs between TF's kernels and XLA: compare with XLA.
    seed = np.array([3, 4], np.int32)
    check(lambda s: (tf.random.stateless_uniform([4, 5], s, alg=alg),
                     tf.random.stateless_normal([7], s, alg=alg),
                     tf.random.stateless_uniform([6], s, minval=0, maxval=10, dtype=tf.int32,
                                                 alg=alg),
                     tf.random.stateless_uniform([3, 2], s, dtype=tf.float16, alg=alg),
                     tf.random.stateless_uniform([3], s, dtype=tf.float64, alg=alg)),
          seed, rtol=1e-5, reference="jit")


# ------------------------------------------------------------ hand-built IR

def _comp(name, root):
    order, seen = [], set()

    def visit(inst):
        if inst not in seen:
            seen.add(inst)
            for op in inst.operands:
                visit(op)
            order.append(inst)
    visit(root)
    return Computation(name, order, root)


def _param(n, dtype, dims):
    return Instruction(f"p{n}", "parameter", Shape.array(dtype, dims), parameter_number=n)


def _inst(opcode, dtype, dims, *operands, **attrs):
    return Instruction(opcode, opcode, Shape.array(dtype, dims), list(operands), attrs)


def _module(root):
    comp = _comp("entry", root)
    return Module("m", [comp], comp)


def _elementwise_module(opcode, dtype, dims, **attrs):
    return _module(_inst(opcode, dtype, dims, _param(0, dtype, dims), **attrs))


def _rng_module(dtype, dims, algorithm="rng_philox", state_size=3):
    state = _param(0, "u64", [state_size])
    shape = Shape.tuple([Shape.array("u64", [state_size]), Shape.array(dtype, dims)])
    return _module(Instruction("rng", "rng-bit-generator", shape, [state],
                               {"algorithm": algorithm}))


def _binary_comp(opcode, dtype="f32"):
    a, b = _param(0, dtype, []), _param(1, dtype, [])
    return _comp(opcode, _inst(opcode, dtype, [], a, b))


def test_reduce_precision_matches_narrow_float_rounding():
    x = np.concatenate([randn(200) * 100, [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30,
                                           -1e-30, 65504, 65520]]).astype(np.float32)
    bf16 = evaluator.evaluate(_elementwise_module(
        "reduce-precision", "f32", x.shape, exponent_bits=8, mantissa_bits=7), [x])
    np.testing.assert_array_equal(bf16, x.astype(tf.bfloat16.as_numpy_dtype).astype(np.float32))
    f16 = evaluator.evaluate(_elementwise_module(
        "reduce-precision", "f32", x.shape, exponent_bits=5, mantissa_bits=10), [x])
    normal = ~(np.abs(x) < 2**-14)                       # f16 keeps denormals; XLA flushes
    with np.errstate(over="ignore"):
        rounded = x.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(f16[normal], rounded[normal])
    assert np.all(f16[~normal] == 0)


def test_count_leading_zeros_and_popcnt():
    x = np.array([0, 1, 2, 255, 2**31, 2**31 - 1, 0xFFFFFFFF], np.uint32)
    clz = evaluator.evaluate(_elementwise_module("count-leading-zeros", "u32", x.shape), [x])
    np.testing.assert_array_equal(clz, [32, 31, 30, 24, 0, 1, 0])
    s8 = np.array([0, 1, -1, 64, -128], np.int8)
    clz8 = evaluator.evaluate(_elementwise_module("count-leading-zeros", "s8", s8.shape), [s8])
    np.testing.assert_array_equal(clz8, [8, 7, 0, 1, 0])
    pop = evaluator.evaluate(_elementwise_module("popcnt", "s8", s8.shape), [s8])
    np.testing.assert_array_equal(pop, [0, 1, 8, 1, 1])


def test_integer_divide_by_zero_and_overflow_follow_xla():
    a = np.array([7, -7, -2**31, -2**31, 0], np.int32)
    b = np.array([0, 0, -1, 0, 0], np.int32)
    pa, pb = _param(0, "s32", [5]), _param(1, "s32", [5])
    div = evaluator.evaluate(_module(_inst("divide", "s32", [5], pa, pb)), [a, b])
    rem = evaluator.evaluate(_module(_inst("remainder", "s32", [5], pa, pb)), [a, b])
    np.testing.assert_array_equal(div, [-1, -1, -2**31, -1, -1])
    np.testing.assert_array_equal(rem, [7, -7, 0, -2**31, 0])


def test_compare_total_order_sorts_nan_and_signed_zero():
    x = np.array([np.nan, -0.0, 0.0, -np.nan, 1.0], np.float32)
    y = np.array([np.inf, 0.0, -0.0, -np.inf, np.nan], np.float32)
    pa, pb = _param(0, "f32", [5]), _param(1, "f32", [5])
    lt = evaluator.evaluate(_module(_inst("compare", "pred", [5], pa, pb, direction="LT",
                                          comparison_type="TOTALORDER")), [x, y])
    np.testing.assert_array_equal(lt, [False, True, False, True, True])


def test_gather_clamps_out_of_range_starts():
    operand = np.arange(20, dtype=np.float32).reshape(5, 4)
    starts = np.array([[-3, 1], [4, 3], [2, 9]], np.int32)
    gather = _inst("gather", "f32", [3, 2, 2], _param(0, "f32", [5, 4]),
                   _param(1, "s32", [3, 2]), offset_dims=(1, 2), collapsed_slice_dims=(),
                   start_index_map=(0, 1), index_vector_dim=1, slice_sizes=(2, 2))
    got = evaluator.evaluate(_module(gather), [operand, starts])
    expected = [operand[0:2, 1:3], operand[3:5, 2:4], operand[2:4, 2:4]]
    np.testing.assert_array_equal(got, expected)


def test_gather_and_scatter_with_batching_dims():
    operand = randn(3, 5, 2)
    idx = randint(0, 5, 3, 4)
    gather = _inst("gather", "f32", [3, 4, 2], _param(0, "f32", [3, 5, 2]),
                   _param(1, "s32", [3, 4]), offset_dims=(2,), collapsed_slice_dims=(1,),
                   start_index_map=(1,), index_vector_dim=2, slice_sizes=(1, 1, 2),
                   operand_batching_dims=(0,), start_indices_batching_dims=(0,))
    got = evaluator.evaluate(_module(gather), [operand, idx])
    np.testing.assert_array_equal(got, np.take_along_axis(operand, idx[..., None], axis=1))
    updates = randn(3, 4, 2)
    scatter = _inst("scatter", "f32", [3, 5, 2], _param(0, "f32", [3, 5, 2]),
                    _param(1, "s32", [3, 4]), _param(2, "f32", [3, 4, 2]),
                    update_window_dims=(2,), inserted_window_dims=(1,),
                    scatter_dims_to_operand_dims=(1,), index_vector_dim=2,
                    input_batching_dims=(0,), scatter_indices_batching_dims=(0,),
                    to_apply=_binary_comp("add"))
    got = evaluator.evaluate(_module(scatter), [operand, idx, updates])
    expected = operand.copy()
    for b in range(3):
        np.add.at(expected[b], idx[b], updates[b])
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_scatter_skips_out_of_bounds_windows():
    operand = np.zeros((5, 3), np.float32)
    idx = np.array([[4], [-1], [3], [5]], np.int32)
    updates = np.ones((4, 2, 3), np.float32)
    scatter = _inst("scatter", "f32", [5, 3], _param(0, "f32", [5, 3]),
                    _param(1, "s32", [4, 1]), _param(2, "f32", [4, 2, 3]),
                    update_window_dims=(1, 2), inserted_window_dims=(),
                    scatter_dims_to_operand_dims=(0,), index_vector_dim=1,
                    to_apply=_binary_comp("add"))
    got = evaluator.evaluate(_module(scatter), [operand, idx, updates])
    np.testing.assert_array_equal(got[:, 0], [0, 0, 0, 1, 1])   # only start 3 fits


def test_reduce_window_base_and_window_dilation_and_generic_fold():
    x = randn(7)
    window = (WindowDim(size=2, stride=2, pad_lo=1, pad_hi=2, lhs_dilate=2, rhs_dilate=3),)
    # base-dilated input: x0 _ x1 _ ... x6, padded (1, 2); window taps t, t+3.
    dilated = np.full(1 + 13 + 2, np.nan)
    dilated[1:14:2] = x
    expected = [np.nansum([dilated[t], dilated[t + 3]]) + 1.0
                for t in range(0, len(dilated) - 3, 2)]
    for comp in (_binary_comp("add"), _generic_add()):
        rw = _inst("reduce-window", "f32", [len(expected)], _param(0, "f32", [7]),
                   _param(1, "f32", []), window=window, to_apply=comp)
        got = evaluator.evaluate(_module(rw), [x, np.float32(1.0)])
        np.testing.assert_allclose(got, expected, rtol=1e-6)


def _generic_add():
    """add written so it is not recognised as one op (a + (b * 1))."""
    a, b = _param(0, "f32", []), _param(1, "f32", [])
    one = Instruction("one", "constant", Shape.array("f32", []), literal=np.float32(1))
    return _comp("generic_add", _inst("add", "f32", [], a, _inst("multiply", "f32", [], b,
                                                                  one)))


def test_dynamic_slice_clamps_and_sort_is_stable():
    x = np.arange(10, dtype=np.int32)
    ds = _inst("dynamic-slice", "s32", [4], _param(0, "s32", [10]), _param(1, "s32", []),
               dynamic_slice_sizes=(4,))
    got = evaluator.evaluate(_module(ds), [x, np.int32(8)])
    np.testing.assert_array_equal(got, [6, 7, 8, 9])
    keys = np.array([3, 1, 3, 1, 2], np.int32)
    params = [_param(n, "s32", []) for n in range(4)]      # compares keys only
    less = _inst("compare", "pred", [], params[0], params[1], direction="LT")
    cmp = Computation("lt", params + [less], less)
    sort = Instruction("sort", "sort", Shape.tuple([Shape.array("s32", [5])] * 2),
                       [_param(0, "s32", [5]), _param(1, "s32", [5])],
                       {"dimensions": (0,), "to_apply": cmp, "is_stable": "true"})
    k, v = evaluator.evaluate(_module(sort), [keys, np.arange(5, dtype=np.int32)])
    np.testing.assert_array_equal(k, [1, 1, 2, 3, 3])
    np.testing.assert_array_equal(v, [1, 3, 4, 0, 2])


def test_call_copy_cbrt_transpose_bitcast():
    x = randn(2, 3)
    callee = _comp("callee", _inst("copy", "f32", [2, 3], _inst("cbrt", "f32", [2, 3],
                                                                _param(0, "f32", [2, 3]))))
    call = _inst("call", "f32", [2, 3], _param(0, "f32", [2, 3]), to_apply=callee)
    flat = _inst("bitcast", "f32", [6], _inst("transpose", "f32", [3, 2], call,
                                              dimensions=(1, 0)))
    got = evaluator.evaluate(_module(flat), [x])
    np.testing.assert_allclose(got, np.cbrt(x).T.reshape(6), rtol=1e-6)


def test_convolution_window_reversal_and_negative_padding():
    x, k = randn(2, 6, 3), randn(3, 3, 4)                  # b0f, 0io
    window = (WindowDim(size=3, pad_lo=1, pad_hi=-1, rhs_reversal=True),)
    conv = _inst("convolution", "f32", [2, 4, 4], _param(0, "f32", [2, 6, 3]),
                 _param(1, "f32", [3, 3, 4]), window=window,
                 dim_labels=DimLabels.parse("b0f_0io->b0f"))
    got = evaluator.evaluate(_module(conv), [x, k])
    padded = np.pad(x, [(0, 0), (1, 0), (0, 0)])[:, :6]    # lo 1, hi -1 crops
    flipped = k[::-1]
    expected = np.stack([np.einsum("btf,tfo->bo", padded[:, o:o + 3], flipped)
                         for o in range(4)], axis=1)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_long_sort_uses_the_per_comparison_path(monkeypatch):
    monkeypatch.setattr(evaluator, "_PAIRWISE_SORT_LIMIT", 4)
    x = np.round(randn(2, 9) * 2).astype(np.float32)
    lt = _inst("compare", "pred", [], _param(0, "f32", []), _param(1, "f32", []),
               direction="GT")
    sort = _inst("sort", "f32", [2, 9], _param(0, "f32", [2, 9]), dimensions=(1,),
                 to_apply=_comp("gt", lt))
    np.testing.assert_array_equal(evaluator.evaluate(_module(sort), [x]), -np.sort(-x))


def test_variadic_reduce_window_argmax():
    x = np.array([3, 1, 4, 4, 5, 9, 2, 6], np.float32)
    av, ai, bv, bi = (_param(0, "f32", []), _param(1, "s32", []), _param(2, "f32", []),
                      _param(3, "s32", []))
    ge = _inst("compare", "pred", [], av, bv, direction="GE")
    pick = Instruction("t", "tuple", Shape.tuple([Shape.array("f32", []),
                                                  Shape.array("s32", [])]),
                       [_inst("select", "f32", [], ge, av, bv),
                        _inst("select", "s32", [], ge, ai, bi)])
    comp = Computation("argmax", [av, ai, bv, bi, ge] + pick.operands + [pick], pick)
    out = Shape.tuple([Shape.array("f32", [3]), Shape.array("s32", [3])])
    rw = Instruction("rw", "reduce-window", out,
                     [_param(0, "f32", [8]), _param(1, "s32", [8]), _param(2, "f32", []),
                      _param(3, "s32", [])],
                     {"window": (WindowDim(size=3, stride=2, pad_hi=-1),), "to_apply": comp})
    values, index = evaluator.evaluate(_module(rw), [x, np.arange(8, dtype=np.int32),
                                                     np.float32(-np.inf), np.int32(-1)])
    np.testing.assert_array_equal(values, [4, 5, 9])
    np.testing.assert_array_equal(index, [2, 4, 5])


def test_sort_comparator_with_bitcast_convert_runs_lifted():
    x = np.array([1.5, -2.0, 0.25, -0.0, 3.0], np.float32)
    a, b = _param(0, "f32", []), _param(1, "f32", [])
    as_int = [_inst("bitcast-convert", "s32", [], p) for p in (a, b)]
    lt = _inst("compare", "pred", [], *as_int, direction="LT")
    sort = _inst("sort", "f32", [5], _param(0, "f32", [5]), dimensions=(0,),
                 to_apply=_comp("bits_lt", lt))
    got = evaluator.evaluate(_module(sort), [x])
    np.testing.assert_array_equal(got.view(np.int32), np.sort(x.view(np.int32)))


def test_unsupported_rng_algorithm_is_named():
    module = _rng_module("u32", [4])
    module.entry.root.attrs["algorithm"] = "rng_new_thing"
    with pytest.raises(NotImplementedError, match="rng_new_thing"):
        evaluator.evaluate(module, [np.zeros(3, np.uint64)])


# ------------------------------------------------------------ properties

_dims = st.lists(st.integers(0, 4), min_size=0, max_size=4)
_BIN = {"add": np.add, "multiply": np.multiply, "maximum": np.maximum,
        "minimum": np.minimum, "subtract": np.subtract}


@settings(max_examples=30, deadline=None)
@given(dims=_dims, op=st.sampled_from(sorted(_BIN)), data=st.data())
def test_property_broadcast_elementwise(dims, op, data):
    kept = sorted(data.draw(st.sets(st.integers(0, max(len(dims) - 1, 0)),
                                    max_size=len(dims))) if dims else [])
    small = [dims[d] for d in kept]
    a, b = randn(*dims), randn(*small)
    bcast = _inst("broadcast", "f32", dims, _param(1, "f32", small), dimensions=tuple(kept))
    root = _inst(op, "f32", dims, _param(0, "f32", dims), bcast)
    got = evaluator.evaluate(_module(root), [a, b])
    shape = [dims[d] if d in kept else 1 for d in range(len(dims))]
    np.testing.assert_array_equal(got, _BIN[op](a, b.reshape(shape)))


@settings(max_examples=30, deadline=None)
@given(dims=_dims, op=st.sampled_from(["add", "maximum", "minimum"]), data=st.data(),
       generic=st.booleans())
def test_property_reduce(dims, op, data, generic):
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, max(len(dims) - 1, 0)),
                                          max_size=len(dims))) if dims else []))
    x = randn(*dims)
    init = {"add": 0.0, "maximum": -np.inf, "minimum": np.inf}[op]
    out = [n for d, n in enumerate(dims) if d not in axes]
    comp = _binary_comp(op)
    if generic:             # a reshape in it forces the per-element path
        a, b = comp.parameters
        comp = _comp("g", _inst(op, "f32", [], _inst("reshape", "f32", [], a), b))
    reduce = _inst("reduce", "f32", out, _param(0, "f32", dims), _param(1, "f32", []),
                   dimensions=axes, to_apply=comp)
    got = evaluator.evaluate(_module(reduce), [x, np.float32(init)])
    expected = _BIN[op].reduce(x, axis=axes, initial=init) if axes else np.asarray(
        _BIN[op](x, init))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
