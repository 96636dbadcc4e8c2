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


class Builder:
    """Nodes named under `base`, appended to `nodes` (a new list by default),
    their output specs recorded in `specs`."""

    def __init__(self, base, specs, nodes=None):
        self.base, self.specs = base, specs
        self.nodes = [] if nodes is None else nodes

    def const(self, name, value):
        made = const(f"{self.base}/{name}", value)
        return self._add(made, np.shape(value), np.asarray(value).dtype)

    def op(self, name, op, inputs, shape, element_type, outputs=1, full_name=None, **attrs):
        """Node `op` of `inputs` (nodes or tensor names) named `name` under the
        base (or `full_name`); `element_type` and `shape`: its outputs';
        `attrs`: its DataType attributes."""
        made = node(full_name or f"{self.base}/{name}", op,
                    [getattr(i, "name", i) for i in inputs], **attrs)
        return self._add(made, shape, element_type, outputs)

    def _add(self, made, shape, dtype, outputs=1):
        self.nodes.append(made)
        for k in range(outputs):
            self.specs[tensor_name(f"{made.name}:{k}")] = tf.TensorSpec(shape, dtype)
        return made
