"""Variables as arrays between steps, and when Keras's variables get them back.

Reading and writing TensorFlow variables every step costs more than a small
model's arithmetic, so a ResidentStore (shared by a model's train, test and
predict steps) keeps the values as arrays between steps and writes them to the
Keras variables only when someone can look (the Keras glue calls `flush` then).
"""
import functools

import numpy as np
import tensorflow as tf

from ..arrays import host


class ResidentStore:
    """Latest values of variables, by identity; `dirty` ones are newer than Keras's."""

    def __init__(self):
        self.values, self.dirty = {}, {}

    def flush(self):
        """Write newer values to the variables and forget them all, so the next
        step reads whatever the variables hold then (a callback may change them)."""
        for var, value in self.dirty.values():
            var.assign(host(value))
        self.values, self.dirty = {}, {}


class VariableState:
    """Reads and writes one step's variables: through a ResidentStore when
    given one, else in one TensorFlow call each way.

    Concrete functions: cheaper per call than per-variable eager ops or a
    polymorphic tf.function (reports/tuning-measurements.md), once traced:
    its trace and first call cost ~1.8 ms a variable, an eager read ~0.14 ms
    (ResNet50: 0.6 s against 0.05 s at the start of training). So a step's
    first EAGER_READS reads are eager (one a fit, epoch or flush), and only a
    step read more often (variables flushed every batch) gets the function."""
    EAGER_READS = 12

    def __init__(self, variables, written, store=None):
        self.variables, self.written, self.store = variables, sorted(written), store
        self.reads = 0

    @functools.cached_property
    def _read(self):
        variables = self.variables
        return tf.function(lambda: [v.read_value() for v in variables]).get_concrete_function()

    @functools.cached_property
    def _write(self):
        """Built on first use: with a store it is never needed, and tracing it
        is costly (reports/tuning-measurements.md)."""
        variables = self.variables
        specs = [tf.TensorSpec(variables[i].shape, variables[i].dtype) for i in self.written]
        return tf.function(lambda *values: [variables[i].assign(x) for i, x in
                                            zip(self.written, values)] and None) \
            .get_concrete_function(*specs) if self.written else None

    def read(self):
        store = self.store
        if store is not None and all(id(v) in store.values for v in self.variables):
            return [store.values[id(v)] for v in self.variables]
        # Arrays, also for scalars (numpy gives those as immutable scalars): an executable
        # binds an array once and recognises it on later steps.
        self.reads += 1
        tensors = self._read() if self.reads > self.EAGER_READS and self.variables else \
            [v.read_value() for v in self.variables]
        values = [np.asarray(t.numpy()) for t in tensors]
        if store is not None:
            store.values.update((id(v), x) for v, x in zip(self.variables, values))
        return values

    def write(self, values):
        if self.store is None:
            if self._write:
                self._write(*[tf.constant(host(values[i])) for i in self.written])
            return
        for i in self.written:
            var = self.variables[i]
            self.store.values[id(var)] = values[i]
            self.store.dirty[id(var)] = (var, values[i])
