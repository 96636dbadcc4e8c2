"""split_dilated_convolutions: the input gradient of a strided convolution (a
convolution over its output gradient dilated by the stride) becomes one
convolution per output phase over the undilated gradient, with the same
values (to float rounding) and no product with an inserted zero."""
import numpy as np
import pytest
import tensorflow as tf

from kerasjit.frontend.bridge import hlo_module
from kerasjit.passes import Pipeline, dce, split_dilated_convolutions
from kerasjit.hlo.evaluator import evaluate
from tests.support.hlo_args import random_args


def _convolutions(module):
    return [i for c in module.computations for i in c.instructions if i.opcode == "convolution"]


def _split(fn, *specs):
    """fn's HLO after the pass (verified), checked against the original on
    random inputs; the convolutions left."""
    before = hlo_module(fn, *specs)
    after = Pipeline([split_dilated_convolutions, dce], debug=True)(hlo_module(fn, *specs))
    # (finite: an inserted zero times an infinite weight is NaN, and not computed after)
    args = [np.nan_to_num(a, posinf=3.0, neginf=-3.0) for a in random_args(before)]
    for want, got in zip(evaluate(before, args), evaluate(after, args), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    convolutions = _convolutions(after)
    assert all(w.lhs_dilate == 1 for c in convolutions for w in c.attrs["window"])
    return convolutions


def _input_gradient(input_shape, kernel, strides, padding):
    """The gradient of conv(x, w) with respect to x, of an output gradient g."""
    def fn(g, w):
        return tf.nn.conv2d_transpose(g, w, (2, *input_shape), strides, padding)
    out = [(n + s - 1) // s if padding == "SAME" else (n - k) // s + 1
           for n, k, s in zip(input_shape[:2], kernel[:2], strides)]
    return fn, tf.TensorSpec((2, *out, kernel[3]), tf.float32), tf.TensorSpec(kernel, tf.float32)


@pytest.mark.parametrize("input_shape,kernel,strides,padding", [
    ((8, 8, 3), (3, 3, 3, 4), (2, 2), "SAME"),      # ResNet's strided 3x3
    ((8, 8, 3), (3, 3, 3, 4), (2, 2), "VALID"),
    ((9, 7, 2), (1, 1, 2, 5), (2, 2), "VALID"),     # a 1x1 stride-2 projection: one phase
    ((9, 7, 2), (1, 1, 2, 5), (2, 2), "SAME"),
    ((10, 11, 2), (5, 4, 2, 3), (3, 2), "SAME"),
    ((10, 11, 2), (2, 5, 2, 3), (2, 3), "VALID"),
    ((7, 7, 1), (3, 3, 1, 2), (1, 3), "SAME"),      # dilated along one dim alone
])
def test_a_strided_convolutions_input_gradient_splits_by_phase(input_shape, kernel, strides,
                                                                padding):
    phases = _split(*_input_gradient(input_shape, kernel, strides, padding))
    assert 1 <= len(phases) <= np.prod(strides)
    # Each phase has the taps of the window that meet its input elements: each tap once.
    assert sum(np.prod([w.size for w in c.attrs["window"]]) for c in phases) \
        <= np.prod(kernel[:2])


def test_a_one_dimensional_strided_convolutions_input_gradient():
    def fn(g, w):
        return tf.nn.conv1d_transpose(g, w, (3, 17, 2), 3, "SAME")
    phases = _split(fn, tf.TensorSpec((3, 6, 4), tf.float32),
                    tf.TensorSpec((4, 2, 4), tf.float32))
    assert len(phases) == 3


def test_a_strided_depthwise_convolutions_input_gradient_splits_by_phase():
    """MobileNet's strided depthwise convolutions: a group per channel."""
    def fn(g, w):
        return tf.nn.depthwise_conv2d_backprop_input((2, 9, 8, 3), w, g, (1, 2, 2, 1), "SAME")
    phases = _split(fn, tf.TensorSpec((2, 5, 4, 6), tf.float32),
                    tf.TensorSpec((3, 3, 3, 2), tf.float32))
    assert len(phases) == 4 and all(c.attrs["feature_group_count"] == 3 for c in phases)
