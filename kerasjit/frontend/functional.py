"""Turn a traced tf.function into a pure dataflow graph.

Variables stop being resources: each captured variable becomes an input
placeholder holding its value at step start; reads see the latest value in
program order, and the last value assigned becomes an output. What remains
is a graph of values only, which can be cut into clusters freely and whose
compiled clusters take variables as parameters and return their updates
(to be aliased in place by a backend).
"""
from dataclasses import dataclass, field

import tensorflow as tf
from tensorflow.core.framework import node_def_pb2

from .checks import add_input_checks, asserted_condition
from .loops import LOOPS, loop_over_values
from .nodes import const, node_name, placeholder, tensor_name
from .rewrites import rewrite_for_tf_parity
from ..errors import UnsupportedGraph

# op type -> elementwise op applying the update to the current value
_UPDATE_OPS = {"AssignAddVariableOp": "AddV2", "AssignSubVariableOp": "Sub"}
# resource ops that never touch the value (no-ops once variables are values)
_INERT_RESOURCE_OPS = {"VarIsInitializedOp", "NoOp"}


@dataclass
class FunctionalGraph:
    nodes: list                 # NodeDef, in a topological (creation) order
    library: object             # FunctionDefLibrary of the traced graph
    inputs: list                # tensor names of the function's flat arguments
    variables: list             # tf.Variable per state input
    state_inputs: list          # placeholder tensor name per variable
    outputs: list               # tensor names of the function's flat outputs
    state_outputs: dict = field(default_factory=dict)   # variable index -> tensor name
    specs: dict = field(default_factory=dict)   # tensor name -> tf.TensorSpec (as traced)
    checked: bool = False       # the last output says whether the inputs passed checks.py's


def functionalize(concrete_fn):
    """ConcreteFunction -> FunctionalGraph with variables as values."""
    graph = concrete_fn.graph
    graph_def = graph.as_graph_def()
    specs = {t.name: tf.TensorSpec(t.shape, t.dtype)
             for op in graph.get_operations() for t in op.outputs}
    variables_by_handle = {id(v.handle): v for v in graph.variables}
    internal_to_var, constants = {}, {}
    for external, internal in graph.captures:
        var = variables_by_handle.get(id(external))
        if var is not None:
            internal_to_var[internal.op.name] = var
        elif internal.dtype == tf.resource:
            raise UnsupportedGraph(f"captured resource '{internal.op.name}' is not a variable")
        else:
            constants[internal.op.name] = external.numpy()

    variables = list({id(v): v for v in internal_to_var.values()}.values())
    var_index = {id(v): i for i, v in enumerate(variables)}
    state_inputs = [f"kerasjit_state_{i}" for i in range(len(variables))]
    # A handle is known by its captured placeholder (the root); Identity copies
    # of it are aliases, so an update through one is seen through the others.
    aliases = {internal: internal for internal in internal_to_var}   # node -> root
    current = {}                      # root -> tensor holding its value
    for internal, var in internal_to_var.items():
        current[internal] = tensor_name(state_inputs[var_index[id(var)]])
    renamed = {}                      # removed tensor -> replacement tensor
    removed = set()
    nodes = [placeholder(n, v.dtype, v.shape) for n, v in zip(state_inputs, variables)]
    specs.update((tensor_name(n), tf.TensorSpec(v.shape, v.dtype))
                 for n, v in zip(state_inputs, variables))

    def resolve(name):
        if name.startswith("^"):
            return None if name[1:] in removed else name
        return renamed.get(tensor_name(name), name)

    def root(name):
        """The variable handle an input names, or None for a value."""
        if name.startswith("^"):
            return None
        return aliases.get(tensor_name(name)) or aliases.get(node_name(name))

    asserted = []                     # conditions of the step's assertions
    for node in graph_def.node:
        condition = asserted_condition(node, graph_def.library)
        if condition is not None:         # run for its effect: a check (checks.py)
            asserted.append(tensor_name(resolve(condition)))
            renamed[tensor_name(node.name)] = asserted[-1]
            removed.add(node.name)
            continue
        if node.name in constants:
            nodes.append(const(node.name, constants[node.name]))
            continue
        if node.name in internal_to_var:
            removed.add(node.name)
            continue
        handles = [h for h in map(root, node.input) if h]
        if node.op in LOOPS and handles:      # a recurrent layer's time loop
            read = {p: root(i) for p, i in enumerate(node.input) if root(i)}
            node = loop_over_values(node, graph_def.library, {
                p: (current[h], internal_to_var[h]) for p, h in read.items()})
            # (the loop passes each handle on: its outputs there name the variables)
            for p, h in read.items():
                aliases[tensor_name(f"{node.name}:{p}")] = h
                var = internal_to_var[h]
                specs[tensor_name(f"{node.name}:{p}")] = tf.TensorSpec(var.shape, var.dtype)
            handles = []
        if node.op == "Identity" and handles:
            aliases[node.name] = handles[0]
            removed.add(node.name)
            continue
        if handles:
            handle = handles[0]
            if node.op == "ReadVariableOp":
                renamed[tensor_name(node.name)] = current[handle]
            elif node.op == "AssignVariableOp":
                current[handle] = resolve(node.input[1])
            elif node.op == "VariableShape":
                shape = node_def_pb2.NodeDef(name=node.name, op="Shape")
                shape.input.append(current[handle])
                shape.attr["T"].type = internal_to_var[handle].dtype.as_datatype_enum
                shape.attr["out_type"].CopyFrom(node.attr["out_type"])
                nodes.append(shape)
                continue
            elif node.op in _UPDATE_OPS:
                update = node_def_pb2.NodeDef(name=node.name + "/value", op=_UPDATE_OPS[node.op])
                update.input.extend([current[handle], resolve(node.input[1])])
                update.attr["T"].CopyFrom(node.attr["dtype"])
                nodes.append(update)
                current[handle] = tensor_name(update.name)
                specs[current[handle]] = specs[tensor_name(node.input[1])]
            elif node.op not in _INERT_RESOURCE_OPS:
                raise UnsupportedGraph(f"op {node.op} ('{node.name}') uses a variable in a "
                                       "way kerasjit cannot turn into dataflow")
            removed.add(node.name)
            continue
        new = node_def_pb2.NodeDef()
        new.CopyFrom(node)
        new.device = ""                  # placement is the runtime's business
        new.attr.pop("_class", None)     # colocation with nodes a cluster may lack
        del new.input[:]
        new.input.extend(r for r in map(resolve, node.input) if r is not None)
        nodes.append(new)

    state_outputs = {}
    for internal, var in internal_to_var.items():
        i = var_index[id(var)]
        if tensor_name(current[internal]) != tensor_name(state_inputs[i]):
            state_outputs[i] = tensor_name(current[internal])
    outputs = [tensor_name(resolve(t.name)) for t in concrete_fn.outputs]
    inputs = [t.name for t in graph.inputs[:len(graph.inputs) - len(graph.captures)]]
    fg = FunctionalGraph(nodes, graph_def.library, inputs, variables,
                         [tensor_name(n) for n in state_inputs], outputs, state_outputs, specs)
    return add_input_checks(rewrite_for_tf_parity(_prune(fg, asserted)), asserted)


def _prune(fg, also=()):
    """Drop nodes that no output (nor a tensor of `also`) depends on: reads
    left dangling, NoOps, Asserts."""
    by_name = {n.name: n for n in fg.nodes}
    live, stack = set(), [node_name(t) for t in [*fg.outputs, *fg.state_outputs.values(),
                                                 *also]]
    stack += [node_name(t) for t in fg.inputs + fg.state_inputs]
    while stack:
        name = stack.pop()
        if name in live or name not in by_name:
            continue
        live.add(name)
        stack.extend(node_name(i) for i in by_name[name].input)
    fg.nodes = [n for n in fg.nodes if n.name in live]
    return fg
