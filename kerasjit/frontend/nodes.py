"""Names and NodeDef builders for the graphs the frontend reads and writes."""
import hashlib

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import function_pb2, graph_pb2, node_def_pb2


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


def _attribute_values(node, field):
    """The values of kind `field` ("func", "type") a NodeDef's attributes hold,
    alone or in lists."""
    values = []
    for a in node.attr.values():
        kind = a.WhichOneof("value")      # (cheaper than reading each field of each value)
        if kind == field:
            values.append(getattr(a, field))
        elif kind == "list":
            values += getattr(a.list, field)
    return values


def called_functions(node):
    """The functions a NodeDef names in its attributes (a call, a loop's body)."""
    return [f.name for f in _attribute_values(node, "func")]


def attribute_types(node):
    """The dtypes a NodeDef's attributes name (its inputs' and outputs' types)."""
    return _attribute_values(node, "type")


def library_for(nodes, library):
    """The part of FunctionDefLibrary `library` that `nodes` call, directly
    or through each other: a graph's digest then holds no function that its
    nodes do not call (each named by a per-process counter)."""
    functions = {f.signature.name: f for f in library.function}
    called, stack = set(), [name for n in nodes for name in called_functions(n)]
    while stack:
        name = stack.pop()
        if name in called or name not in functions:
            continue
        called.add(name)
        stack.extend(name for n in functions[name].node_def for name in called_functions(n))
    part = function_pb2.FunctionDefLibrary()
    part.function.extend(functions[name] for name in sorted(called))
    part.gradient.extend(g for g in library.gradient if g.function_name in called)
    return part


def graph_digest(nodes, inputs, outputs, library=None):
    """A hash of the graph of `nodes` (calling functions of FunctionDefLibrary
    `library`, if any) with its nodes named by position and its inputs by index: a
    second copy of a model (layers `dense_1` where the first had `dense`)
    finds the first one's HLO."""
    canonical, inputs, outputs = _canonical(nodes, inputs, outputs, library)
    digest = hashlib.sha256(canonical.SerializeToString(deterministic=True))
    digest.update(repr((inputs, outputs)).encode())
    return digest.hexdigest()


def _canonical(nodes, inputs, outputs, library):
    """The graph, its inputs and its outputs with every node named by position
    and every input tensor by index. Only names change, each to a name TF does
    not allow (`%`), so no two graphs that differ otherwise look the same;
    and the attribute numbering custom gradients goes (a per-process counter,
    used while tracing only)."""
    names = {n.name: f"%n{i}" for i, n in enumerate(nodes)}
    fed = {t: f"%in{k}" for k, t in enumerate(inputs)}

    def renamed(t):
        control = t.startswith("^")
        node, colon, port = t.lstrip("^").partition(":")
        if node in names:
            return "^" * control + names[node] + colon + port
        return "^" * control + fed.get(node + (colon + port or ":0"), node + colon + port)
    canonical = graph_pb2.GraphDef()
    canonical.node.extend(nodes)
    if library is not None:
        canonical.library.CopyFrom(library)
    for n in canonical.node:
        n.name = names[n.name]
        n.input[:] = [renamed(i) for i in n.input]
        n.attr.pop("_gradient_op_type", None)
    return canonical, [fed[t] for t in inputs], [renamed(t) for t in outputs]
