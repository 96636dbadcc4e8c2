"""A compiled step: a Python function of tensors, specialised per signature.

Each new input signature (structure, shapes, dtypes) is traced with
tf.function, made pure (variables in, updates out), partitioned and lowered;
later calls with that signature run the cached Program (a program of one
settled compiled cluster straight through its executable, the per-step
lookups done once). Variables are read before and written after every call,
so whoever looks at them between calls sees the compiled state.
"""
import hashlib
import os
import sys
import threading
import time
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from .backends import get_backend
from .backends.cpu import cache as compile_cache
from .backends.cpu import workers as compile_workers
from .cancel import CompileCancelled
from .errors import NotCached, warn
from .frontend.functional import UnsupportedGraph, functionalize
from .frontend.bridge import traced_for_xla
from .frontend.plan import build_program, whole_step_in_tensorflow
from .frontend import recipe
from .frontend.trace_interning import interned_trace
from .frontend.row_wise import RowWiseProof
from .arrays import Rows, gathered
from .runtime.race import BACKGROUND_COMPILES, BAND, MAX_TRIALS
from .runtime.state import VariableState

# tf.function's attribute for a trace without automatic control dependencies
_NO_CONTROL_DEPENDENCIES = "_disable_acd"


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
    """tf.nest.pack_sequence_as(structure, ·) of the step's outputs other than
    its Nones (a gradient of a value that does not depend on a variable); directly,
    and cheaper, for a flat dict of tensors (a step's logs)."""
    if type(structure) is dict and all(type(k) is str and v is not None
                                       and not tf.nest.is_nested(v)
                                       for k, v in structure.items()):
        order = sorted(structure)               # tf.nest's order of the values
        slots = [(k, order.index(k)) for k in structure]
        return lambda flat: {k: flat[i] for k, i in slots}
    leaves = tf.nest.flatten(structure)
    if None not in leaves:
        return lambda flat: tf.nest.pack_sequence_as(structure, flat)

    def pack(flat):
        given = iter(flat)
        return tf.nest.pack_sequence_as(structure, [None if leaf is None else next(given)
                                                    for leaf in leaves])
    return pack


class _Trace:
    """The step traced for one signature, and the structure of its outputs.

    TensorFlow runs a trace only with its automatic control dependencies,
    which order the variable updates. functional.py orders them by program
    order and needs none, and a trace without them takes a fifth less time
    (reports/tuning-measurements.md): a warm start traces so (`ordered`
    False), and traces again only where TensorFlow must run the whole step.
    While a trace lives, the functions of its graph (a cond's branches) stay
    registered for the TensorFlow clusters that call them. Given the
    `out_structure` (a step rebuilt from its recipe), nothing is traced
    until TensorFlow must run the step."""

    def __init__(self, trace, ordered=True, out_structure=None):
        self._trace = trace
        if out_structure is not None:
            self.concrete, self.out_structure, self.unordered = None, out_structure, False
            self._ordered, self.traces = None, 0
            return
        self.concrete, self.out_structure = trace(ordered)
        self.unordered = not ordered
        self._ordered = None if self.unordered else self.concrete
        self.traces = 1

    def ordered(self):
        """The step as TensorFlow can run it."""
        if self._ordered is None:
            self._ordered = self._trace(True)[0]
            self.traces += 1
        return self._ordered


class _Run:
    """One input signature's step, resolved once: its Program, variables and
    output packing, and once it can, the direct route to its executable.
    `trace` is the _Trace it was made of; a program whose last output is its
    input checks' verdict (checks.py) runs the trace in TensorFlow for a step
    that failed them."""

    def __init__(self, program, state, trace, digest=None):
        self.program, self.state, self.trace = program, state, trace
        self.digest = digest    # of the graph compiled, if it has one (FunctionalGraph.digest)
        self.pack = _packer(trace.out_structure)
        self.direct, self.ran, self.recheck = None, False, None

    def __call__(self, tensors):
        outputs = self.checked(tensors)
        if outputs is not None:
            return outputs
        # The variables kept their values: TensorFlow's kernels raise their error
        # (or, accepting the inputs after all, make the step).
        if self.recheck is None:
            self.recheck = whole_step_in_tensorflow(
                self.trace.ordered(), "its inputs failed a check", self.state.store)
        return self.recheck.run(tensors, [])[0]

    def checked(self, tensors):
        """The step's outputs, or None where its inputs failed a check (checks.py)."""
        values = self.state.read()
        try:
            self.direct = self.direct or self.program.bind(tensors, values)
            outputs, new_state = (self.direct or self.program.run)(tensors, values)
        except (ValueError, TypeError) as e:
            if self.ran:
                raise
            # TensorFlow could not build a part of the program (kerasjit's rewrite of a
            # cond whose branches make values of different shapes, known only now):
            # no variable changed yet, so TensorFlow runs the step as it traced it.
            warn(f"kerasjit: TensorFlow runs the step: its first call failed: "
                 f"{type(e).__name__}: {str(e).splitlines()[0]}")
            store = self.state.store
            self.program = whole_step_in_tensorflow(self.trace.ordered(), "its compiled "
                                                    "program failed", store)
            self.state, self.direct = VariableState([], {}, store), None
            return self.checked(tensors)
        self.ran = True
        if self.program.checked and not outputs.pop():
            return None
        self.state.write(new_state)
        return outputs


class _RowWise:
    """A signature served by another's compiled step for `size` rows, where
    the step is row-wise (frontend/row_wise.py): the inputs numbered `rows`
    padded to `size` rows with copies of their last row, or split `size` rows
    at a time, and the outputs cut back to their rows. `fallback` runs the
    step in TensorFlow where the inputs fail a check (its error names their
    own rows)."""

    def __init__(self, compiled, rows, size, fallback):
        self.compiled, self.rows, self.size, self.fallback = compiled, rows, size, fallback
        self.program, self.pack = compiled.program, compiled.pack
        self.calls = 0

    def outgrown(self, rows):
        """Whether `rows` rows, served before, take several calls of the
        compiled step: a size that recurs so is worth a compile of its own."""
        return self.calls > 0 and rows > 2 * self.size

    def __call__(self, tensors):
        self.calls += 1
        n = len(tensors[self.rows[0]])
        parts = []
        for start in range(0, n, self.size):
            part = list(tensors)
            for i in self.rows:
                part[i] = _padded(tensors[i][start:start + self.size], self.size)
            outputs = self.compiled.checked(part)
            if outputs is None:
                return self.fallback(tensors)
            parts.append(outputs)
        return [np.concatenate(o)[:n] for o in zip(*parts)]


def _padded(rows, size):
    """`rows` and copies of its last row, `size` rows in all."""
    return rows if len(rows) == size else \
        np.concatenate([rows, np.repeat(rows[-1:], size - len(rows), axis=0)])


class CompileEvent(NamedTuple):
    """A trace-and-compile: when it started (perf_counter), how long it took,
    what it was; `background`: it ran beside training (TensorFlow ran the
    steps meanwhile), so the steps did not wait for it."""
    start: float
    seconds: float
    what: str
    background: bool = False


# How much lower a background compile's CPU priority is than training's (a
# nice value): on a busy machine the steps keep their cores, the compile takes
# what they leave.
BACKGROUND_NICE = 10


def _yield_to_training():
    """Lower this thread's CPU priority (Linux nices threads one by one; elsewhere
    the whole process would follow, so it stays as it is), and let its compiles
    take fewer cores."""
    compile_workers.beside_training()
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
        except OSError:
            pass


class _Compiling:
    """A signature's compiled _Run, built on a thread of its own while
    TensorFlow runs the step as traced (tiered execution)."""

    def __init__(self, build, what, events, announce):
        self.what, self.events, self.announce = what, events, announce
        self.run, self.error, self.done = None, None, threading.Event()
        self.start = time.perf_counter()

        def work():
            _yield_to_training()
            try:
                with BACKGROUND_COMPILES.one():
                    self.run = build()
            except CompileCancelled:    # (the program is ending: nobody waits for it)
                return
            except Exception as e:      # a compiler failure must not kill training
                self.error = e
            self.seconds = time.perf_counter() - self.start
            self.done.set()
        threading.Thread(target=work, name="kerasjit-compile").start()     # (cancel.py)

    def adopt(self, fallback):
        """The compiled _Run once built (else None); `fallback` when it failed."""
        if not self.done.is_set():
            return None
        self.events.append(CompileEvent(self.start, self.seconds, self.what, background=True))
        if self.error is not None:
            warn(f"kerasjit: {self.what} failed, TensorFlow runs the step: "
                 f"{type(self.error).__name__}: {self.error}")
            return fallback
        if self.announce():
            print(f"kerasjit: {self.what}: done in {self.seconds:.1f} s; "
                  "the compiled step runs from here on", flush=True)
        return self.run


class _Verdict:
    """After the switch: CALLS + 1 steps compiled (once its clusters' races
    are over), then CALLS + 1 in TensorFlow, the first of each untimed (it
    moves the variables between Keras and the compiled step's arrays), and
    blocks of both again while too close to call; TensorFlow keeps the step
    where clearly faster. Both timed alike, after the compile: TensorFlow's
    steps during the compile had fewer cores. `tensorflow` makes
    TensorFlow's _Run when first needed (a warm start traced the step for
    the compiler alone)."""
    CALLS = 3
    MARGIN = 0.9        # TensorFlow must be this much faster to keep the step

    def __init__(self, name, compiled, tensorflow):
        self.name, self.runs, self.tensorflow = name, {"compiled": compiled}, tensorflow
        self.times = {"compiled": [], "tensorflow": []}
        self.turns = ["compiled"] * (self.CALLS + 1) + ["tensorflow"] * (self.CALLS + 1)
        self.calls = 0

    def run(self, tier):
        if tier not in self.runs:
            self.runs[tier] = self.tensorflow()
        return self.runs[tier]

    def next_run(self):
        return self.run(self.turns[self.calls])

    def _cache_key(self):
        """The compile cache's name for this verdict: after the code keys of
        the compiled step's clusters (None where one has none)."""
        keys = [e.cache_key for c in self.runs["compiled"].program.clusters if c.specializer
                for e in c.specializer.cache.values()]
        if not keys or None in keys:
            return None
        return "verdict-" + hashlib.sha256("\n".join(keys).encode()).hexdigest()

    def recorded(self):
        """The tier an earlier run of the same code kept ("compiled" or
        "tensorflow"), if the compile cache holds its verdict: it is not timed
        again, since TensorFlow's first call of a large step costs seconds."""
        key = self._cache_key()
        kept = key and compile_cache.load_text(key)
        return kept if kept in self.times else None

    def record(self):
        """Keep the decided verdict in the compile cache."""
        key = self._cache_key()
        if key is not None:
            compile_cache.store_text(key, self.kept)

    def timed(self, run, seconds, quiet):
        """The run to keep once decided, else None. `quiet`: no compile ran
        beside the call (else it is timed again: race.BACKGROUND_COMPILES)."""
        turn = self.turns[self.calls]
        if turn == "compiled" and any(c.race is not None and c.race.winner is None
                                      for c in run.program.clusters):
            return None         # (its clusters' races still run: the compiled step again)
        if self.calls and self.turns[self.calls - 1] == turn:   # (a block's first: untimed)
            if not quiet:
                return None
            self.times[turn].append(seconds)
        self.calls += 1
        if self.calls < len(self.turns):
            return None
        ours, theirs = min(self.times["compiled"]), min(self.times["tensorflow"])
        if abs(theirs / ours - self.MARGIN) <= BAND and len(self.times["compiled"]) < MAX_TRIALS:
            # Too close to call: a block of each again (as a cluster's race does),
            # or noise would decide the step for this run and the next ones.
            self.turns += self.turns[:2 * (self.CALLS + 1)]
            return None
        if theirs >= self.MARGIN * ours:
            self.kept = "compiled"
            return self.runs["compiled"]
        self.kept = "tensorflow"
        warn(f"kerasjit: {self.name} runs in TensorFlow: TensorFlow ran the step "
             f"faster here ({1000 * theirs:.1f} vs {1000 * ours:.1f} ms compiled)")
        return self.runs["tensorflow"]


class CompiledStep:
    def __init__(self, fn, backend="auto", name=None, max_shapes=8, events=None, store=None,
                 verbose=lambda: False, race=True, background=False, describe=lambda: "",
                 autograph=False, identity=lambda: None):
        self.fn, self.backend, self.max_shapes = fn, get_backend(backend), max_shapes
        # Python control flow on tensors made graph ops, as tf.function does by
        # default (Keras's steps are traced without: plain Keras's are too)
        self.autograph = autograph
        self.race = race            # compiled clusters are timed against TensorFlow
        self.verbose = verbose      # whether to announce compiles (fit's verbosity)
        self.describe = describe    # what the step computes beyond its code (its model)
        # A step_identity.StepIdentity of what the step computes, or None where only
        # its trace can tell: a warm start with one rebuilds the step untraced.
        self.identity = identity
        self.identities = {}        # signature -> its StepIdentity at the first call
        self.marks = {}             # signature -> the digest its _warm_key holds (None: none)
        self.store = store          # a ResidentStore keeps variables as arrays between calls
        # Tiered execution: a new signature's steps run in TensorFlow while it compiles.
        self.background = background and self.backend.name != "reference"
        # Every trace-and-compile, as CompileEvents.
        self.events = events if events is not None else []
        self.name = name or getattr(fn, "__name__", "step")
        self.programs = {}          # (structure, signature) -> _Run, up to max_shapes
        self.compiling = {}         # (structure, signature) -> _Compiling
        self.verdicts = {}          # (structure, signature) -> _Verdict, after the switch
        # Signatures TensorFlow runs: (structure, open signature) -> _Run.
        self.open_programs = {}
        # Signatures served by another's compiled step (_RowWise), or None where they can't be.
        self.row_wise = {}
        # What proving a step row-wise needs once per pair of signatures:
        # (open signature, compiled _Run, row inputs) -> RowWiseProof.
        self.row_wise_proofs = {}
        # Undecided signatures -> (programs, compiles) counted when last looked.
        self.row_wise_unmatched = {}
        # Signatures compiled when next run, whatever time they spent in TensorFlow
        # (explain(), a recurring batch size many times the compiled one).
        self.compile_asked, self.warned_cap = set(), False
        # Seconds TensorFlow spent running each signature not compiled.
        self.tensorflow_seconds = {}

    def _traced(self, structure, flat, open_batch=False, ordered=True, out_structure=None):
        """The _Trace of the step for these arguments (with `open_batch`, for
        any size of their leading dims; given `out_structure`, traced when
        first needed)."""
        holes = [i for i, a in enumerate(flat) if a is None]
        specs = [tf.TensorSpec((None, *a.shape[1:]) if open_batch and a.shape else a.shape,
                               a.dtype) for a in flat if a is not None]

        def trace(ordered):
            out_structure = []

            def pure(*args):
                it = iter(args)
                full = [None if i in holes else next(it) for i in range(len(flat))]
                with traced_for_xla(), interned_trace():
                    out = self.fn(*tf.nest.pack_sequence_as(structure, full))
                out_structure.append(out)
                return [t for t in tf.nest.flatten(out) if t is not None]
            unordered = None if ordered else {_NO_CONTROL_DEPENDENCIES: True}
            concrete = tf.function(pure, autograph=self.autograph,
                                   experimental_attributes=unordered).get_concrete_function(*specs)
            return concrete, out_structure[0]
        return _Trace(trace, ordered, out_structure)

    def _in_tensorflow(self, trace, reason):
        """The step run whole, as TensorFlow traced it."""
        return _Run(whole_step_in_tensorflow(trace.ordered(), reason, self.store),
                    VariableState([], {}, self.store), trace)

    def _from_cache(self, trace, compiled_before):
        """The compiled step from the compile cache alone, else None (not all
        of it is there: NotCached, or it failed: the background compile meets
        that again and says so). `compiled_before`: the digest of the graph an
        earlier run compiled, which an unordered trace's must equal."""
        try:
            return self._compiled(trace, only_cached=True, compiled_before=compiled_before)
        except Exception:
            return None

    def _from_recipe(self, key, args, flat):
        """The compiled step rebuilt, untraced, from the recipe an earlier run
        kept under the step's identity (frontend/recipe.py), else None."""
        identity = self.identities[key] = self.identity()
        text = identity and compile_cache.load_text(self._recipe_key(key, identity))
        if not text:
            return None
        try:
            program, positions, out_structure, digest = recipe.rebuilt(
                text, self.backend, self.max_shapes, self.events, self.race)
            variables = [identity.variables[i] for i in positions]
        except Exception:   # (not all of it in the cache: traced and compiled as usual)
            return None
        del self.identities[key]        # (nothing new to keep)
        self.marks[key] = digest
        return _Run(program, VariableState(variables, program.state_outputs, self.store),
                    self._traced(args, flat, out_structure=out_structure), digest)

    def _keep_recipe(self, key, run):
        """Keep the recipe of the compiled step `run` where it has one, under
        the step's identity at its signature's first call."""
        identity = self.identities.pop(key, None)
        if identity is None or not isinstance(run, _Run):
            return
        where = {id(v): i for i, v in enumerate(identity.variables)}
        text = recipe.recipe_text(run.program, [where.get(id(v)) for v in run.state.variables],
                                  run.trace.out_structure, run.digest)
        if text is not None:
            compile_cache.store_text(self._recipe_key(key, identity), text)

    def _recipe_key(self, key, identity):
        text = repr((self.name, key, identity.text, self.backend.name,
                     compile_cache.compiler_fingerprint()))
        return "recipe-" + hashlib.sha256(text.encode()).hexdigest()

    def _compiled(self, trace, only_cached=False, compiled_before=None):
        """The traced step made pure, partitioned and compiled (with
        `only_cached`, from the compile cache alone, else NotCached). Only a
        lookup takes the unordered trace, and only where its graph is the one
        compiled before: a miss compiles the trace TensorFlow runs."""
        try:
            unordered = only_cached and trace.unordered
            fg = functionalize(trace.concrete if unordered else trace.ordered())
            digest = fg.digest()
            if unordered and digest != compiled_before:
                raise NotCached("the step's graph is not the one compiled before")
            program = build_program(fg, self.backend, self.max_shapes, self.events, self.race,
                                    only_cached, digest)
        except UnsupportedGraph as e:     # the whole step runs as TensorFlow traced it
            warn(f"kerasjit: {self.name} runs in TensorFlow: {e}")
            return self._in_tensorflow(trace, str(e))
        return _Run(program, VariableState(fg.variables, fg.state_outputs, self.store), trace,
                    digest)

    def _key(self, args):
        flat = []
        try:
            structure = _array_structure_key(args, flat)
        except _NotArrays:
            flat = [None if a is None else np.asarray(a) for a in tf.nest.flatten(list(args))]
            structure = _structure_key(args)
        return (structure, _signature(flat)), flat

    def _program(self, key, flat, args):
        if key in self.compiling:
            self._adopt(key)
        if key in self.verdicts:
            return self.verdicts[key].next_run()
        if key in self.programs:
            return self.programs[key]
        row_wise = self._served_row_wise(key, flat, args)
        if row_wise is not None:
            return row_wise
        if len(self.programs) >= self.max_shapes:
            if not self.warned_cap:
                self.warned_cap = True
                warn(f"kerasjit: {self.name} has run with more than {self.max_shapes} "
                     "input signatures; new ones run in TensorFlow (raise max_shapes "
                     "to compile more)")
            return self._any_batch_size(key, flat, args)
        if self.background and self.programs and key not in self.compile_asked and (
                self.compiling or self.tensorflow_seconds.get(key, 0.0) < self._compile_cost()):
            # A signature new to a step that has one already (a partial last batch,
            # a one-off predict_on_batch size): TensorFlow runs it until the time it
            # spent there reaches what the step's compile took. Sooner, a compile
            # beside the training would not repay itself: ResNet50's partial batch,
            # once an epoch, would take hundreds of epochs.
            return self._any_batch_size(key, flat, args)
        shapes = [a.shape for a in flat if a is not None]
        start = time.perf_counter()
        # A warm start compiles here, from the compile cache, rather than in the
        # background: it takes less time than TensorFlow's first steps would. (A
        # step of one cluster keeps no graph in its recipe, and its race against
        # TensorFlow is the verdict's in the background alone: where the steps
        # wait for compiles, its cluster races, so only race=False rebuilds it.)
        rebuilt = self._from_recipe(key, list(args), flat) \
            if self.background or not self.race else None
        if rebuilt is not None:
            self._switch(key, rebuilt, lambda: self._in_tensorflow(rebuilt.trace, "not compiled"))
            what = f"{self.name}: rebuilt from the compile cache for inputs {shapes}"
            self.events.append(CompileEvent(start, time.perf_counter() - start, what))
            if self.verbose():
                print(f"kerasjit: {what} in {self.events[-1].seconds:.1f} s", flush=True)
            return self.programs[key]
        what = f"{self.name}: {'tracing' if self.background else 'tracing and compiling'} " \
               f"for inputs {shapes}"
        if self.verbose():
            print(f"kerasjit: {what} ...", end="", flush=True)
        compiled_before = self.marks[key] = compile_cache.load_text(self._warm_key(key)) \
            if self.background else None
        trace = self._traced(list(args), flat, ordered=compiled_before is None)
        cached = self._from_cache(trace, compiled_before) if self.background else None
        if cached is not None:
            what = f"{self.name}: tracing, and compiling from the cache, for inputs {shapes}"
            self._switch(key, cached, lambda: self._in_tensorflow(trace, "not compiled"))
        elif self.background:
            self.programs[key] = self._in_tensorflow(trace, "compiling in the background")
            self.compiling[key] = _Compiling(
                lambda: self._compiled(trace),
                f"{self.name}: compiling for inputs {shapes} in the background",
                self.events, self.verbose)
        else:
            self.programs[key] = self._compiled(trace)
            if not self.race:       # (else a warm start would time TensorFlow's step)
                self._remember(key, self.programs[key])
        seconds = time.perf_counter() - start
        self.events.append(CompileEvent(start, seconds, what))
        if self.verbose():
            print(f" {seconds:.1f} s" + (" (from the compile cache)" if cached is not None else
                                        "; compiling in the background, TensorFlow runs "
                                        "the steps meanwhile" if self.background else ""),
                  flush=True)
        return self.programs[key]

    def _adopt(self, key):
        job, tf_run = self.compiling[key], self.programs[key]
        run = job.adopt(fallback=tf_run)
        if run is not None:
            del self.compiling[key]
            self._switch(key, run, lambda: tf_run)

    def _switch(self, key, run, tensorflow):
        """`run` serves signature `key` from now on, timed against TensorFlow's
        whole step (the _Run `tensorflow()` makes) on its first calls when
        racing (unless the compile cache holds the verdict of an earlier run of
        the same code)."""
        self.programs[key] = run
        if not self.race or not any(c.kind == "compiled" for c in run.program.clusters):
            self._remember(key, run)
            return
        if len(run.program.clusters) == 1:
            # The verdict times the whole step against TensorFlow's already:
            # a race of its one cluster would cost TensorFlow a trace of it.
            run.program.clusters[0].race = None
        verdict = _Verdict(self.name, run, tensorflow)
        recorded = verdict.recorded()
        if recorded is None:
            self.verdicts[key] = verdict
        elif recorded == "tensorflow":
            warn(f"kerasjit: {self.name} runs in TensorFlow: TensorFlow ran the step "
                 "faster here (timed on an earlier run of this code; race=False keeps the "
                 "compiled step, and an emptied compile cache times the two again)")
            self.programs[key] = verdict.run("tensorflow")
        else:
            self._remember(key, run)

    def _remember(self, key, run):
        """Keep the digest of the graph compiled for `key` where _warm_key says,
        once the compiled step is the one kept (no race, or its verdict): a
        warm start traced for the compiler alone then runs no TensorFlow step,
        which would need a trace of its own. And its recipe, where it has one."""
        self._keep_recipe(key, run)
        if run.digest not in (None, self.marks.get(key)) \
                and any(c.kind == "compiled" for c in run.program.clusters):
            compile_cache.store_text(self._warm_key(key), run.digest)
            self.marks[key] = run.digest

    def _warm_key(self, key):
        """Where the compile cache keeps the digest of the graph this step
        compiled for signature `key` (its model as `describe` tells it): a
        hint that its code is in the cache, so the step is traced for the
        compiler alone. Its graph must have that digest to use the code; a
        wrong hint costs a second trace, for TensorFlow to run the step."""
        text = repr((self.name, key, self.describe(), tf.__version__))
        return "warm-" + hashlib.sha256(text.encode()).hexdigest()

    def _compile_cost(self):
        """Seconds the longest trace-and-compile of this step took (the events
        hold CompileEvents and a cluster's own compiles, (start, seconds, what))."""
        return max((seconds for _, seconds, what, *_ in self.events
                    if what.startswith(f"{self.name}:")), default=0.0)

    def _timed(self, key, run, seconds, quiet):
        """A step's time: counted where TensorFlow runs a signature not compiled,
        compared where the two tiers of its signature are timed (`quiet`: no
        compile ran beside it)."""
        if run is self.open_programs.get(self._open_key(key)):
            self.tensorflow_seconds[key] = self.tensorflow_seconds.get(key, 0.0) + seconds
        if key in self.verdicts:
            kept = self.verdicts[key].timed(run, seconds, quiet)
            if kept is not None:
                self.programs[key] = kept
                verdict = self.verdicts.pop(key)
                verdict.record()
                if verdict.kept == "compiled":
                    self._remember(key, kept)
                self.identities.pop(key, None)

    def _any_batch_size(self, key, flat, args):
        """The step as TensorFlow runs it for a signature that is not compiled,
        traced once for every batch size (leading dims open), as Keras would."""
        open_key = self._open_key(key)
        if open_key not in self.open_programs:
            start = time.perf_counter()
            trace = self._traced(list(args), flat, open_batch=True)
            self.open_programs[open_key] = self._in_tensorflow(trace, "not compiled")
            self.events.append(CompileEvent(start, time.perf_counter() - start,
                                            f"{self.name}: tracing for any batch size"))
        return self.open_programs[open_key]

    @staticmethod
    def _open_key(key):
        """A signature with its inputs' leading dims open."""
        structure, signature = key
        return structure, tuple(s and ((None, *s[0][1:]) if s[0] else s[0], s[1])
                                for s in signature)

    def _served_row_wise(self, key, flat, args):
        """A _RowWise run of `key` on a compiled signature that differs from it
        in the leading dims of some inputs alone (the batch size), the largest
        such, where the step is row-wise; else None (asked again while there
        is no such signature compiled yet)."""
        if key in self.row_wise:
            served = self.row_wise[key]
            rows = served and [a for a in flat if a is not None][served.rows[0]].shape[0]
            if served is None or not served.outgrown(rows) \
                    or len(self.programs) >= self.max_shapes:
                return served
            # (a batch size that recurs, many times the compiled one: compiled now)
            self.compile_asked.add(key)
            self.row_wise[key] = None
            return None
        for job_key in list(self.compiling):        # (a compile that finished meanwhile)
            self._adopt(job_key)
        looked = (len(self.programs), len(self.compiling))
        if self.row_wise_unmatched.get(key) == looked:
            return None             # (no compiled signature has come since it was last asked)
        structure, signature = key
        leaves = [s for s in signature if s is not None]
        candidates = []
        for (other_structure, other), run in list(self.programs.items()):
            # (a step that updates variables, such as a train step, is never row-wise)
            compiled = [c.kind for c in run.program.clusters] == ["compiled"] \
                and not run.program.state_outputs
            if other_structure != structure or not compiled or (other_structure, other) in \
                    self.compiling:
                continue
            other_leaves = [s for s in other if s is not None]
            rows = _batch_inputs(other_leaves, leaves)
            if rows:
                candidates.append((other_leaves[rows[0]][0][0], rows, other_leaves, run))
        if not candidates:
            self.row_wise_unmatched[key] = looked
            return None
        size, rows, other_leaves, run = max(candidates, key=lambda c: c[0])
        tf_run = self._any_batch_size(key, flat, args)
        start = time.perf_counter()
        proof_key = (self._open_key(key), run, tuple(rows))
        if proof_key not in self.row_wise_proofs:
            self.row_wise_proofs[proof_key] = RowWiseProof(
                tf_run.trace.ordered(), self.backend, set(rows), run.program, [s[0] for s in other_leaves])
        proved = self.row_wise_proofs[proof_key].serves([s[0] for s in leaves])
        self.events.append(CompileEvent(
            start, time.perf_counter() - start,
            f"{self.name}: checking whether the step for {size} rows serves "
            f"{leaves[rows[0]][0][0]}: {'yes' if proved else 'no'}"))
        self.row_wise[key] = _RowWise(run, rows, size, tf_run) if proved else None
        return self.row_wise[key]

    def wait(self):
        """Wait for the compiles running in the background and switch to their
        compiled steps (whoever needs the compiled step now: explain())."""
        for job in list(self.compiling.values()):
            job.done.wait()
        for key in list(self.compiling):
            self._adopt(key)

    def executables(self):
        """Every executable compiled for this step, all signatures and shapes."""
        return [e for run in self.programs.values() for c in run.program.clusters
                if c.specializer for e in c.specializer.cache.values()]

    def program_for(self, *args):
        """The Program these arguments run (traced and compiled if new, waited for
        if compiling in the background)."""
        key, flat = self._key(args)
        self.compile_asked.add(key)     # (compiled now, not left to TensorFlow as a one-off)
        run = self._program(key, flat, args)
        self.wait()
        return self.programs[key].program if key in self.programs else run.program

    def __call__(self, *args):
        """One step: numpy results, or tensors where an argument is a tensor
        (as a tf.function returns them)."""
        outputs = self.run_many([args])
        if any(isinstance(a, tf.Tensor) for a in tf.nest.flatten(args)):
            return tf.nest.map_structure(lambda o: o if o is None else tf.convert_to_tensor(o),
                                         outputs)
        return outputs

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
        mark, start = BACKGROUND_COMPILES.mark(), time.perf_counter()
        outputs = self._outputs(run, flats, keep_all)
        self._timed(key, run, (time.perf_counter() - start) / len(flats),
                    BACKGROUND_COMPILES.quiet_since(mark))
        return run.pack(outputs)

    def _outputs(self, run, flats, keep_all):
        steps = [[a for a in flat if a is not None] for flat in flats]
        ran = None
        if len(steps) > 1 and isinstance(run, _Run):
            ran = run.program.run_steps([list(column) for column in zip(*steps)],
                                        run.state.read(), keep_all)
        if ran is not None and (not run.program.checked or ran[0].pop().all()):
            outputs, new_state = ran
            if keep_all:
                outputs = [o.reshape((-1, *o.shape[2:])) for o in outputs]
            run.state.write(new_state)
        else:       # (a step that failed its checks, the group's state untouched: step by step)
            per_step = [run([gathered(a) for a in tensors]) for tensors in steps]
            outputs = [np.concatenate(o) for o in zip(*per_step)] \
                if keep_all and len(per_step) > 1 else per_step[-1]
        return outputs


def _batch_inputs(compiled, new):
    """The positions of the flat inputs (their (shape, dtype)s) whose leading
    dims differ between two signatures, one size in each and nothing else
    different; else []."""
    rows = [i for i, (a, b) in enumerate(zip(compiled, new)) if a != b]
    for i in rows:
        (shape, dtype), (new_shape, new_dtype) = compiled[i], new[i]
        if dtype != new_dtype or not shape or len(shape) != len(new_shape) \
                or shape[1:] != new_shape[1:]:
            return []
    sizes = {(compiled[i][0][0], new[i][0][0]) for i in rows}
    return rows if len(compiled) == len(new) and len(sizes) == 1 \
        and 0 not in next(iter(sizes)) else []


def jit(fn, backend="auto", max_shapes=8, race=True):
    """Compile a TensorFlow function of tensors (the seed's `xla.compile`).

    Returns a callable taking arrays or tensors and returning numpy results
    for arrays, tensors for tensors (as a tf.function does; a None among them
    stays None); variables it captures are read and updated as TensorFlow
    would. Python control flow on tensors (an `if`, a `for` over `tf.range`)
    becomes graph ops, as tf.function's AutoGraph makes it. `race` as for
    `wrap`.
    """
    return CompiledStep(fn, backend, max_shapes=max_shapes, race=race, autograph=True)
