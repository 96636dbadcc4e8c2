"""f16 and bf16 programs on the CPU backend: stored in 16 bits, computed in
f32 (passes/widen_floats.py), bit for bit the evaluator's results, and within
16-bit rounding of TensorFlow's own kernels."""
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from kerasjit.backends.cpu import BACKEND
from kerasjit.hlo.evaluator import evaluate
from tests.support.bridge import bridge

pytestmark = pytest.mark.tensorflow_reference


def _step(x, w, b):
    y = tf.nn.relu(tf.matmul(x, w) + b)
    return [tf.reduce_sum(tf.cast(y, tf.float32)), y * 3 - tf.exp(y / 4), tf.nn.softmax(y),
            tf.cast(x, tf.int32), tf.cast(tf.range(7), x.dtype) + b]


@pytest.mark.parametrize("dtype, ulp", [(np.float16, 2 ** -10), (ml_dtypes.bfloat16, 2 ** -7)])
def test_matches_the_evaluator_exactly_and_tensorflow_within_rounding(dtype, ulp):
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(dtype) for s in [(8, 5), (5, 7), (7,)]]
    want = tf.function(_step)(*args)
    got = BACKEND.compile(bridge(_step, *args))(args)
    ours = evaluate(bridge(_step, *args), args)
    for g, e, w in zip(got, ours, want):
        assert g.dtype == np.asarray(w).dtype
        np.testing.assert_array_equal(g, e)
        w = np.asarray(w).astype(np.float32)
        scale = np.maximum(np.abs(w), 1) * 8 * ulp
        assert (np.abs(g.astype(np.float32) - w) <= scale).all()
