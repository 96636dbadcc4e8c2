"""While loops that read variables, made loops over values.

A recurrent layer's time loop receives its weights as variable handles and
reads them in its body. Here such a loop instead receives the weights' values
(at the point of the loop in program order), and its body and condition are
copies whose reads of those arguments are the arguments themselves; the
bridge then lowers it like any other loop. A loop that assigns a variable,
or hands one on to an op other than a read, stays as it is (the caller says
why it is not compiled).
"""
from tensorflow.core.framework import function_pb2
from tensorflow.python.eager import context

from ..errors import UnsupportedGraph

LOOPS = ("While", "StatelessWhile")


def loop_over_values(loop, library, values):
    """`loop` (a While NodeDef, changed in place) reading the values `values`
    ({input position: (value tensor, tf.Variable)}) instead of the handles
    there; its body and condition copied into `library`."""
    dtypes = {p: var.dtype for p, (_, var) in values.items()}
    for key in ("body", "cond"):
        name = loop.attr[key].func.name
        loop.attr[key].func.name = _with_values(library, name, dtypes, loop.name)
    for p, (tensor, var) in values.items():
        loop.input[p] = tensor
        loop.attr["T"].list.type[p] = var.dtype.as_datatype_enum
        if len(loop.attr["output_shapes"].list.shape) > p:
            loop.attr["output_shapes"].list.shape[p].CopyFrom(var.shape.as_proto())
    loop.attr.pop("_read_only_resource_inputs", None)
    return loop


def _with_values(library, name, dtypes, where):
    """The name of a copy of function `name` in `library` whose arguments at
    positions `dtypes` are values of those types, where it read them as variables."""
    original = next(f for f in library.function if f.signature.name == name)
    fn = function_pb2.FunctionDef()
    fn.CopyFrom(original)
    fn.signature.name = f"{name}_over_values"
    if any(f.signature.name == fn.signature.name for f in library.function):
        return fn.signature.name
    handles = {}                  # name a handle is read through -> its dtype
    for p, dtype in dtypes.items():
        arg = fn.signature.input_arg[p]
        arg.type = dtype.as_datatype_enum
        handles[arg.name] = dtype
        fn.arg_attr.pop(p, None)          # (the handle's dtype and shape annotations)
    outputs = {}                  # "node:value:0" of a read -> "node:output:0"
    for node in fn.node_def:
        node.input[:] = [outputs.get(i, i) for i in node.input]
        read = [i for i in node.input if i.split(":")[0] in handles]
        if not read:
            continue
        dtype = handles[read[0].split(":")[0]]
        if node.op not in ("ReadVariableOp", "Identity"):
            raise UnsupportedGraph(f"loop '{where}' hands a variable to {node.op} "
                                   f"('{node.name}'): kerasjit compiles loops that only read them")
        if node.op == "ReadVariableOp":   # the value itself, under the name the reads use
            outputs[f"{node.name}:value:0"] = f"{node.name}:output:0"
            node.op = "Identity"
            node.attr.pop("dtype")
        else:                             # an alias of the handle: reads through it too
            handles[node.name] = dtype
            outputs[f"{node.name}:output:0"] = f"{node.name}:output:0"
        node.attr["T"].type = dtype.as_datatype_enum
    for out in fn.signature.output_arg:
        value = fn.ret[out.name] = outputs.get(fn.ret[out.name], fn.ret[out.name])
        if value.split(":")[0] in handles:        # a handle passed on: now its value
            out.type = handles[value.split(":")[0]].as_datatype_enum
    library.function.append(fn)
    # The bridge looks called functions up in the eager context, where tracing
    # registered the originals.
    context.context().add_function_def(fn)
    return fn.signature.name
