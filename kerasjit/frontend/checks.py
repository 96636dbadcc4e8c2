"""The input checks TensorFlow's kernels make, made by the compiled step too.

TensorFlow's CPU kernels reject an index or label out of range (or an
integer raised to a negative power), variables unchanged; the HLO of the same
ops computes on (a NaN loss, a clamped gather), and XLA drops Assert ops. So the step also computes whether every such input
is in range and every assertion holds, and each variable update becomes
select(ok, new, old): a failing step leaves the variables as they were and is
run again in TensorFlow, whose kernel raises its own error.
"""
import numpy as np
import tensorflow as tf

from .nodes import Builder, node, node_name, tensor_name

_NAME = "kerasjit_checks"


def _const_input(fg, tensor):
    """The value of a Const node's output, or None."""
    made = next((n for n in fg.nodes if n.name == node_name(tensor)), None)
    return tf.make_ndarray(made.attr["value"].tensor) if made is not None \
        and made.op == "Const" else None


def _dims(fg, tensor):
    spec = fg.specs.get(tensor_name(tensor))
    return None if spec is None or spec.shape.rank is None else spec.shape.as_list()


def _label_range(fg, n):
    dims = _dims(fg, n.input[0])            # logits: [batch, classes]
    return n.input[1], dims and dims[-1:], True


def _gather_range(fg, n):
    dims, axis = _dims(fg, n.input[0]), _const_input(fg, n.input[2])
    if dims is None or axis is None:
        return n.input[1], None, True
    return n.input[1], [dims[int(axis) % len(dims)]], True


def _nd_range(params, indices):
    """Bounds of an index tensor whose last dimension indexes `params`' leading dims."""
    def bounds(fg, n):
        dims, width = _dims(fg, n.input[params]), _dims(fg, n.input[indices])
        if dims is None or not width or width[-1] is None:
            return n.input[indices], None, True
        return n.input[indices], dims[:width[-1]], True
    return bounds


def _scatter_nd_range(fg, n):
    shape = _const_input(fg, n.input[2])
    width = _dims(fg, n.input[0])
    if shape is None or not width or width[-1] is None:
        return n.input[0], None, True
    return n.input[0], list(shape[:width[-1]]), True


def _segment_range(fg, n):
    count = _const_input(fg, n.input[2])       # negative ids are dropped, not errors
    return n.input[1], None if count is None else [int(count)], False


def _integer_exponent(fg, n):
    spec = fg.specs.get(tensor_name(n.input[1]))
    return n.input[1], () if spec is not None and spec.dtype.is_integer else None, True


# op -> fn(fg, node) -> (index tensor, bounds per its last dim or one for all
# (None: not known before run time, no check; (): no upper bound), whether
# negatives are errors)
_CHECKED = {
    "SparseSoftmaxCrossEntropyWithLogits": _label_range,
    "GatherV2": _gather_range,
    "GatherNd": _nd_range(0, 1),
    "ScatterNd": _scatter_nd_range,
    **{op: _nd_range(0, 1) for op in ("TensorScatterUpdate", "TensorScatterAdd",
                                       "TensorScatterSub", "TensorScatterMax",
                                       "TensorScatterMin")},
    **{op: _segment_range for op in ("UnsortedSegmentSum", "UnsortedSegmentMax",
                                     "UnsortedSegmentMin", "UnsortedSegmentProd")},
    "Pow": _integer_exponent,
}


def _in_range(fg, index, bounds, negatives_fail, name):
    """Nodes computing whether every element of `index` is within `bounds`
    (None: no upper bound; their specs added to fg's); the last one holds the
    verdict."""
    spec = fg.specs[tensor_name(index)]
    dtype, shape = spec.dtype, spec.shape
    b = Builder(name, fg.specs)
    tests = []
    if bounds is not None:
        tests.append(b.op("below", "Less", [index, b.const(
            "bounds", np.asarray(bounds, dtype.as_numpy_dtype))], shape, tf.bool, T=dtype))
    if negatives_fail:
        zero = b.const("zero", np.zeros((), dtype.as_numpy_dtype))
        tests.append(b.op("not_negative", "GreaterEqual", [index, zero], shape, tf.bool,
                          T=dtype))
    within = tests[0] if len(tests) == 1 else \
        b.op("within", "LogicalAnd", tests, shape, tf.bool)
    flat = b.op("all_flat", "Reshape", [within, b.const("flat", np.array([-1], np.int32))],
                [shape.num_elements()], tf.bool, T=tf.bool, Tshape=tf.int32)
    verdict = b.op("ok", "All", [flat, b.const("axis", np.int32(0))], [], tf.bool,
                   Tidx=tf.int32)
    verdict.attr["keep_dims"].b = False
    return b.nodes


_GUARD_OPS = {"Assert", "NoOp", "Identity", "Const"}


def asserted_condition(n, library):
    """The condition tensor node `n` asserts, or None: an Assert, or the If that
    tf.debugging's asserts wrap one in (its one output passes the condition on)."""
    if n.op == "Assert":
        return n.input[0]
    if n.op not in ("If", "StatelessIf") \
            or list(n.attr["Tout"].list.type) != [tf.bool.as_datatype_enum]:
        return None
    bodies = {f.signature.name: f for f in library.function}
    branches = [bodies.get(n.attr[b].func.name) for b in ("then_branch", "else_branch")]
    ops = {m.op for b in branches if b is not None for m in b.node_def}
    return n.input[0] if None not in branches and "Assert" in ops and ops <= _GUARD_OPS \
        else None


def add_input_checks(fg, asserted=()):
    """`fg` with its checks' verdict as one more output (fg.checked), every state
    update guarded by it; unchanged where no op needs a check. `asserted`: the
    conditions of the step's Assert ops (tf.debugging's), checks too."""
    made, verdicts = [], list(asserted)
    for n in list(fg.nodes):
        if n.op not in _CHECKED:
            continue
        index, bounds, negatives_fail = _CHECKED[n.op](fg, n)
        if bounds is None or any(b is None for b in bounds) \
                or tensor_name(index) not in fg.specs:
            continue
        upper = bounds if len(bounds) > 1 else bounds[0] if bounds else None
        made += _in_range(fg, index, upper, negatives_fail, f"{_NAME}/{len(verdicts)}")
        verdicts.append(made[-1].name)
    if not verdicts:
        return fg
    verdict = verdicts[0]
    for i, other in enumerate(verdicts[1:]):
        made.append(node(f"{_NAME}/and_{i}", "LogicalAnd", [verdict, other]))
        verdict = made[-1].name
        fg.specs[tensor_name(verdict)] = tf.TensorSpec([], tf.bool)
    for i, new in sorted(fg.state_outputs.items()):
        old = fg.state_inputs[i]
        made.append(node(f"{_NAME}/update_{i}", "SelectV2", [verdict, new, old],
                         T=fg.specs[old].dtype))
        fg.state_outputs[i] = tensor_name(made[-1].name)
        fg.specs[fg.state_outputs[i]] = fg.specs[old]
    fg.nodes += made
    fg.outputs.append(tensor_name(verdict))
    fg.checked, fg.asserts = True, bool(asserted)
    return fg
