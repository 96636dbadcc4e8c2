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
    alone or in lists, by attribute name (the order of a map's entries is
    not the same from one serialization to the next)."""
    values = []
    for key in sorted(node.attr):
        a = node.attr[key]
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
    or through each other: what a graph of `nodes` imported alone needs."""
    functions = {f.signature.name: f for f in library.function}
    called = _called(nodes, functions)
    part = function_pb2.FunctionDefLibrary()
    part.function.extend(functions[name] for name in called)
    part.gradient.extend(g for g in library.gradient if g.function_name in called)
    return part


def _called(nodes, functions):
    """The names of `functions` (name -> FunctionDef) that `nodes` call,
    directly or through each other, in the order of their first call (nodes
    in order, a function's body before the next node)."""
    order = {}

    def visit(name):
        if name in functions and name not in order:
            order[name] = None
            for n in functions[name].node_def:
                for called in called_functions(n):
                    visit(called)
    for n in nodes:
        for name in called_functions(n):
            visit(name)
    return list(order)


def graph_digest(nodes, inputs, outputs, library=None):
    """A hash of the graph of `nodes` (calling functions of FunctionDefLibrary
    `library`, if any) with its nodes named by position, its inputs by index
    and the functions it calls by the order of their first call: a second
    copy of a model (layers `dense_1` where the first had `dense`, a loop's
    body `while_body_374` where it had `while_body_281`) finds the first
    one's HLO."""
    canonical, inputs, outputs = _canonical(nodes, inputs, outputs, library)
    digest = hashlib.sha256(canonical.SerializeToString(deterministic=True))
    digest.update(repr((inputs, outputs)).encode())
    return digest.hexdigest()


# Attributes that hold names alone (colocation, the per-process counter of
# custom gradients, a placeholder's name in Python): nothing the graph computes.
_NAMING_ATTRIBUTES = ("_class", "_gradient_op_type", "_user_specified_name")


def _canonical(nodes, inputs, outputs, library):
    """The graph, its inputs and its outputs with every node named by position
    and every input tensor by index, and the library its nodes call with each
    function named by the order of its first call (_canonical_functions).
    Only names change, each to a name TF does not allow (`%`), so no two
    graphs that differ otherwise look the same."""
    names = {n.name: f"%n{i}" for i, n in enumerate(nodes)}
    fed = {t: f"%in{k}" for k, t in enumerate(inputs)}
    canonical = graph_pb2.GraphDef()
    canonical.node.extend(nodes)
    if library is not None:
        canonical.library.CopyFrom(_canonical_functions(canonical.node, library))
    for n in canonical.node:
        n.name = names[n.name]
        n.input[:] = [_renamed(i, names, fed) for i in n.input]
        _drop_naming_attributes(n.attr)
    return canonical, [fed[t] for t in inputs], [_renamed(t, names, fed) for t in outputs]


def _renamed(t, names, fed=None):
    """Input `t` ("node:port", "^node"; in a function's body also
    "node:output_arg:index" and "argument") with its node renamed by `names`,
    else the tensor by `fed` (tensor name -> name)."""
    control = t.startswith("^")
    node, colon, port = t.lstrip("^").partition(":")
    if node in names:
        return "^" * control + names[node] + colon + port
    return "^" * control + (fed or {}).get(node + (colon + port or ":0"), node + colon + port)


def _canonical_functions(nodes, library):
    """The functions of FunctionDefLibrary `library` that `nodes` call,
    directly or through each other, named `%f0`, `%f1`... by the order of
    their first call (_called), with their arguments, results and nodes
    named by position; the
    calls in `nodes` and in the functions renamed to match. TensorFlow names
    a traced function by a per-process counter, so the same loop traced
    after other functions, or in a second copy of a model, gets another
    name."""
    functions = {f.signature.name: f for f in library.function}
    order = {name: f"%f{k}" for k, name in enumerate(_called(nodes, functions))}
    canonical = function_pb2.FunctionDefLibrary()
    for name in order:
        function = canonical.function.add()
        function.CopyFrom(functions[name])
        _rename_function_body(function, order[name])
    for n in [*nodes, *(n for f in canonical.function for n in f.node_def)]:
        for called in _attribute_values(n, "func"):
            called.name = order.get(called.name, called.name)
    canonical.gradient.extend(
        function_pb2.GradientDef(function_name=order[g.function_name],
                                 gradient_func=order.get(g.gradient_func, g.gradient_func))
        for g in library.gradient if g.function_name in order)
    return canonical


def _rename_function_body(function, name):
    """FunctionDef `function` named `name`, with its arguments (`%a`), results
    (`%r`), control outputs (`%c`) and nodes (`%b`) named by position."""
    signature = function.signature
    local = {a.name: f"%a{i}" for i, a in enumerate(signature.input_arg)}
    local.update({n.name: f"%b{i}" for i, n in enumerate(function.node_def)})
    results = {a.name: f"%r{i}" for i, a in enumerate(signature.output_arg)}
    controls = {c: f"%c{i}" for i, c in enumerate(signature.control_output)}
    signature.name = name
    for a in signature.input_arg:
        a.name = local[a.name]
    for a in signature.output_arg:
        a.name = results[a.name]
    signature.control_output[:] = [controls[c] for c in signature.control_output]
    for n in function.node_def:
        n.name = local[n.name]
        n.input[:] = [_renamed(i, local) for i in n.input]
        _drop_naming_attributes(n.attr)
    for attrs in function.arg_attr.values():
        _drop_naming_attributes(attrs.attr)
    ret = {results[k]: _renamed(v, local) for k, v in function.ret.items()}
    control_ret = {controls[k]: local[v] for k, v in function.control_ret.items()}
    function.ClearField("ret")
    function.ret.update(ret)
    function.ClearField("control_ret")
    function.control_ret.update(control_ret)


def _drop_naming_attributes(attributes):
    for key in _NAMING_ATTRIBUTES:
        attributes.pop(key, None)
