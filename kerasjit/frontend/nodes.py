"""Names and NodeDef builders for the graphs the frontend reads and writes."""
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import node_def_pb2


def tensor_name(name):
    """A GraphDef input ('x', 'x:1', '^x') as a tensor name ('x:0', 'x:1')."""
    name = name.lstrip("^")
    return name if ":" in name else name + ":0"


def node_name(tensor):
    """The node producing a tensor (or named by a control input)."""
    return tensor.lstrip("^").split(":")[0]


def node(name, op, inputs, **type_attrs):
    """A NodeDef of `op` reading `inputs`, with DataType attributes (as tf.DType)."""
    made = node_def_pb2.NodeDef(name=name, op=op)
    made.input.extend(inputs)
    for key, dtype in type_attrs.items():
        made.attr[key].type = tf.as_dtype(dtype).as_datatype_enum
    return made


def const(name, value):
    value = np.asarray(value)
    made = node(name, "Const", [], dtype=value.dtype)
    made.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
    return made


def placeholder(name, dtype, shape):
    made = node(name, "Placeholder", [], dtype=dtype)
    made.attr["shape"].shape.CopyFrom(tf.TensorShape(shape).as_proto())
    return made
