"""Turn a traced tf.function into a pure dataflow graph.

Variables stop being resources: each captured variable becomes an input
placeholder holding its value at step start; reads see the latest value in
program order, and the last value assigned becomes an output. What remains
is a graph of values only, which can be cut into clusters freely and whose
compiled clusters take variables as parameters and return their updates
(to be aliased in place by a backend).

Called functions are inlined (a nested tf.function, Keras's grouped
convolution), and branches (If, Case: a warm-up schedule, gradient
accumulation, loss scaling) are if-converted: every branch is inlined with
its own view of the variables, and each result and each variable a branch
changes is selected by the condition. The bridge then sees plain ops; the
price is that every branch runs, which for the branches of a training step
(an optimizer's update or not) costs little. A branch that takes no variable
and makes values of no static shape (RMSprop's sparse update) stays an op
that TensorFlow runs: no select can pick between values of two shapes.
"""
import functools
import hashlib
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import node_def_pb2
from tensorflow.python.framework import op_def_registry
from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

from .checks import add_input_checks, asserted_condition
from .collectives import COLLECTIVES, local_all_reduces
from .loops import LOOPS, as_function, retyped_loop, value_arguments
from .nodes import (Builder, called_functions, const, graph_digest, node, node_name,
                    placeholder, tensor_name)
from .rewrites import rewrite_for_tf_parity
from ..errors import UnsupportedGraph

# op type -> elementwise op applying the update to the current value
_UPDATE_OPS = {"AssignAddVariableOp": "AddV2", "AssignSubVariableOp": "Sub"}
# op type -> the TensorScatter op applying a scatter into a variable to its value
_SCATTER_OPS = {f"ResourceScatter{kind}": f"TensorScatter{kind}"
                for kind in ("Add", "Sub", "Update", "Max", "Min")}
# resource ops that never touch the value (no-ops once variables are values)
_INERT_RESOURCE_OPS = {"VarIsInitializedOp", "NoOp"}
_CALLS = {"PartitionedCall", "StatefulPartitionedCall"}
_IFS = {"If", "StatelessIf"}
_CASES = {"Case", "StatelessCase"}     # (bridge.BRANCH_OPS: both)


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
    # Captured resources that only TensorFlow's ops read (collectives' ordering
    # tokens): placeholder tensor name -> the handle, fed to the clusters as is.
    resources: dict = field(default_factory=dict)
    checked: bool = False       # the last output says whether the inputs passed checks.py's
    asserts: bool = False       # ... and the step's own assertions (tf.debugging's) too

    def digest(self):
        """A hash of what the step computes and which variables it reads and
        updates, names aside (nodes.graph_digest); None where a node calls a
        function (a loop's body): the digest tells a warm start's trace
        without automatic control dependencies (step._Trace) from another
        graph, and the functions of such a trace lack theirs."""
        if any(called_functions(n) for n in self.nodes):
            return None
        updates = sorted(self.state_outputs.items())
        digest = graph_digest(self.nodes, self.inputs + self.state_inputs,
                              self.outputs + [t for _, t in updates])
        return hashlib.sha256(repr((
            digest, [i for i, _ in updates], len(self.resources), self.checked, self.asserts,
            [(tuple(v.shape), v.dtype.name) for v in self.variables])).encode()).hexdigest()


def functionalize(concrete_fn):
    """ConcreteFunction -> FunctionalGraph with variables as values."""
    graph = concrete_fn.graph
    graph_def = graph.as_graph_def()
    specs = {t.name: tf.TensorSpec(t.shape, t.dtype)
             for op in graph.get_operations() for t in op.outputs}
    variables_by_handle = {id(v.handle): v for v in graph.variables}
    internal_to_var, constants, tokens = {}, {}, {}
    for external, internal in graph.captures:
        var = variables_by_handle.get(id(external))
        if var is not None:
            internal_to_var[internal.op.name] = var
        elif internal.dtype == tf.resource:
            tokens[internal.op.name] = external   # a collective's ordering token
        else:
            constants[internal.op.name] = external.numpy()
    # Values captured by reference (a strategy's collective instance keys), as
    # they are now: the same keys serve every call, as in a TF1 graph.
    captures = graph.function_captures
    for key, internal in captures.by_ref_internal.items():
        constants[internal.op.name] = np.reshape(captures.by_ref_external[key](), internal.shape)

    variables = list({id(v): v for v in internal_to_var.values()}.values())
    var_index = {id(v): i for i, v in enumerate(variables)}
    state_inputs = [f"kerasjit_state_{i}" for i in range(len(variables))]
    walker = _Walker(graph_def.library, specs, internal_to_var, tokens)
    walker.nodes = [placeholder(n, v.dtype, v.shape) for n, v in zip(state_inputs, variables)]
    specs.update((tensor_name(n), tf.TensorSpec(v.shape, v.dtype))
                 for n, v in zip(state_inputs, variables))
    for internal, var in internal_to_var.items():
        walker.current[internal] = tensor_name(state_inputs[var_index[id(var)]])
    for n in graph_def.node:
        if n.name in constants:
            walker.nodes.append(const(n.name, constants[n.name]))
        elif n.name in internal_to_var:
            walker.removed.add(n.name)
        else:
            walker.visit(n)

    state_outputs = {}
    for internal, var in internal_to_var.items():
        i = var_index[id(var)]
        if tensor_name(walker.current[internal]) != tensor_name(state_inputs[i]):
            state_outputs[i] = tensor_name(walker.current[internal])
    producers = {n.name: n for n in walker.nodes}
    outputs = [_passed_on(tensor_name(walker.resolve(t.name)), producers)
               for t in concrete_fn.outputs]
    inputs = [t.name for t in graph.inputs[:len(graph.inputs) - len(concrete_fn.captured_inputs)]]
    fg = FunctionalGraph(walker.nodes, graph_def.library, inputs, variables,
                         [tensor_name(n) for n in state_inputs], outputs, state_outputs, specs,
                         {tensor_name(name): handle for name, handle in tokens.items()})
    asserted = walker.asserted
    # (TensorFlow runs every stateful op of a step, whether or not its outputs are read)
    effects = [n.name for n in walker.nodes if _stateful(n.op)]
    fg = _prune(local_all_reduces(fg), asserted + effects)
    live = {n.name for n in fg.nodes}
    fg.resources = {t: h for t, h in fg.resources.items() if node_name(t) in live}
    return add_input_checks(rewrite_for_tf_parity(fg), asserted)


@functools.cache
def _stateful(op):
    """Whether op `op` may have an effect beyond its outputs (a tf.py_function's,
    a print's): automatic control dependencies make TensorFlow run it."""
    op_def = op_def_registry.get(op)
    return op_def is not None and op_def.is_stateful


def _passed_on(output, producers):
    """An output as the value its Identity passes on, where the Identity only
    orders it after the step's side effects (automatic control dependencies
    wrap each output so; a pure graph orders nothing, and its stateful ops
    are kept as effects): the step is then the same graph whether traced with
    them or without (step._Trace)."""
    node = producers.get(node_name(output))
    if node is None or node.op != "Identity" or len(node.input) < 2 \
            or not all(i.startswith("^") for i in node.input[1:]):
        return output
    return tensor_name(node.input[0])


class _Walker:
    """Visits nodes in program order, tracking each variable's current value.

    A handle is known by its captured placeholder (the root); Identity copies
    of it, a function's argument bound to it and a loop's output passing it
    on are aliases, so an update through one is seen through the others."""

    def __init__(self, library, specs, internal_to_var, tokens=()):
        self.functions = {f.signature.name: f for f in library.function}
        self.tokens = tokens          # captured resources that order collectives
        self.library, self.specs, self.internal_to_var = library, specs, internal_to_var
        self.aliases = {internal: internal for internal in internal_to_var}  # name -> root
        self.current = {}             # root -> tensor holding its value
        self.renamed = {}             # removed tensor -> replacement tensor
        self.removed = set()
        self.nodes = []
        self.asserted = []            # conditions of the step's assertions

    def resolve(self, name):
        if name.startswith("^"):
            return None if name[1:] in self.removed else name
        return self.renamed.get(tensor_name(name), name)

    def root(self, name):
        """The variable handle an input names, or None for a value."""
        if name.startswith("^"):
            return None
        return self.aliases.get(tensor_name(name)) or self.aliases.get(node_name(name))

    def visit(self, n):
        condition = asserted_condition(n, self.library)
        if condition is not None:         # run for its effect: a check (checks.py)
            self.asserted.append(tensor_name(self.resolve(condition)))
            self.renamed[tensor_name(n.name)] = self.asserted[-1]
            self.removed.add(n.name)
            return
        if n.op in _CALLS:
            self._results(n, self.inline(n.attr["f"].func.name, n.input,
                                         f"{n.name}/kerasjit_inlined/"))
            return
        handles = [h for h in map(self.root, n.input) if h]
        if (n.op in _IFS or n.op in _CASES) and (handles or self._shaped_alike(n)):
            self._if_convert(n)
            return
        if n.op in LOOPS and handles:      # a recurrent layer's time loop
            n, handles = self._loop(n), []
        if handles:
            self._variable_op(n, handles[0])
            return
        new = node_def_pb2.NodeDef()
        new.CopyFrom(n)
        if n.op not in COLLECTIVES:     # a collective's device is its member of the group;
            new.device = ""             # other placement is the runtime's business
        new.attr.pop("_class", None)     # colocation with nodes a cluster may lack
        del new.input[:]
        new.input.extend(r for r in map(self.resolve, n.input) if r is not None)
        if "Nordering_token" not in n.attr and any(node_name(i) in self.tokens
                                                   for i in n.input):
            raise UnsupportedGraph(f"op {n.op} ('{n.name}') uses a captured resource that "
                                   "is not a variable")
        self.nodes.append(new)

    def _variable_op(self, n, handle):
        if n.op == "Identity":
            self.aliases[n.name] = handle
        elif n.op == "ReadVariableOp":
            self.renamed[tensor_name(n.name)] = self.current[handle]
        elif n.op == "AssignVariableOp":
            self.current[handle] = self.resolve(n.input[1])
        elif n.op == "VariableShape":
            shape = node(n.name, "Shape", [self.current[handle]],
                         T=self.internal_to_var[handle].dtype)
            shape.attr["out_type"].CopyFrom(n.attr["out_type"])
            self.nodes.append(shape)
            return
        elif n.op in _UPDATE_OPS:
            update = node(n.name + "/value", _UPDATE_OPS[n.op],
                          [self.current[handle], self.resolve(n.input[1])])
            update.attr["T"].CopyFrom(n.attr["dtype"])
            self.nodes.append(update)
            self.current[handle] = tensor_name(update.name)
            self.specs[self.current[handle]] = self.specs[tensor_name(n.input[1])]
        elif n.op in _SCATTER_OPS:
            self._scatter(n, handle)
        elif n.op not in _INERT_RESOURCE_OPS:
            raise UnsupportedGraph(f"op {n.op} ('{n.name}') uses a variable in a "
                                   "way kerasjit cannot turn into dataflow")
        self.removed.add(n.name)

    def _scatter(self, n, handle):
        """A scatter into a variable (a sparse gradient's update: an Embedding
        trained by SGD) as the TensorScatter op of its value, the indices
        made coordinates along the first dim."""
        var = self.internal_to_var[handle]
        indices, updates = n.input[1:3]
        index_spec = self.specs[tensor_name(indices)]
        b = Builder(n.name, self.specs, self.nodes)
        coordinates = b.op("coordinates", "ExpandDims", [self.resolve(indices),
                                                         b.const("axis", np.int32(-1))],
                           index_spec.shape.concatenate([1]), index_spec.dtype,
                           T=index_spec.dtype, Tdim=tf.int32)
        value = b.op("value", _SCATTER_OPS[n.op],
                     [self.current[handle], coordinates, self.resolve(updates)],
                     var.shape, var.dtype, T=var.dtype, Tindices=index_spec.dtype)
        self.current[handle] = tensor_name(value.name)

    def inline(self, name, inputs, prefix):
        """Visit function `name`'s body, its arguments bound to `inputs`, its
        nodes named under `prefix`; the tensors it returns."""
        inputs = [i for i in inputs if not i.startswith("^")]
        shapes = [self.specs[tensor_name(i)].shape if tensor_name(i) in self.specs else None
                  for i in inputs]
        body = self._body(name, self.specs, prefix, shapes)
        arguments = {t.op.name: i for t, i in zip(body.inputs, inputs)}
        for n in body.as_graph_def().node:
            if n.name in arguments:
                source = arguments[n.name]
                if self.root(source):
                    self.aliases[prefix + n.name] = self.root(source)
                else:
                    self.renamed[tensor_name(prefix + n.name)] = tensor_name(self.resolve(source))
                self.removed.add(prefix + n.name)
                continue
            inner = node_def_pb2.NodeDef()
            inner.CopyFrom(n)
            inner.name = prefix + n.name
            inner.input[:] = [f"^{prefix}{i[1:]}" if i.startswith("^") else prefix + i
                              for i in n.input]
            self.visit(inner)
        return [prefix + t.name for t in body.outputs]

    def _body(self, name, specs, prefix="", shapes=None):
        """Function `name` as a graph (its arguments' shapes `shapes` if known),
        the specs of its tensors recorded in `specs` under `prefix`."""
        if name not in self.functions:
            raise UnsupportedGraph(f"function '{name}' is not in the step's library")
        body = function_def_to_graph(self.functions[name], input_shapes=shapes)
        for op in body.get_operations():
            for t in op.outputs:
                specs[prefix + t.name] = tf.TensorSpec(t.shape, t.dtype)
        return body

    def _loop(self, n):
        """While `n` over variables as a loop over their values (loops.py): the
        new While, after which each variable its body assigns is the loop's
        output in its place."""
        read = {p: self.root(i) for p, i in enumerate(n.input) if self.root(i)}
        changed = set()
        for key in ("body", "cond"):
            n.attr[key].func.name, assigned = self._over_values(n.attr[key].func.name, read)
            changed |= assigned
        n = retyped_loop(n, {p: (self.current[h], self.internal_to_var[h])
                             for p, h in read.items()})
        for p, h in read.items():       # (the loop passes each variable on)
            out = tensor_name(f"{n.name}:{p}")
            var = self.internal_to_var[h]
            self.aliases[out] = h
            self.specs[out] = tf.TensorSpec(var.shape, var.dtype)
            if h in changed:
                self.current[h] = out
        return n

    def _over_values(self, name, read):
        """A copy of loop function `name` taking the values of the variables whose
        handles it takes at positions `read` ({position: root}) and returning
        their values after it ran in the handles' places; its name and the
        variables it assigns."""
        variables = {h: self.internal_to_var[h] for h in read.values()}
        inner = _Walker(self.library, {}, self.internal_to_var)
        body = self._body(name, inner.specs)
        arguments = value_arguments(body, read, variables)
        for p, h in read.items():
            inner.aliases[arguments[p].name] = h
            inner.current[h] = tensor_name(arguments[p].name)
            inner.specs[tensor_name(arguments[p].name)] = tf.TensorSpec(variables[h].shape,
                                                                        variables[h].dtype)
        taken = {a.name for a in arguments}
        for m in body.as_graph_def().node:
            if m.name not in taken:
                inner.visit(m)
        results = [tensor_name(inner.current[inner.root(t.name)] if inner.root(t.name)
                               else inner.resolve(t.name)) for t in body.outputs]
        assigned = {h for p, h in read.items()
                    if tensor_name(inner.current[h]) != tensor_name(arguments[p].name)}
        return as_function(inner.nodes, self.library, arguments, results, name), assigned

    def _results(self, n, returned):
        """Bind the outputs of node `n` to the tensors (or handles) `returned`."""
        for i, t in enumerate(returned):
            if self.root(t):
                self.aliases[tensor_name(f"{n.name}:{i}")] = self.root(t)
            else:
                self.renamed[tensor_name(f"{n.name}:{i}")] = tensor_name(self.resolve(t))
        self.removed.add(n.name)

    def _shaped_alike(self, n):
        """Whether every result of branch node `n` has one static shape, as a
        select between its branches' values needs. One that does not (a sparse
        gradient's union of indices, as long as it comes out) stays a branch
        TensorFlow runs, where it takes no variable."""
        specs = [self.specs.get(f"{n.name}:{i}") for i in range(len(n.attr["Tout"].list.type))]
        return all(spec is not None and spec.shape.is_fully_defined() for spec in specs)

    def _if_convert(self, n):
        """Every branch of If or Case `n` inlined on the variables as they are;
        its results and the variables' values then picked by the condition."""
        if n.op in _IFS:
            names = [n.attr["then_branch"].func.name, n.attr["else_branch"].func.name]
        else:
            names = [f.name for f in n.attr["branches"].list.func]
        before, branches = dict(self.current), []
        for b, name in enumerate(names):
            self.current = dict(before)
            returned = self.inline(name, n.input[1:], f"{n.name}/kerasjit_branch{b}/")
            branches.append(([self.root(t) or tensor_name(self.resolve(t)) for t in returned],
                             self.current))
        pick = self._picker(n, len(names))
        self.current = {h: pick(f"{n.name}/{node_name(h)}", [c[h] for _, c in branches])
                        for h in before}
        for i, outs in enumerate(zip(*(r for r, _ in branches))):
            if any(o in self.current for o in outs):       # a handle passed on
                if len(set(outs)) != 1:
                    raise UnsupportedGraph(f"the branches of '{n.name}' return different "
                                           "variables")
                self.aliases[tensor_name(f"{n.name}:{i}")] = outs[0]
            else:
                self.renamed[tensor_name(f"{n.name}:{i}")] = pick(f"{n.name}/out{i}", list(outs))
        self.removed.add(n.name)

    def _picker(self, n, count):
        """fn(name, values per branch) -> the tensor of the value branch `n`'s
        condition picks (out of range, Case's last branch, as TensorFlow does)."""
        selector = tensor_name(self.resolve(n.input[0]))
        spec = self.specs[selector]
        if spec.shape.rank not in (0, None) or not (spec.dtype.is_bool or spec.dtype.is_integer):
            raise UnsupportedGraph(f"'{n.name}' branches on a {spec.dtype.name} of shape "
                                   f"{spec.shape}: kerasjit takes a scalar bool or index")
        b = Builder(n.name, self.specs, self.nodes)
        conditions = []
        for k in range(count - 1):
            if n.op in _IFS and spec.dtype.is_bool:
                conditions.append(selector)
                continue
            value = k if n.op in _CASES else 0       # (If on a number: true unless 0)
            test = b.op(f"is{k}", "Equal" if n.op in _CASES else "NotEqual",
                        [selector, b.const(f"is{k}/value",
                                           np.asarray(value, spec.dtype.as_numpy_dtype))],
                        [], tf.bool, T=spec.dtype)
            conditions.append(tensor_name(test.name))

        def pick(name, values):
            values = [tensor_name(v) for v in values]
            shapes = {tuple(self.specs[v].shape.as_list()) for v in values
                      if self.specs[v].shape.is_fully_defined()}
            if len(shapes) > 1:         # (a select takes one shape)
                raise UnsupportedGraph(f"the branches of '{n.name}' make values of different "
                                       f"shapes {sorted(shapes)}")
            chosen = values[-1]
            for k in reversed(range(count - 1)):
                if values[k] != chosen:
                    value = self.specs[values[k]]
                    chosen = tensor_name(b.op("", "SelectV2", [conditions[k], values[k], chosen],
                                              value.shape, value.dtype,
                                              full_name=f"{name}/pick{k}", T=value.dtype).name)
            return chosen
        return pick


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
