"""Running a partitioned step: clusters in order over a table of values."""
import time
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

from ..arrays import array, host
from ..errors import warn


@dataclass(eq=False)
class ClusterRun:
    """One cluster of a Program and how to run it."""
    kind: str                   # "compiled" or "tensorflow"
    ops: list                   # (node name, op type) of the TF nodes it holds
    inputs: list                # tensor names it reads
    outputs: list               # tensor names it produces for later clusters
    reason: str = ""            # why it runs in TensorFlow
    tf_function: object = None  # runs the cluster in TensorFlow
    specializer: object = None  # compiled clusters: shapes -> executable
    race: object = None         # compiled clusters: timing it against TensorFlow (race.py)
    graph_def: object = None    # () -> its GraphDef, where it has one (a recipe keeps it)

    def run(self, args):
        if self.kind == "compiled":
            executable = self.specializer.get(args)
            if executable is not None:
                if self.race is None or self.race.winner == "compiled":
                    return executable(args)
                if self.race.winner is None:
                    outputs = self.race.run(args, executable, self._in_tensorflow)
                    if self.race.winner == "tensorflow":
                        self.kind, self.reason = "tensorflow", self.race.reason
                    return outputs
        return self._in_tensorflow(args)

    def _in_tensorflow(self, args):
        # A variant (a loop's TensorList) or resource has no array form: it goes on
        # as a tensor, to another TensorFlow cluster (plan.py keeps its readers there).
        return [o if o.dtype in (tf.variant, tf.resource) else np.asarray(o)
                for o in self.tf_function(*map(host, args))]

    @property
    def settled(self):
        """Compiled, with no race against TensorFlow still running."""
        return self.kind == "compiled" and (self.race is None or self.race.winner is not None)


class Specializer:
    """Per-shape compiled executables of one cluster, up to `cap` of them.

    Past the cap (or when a shape cannot be compiled) the cluster runs in
    TensorFlow, with one warning: compiling every shape would cost more than
    it saves.
    """

    def __init__(self, compile_fn, name, cap=8, events=None, hlo_fn=None, digest=None,
                 donate=None):
        self.compile_fn, self.name, self.cap = compile_fn, name, cap
        self.hlo_fn = hlo_fn          # (TensorSpecs, optimized) -> the bridge's module
        self.digest = digest          # of the cluster's graph (bridge.subgraph_function)
        self.donate = donate or {}    # {parameter index: output index} it updates in place
        self.cache, self.gave_up, self.module = {}, None, None
        self.events = events if events is not None else []   # (t_start, seconds, reason)

    def get(self, args):
        if self.gave_up:
            return None
        key = tuple((a.shape, np.dtype(a.dtype)) for a in args)
        if key not in self.cache:
            if len(self.cache) >= self.cap:
                return self._give_up(f"more than {self.cap} input shapes seen")
            start = time.perf_counter()
            try:
                self.compile(key)
            except Exception as e:     # a compiler failure must not kill training
                return self._give_up(f"compiling for shapes {[s for s, _ in key]} failed: {e}")
            finally:
                self.events.append((start, time.perf_counter() - start,
                                    f"cluster {self.name}: new input shapes "
                                    f"{[s for s, _ in key]}"))
        return self.cache[key]

    def compile(self, key):
        """Compile for ((shape, dtype), ...); the bridge's rejections propagate."""
        module, executable = self.compile_fn([tf.TensorSpec(s, d) for s, d in key])
        self.module = self.module or module
        self.cache[key] = executable

    def _give_up(self, reason):
        self.gave_up = reason
        warn(f"kerasjit: cluster {self.name} now runs in TensorFlow: {reason}")
        return None


@dataclass(eq=False)
class Program:
    """A step as clusters over named tensors, with its state (variables) wired in."""
    clusters: list
    inputs: list                # tensor names of the flat step arguments
    state_inputs: list          # tensor name per variable
    outputs: list               # tensor names of the flat step outputs
    state_outputs: dict         # variable index -> tensor name
    constants: dict = field(default_factory=dict)   # const tensors read outside clusters
    checked: bool = False       # the last output is the input checks' verdict (checks.py)
    asserts: bool = False       # ... of the step's own assertions too

    def buffer_bytes(self):
        """Bytes held by the compiled executables' own buffers."""
        return sum(e.buffer_bytes for c in self.clusters if c.specializer
                   for e in c.specializer.cache.values())

    def run(self, args, state):
        values = dict(self.constants)
        values.update(zip(self.inputs, args))
        values.update(zip(self.state_inputs, state))
        for cluster in self.clusters:
            outs = cluster.run([values[t] for t in cluster.inputs])
            values.update(zip(cluster.outputs, outs))
        new_state = list(state)
        for i, t in self.state_outputs.items():
            new_state[i] = values[t]
        return [host(values[t]) for t in self.outputs], new_state

    def bind(self, args, state):
        """`run` for arguments of these shapes, with the names and the executable
        resolved once (reports/tuning-measurements.md): for a program of one
        compiled cluster whose race (if any) is over; else None."""
        if len(self.clusters) != 1 or not self.clusters[0].settled:
            return None
        cluster, constants = self.clusters[0], list(self.constants.values())
        names = [*self.constants, *self.inputs, *self.state_inputs, *cluster.outputs]
        where = {t: i for i, t in enumerate(names)}      # later ones win, as in run
        take = [where[t] for t in cluster.inputs]
        pool = [*constants, *args, *state]
        executable = cluster.specializer.get([pool[i] for i in take])
        if executable is None:
            return None
        outputs = [where[t] for t in self.outputs]
        updates = [(i, where[t]) for i, t in self.state_outputs.items()]

        def run(args, state):
            pool = [*constants, *args, *state]
            pool += executable([pool[i] for i in take])
            new_state = list(state)
            for i, j in updates:
                new_state[i] = pool[j]
            return [host(pool[j]) for j in outputs], new_state
        return run

    def run_steps(self, step_args, state, keep_all_outputs=False):
        """len(step_args[0]) steps in one native call: step_args hold, per step
        input, a list of that input's value at each step; variables carry from
        step to step.

        Returns (outputs, new_state) as `run` does, outputs of the last step (of
        every step, stacked, with keep_all_outputs; a checked program's verdict
        always of every step), or None where this program cannot: more than one
        cluster, TensorFlow clusters, a backend without it, checks with state
        (a step that fails them must stop the steps after it).
        """
        if len(self.clusters) != 1 or not self.clusters[0].settled \
                or self.checked and self.state_outputs:
            return None
        cluster, n = self.clusters[0], len(step_args[0])
        where = {t: i for i, t in enumerate(cluster.outputs)}
        wanted = [*self.outputs, *self.state_outputs.values()]
        if any(t not in where for t in wanted):
            return None       # an output that is an input passed through
        carried_from = {t: where[self.state_outputs[i]] for i, t in enumerate(self.state_inputs)
                        if i in self.state_outputs}
        stacked_outputs = {where[t] for t in (self.outputs if keep_all_outputs else
                                              self.outputs[-1:] if self.checked else [])}
        if stacked_outputs & set(carried_from.values()):
            return None
        sources = dict(self.constants)
        sources.update(zip(self.state_inputs, state))
        sources.update(zip(self.inputs, step_args))
        args = [sources[t] for t in cluster.inputs]
        per_step = {p for p, t in enumerate(cluster.inputs) if t in self.inputs}
        executable = cluster.specializer.get(
            [array(a[0] if p in per_step else a) for p, a in enumerate(args)])
        if executable is None or not executable.multi_step:
            return None
        carried = {p: carried_from[t] for p, t in enumerate(cluster.inputs) if t in carried_from}
        outs = executable.run_steps(n, args, per_step, carried, stacked_outputs)
        new_state = list(state)
        for i, t in self.state_outputs.items():
            new_state[i] = outs[where[t]]
        return [host(outs[where[t]]) for t in self.outputs], new_state
