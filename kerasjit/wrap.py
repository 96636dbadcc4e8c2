"""`kerasjit.wrap(model)`: Keras's own fit/evaluate/predict, compiled steps.

Keras builds `train_function` & co. lazily through `make_*_function`; wrap
swaps those three for versions that run the model's own `train_step`,
`test_step` and `predict_step` through kerasjit. Everything else (callbacks,
History, progress bar, validation, save/load, summary) is Keras's code
untouched, which is how the wrapped model keeps behaving as the original.
The model object itself is returned, switched to compiled steps, the way
`compile(jit_compile=True)` switches a model to XLA.
"""
import functools
import os
import re

import keras
import tensorflow as tf
from keras.src.backend import compute_output_spec
from keras.src.models.functional import Functional
from keras.src.trainers.data_adapters.data_adapter_utils import unpack_x_y_sample_weight

from .backends import get_backend
from .runtime import feed
from .arrays import gathered
from .runtime.metric_resets import reset_in_store
from .runtime.state import ResidentStore
from .runtime.distribute import (check_strategy, local_batches, multi_worker, replicated,
                                 strategy_of, symbolic_build)
from .step import CompiledStep
from .step_identity import step_identity


class JitState:
    """What wrap attaches to a model: the backend, its compiled steps, and what
    JitProfiler reads (`compile_events`, `buffer_bytes()`)."""

    def __init__(self, model, backend, max_shapes, race, background):
        self.backend = backend
        self.compile_events = []      # step.CompileEvent: (perf_counter start, seconds, what, ...)
        # Steps keep variables as arrays between calls, in one store the three
        # steps share (they share weights and metric variables); every Keras
        # entry point flushes it before and after it runs.
        self.store = ResidentStore()
        self.verbose = False          # set while a verbose fit runs: compiles say so
        announce = lambda: self.verbose     # noqa: E731
        self.strategy = strategy_of(model)
        if self.strategy is not None and multi_worker(self.strategy):
            # Every worker must switch to the compiled step at the same step (their
            # collectives meet by key): no background compile, no timing verdict.
            background = False
        # (a strategy's step holds its collectives: only its trace tells them)
        identity = (lambda: None) if self.strategy is not None else \
            functools.partial(step_identity, model)
        self.train, self.test, self.predict = (
            CompiledStep(replicated(step, self.strategy, reduction), backend, name, max_shapes,
                         self.compile_events, self.store, announce, race, background,
                         functools.partial(_description, model), identity=identity)
            for step, name, reduction in ((model.train_step, "train_step", "auto"),
                                          (model.test_step, "test_step", "auto"),
                                          (model.predict_step, "predict_step", "concat")))

    def arguments(self, batch):
        """A step's arguments for one of Keras's batches."""
        return local_batches(batch, self.strategy)

    def buffer_bytes(self):
        return sum(run.program.buffer_bytes() for step in (self.train, self.test, self.predict)
                   for run in step.programs.values())


def _description(model):
    """What tells one model's steps from another's of the same inputs: the
    paths, shapes and dtypes of its variables, the paths without the numbers
    that tell a second copy of a layer or model in a process (`dense_1`)."""
    return repr([(re.sub(r"_\d+(?=/|$)", "", v.path), tuple(v.shape), v.dtype)
                 for v in model.variables])


def _check_model(model):
    if not isinstance(model, keras.Model):
        raise TypeError(f"kerasjit.wrap expects a keras.Model, got {type(model).__name__}")
    if keras.backend.backend() != "tensorflow":
        raise RuntimeError("kerasjit needs Keras's TensorFlow backend "
                           f"(KERAS_BACKEND is '{keras.backend.backend()}')")
    if not model.compiled or model.optimizer is None:
        raise ValueError(f"model '{model.name}' is not compiled: call model.compile(optimizer=..., "
                         "loss=...) before kerasjit.wrap")


def _build_variables(model, batch):
    """Create the variables the steps use (model, metrics, loss, optimizer) before
    the first trace, as Keras's other backends do: tf.function traces a function
    that creates variables twice (reports/tuning-measurements.md)."""
    with model.distribute_strategy.scope():     # (mirrored variables under a strategy)
        # Where either fails, what it left unbuilt the next step or the trace builds.
        for build in (_build_metrics_and_loss, _symbolic_build):
            try:
                build(model, batch)
            except Exception:   # (a Keras without it, or a model it cannot build)
                pass


def _symbolic_build(model, batch):
    model._symbolic_build(data_batch=batch)


def _build_metrics_and_loss(model, batch):
    """Build a built graph-of-layers model's compiled metrics and loss from its
    output spec, layer by layer. Keras's _symbolic_build gets that spec by
    running the whole model in a scratch graph, which takes as long as a
    forward trace (ResNet50: 0.45 s, against 0.016 s layer by layer); it then
    finds them built and builds only the optimizer."""
    metrics, loss = (c if c is not None and not c.built else None
                     for c in (model._compile_metrics, model._compile_loss))
    if metrics is None and loss is None or not isinstance(model, (Functional, keras.Sequential)) \
            or not all(layer.built for layer in model._flatten_layers()):
        return
    x, y, sample_weight = unpack_x_y_sample_weight(tf.nest.map_structure(
        lambda v: None if v is None else keras.KerasTensor(
            v.shape, keras.backend.standardize_dtype(v.dtype)), batch))
    y_pred = model.compute_output_spec(x, training=False)
    if metrics is not None:
        compute_output_spec(model.compute_metrics, x, y, y_pred, sample_weight=sample_weight)
    if loss is not None:
        compute_output_spec(model._compute_loss, x, y, y_pred, sample_weight=sample_weight,
                            training=False)


def _same_as_fit(batch):
    """(x, y) for the (x, y, None) that train_on_batch and test_on_batch pass
    where fit passes (x, y): Keras's steps read both alike, and one traced
    step then serves fit and train_on_batch."""
    if type(batch) is tuple and len(batch) == 3 and batch[2] is None:
        return batch[:2]
    return batch


def _same_as_predict(model, batch):
    """x for the (x,) that predict_on_batch passes where predict passes x:
    Keras's own predict_step reads both alike (a 1-tuple of anything but a
    tuple or list unpacks to its element), and one traced step then serves
    both. A predict_step of the model's own may tell them apart: left as is."""
    if type(batch) is tuple and len(batch) == 1 and not isinstance(batch[0], (tuple, list)) \
            and type(model).predict_step is keras.Model.predict_step:
        return batch[0]
    return batch


def _steps(model, state, step):
    """A Keras train/test function: up to steps_per_execution steps per call,
    run together (one native call where the step compiles to one cluster)."""
    def function(iterator):
        batches = []
        for _ in range(model.steps_per_execution):
            try:
                batches.append(state.arguments(_same_as_fit(next(iterator))))
            except (StopIteration, tf.errors.OutOfRangeError):
                break
        if not batches:
            raise StopIteration
        if not step.programs:
            _build_variables(model, tf.nest.map_structure(gathered, batches[0][0]))
        return step.run_many(batches)
    return function


_BATCH_HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end")


def _observes_batches(callback):
    """Whether a callback may look at (or change) variables between steps."""
    if getattr(callback, "kerasjit_batch_safe", False) or isinstance(
            callback, (keras.callbacks.ProgbarLogger, keras.callbacks.History)):
        return False
    if isinstance(callback, keras.callbacks.ModelCheckpoint) and callback.save_freq == "epoch":
        return False
    # (a hook overridden in its class, or set on the instance: LambdaCallback's)
    return any(getattr(type(callback), hook) is not getattr(keras.callbacks.Callback, hook)
               or hook in vars(callback) for hook in _BATCH_HOOKS)


class _Flush(keras.callbacks.Callback):
    """First in fit's callbacks: Keras variables are current before any other
    callback runs at an epoch's end (and at each batch's end when one of them
    observes batches)."""

    def __init__(self, store, every_batch):
        super().__init__()
        self.store, self.every_batch = store, every_batch

    def on_train_batch_end(self, batch, logs=None):
        if self.every_batch:
            self.store.flush()

    def on_epoch_end(self, epoch, logs=None):
        self.store.flush()


def _entry(method, model, store):
    """A Keras entry point (fit, evaluate, ...) of a wrapped model: array inputs
    fed as numpy batches, and the Keras variables current however it returns."""
    @functools.wraps(method)
    def call(*args, **kwargs):
        if tf.inside_function():      # being traced (train_step calls get_metrics_result):
            return method(*args, **kwargs)    # an assign here would join the graph
        store.flush()
        try:
            with feed.feeding(model):
                return method(*args, **kwargs)
        finally:              # also on an exception or KeyboardInterrupt mid-epoch:
            store.flush()     # the variables then hold the last completed step
    return call


def _resetting_in_store(entry, model, state):
    """train_on_batch / test_on_batch (their `_entry`): Keras resets the
    metrics right before the step, and that reset goes to the store where it
    can (metric_resets)."""
    if state.strategy is not None or "reset_metrics" in vars(model) \
            or type(model).reset_metrics is not keras.Model.reset_metrics:    # (a model's own)
        return entry

    @functools.wraps(entry)
    def call(*args, **kwargs):
        if tf.inside_function():
            return entry(*args, **kwargs)
        model.reset_metrics = functools.partial(reset_in_store, model, state.store)
        try:
            return entry(*args, **kwargs)
        finally:
            del model.reset_metrics
    return call


def _fit_entry(fit, model, state):
    @functools.wraps(fit)
    def call(*args, callbacks=None, verbose="auto", **kwargs):
        given = callbacks.callbacks if isinstance(callbacks, keras.callbacks.CallbackList) \
            else list(callbacks or [])
        flush = _Flush(state.store, any(_observes_batches(c) for c in given))
        if isinstance(callbacks, keras.callbacks.CallbackList):   # Keras uses it as given
            flush.set_model(model)
            callbacks.callbacks.insert(0, flush)
        else:
            callbacks = [flush, *given]
        state.verbose = verbose != 0
        try:
            return _entry(fit, model, state.store)(
                *args, callbacks=callbacks, verbose=verbose, **kwargs)
        finally:
            state.verbose = False
            if flush in given:
                given.remove(flush)
    return call


def _metrics_result_entry(get_metrics_result, model, state):
    """Keras's get_metrics_result, without the metrics that no step has built
    when none has run (a fit or evaluate on no data: Keras's traced step
    would have built them, and its logs then leave them out all the same)."""
    entry = _entry(get_metrics_result, model, state.store)

    @functools.wraps(get_metrics_result)
    def call():
        built = [m for m in model.metrics if getattr(m, "built", True)]
        if state.train.programs or state.test.programs or len(built) == len(model.metrics):
            return entry()
        return {m.name: m.result() for m in built}
    return call


# Keras entry points that read data or read/reset variables.
_ENTRIES = ("evaluate", "predict", "train_on_batch", "test_on_batch", "predict_on_batch")
# Every instance attribute wrap sets; re-wrapping restores Keras's own first.
_WRAPPED_METHODS = ("fit", "compile", *_ENTRIES, "get_metrics_result", "make_train_function",
                    "make_test_function", "make_predict_function", "_maybe_symbolic_build")


def wrap(model, backend="auto", max_shapes=8, race=True, background=None):
    """Make `model` train, evaluate and predict through kerasjit; returns the model.

    backend: "auto" (best available), "reference" (the numpy evaluator), or a
    compiler backend. max_shapes: how many input shapes a cluster whose shapes
    are known only at run time is compiled for before it stays in TensorFlow.
    race: time each compiled cluster that holds an op TensorFlow may run
    faster (a convolution, batched matmul or einsum, pooling, a scan, top-k)
    against TensorFlow on its first calls and keep TensorFlow where it is
    clearly faster, and a background-compiled step against TensorFlow's
    whole step (a compiler backend only; False always runs compiled code).
    background: a step compiles on a thread of its own while TensorFlow runs
    it (training starts at once; the compiled step takes over between two
    steps, with the variables as TensorFlow left them); False waits for the
    compile; None: True unless KERASJIT_BACKGROUND=0. Bad input raises before
    the model is changed.
    """
    _check_model(model)
    check_strategy(strategy_of(model))
    if background is None:
        background = os.environ.get("KERASJIT_BACKGROUND", "1") != "0"
    previous = getattr(model, "_kerasjit", None)
    if previous is not None:          # re-wrapping (e.g. another backend): start from Keras's own
        previous.store.flush()
        for name, method in previous.originals.items():
            setattr(model, name, method)
    state = JitState(model, get_backend(backend), max_shapes, race, background)
    state.originals = {name: getattr(model, name) for name in _WRAPPED_METHODS}

    def make_train_function(force=False):
        if model.train_function is None or force:
            model.train_function = _steps(model, state, state.train)
        return model.train_function

    def make_test_function(force=False):
        if model.test_function is None or force:
            model.test_function = _steps(model, state, state.test)
        return model.test_function

    def make_predict_function(force=False):
        if model.predict_function is None or force:
            def predict_function(batches):
                outputs = state.predict.run_many([state.arguments(_same_as_predict(model, b))
                                                  for b in batches],
                                                 keep_all=True)
                # Keras joins numpy outputs only through feed.py's stand-ins.
                return outputs if feed.active() else tf.nest.map_structure(tf.constant, outputs)
            model.predict_function = predict_function
        return model.predict_function

    def compile(*args, **kwargs):
        # A new optimizer, loss or metrics are new variables and a new step to
        # trace: Keras's compile, then wrap anew (the weights written back first).
        state.store.flush()
        state.originals["compile"](*args, **kwargs)
        wrap(model, backend, max_shapes, race, background)

    model._kerasjit = state
    model.compile = compile
    # Flush before Keras's own code runs: evaluate resets metric variables first thing,
    # and fit reads the metric variables for the epoch's logs before any callback runs.
    model.fit = _fit_entry(model.fit, model, state)
    for name in _ENTRIES:
        entry = _entry(getattr(model, name), model, state.store)
        if name in ("train_on_batch", "test_on_batch"):
            entry = _resetting_in_store(entry, model, state)
        setattr(model, name, entry)
    model.get_metrics_result = _metrics_result_entry(model.get_metrics_result, model, state)
    model.make_train_function = make_train_function
    model.make_test_function = make_test_function
    model.make_predict_function = make_predict_function
    if state.strategy is not None:
        model._maybe_symbolic_build = symbolic_build(model)
    model.train_function = model.test_function = model.predict_function = None
    return model
