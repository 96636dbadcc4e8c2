"""What a kerasjit trace makes once: constants, pure ops and variable reads.

TensorFlow builds a step's graph op by op in Python (~180 us a node), and
Keras makes the same values again at every use: Adam, for each weight, its
hyperparameters as constants and the chain of step-count scalars (the
`iterations` read, its cast, two powers, the bias corrections: ~10 ops that
equal the previous weight's), a layer a shape list per reshape. Within a trace
(interned_trace), on this thread:

- a scalar or short list of Python numbers that the graph already holds as a
  constant is that constant;
- a variable's read is the graph's earlier read of it where no op that takes
  the variable (a write, a call that may write) was made since;
- a pure op (no state, at least one tensor input, no variable) with the same
  inputs and attributes as one made before is that op.

Each only in the same graph and control-flow context, under the same device
scope (a mirrored strategy's replicas each keep their own), with no control
dependency, gradient override or attribute scope active. Nothing but
constants is shared while a gradient tape records: a tape keeps one entry per
op made (the forward pass; the gradient, the optimizer, the metrics and
evaluate's step are traced with none). Colocation is left out of the key: it
places an op, it does not change its value.
"""
import contextlib
import threading

from tensorflow.core.framework import types_pb2
from tensorflow.python.eager import record
from tensorflow.python.framework import dtypes, op_def_library, op_def_registry, ops
from tensorflow.python.framework import tensor as tensor_lib

_NUMBERS = (int, float, bool)
_LONGEST = 16       # a list longer than a shape or an axis list is rarely met twice
# Where TensorFlow's constant() and convert_to_tensor() make graph constants,
# and where every generated op wrapper makes its op (a TensorFlow without the
# first makes every constant anew).
_make_constant = getattr(ops, "_create_graph_constant", None)
_make_op = op_def_library._apply_op_helper
# Ops with no state whose value is still not a function of their inputs.
_NOT_FUNCTIONS = frozenset({"Empty"})   # (uninitialised memory)
_TAKES_RESOURCES = {}      # op type -> whether its op def admits a resource input
_trace = threading.local()      # .memo: key -> what was made; None outside a trace


class _Unkeyable(Exception):
    """An argument whose identity a key cannot hold (a variable, an array...)."""


@contextlib.contextmanager
def interned_trace():
    """Within this block on this thread, what a graph makes twice it makes once."""
    if getattr(_trace, "memo", None) is not None:      # (nested: the outer one holds)
        yield
        return
    _trace.memo = {}
    try:
        yield
    finally:
        _trace.memo = None


def _value_key(value):
    """A key telling `value` from every other (-0.0 from 0.0, 1 from 1.0 and
    True), or None for what is not interned."""
    if type(value) in _NUMBERS:
        return type(value), repr(value)
    if isinstance(value, (list, tuple)) and len(value) <= _LONGEST \
            and all(type(v) in _NUMBERS for v in value):
        return tuple, repr([(type(v), v) for v in value])
    return None


def _scope_key(graph):
    """Where in `graph` an op is being made, or None where nothing is shared
    (control dependencies, a gradient override or attribute scope active)."""
    if graph._control_dependencies_stack or graph._gradient_override_map \
            or graph._attr_scope_map or graph._op_to_kernel_label_map:
        return None
    devices = tuple(getattr(d, "display_name", repr(d))
                    for d in graph._device_function_stack.peek_objs())
    return graph, id(graph._control_flow_context), devices


def _constant(value, dtype, shape, name, verify_shape, allow_broadcast):
    memo = getattr(_trace, "memo", None)
    key = memo is not None and shape is None and _value_key(value)
    scope = key and _scope_key(ops.get_default_graph())
    if not scope:
        return _make_constant(value, dtype, shape, name, verify_shape, allow_broadcast)
    key = ("const", scope, key, dtype, verify_shape, allow_broadcast)
    if key not in memo:
        memo[key] = _make_constant(value, dtype, shape, name, verify_shape, allow_broadcast)
    return memo[key]


def _argument_key(value, tensors):
    """`value`'s key (a tensor by identity, kept alive in `tensors` so that
    its id is not reused); _Unkeyable for a variable, an array or a resource."""
    if isinstance(value, tensor_lib.Tensor):
        if value.dtype == dtypes.resource:
            raise _Unkeyable
        tensors.append(value)
        return id(value)
    if value is None or isinstance(value, (str, dtypes.DType)):
        return type(value), value
    if type(value) in _NUMBERS:
        return _value_key(value)
    if isinstance(value, (list, tuple)):
        return tuple(_argument_key(v, tensors) for v in value)
    raise _Unkeyable


def _takes_resources(op_type):
    """Whether an op of this type may take a resource: an input of that type,
    or of a type attribute that admits it (a function call's arguments)."""
    if op_type not in _TAKES_RESOURCES:
        op_def = op_def_registry.get(op_type)
        allowed = {a.name: a.allowed_values.list.type for a in op_def.attr} if op_def else {}
        _TAKES_RESOURCES[op_type] = op_def is None or any(
            arg.type == types_pb2.DT_RESOURCE
            or ((arg.type_attr or arg.type_list_attr)
                and types_pb2.DT_RESOURCE in (allowed[arg.type_attr or arg.type_list_attr]
                                              or (types_pb2.DT_RESOURCE,)))
            for arg in op_def.input_arg)
    return _TAKES_RESOURCES[op_type]


def _noting_writes(add_op):
    """Graph._add_op (every op made passes it), counting in the trace's memo
    the ops other than reads that take each resource (by its tensor's id)."""
    def added(graph, op):
        memo = getattr(_trace, "memo", None)
        if memo is not None and op.type != "ReadVariableOp" and _takes_resources(op.type):
            for t in op.inputs:
                if t.dtype == dtypes.resource:
                    memo[("writes", id(t))] = memo.get(("writes", id(t)), 0) + 1
        return add_op(graph, op)
    return added


def _read_key(scope, memo, keywords):
    """A variable read's key: its resource and how often it was written to, or
    None where the resource is not a plain graph input (a handle an op made
    could alias another)."""
    graph, given = scope[0], keywords["resource"]
    known = memo.get(("handle", graph, id(given)))
    if known is None:
        try:
            handle = ops.convert_to_tensor(given)   # (the graph's capture of it)
        except Exception:       # (left for the op's own making to report)
            return None
        if handle.graph is not graph or handle.op.type != "Placeholder":
            return None
        known = memo[("handle", graph, id(given))] = handle, given
    handle = known[0]
    return ("read", scope, id(handle), memo.get(("writes", id(handle)), 0),
            keywords.get("dtype"))


def _op_key(op_type_name, scope, keywords, tensors):
    """A pure op's key, or None for an op with state or without tensor inputs."""
    op_def = op_def_registry.get(op_type_name)
    if op_def is None or op_def.is_stateful or op_type_name in _NOT_FUNCTIONS:
        return None
    try:
        arguments = tuple(sorted((k, _argument_key(v, tensors)) for k, v in keywords.items()))
    except _Unkeyable:
        return None
    if not tensors:      # (a Placeholder, a NoOp: each one is its own)
        return None
    return "op", scope, op_type_name, arguments


def _op(op_type_name, name=None, **keywords):
    memo = getattr(_trace, "memo", None)
    scope = memo is not None and not record.could_possibly_record() \
        and _scope_key(ops.get_default_graph())
    if not scope:
        return _make_op(op_type_name, name, **keywords)
    tensors = []
    if op_type_name == "ReadVariableOp":
        key = _read_key(scope, memo, keywords)
    else:
        key = _op_key(op_type_name, scope, keywords, tensors)
    if key is None:
        return _make_op(op_type_name, name, **keywords)
    if key not in memo:
        memo[key] = _make_op(op_type_name, name, **keywords), tensors
    return memo[key][0]


if _make_constant is not None:
    ops._create_graph_constant = _constant
op_def_library._apply_op_helper = _op
ops.Graph._add_op = _noting_writes(ops.Graph._add_op)
