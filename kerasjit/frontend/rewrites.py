"""TensorFlow-graph rewrites that make compiled results match plain TensorFlow.

XLA's lowering of `StatelessRandomUniformV2` draws the same Philox bits as
TensorFlow's CPU kernel but turns them into floats differently (XLA keeps the
high 23 bits, TensorFlow the low 23), so dropout masks differ and a model
trained under XLA drifts from the unwrapped one. We ask the bridge for the raw
bits (`StatelessRandomUniformFullIntV2`, identical in both) and convert them
the way TensorFlow's kernel does: `bitcast((bits & 0x7fffff) | 0x3f800000) - 1`.
"""
import numpy as np
import tensorflow as tf

from .nodes import const, node


def _float_uniform_as_tf_does(uniform):
    """Nodes replacing one float32 StatelessRandomUniformV2 (same output name)."""
    base = uniform.name + "/kerasjit"
    bits = node(base + "/bits", "StatelessRandomUniformFullIntV2", list(uniform.input),
                dtype=tf.uint32, Tshape=uniform.attr["Tshape"].type)
    mantissa = const(base + "/mantissa_mask", np.uint32(0x7FFFFF))
    one_bits = const(base + "/one_exponent", np.uint32(0x3F800000))
    masked = node(base + "/masked", "BitwiseAnd", [bits.name, mantissa.name], T=tf.uint32)
    in_one_two = node(base + "/in_1_2", "BitwiseOr", [masked.name, one_bits.name], T=tf.uint32)
    as_float = node(base + "/as_float", "Bitcast", [in_one_two.name], T=tf.uint32,
                    type=tf.float32)
    one = const(base + "/one", np.float32(1.0))
    result = node(uniform.name, "Sub", [as_float.name, one.name], T=tf.float32)
    return [bits, mantissa, one_bits, masked, in_one_two, as_float, one, result]


def rewrite_for_tf_parity(fg):
    nodes = []
    for n in fg.nodes:
        if n.op == "StatelessRandomUniformV2" and tf.as_dtype(n.attr["dtype"].type) == tf.float32:
            nodes.extend(_float_uniform_as_tf_does(n))
        else:
            nodes.append(n)
    fg.nodes = nodes
    return fg
