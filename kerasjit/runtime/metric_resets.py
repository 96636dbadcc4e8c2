"""Metric resets that a ResidentStore makes itself, without TensorFlow.

`train_on_batch` and `test_on_batch` reset the model's metrics before each
step: Keras assigns zeros to each metric variable, eagerly, one TensorFlow
op each (~0.1 ms apiece: a fifth of an MLP's whole call). Nothing can look
between that reset and the step, so zeros in the store, written back with
the step's other results, leave every variable as Keras's reset would.

Only resets whose effect is known are made so: Keras's own `reset_state`
implementations that assign zeros (the base Metric's to all its variables,
Mean's and Sum's to their accumulators) and the compiled-metrics container
that resets its members. Any other metric resets itself as before.
"""
import numpy as np
import tensorflow as tf
from keras.src.metrics import metric, reduction_metrics
from keras.src.trainers import compile_utils

# reset_state implementation -> the variables it sets to zero
_ZEROING = {metric.Metric.reset_state: lambda m: list(m.variables),
            reduction_metrics.Mean.reset_state: lambda m: [m.total, m.count],
            reduction_metrics.Sum.reset_state: lambda m: [m.total]}


def _zeroed(m):
    """The variables `m.reset_state()` sets to zero, or None where it may do
    anything else."""
    reset = type(m).reset_state
    if reset in _ZEROING:
        return _ZEROING[reset](m)
    if reset is compile_utils.CompileMetrics.reset_state:
        if not m.built:
            return []
        variables = []
        for member in (*m._flat_metrics, *m._flat_weighted_metrics):
            zeroed = _zeroed(member) if member is not None else []
            if zeroed is None:
                return None
            variables += zeroed
        return variables
    return None


def reset_in_store(model, store):
    """`model.reset_metrics()` with the zeros kept in `store` where it can
    (the store keys a Keras variable by the tf.Variable beneath it)."""
    for m in model.metrics:
        zeroed = _zeroed(m)
        beneath = [getattr(v, "_value", None) for v in zeroed or ()]
        if zeroed is None or not all(isinstance(v, tf.Variable) for v in beneath):
            m.reset_state()
        else:
            store.set_values(beneath, [np.zeros(v.shape, v.dtype.as_numpy_dtype) for v in beneath])
