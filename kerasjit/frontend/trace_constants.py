"""One graph constant per value while kerasjit traces a step.

Keras turns the same Python numbers into graph constants again at every use:
Adam makes eight for each weight, a layer a shape list per reshape, and
TensorFlow spends as long on a Const node as on any other op (ResNet50's
train step: 3,200 of its 14,500 nodes, ~15% of its trace). Within a trace
(interned_constants), a scalar or short list of Python numbers that the same
graph already holds as a constant, made in the same control-flow context,
under the same device scope (a mirrored strategy's replicas each keep their
own) and outside any control dependency, is that constant.
"""
import contextlib
import threading

from tensorflow.python.framework import ops

_NUMBERS = (int, float, bool)
_LONGEST = 16       # a list longer than a shape or an axis list is rarely met twice
# Where TensorFlow's constant() and convert_to_tensor() make graph constants
# (a TensorFlow without this function makes every constant anew).
_made = getattr(ops, "_create_graph_constant", None)
_trace = threading.local()      # .constants: (graph, context, value key, ...) -> Tensor


@contextlib.contextmanager
def interned_constants():
    """Within this block on this thread, equal constants of a graph are one."""
    if getattr(_trace, "constants", None) is not None:      # (nested: the outer one holds)
        yield
        return
    _trace.constants = {}
    try:
        yield
    finally:
        _trace.constants = None


def _value_key(value):
    """A key telling `value` from every other (-0.0 from 0.0, 1 from 1.0 and
    True), or None for what is not interned."""
    if type(value) in _NUMBERS:
        return type(value), repr(value)
    if isinstance(value, (list, tuple)) and len(value) <= _LONGEST \
            and all(type(v) in _NUMBERS for v in value):
        return tuple, repr([(type(v), v) for v in value])
    return None


def _constant(value, dtype, shape, name, verify_shape, allow_broadcast):
    constants = getattr(_trace, "constants", None)
    key = constants is not None and shape is None and _value_key(value)
    if key:
        graph = ops.get_default_graph()
        if not graph._control_dependencies_stack:   # (such a Const waits for them)
            devices = tuple(getattr(d, "display_name", repr(d))
                            for d in graph._device_function_stack.peek_objs())
            key = (graph, id(graph._control_flow_context), devices, key, dtype, verify_shape,
                   allow_broadcast)
            if key not in constants:
                constants[key] = _made(value, dtype, shape, name, verify_shape, allow_broadcast)
            return constants[key]
    return _made(value, dtype, shape, name, verify_shape, allow_broadcast)


if _made is not None:
    ops._create_graph_constant = _constant
