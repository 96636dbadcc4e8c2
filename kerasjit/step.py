"""A compiled step: a Python function of tensors, specialised per signature.

Each new input signature (structure, shapes, dtypes) is traced with
tf.function, made pure (variables in, updates out), partitioned and lowered;
later calls with that signature run the cached Program (a program of one
settled compiled cluster straight through its executable, the per-step
lookups done once). Variables are read before and written after every call,
so whoever looks at them between calls sees the compiled state.
"""
import time
import warnings

import numpy as np
import tensorflow as tf

from .backends import get_backend
from .frontend.functional import UnsupportedGraph, functionalize
from .frontend.bridge import traced_for_xla
from .frontend.plan import build_program, whole_step_in_tensorflow
from .arrays import Rows, gathered
from .runtime.state import VariableState


def _structure_key(obj):
    """A hashable description of a nest's shape (per-step: tf.nest.map_structure is slow)."""
    if isinstance(obj, (tuple, list)):
        return (type(obj).__name__, *map(_structure_key, obj))
    if isinstance(obj, dict):
        return ("dict", *((k, _structure_key(v)) for k, v in sorted(obj.items())))
    return obj is None


class _NotArrays(Exception):
    pass


def _array_structure_key(obj, flat):
    """_structure_key of a nest of tuples, lists, dicts, numpy arrays, Rows and
    Nones (Keras's array batches, shuffled ones maybe not gathered yet),
    appending its leaves to `flat` in tf.nest.flatten's order (a dict's by
    sorted key) in the same pass; raises _NotArrays on anything else."""
    kind = type(obj)
    if kind is tuple or kind is list:
        return (kind.__name__, *[_array_structure_key(x, flat) for x in obj])
    if kind is dict:
        return ("dict", *((k, _array_structure_key(v, flat)) for k, v in sorted(obj.items())))
    if kind is not np.ndarray and kind is not Rows and obj is not None:
        raise _NotArrays
    flat.append(obj)
    return obj is None


def _signature(flat):
    return tuple(None if a is None else (a.shape, a.dtype) for a in flat)


def _packer(structure):
    """tf.nest.pack_sequence_as(structure, ·); directly, and cheaper, for a
    flat dict of tensors (a step's logs)."""
    if type(structure) is dict and all(type(k) is str and not tf.nest.is_nested(v)
                                       for k, v in structure.items()):
        order = sorted(structure)               # tf.nest's order of the values
        slots = [(k, order.index(k)) for k in structure]
        return lambda flat: {k: flat[i] for k, i in slots}
    return lambda flat: tf.nest.pack_sequence_as(structure, flat)


class _Run:
    """One input signature's step, resolved once: its Program, variables and
    output packing, and once it can, the direct route to its executable.

    `traced` is the step as TensorFlow traced it: while it lives, the functions
    of its graph (a cond's branches) stay registered for the TensorFlow
    clusters that call them. A program whose last output is its input
    checks' verdict (checks.py) has `recheck`: `traced` as a Program, run for
    a step that failed them."""

    def __init__(self, program, state, out_structure, traced, recheck=None):
        self.program, self.state, self.pack = program, state, _packer(out_structure)
        self.traced, self.recheck = traced, recheck
        self.direct = None

    def __call__(self, tensors):
        values = self.state.read()
        self.direct = self.direct or self.program.bind(tensors, values)
        outputs, new_state = (self.direct or self.program.run)(tensors, values)
        if self.recheck is not None and not outputs.pop():
            # The variables kept their values: TensorFlow's kernels raise their error
            # (or, accepting the inputs after all, make the step).
            return self.recheck.run(tensors, [])[0]
        self.state.write(new_state)
        return outputs


class CompiledStep:
    def __init__(self, fn, backend="auto", name=None, max_shapes=8, events=None, store=None,
                 verbose=lambda: False, race=True):
        self.fn, self.backend, self.max_shapes = fn, get_backend(backend), max_shapes
        self.race = race            # compiled clusters are timed against TensorFlow
        self.verbose = verbose      # whether to announce compiles (fit's verbosity)
        self.store = store          # a ResidentStore keeps variables as arrays between calls
        # Every trace-and-compile, as (perf_counter start, seconds, reason).
        self.events = events if events is not None else []
        self.name = name or getattr(fn, "__name__", "step")
        self.programs = {}          # (structure, signature) -> _Run

    def _trace(self, structure, flat):
        tensors = [a for a in flat if a is not None]
        holes = [i for i, a in enumerate(flat) if a is None]
        out_structure = []

        def pure(*args):
            it = iter(args)
            full = [None if i in holes else next(it) for i in range(len(flat))]
            with traced_for_xla():
                out = self.fn(*tf.nest.pack_sequence_as(structure, full))
            out_structure.append(out)
            return tf.nest.flatten(out)
        specs = [tf.TensorSpec(a.shape, a.dtype) for a in tensors]
        concrete = tf.function(pure, autograph=False).get_concrete_function(*specs)
        try:
            fg = functionalize(concrete)
        except UnsupportedGraph as e:     # the whole step runs as TensorFlow traced it
            warnings.warn(f"kerasjit: {self.name} runs in TensorFlow: {e}", RuntimeWarning,
                          stacklevel=5)
            return _Run(whole_step_in_tensorflow(concrete, str(e), self.store),
                        VariableState([], {}, self.store), out_structure[0], concrete)
        program = build_program(fg, self.backend, self.max_shapes, self.events, self.race)
        recheck = whole_step_in_tensorflow(concrete, "its inputs failed a check", self.store) \
            if fg.checked else None
        return _Run(program, VariableState(fg.variables, fg.state_outputs, self.store),
                    out_structure[0], concrete, recheck)

    def _key(self, args):
        flat = []
        try:
            structure = _array_structure_key(args, flat)
        except _NotArrays:
            flat = [None if a is None else np.asarray(a) for a in tf.nest.flatten(list(args))]
            structure = _structure_key(args)
        return (structure, _signature(flat)), flat

    def _program(self, key, flat, args):
        if key not in self.programs:
            shapes = [a.shape for a in flat if a is not None]
            what = f"{self.name}: tracing and compiling for inputs {shapes}"
            if self.verbose():
                print(f"kerasjit: {what} ...", end="", flush=True)
            start = time.perf_counter()
            self.programs[key] = self._trace(list(args), flat)
            seconds = time.perf_counter() - start
            self.events.append((start, seconds, what))
            if self.verbose():
                print(f" {seconds:.1f} s", flush=True)
        return self.programs[key]

    def executables(self):
        """Every executable compiled for this step, all signatures and shapes."""
        return [e for run in self.programs.values() for c in run.program.clusters
                if c.specializer for e in c.specializer.cache.values()]

    def program_for(self, *args):
        """The Program these arguments run (traced and compiled if new)."""
        key, flat = self._key(args)
        return self._program(key, flat, args).program

    def __call__(self, *args):
        return self.run_many([args])

    def run_many(self, batches, keep_all=False):
        """One step per element of `batches` (each a tuple of step arguments).

        Consecutive batches of one signature run as one native call where the
        program allows (a single compiled cluster), else step by step. Returns
        the outputs of the last step, or with keep_all every step's outputs
        concatenated along their first axis.
        """
        if len(batches) == 1:     # (fit's usual call: skips the grouping's cost)
            key, flat = self._key(batches[0])
            return self._run_group(key, [flat], batches[0], keep_all)
        groups = []               # [key, flats, first args]
        for args in batches:
            key, flat = self._key(args)
            if groups and groups[-1][0] == key:
                groups[-1][1].append(flat)
            else:
                groups.append([key, [flat], args])
        results = [self._run_group(key, flats, args, keep_all) for key, flats, args in groups]
        if not keep_all:
            return results[-1]
        return tf.nest.map_structure(lambda *o: np.concatenate(o), *results) \
            if len(results) > 1 else results[0]

    def _run_group(self, key, flats, args, keep_all):
        run = self._program(key, flats[0], args)
        steps = [[a for a in flat if a is not None] for flat in flats]
        ran = None
        if len(steps) > 1:
            ran = run.program.run_steps([list(column) for column in zip(*steps)],
                                        run.state.read(), keep_all)
        if ran is not None and (run.recheck is None or ran[0].pop().all()):
            outputs, new_state = ran
            if keep_all:
                outputs = [o.reshape((-1, *o.shape[2:])) for o in outputs]
            run.state.write(new_state)
        else:       # (a step that failed its checks, the group's state untouched: step by step)
            per_step = [run([gathered(a) for a in tensors]) for tensors in steps]
            outputs = [np.concatenate(o) for o in zip(*per_step)] \
                if keep_all and len(per_step) > 1 else per_step[-1]
        return run.pack(outputs)


def jit(fn, backend="auto", max_shapes=8, race=True):
    """Compile a TensorFlow function of tensors (the seed's `xla.compile`).

    Returns a callable taking arrays/tensors and returning numpy results;
    variables it captures are read and updated as TensorFlow would. `race` as
    for `wrap`.
    """
    return CompiledStep(fn, backend, max_shapes=max_shapes, race=race)
