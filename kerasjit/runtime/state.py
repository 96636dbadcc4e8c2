"""Variables as arrays between steps, and when Keras's variables get them back.

Reading and writing TensorFlow variables every step costs more than a small
model's arithmetic, so a ResidentStore (shared by a model's train, test and
predict steps) keeps the values as arrays between steps and writes them to the
Keras variables only when someone can look (the Keras glue calls `flush` then).

Between two entry points (a `train_on_batch` loop, epoch after epoch) the
arrays stay too: each comes with a tensor on the buffer its variable held
when the array was read or written. TensorFlow never writes a buffer that a
tensor still holds: an assignment (Keras's, a callback's, TensorFlow's own
step) gives the variable a new buffer. So a variable whose buffer is still
the held one has not been written since, and its array is used as it is;
any other is read again. Re-reading every variable after each flush cost
ResNet50's `train_on_batch` more than its step (270 MB copied per call).
"""
import functools

import numpy as np
import tensorflow as tf

from ..arrays import host

# Concrete functions: cheaper per call than per-variable eager ops or a
# polymorphic tf.function (reports/tuning-measurements.md), once traced: the
# trace and first call cost ~1.8 ms a variable, an eager read ~0.14 ms
# (ResNet50: 0.6 s against 0.05 s at the start of training). So the first
# EAGER_CALLS reads of a step's variables, and writes of a store's, are eager
# (one a fit, epoch or flush), and only those made more often (variables
# flushed every batch, a `train_on_batch` loop) get a function.
EAGER_CALLS = 12


def _buffer(tensor):
    """Where `tensor`'s data lies, or None where that cannot be told without
    a copy (a device tensor, a scalar that numpy gives as a new object)."""
    try:
        data = tensor._numpy()
    except Exception:       # (a dtype numpy does not hold)
        return None
    return data.__array_interface__["data"][0] if isinstance(data, np.ndarray) \
        and data.ndim and data.base is not None else None


class ResidentStore:
    """Latest values of variables, by identity; `dirty` ones are newer than
    Keras's, `current` ones checked against their variables since the last
    flush, `held` ones a (tensor, buffer) of what their variable last held."""

    def __init__(self):
        self.values, self.dirty, self.current, self.held = {}, {}, set(), {}
        self.flushes, self.writers = {}, {}     # by the flushed variables' ids

    def flush(self):
        """Write newer values to the variables; each value is checked against
        its variable before a step reads it again (a callback may change them)."""
        keys = tuple(self.dirty)
        if keys:
            variables = [var for var, _ in self.dirty.values()]
            values = [value for _, value in self.dirty.values()]
            for key in keys:
                self.held.pop(key, None)
            self.flushes[keys] = self.flushes.get(keys, 0) + 1
            if self.flushes[keys] > EAGER_CALLS:
                if keys not in self.writers:
                    self.writers[keys] = _Writer(variables)
                tensors = self.writers[keys](values)
            else:
                # New tensors that the assignments hand to the variables: their
                # buffers are then the variables' (where TensorFlow copies instead,
                # the next read finds another buffer and reads the value: slower,
                # never stale).
                tensors = [tf.constant(host(value), var.dtype)
                           for var, value in zip(variables, values)]
                for var, tensor in zip(variables, tensors):
                    var.assign(tensor, read_value=False)
            for key, tensor in zip(keys, tensors):
                self.held[key] = (tensor, _buffer(tensor))
        self.dirty, self.current = {}, set()

    def hand_over(self):
        """Flush, and let go of every array and held buffer: TensorFlow runs
        steps that write the variables itself next, in place where no tensor
        holds their buffers (held ones would cost a copy of each variable and
        keep the old values alive)."""
        self.flush()
        self.values, self.held = {}, {}

    def take(self, variables, tensors):
        """The values of `variables` as arrays, `tensors` their values now (on
        the variables' buffers): a held buffer's array without a copy."""
        values = []
        for var, tensor in zip(variables, tensors):
            key = id(var)
            if key in self.dirty:       # (newer here: set since the flush)
                values.append(self.values[key])
                continue
            buffer = _buffer(tensor)
            held = self.held.get(key)
            if buffer is None or held is None or held[1] != buffer:
                # Arrays, also for scalars (numpy gives those as immutable scalars): an
                # executable binds an array once and recognises it on later steps.
                self.values[key] = np.asarray(tensor.numpy())
            self.held[key] = (tensor, buffer)
            self.current.add(key)
            values.append(self.values[key])
        return values

    def set_values(self, variables, values):
        """Newer values of `variables`, for Keras's on the next flush."""
        for var, value in zip(variables, values):
            key = id(var)
            self.values[key] = value
            self.dirty[key] = (var, value)
            self.current.add(key)


class _Writer:
    """A concrete function assigning variables their new values and returning
    the tensors they then hold. Small variables come packed, one flat buffer
    per dtype: each argument of a call costs ~20 us and each conversion to a
    tensor ~25 us, more than an MLP's whole step's worth of small writes."""
    PACKED_BYTES = 1 << 16      # (larger ones: a copy more than their own argument)

    def __init__(self, variables):
        sizes = [v.shape.num_elements() for v in variables]
        self.packs, self.alone = {}, []     # dtype -> the small variables of that dtype
        for i, v in enumerate(variables):
            if sizes[i] * v.dtype.size <= self.PACKED_BYTES:
                self.packs.setdefault(v.dtype, []).append(i)
            else:
                self.alone.append(i)

        def write(*arguments):
            arguments = iter(arguments)
            for members in self.packs.values():
                parts = tf.split(next(arguments), [sizes[i] for i in members])
                for i, part in zip(members, parts):
                    variables[i].assign(tf.reshape(part, variables[i].shape), read_value=False)
            for i in self.alone:
                variables[i].assign(next(arguments), read_value=False)
            return [v.read_value() for v in variables]      # (after the writes)
        specs = [tf.TensorSpec([sum(sizes[i] for i in members)], dtype)
                 for dtype, members in self.packs.items()]
        specs += [tf.TensorSpec(variables[i].shape, variables[i].dtype) for i in self.alone]
        self.function = tf.function(write).get_concrete_function(*specs)
        self.dtypes = list(self.packs) + [variables[i].dtype for i in self.alone]

    def __call__(self, values):
        """Write the variables' new `values`; the tensors they then hold."""
        flat = [np.concatenate([np.ravel(host(values[i])) for i in members])
                for members in self.packs.values()] + [host(values[i]) for i in self.alone]
        return self.function(*[tf.constant(a, dtype) for a, dtype in zip(flat, self.dtypes)])


class VariableState:
    """Reads and writes one step's variables: through a ResidentStore when
    given one, else in one TensorFlow call each way (EAGER_CALLS)."""

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
        if store is not None and all(id(v) in store.current for v in self.variables):
            return [store.values[id(v)] for v in self.variables]
        self.reads += 1
        tensors = self._read() if self.reads > EAGER_CALLS and self.variables else \
            [v.value() for v in self.variables]
        if store is not None:
            return store.take(self.variables, tensors)
        return [np.asarray(t.numpy()) for t in tensors]

    def write(self, values):
        if self.store is None:
            if self._write:
                self._write(*[tf.constant(host(values[i])) for i in self.written])
            return
        self.store.set_values([self.variables[i] for i in self.written],
                              [values[i] for i in self.written])
