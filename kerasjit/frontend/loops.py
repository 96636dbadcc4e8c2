"""While loops over variables, made loops over values.

A recurrent layer's time loop receives its weights as variable handles and
reads them in its body; a loop may also assign a variable. Such a loop here
receives the variables' values instead (as they are at the loop, in program
order), and its body is walked like the step itself (functional.py: reads
see the latest value, assignments make a new one, calls are inlined and
branches if-converted) into a new body that returns each variable's value
after one iteration in the handle's place: the variable becomes loop-carried
state, and the loop's output there is its value after the loop. The bridge
then lowers it like any other loop.
"""
import itertools

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.python.eager import context

from .nodes import placeholder, tensor_name

LOOPS = ("While", "StatelessWhile")
_names = itertools.count()


def as_function(nodes, library, arguments, results, name):
    """Register, in `library` and in the eager context (where the bridge looks
    called functions up), a function of placeholders `arguments` (NodeDefs)
    computing the tensors `results` via `nodes`; its name, `name` made unique."""
    graph_def = graph_pb2.GraphDef()
    graph_def.node.extend(nodes)
    graph_def.library.CopyFrom(library)
    names = [tensor_name(a.name) for a in arguments]
    used = {tensor_name(i) for m in nodes for i in m.input if not i.startswith("^")}
    computed = [r for r in results if r not in names]

    def run(*values):
        given = dict(zip(names, values))      # (the placeholders themselves stay out)
        made = dict(zip(computed, tf.graph_util.import_graph_def(
            graph_def, input_map={k: v for k, v in given.items() if k in used},
            return_elements=computed, name=""))) if computed else {}
        return [given[r] if r in given else made[r] for r in results]
    specs = [tf.TensorSpec(tf.TensorShape(a.attr["shape"].shape), a.attr["dtype"].type)
             for a in arguments]
    fn = tf.function(run, autograph=False).get_concrete_function(*specs).function_def
    fn.signature.name = f"{name}_over_values_{next(_names)}"
    library.function.append(fn)
    context.context().add_function_def(fn)
    return fn.signature.name


def value_arguments(body, read, variables):
    """Placeholders for the arguments of function graph `body`, those at the
    positions `read` ({position: root handle}) holding the value of variable
    `variables[root]` instead of its handle."""
    made = []
    for p, t in enumerate(body.inputs):
        var = variables.get(read.get(p))
        made.append(placeholder(t.op.name, var.dtype, var.shape) if var is not None
                    else placeholder(t.op.name, t.dtype, t.shape))
    return made


def retyped_loop(loop, values):
    """`loop` (a While NodeDef, changed in place) taking `values` ({input
    position: (value tensor, tf.Variable)}) where it took handles."""
    for p, (tensor, var) in values.items():
        loop.input[p] = tensor
        loop.attr["T"].list.type[p] = var.dtype.as_datatype_enum
        if len(loop.attr["output_shapes"].list.shape) > p:
            loop.attr["output_shapes"].list.shape[p].CopyFrom(var.shape.as_proto())
    loop.attr.pop("_read_only_resource_inputs", None)
    return loop
