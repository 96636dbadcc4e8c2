"""From a FunctionalGraph to a Program: partition, ask the bridge, repeat.

Nodes that can never compile are known up front (bridge.static_reason);
others are found by asking the bridge for each compiled cluster's HLO: a
rejected node moves to TensorFlow and the graph is partitioned again, until
every compiled cluster is accepted. The plan found is kept in the compile
cache by the graph's digest: the next step of the same graph replays it.
"""

import functools
import hashlib
import json

import numpy as np
import tensorflow as tf

from ..backends.cpu import cache
from ..cancel import checkpoint
from ..errors import NotCached, warn
from ..hlo.gemm import dot_layout
from ..runtime.program import ClusterRun, Program, Specializer
from ..runtime.race import Race
from . import bridge
from .collectives import collective_instance
from .nodes import node_name, tensor_name
from .partition import Node, partition

_SOURCE_OPS = {"Placeholder", "Const"}
# Ops with which TensorFlow's own kernels can beat the compiled cluster, whose
# clusters race: convolutions (oneDNN's), and what may become loop nests rather
# than GEMMs (batched matmuls and einsums BLAS cannot read in place, pooling,
# scans, top-k). Other clusters always won, and a race costs a TensorFlow trace
# (reports/tuning-measurements.md).
_RACED_OPS = ("Conv", "DepthwiseConv", "BatchMatMul", "Einsum", "MaxPool", "AvgPool",
              "Cumsum", "Cumprod", "TopK")
# What such a cluster's compiled HLO must hold for the race to be run.
_LOOP_NEST_OPS = {"convolution", "reduce-window", "select-and-scatter", "sort"}


def _tensorflow_may_win(specializer, target):
    """Whether the module `specializer` compiled for `target` holds a loop nest
    where TensorFlow has a library kernel: a convolution, pooling, a scan, a
    sort, or a dot that is no GEMM."""
    module = specializer.module
    return any(inst.opcode in _LOOP_NEST_OPS or inst.opcode == "dot"
               and dot_layout(inst, target.min_batched_product) is None
               for comp in module.computations for inst in comp.instructions)


def _tensorflow_function(fn):
    """A cluster's function as TensorFlow runs it. TensorFlow counts the traces
    of every function of one code object together and warns of retracing past
    five in its last calls: each cluster of a step traces on its first call,
    as designed, and the warning would tell the user to change their code."""
    function = tf.function(fn, autograph=False)
    function._omit_frequent_tracing_warning = True
    return function


def cluster_name(ops):
    """How messages name a cluster of ops ((node name, op type), ...)."""
    return f"'{ops[0][0]}' ({len(ops)} ops)"


def cluster_run(kind, ops, inputs, outputs, reason, fn, digest, donations, backend, cap,
                events, race, only_cached):
    """A ClusterRun of the cluster TensorFlow runs as `fn`; a compiled one with
    its Specializer (compiling only from the cache while `only_cached()`), and
    its Race against TensorFlow with `race` where TensorFlow may win."""
    run = ClusterRun(kind, ops, inputs, outputs, reason, tf_function=_tensorflow_function(fn),
                     graph_def=getattr(fn, "graph_def", None))
    if kind != "compiled":
        return run
    hlo_fn = functools.partial(bridge.cached_hlo_module, fn, digest)

    def compile_for(specs):
        checkpoint()
        optimized, cached = backend.optimizes, only_cached()
        module = hlo_fn(specs, optimized, cached)
        return module, backend.compile(module, donations, optimized, cached)
    run.specializer = Specializer(compile_for, cluster_name(ops), cap, events, hlo_fn, digest,
                                  donations)
    if race and any(op.startswith(_RACED_OPS) for _, op in ops):
        run.race = Race(run.specializer.name, functools.partial(
            _tensorflow_may_win, run.specializer, backend.target))
    return run


class Planner:
    def __init__(self, fg, backend, cap=8, events=None, race=True, only_cached=False,
                 digest=None):
        self.fg, self.backend, self.cap, self.events = fg, backend, cap, events
        self.digest = digest              # fg.digest(), if known: the key of its kept plan
        self.only_cached = only_cached    # while planning: NotCached where the cache has no code
        self.race = race and backend.races_tensorflow
        self.by_name = {n.name: n for n in fg.nodes}
        self.sources = {n.name for n in fg.nodes if n.op in _SOURCE_OPS}
        self.consts = {n.name for n in fg.nodes if n.op == "Const"}
        self.rejected = {}            # node name -> reason

    @functools.cached_property
    def readers(self):
        """Tensor name -> names of the nodes reading it (a replayed plan needs none)."""
        readers = {}
        for n in self.fg.nodes:
            for t in n.input:
                if not t.startswith("^"):
                    readers.setdefault(tensor_name(t), set()).add(n.name)
        return readers

    def _partition(self):
        nodes = []
        for n in self.fg.nodes:
            if n.name in self.sources:
                continue
            inputs = list(n.input)      # (a NodeDef's field makes its strings anew each read)
            deps = [node_name(i) for i in inputs]
            reason = self.rejected.get(n.name) or bridge.static_reason(n)
            nodes.append(Node(n.name,
                              tuple(d for d, i in zip(deps, inputs)
                                    if d not in self.sources and not i.startswith("^")),
                              tuple(d for d, i in zip(deps, inputs)
                                    if d not in self.sources and i.startswith("^")),
                              compilable=not reason, reason=reason,
                              together=collective_instance(n, self.by_name)))
        return partition(nodes)

    def _opaque_edges(self, members, inputs, outputs):
        """{member node: why} for the nodes of a compiled cluster that take or
        make a variant (a loop's TensorList) or resource value across its
        boundary: no array can carry one between clusters, so they move to
        TensorFlow with the other end. Within a cluster the bridge lowers them."""
        def opaque(t):
            spec = self.fg.specs.get(t)
            return spec is not None and spec.dtype in (tf.variant, tf.resource)
        members = set(members)
        crossing = [node_name(t) for t in outputs if opaque(t)]
        crossing += [n for t in inputs if opaque(t) for n in self.readers.get(t, ())
                     if n in members]
        return {n: "a variant or resource value (a loop's TensorList) that TensorFlow "
                   "makes or uses" for n in crossing}

    def _boundary(self, members):
        """Input and output tensors of a cluster's nodes (constants are copied in)."""
        position = {name: i for i, name in enumerate(members)}
        inputs = []
        for name in members:
            for t in self.by_name[name].input:
                if t.startswith("^"):
                    continue
                t, producer = tensor_name(t), node_name(t)
                if producer not in position and producer not in self.consts and t not in inputs:
                    inputs.append(t)
        needed = set(self.fg.outputs) | set(self.fg.state_outputs.values())
        consumed = {tensor_name(t) for n in self.fg.nodes if n.name not in position
                    for t in n.input if not t.startswith("^")}
        outputs = sorted({t for t in consumed | needed if node_name(t) in position},
                         key=lambda t: (position[node_name(t)], t))
        return inputs, outputs

    def _nodes_for(self, members):
        """The cluster's nodes plus every constant they read (so shapes stay constant)."""
        wanted = set(members)
        for name in members:
            wanted.update(node_name(i) for i in self.by_name[name].input
                          if node_name(i) in self.consts)
        nodes = []
        for n in self.fg.nodes:
            if n.name in wanted:       # control edges from other clusters: the order keeps them
                copy = type(n)()
                copy.CopyFrom(n)
                del copy.input[:]
                copy.input.extend(i for i in n.input
                                  if not i.startswith("^") or i[1:] in wanted)
                nodes.append(copy)
        return nodes

    def _input_specs(self, inputs):
        """TensorSpecs of `inputs` if all their shapes are static, else None."""
        specs = [self.fg.specs.get(t) for t in inputs]
        if any(s is None or not s.shape.is_fully_defined() for s in specs):
            return None
        return specs

    def _donations(self, members, inputs, outputs):
        """{input index: output index} for the variables that this cluster alone reads
        and that it updates: their old value is dead once it ran, so the new one may
        be written over it."""
        members, donate = set(members), {}
        for i, old in enumerate(self.fg.state_inputs):
            new = self.fg.state_outputs.get(i)
            if old in inputs and new in outputs and old not in self.fg.outputs \
                    and self.readers.get(old, set()) <= members:
                donate[inputs.index(old)] = outputs.index(new)
        return donate

    def plan(self):
        runs = self._replayed()
        while runs is None:
            runs = self._try_plan()
        self.only_cached = False     # (shapes met at run time compile as usual)
        return runs

    def _try_plan(self):
        """ClusterRuns, or None when the bridge rejected a node (partition again)."""
        runs, record = [], []
        for cluster in self._partition():
            members = cluster.nodes
            inputs, outputs = self._boundary(members)
            fn, digest = bridge.subgraph_function(self._nodes_for(members), self.fg.library,
                                                  inputs, outputs)
            donations = {}
            if cluster.kind == "compiled":
                opaque = self._opaque_edges(members, inputs, outputs)
                if opaque:
                    self.rejected.update(opaque)
                    return None
                donations = self._donations(members, inputs, outputs)
            run = self._cluster_run(cluster.kind, members, inputs, outputs, cluster.reason, fn,
                                    digest, donations)
            if run is None:
                return None
            runs.append(run)
            # (a cluster the bridge left whole to TensorFlow stays there; one our
            # compiler failed on is tried again)
            by_bridge = run.kind != cluster.kind and run.specializer is not None
            record.append((run.kind if by_bridge else cluster.kind, members, inputs, outputs,
                           run.reason if by_bridge else cluster.reason, digest, donations))
        self._remember(record)
        return runs

    def _cluster_run(self, kind, members, inputs, outputs, reason, fn, digest, donations):
        """The ClusterRun of a cluster, its code compiled where the shapes it reads
        are static; None where the bridge rejected one of its nodes."""
        ops = [(m, self.by_name[m].op) for m in members]
        run = cluster_run(kind, ops, inputs, outputs, reason, fn, digest, donations,
                          self.backend, self.cap, self.events, self.race,
                          lambda: self.only_cached)
        if kind != "compiled":
            return run
        specs = self._input_specs(inputs)
        if specs is None:             # shapes known only at run time
            return run
        try:
            run.specializer.compile(tuple((tuple(s.shape), np.dtype(s.dtype.as_numpy_dtype))
                                          for s in specs))
        except bridge.BridgeRejected as e:
            named = [n for n in e.nodes if n in self.by_name]
            if not named:             # nothing to move out: keep it all in TF
                run.kind, run.reason = "tensorflow", e.message
                return run
            self.rejected.update((n, e.message) for n in named)
            return None
        except NotCached:
            raise
        except Exception as e:        # our compiler's limits: TF runs it, we say why
            warn(f"kerasjit: a cluster of {len(members)} ops runs in TensorFlow: {e}")
            run.kind, run.reason, run.specializer = "tensorflow", str(e).split("\n")[0], None
        return run

    # A plan found once (the partition, each cluster's boundary, its graph's digest
    # and donations: a third of a warm ResNet50 start's own work) is kept in the
    # compile cache by the step's digest and replayed: nodes and tensors by position.
    def _plan_key(self):
        if self.digest is None:
            return None
        return "plan-" + hashlib.sha256(
            f"{bridge.bridge_key(self.digest)}\n{cache.compiler_fingerprint()}".encode()).hexdigest()

    def _remember(self, record):
        key = self._plan_key()
        if key is None:
            return
        position = {n.name: i for i, n in enumerate(self.fg.nodes)}

        def at(t):
            name, _, port = t.partition(":")
            return position[name], int(port or 0)
        cache.store_text(key, json.dumps([
            (kind, [position[m] for m in members], [at(t) for t in inputs],
             [at(t) for t in outputs], reason, digest, sorted(donations.items()))
            for kind, members, inputs, outputs, reason, digest, donations in record]))

    def _replayed(self):
        """The ClusterRuns of the plan kept for this graph, else None."""
        key = self._plan_key()
        text = key and cache.load_text(key)
        if not text:
            return None
        names = [n.name for n in self.fg.nodes]
        runs = []
        for kind, members, inputs, outputs, reason, digest, donations in json.loads(text):
            members = [names[i] for i in members]
            inputs, outputs = ([f"{names[i]}:{port}" for i, port in ts] for ts in (inputs, outputs))
            fn = bridge.lazy_subgraph_function(functools.partial(self._nodes_for, members),
                                               self.fg.library, inputs, outputs)
            run = self._cluster_run(kind, members, inputs, outputs, reason, fn, digest,
                                    dict(donations))
            if run is None:
                return None
            runs.append(run)
        return runs

def build_program(fg, backend, cap=8, events=None, race=True, only_cached=False, digest=None):
    """Program for `fg`; run-time compiles are appended to `events`. With `race`
    (and a backend that races), each compiled cluster with an op of
    _RACED_OPS is timed against TensorFlow on its first calls and the
    faster one keeps it. `only_cached`: NotCached unless every compiled
    cluster's optimised HLO and code come from the compile cache. `digest`:
    fg.digest(), under which the plan is kept for the next process."""
    planner = Planner(fg, backend, cap, events, race, only_cached, digest)
    clusters = planner.plan()
    constants = dict(fg.resources)
    for t in fg.outputs + list(fg.state_outputs.values()):
        node = planner.by_name.get(node_name(t))
        if node is not None and node.op == "Const":
            constants[t] = tf.make_ndarray(node.attr["value"].tensor)
    return Program(clusters, fg.inputs, fg.state_inputs, fg.outputs, fg.state_outputs,
                   constants, fg.checked, fg.asserts)


def whole_step_in_tensorflow(concrete, reason, store=None):
    """A Program of one TensorFlow cluster: the traced step as it is, variables
    and all, for a step that cannot be made pure dataflow (functional.py). It
    reads and writes the Keras variables itself, so `store` (the values other
    compiled steps keep) is written back before each call, and forgotten."""
    def run(*args):
        if store is not None:
            store.hand_over()
        return concrete(*args)
    nodes = concrete.graph.as_graph_def().node
    inputs = [t.name for t in concrete.inputs[:len(concrete.inputs)
                                              - len(concrete.captured_inputs)]]
    outputs = [t.name for t in concrete.outputs]
    cluster = ClusterRun("tensorflow", [(n.name, n.op) for n in nodes], inputs, outputs,
                         reason, run)
    return Program([cluster], inputs, [], outputs, {})
