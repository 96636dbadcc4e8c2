"""Array inputs straight into compiled steps: numpy batches, no tf.data.

While a wrapped model's fit/evaluate/predict runs, Keras's TFEpochIterator,
pythonify_logs and predict's concatenation resolve to the stand-ins below:
in-memory arrays are batched by Keras's own ArrayDataAdapter as numpy (same
shuffling, weights and last batch), logs of numpy scalars become floats
directly, and predict's outputs stay numpy. Datasets, generators, PyDatasets
and multi-worker strategies keep Keras's tf.data path, which costs more per
batch than a small model's step (reports/tuning-measurements.md).
"""
import contextlib
import contextvars
import functools

import numpy as np
import tensorflow as tf
from keras.src.backend.tensorflow import trainer as tf_trainer
from keras.src.trainers.data_adapters import (array_data_adapter, array_slicing,
                                              data_adapter_utils)
from keras.src.trainers.epoch_iterator import EpochIterator
from keras.src import tree
from keras.src.utils import python_utils

from ..arrays import Rows
from .distribute import multi_worker, split_batch, strategy_of
from .prefetch import Prefetcher

_KERAS_ITERATOR = tf_trainer.TFEpochIterator
_KERAS_PYTHONIFY = python_utils.pythonify_logs
_KERAS_CONCAT = tf_trainer.potentially_ragged_concat
_KERAS_TO_NUMPY = tf_trainer.convert_to_np_if_not_ragged
_FEEDING = contextvars.ContextVar("kerasjit_feeding", default=False)
# Under a strategy: a batch -> its replicas' parts (distribute.split_batch).
_SPLIT = contextvars.ContextVar("kerasjit_split", default=None)
# The Prefetchers of the innermost feeding block, closed when it ends: no thread
# draws batches after fit/evaluate/predict returns.
_PREFETCHERS = contextvars.ContextVar("kerasjit_prefetchers", default=None)
# The Keras internals used here (Keras 3's TF trainer and epoch iterator); a Keras
# without them keeps every input on its tf.data path.
_SUPPORTED = hasattr(EpochIterator, "_enumerate_iterator")
# Keras's batching by index, which lazy batches reuse (else they are gathered as usual).
_LAZY = hasattr(array_data_adapter.ArrayDataAdapter, "_get_iterator") \
    and hasattr(array_slicing, "convert_to_sliceable")


class ArrayEpochIterator(EpochIterator):
    """Keras's numpy epoch iterator, handing over the batch iterator itself as
    TFEpochIterator does, so a short last execution is not 'running out of data'.

    With one step per call, batches are drawn ahead on a second thread
    (prefetch.py), except with shuffle="batch": its per-batch draws from
    numpy's global RNG would interleave with the caller's. With several, a
    shuffled batch stays Rows of the data (gathered by the native call, see
    arrays.Rows) and an unshuffled one a view: same batches, same RNG draws."""

    def __init__(self, *args, shuffle=False, split=None, **kwargs):
        super().__init__(*args, shuffle=shuffle, **kwargs)
        self._prefetch = shuffle != "batch"
        self._split = split     # a batch -> its replicas' parts, under a strategy

    def _get_iterator(self):
        lazy = self._lazy_batches() if self.steps_per_execution > 1 and not self._split \
            else None
        if lazy is not None:
            return lazy
        # As many batches ahead as one call of the step function takes.
        batches = super()._get_iterator()
        if self._split:
            batches = map(self._split, batches)
        if not self._prefetch:
            return batches
        prefetcher = Prefetcher(batches, self.steps_per_execution)
        owners = _PREFETCHERS.get()
        if owners is not None:
            owners.append(prefetcher)
        return prefetcher

    def _lazy_batches(self):
        """Keras's numpy batches, where a batch of rows picked by index (a
        shuffled one) of a C-contiguous numpy array is those Rows instead;
        None where this Keras's array adapter lacks what they need."""
        adapter = self.data_adapter
        data = getattr(adapter, "_inputs", None)
        if not _LAZY or data is None \
                or not isinstance(adapter, array_data_adapter.ArrayDataAdapter):
            return None
        inputs = array_slicing.convert_to_sliceable(data, target_backend="numpy")

        def take(sliceable, indices=None):
            source = getattr(sliceable, "array", None)
            if type(indices) is np.ndarray and type(source) is np.ndarray \
                    and source.dtype.kind in "biuf" and source.flags.c_contiguous:
                return Rows(source, indices)
            return sliceable.convert_to_numpy(sliceable[indices])
        return adapter._get_iterator(take, inputs)

    def __next__(self):
        return next(self._epoch_iterator)


def _dense_arrays(*arrays):
    if not array_data_adapter.can_convert_arrays(arrays):
        return False
    return not any(isinstance(a, (tf.SparseTensor, tf.RaggedTensor))
                   or data_adapter_utils.is_scipy_sparse(a) for a in tree.flatten(arrays))


def epoch_iterator(distribute_strategy=None, x=None, y=None, sample_weight=None, **kwargs):
    """Stands in for TFEpochIterator: numpy batches for arrays while feeding."""
    if _SUPPORTED and _FEEDING.get() and x is not None and _dense_arrays(x, y, sample_weight):
        return ArrayEpochIterator(x=x, y=y, sample_weight=sample_weight, split=_SPLIT.get(),
                                  **kwargs)
    return _KERAS_ITERATOR(distribute_strategy, x=x, y=y, sample_weight=sample_weight, **kwargs)


def _numeric(value):
    """A float, or a numpy number or 0-d array of one: what float() takes as is."""
    if type(value) is float:
        return True
    numpy = type(value) is np.ndarray and value.ndim == 0 or isinstance(value, np.generic)
    return numpy and value.dtype.kind in "biuf"


def _scalar_logs(logs, result):
    """Keras's pythonify_logs into `result`, in its order (sorted keys, nested
    dicts flattened); False, leaving `result` partial, on a value neither
    _numeric nor an array of other than one element."""
    for key, value in sorted(logs.items()):
        if isinstance(value, dict):
            if not _scalar_logs(value, result):
                return False
        elif _numeric(value):
            result[key] = float(value)
        elif type(value) is np.ndarray and value.size != 1:    # (predict's outputs)
            result[key] = value     # Keras's float() fails on it and keeps it as it is
        else:
            return False
    return True


def pythonify_logs(logs):
    """Stands in for Keras's pythonify_logs: a quick conversion while feeding."""
    if _FEEDING.get() and (logs is None or isinstance(logs, dict)):
        result = {}
        if _scalar_logs(logs or {}, result):
            return result
    return _KERAS_PYTHONIFY(logs)


def active():
    """Whether this is a wrapped model's fit/evaluate/predict with numpy batches."""
    return _FEEDING.get()


def potentially_ragged_concat(outputs):
    """Stands in for Keras's: predict's per-batch outputs joined along the batch."""
    if _FEEDING.get() and all(type(o) is np.ndarray and o.ndim for o in outputs) \
            and len({o.shape[1:] for o in outputs}) == 1:
        return np.concatenate(outputs) if len(outputs) > 1 else outputs[0]
    return _KERAS_CONCAT([tf.constant(o) if type(o) is np.ndarray else o for o in outputs])


def convert_to_np_if_not_ragged(x):
    return x if _FEEDING.get() and type(x) is np.ndarray else _KERAS_TO_NUMPY(x)


@contextlib.contextmanager
def feeding(model):
    """Array inputs of `model`'s fit/evaluate/predict go to numpy batches in this
    block, batch logs of numpy scalars to floats quickly, and predict's numpy
    outputs are joined as numpy."""
    tf_trainer.TFEpochIterator = epoch_iterator   # these act only under the context variable
    python_utils.pythonify_logs = pythonify_logs
    tf_trainer.potentially_ragged_concat = potentially_ragged_concat
    tf_trainer.convert_to_np_if_not_ragged = convert_to_np_if_not_ragged
    # Under a strategy of one process, the batches are split over its replicas as a
    # distributed dataset splits them; across workers, they stay tf.data's (which
    # gives each worker its own share of the data).
    strategy = strategy_of(model)
    token = _FEEDING.set(strategy is None or not multi_worker(strategy))
    split = _SPLIT.set(strategy and functools.partial(split_batch, strategy=strategy))
    prefetchers = []
    owned = _PREFETCHERS.set(prefetchers)
    try:
        yield
    finally:
        _PREFETCHERS.reset(owned)
        _FEEDING.reset(token)
        _SPLIT.reset(split)
        for prefetcher in prefetchers:
            prefetcher.close()
