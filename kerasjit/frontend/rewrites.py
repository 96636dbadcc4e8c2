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
from tensorflow.core.framework import node_def_pb2

_FLOAT32 = tf.float32.as_datatype_enum
_UINT32 = tf.uint32.as_datatype_enum


def _node(name, op, inputs, **type_attrs):
    node = node_def_pb2.NodeDef(name=name, op=op)
    node.input.extend(inputs)
    for key, dtype in type_attrs.items():
        node.attr[key].type = dtype
    return node


def _const_u32(name, value):
    node = _node(name, "Const", [], dtype=_UINT32)
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.uint32(value)))
    return node


def _float_uniform_as_tf_does(node):
    """Nodes replacing one float32 StatelessRandomUniformV2 (same output name)."""
    base = node.name + "/kerasjit"
    bits = _node(base + "/bits", "StatelessRandomUniformFullIntV2", list(node.input),
                 dtype=_UINT32, Tshape=node.attr["Tshape"].type)
    mantissa = _const_u32(base + "/mantissa_mask", 0x7FFFFF)
    one_bits = _const_u32(base + "/one_exponent", 0x3F800000)
    masked = _node(base + "/masked", "BitwiseAnd", [bits.name, mantissa.name], T=_UINT32)
    in_one_two = _node(base + "/in_1_2", "BitwiseOr", [masked.name, one_bits.name], T=_UINT32)
    as_float = _node(base + "/as_float", "Bitcast", [in_one_two.name], T=_UINT32, type=_FLOAT32)
    one = _node(base + "/one", "Const", [], dtype=_FLOAT32)
    one.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.float32(1.0)))
    result = _node(node.name, "Sub", [as_float.name, one.name], T=_FLOAT32)
    return [bits, mantissa, one_bits, masked, in_one_two, as_float, one, result]


def rewrite_for_tf_parity(fg):
    nodes = []
    for node in fg.nodes:
        if node.op == "StatelessRandomUniformV2" and node.attr["dtype"].type == _FLOAT32:
            nodes.extend(_float_uniform_as_tf_does(node))
        else:
            nodes.append(node)
    fg.nodes = nodes
    return fg
