"""The values a step passes between clusters: numpy arrays, or the device
arrays of a GPU backend (anything with the CUDA array interface), which stay
on the device until TensorFlow or Keras needs them."""
import numpy as np


def on_device(value):
    return hasattr(value, "__cuda_array_interface__")


def host(value):
    """`value` in host memory (a device array is copied back)."""
    return value.get() if on_device(value) else value


def array(value):
    """`value` as an array with shape and dtype, left where it is (Rows too)."""
    return value if on_device(value) or type(value) is Rows else np.asarray(value)


class Rows:
    """Rows `indices` of the C-contiguous array `source`, not gathered yet: a
    shuffled batch of training data. A multi-step native call copies the rows
    itself, while the step before runs (backends/cpu/stepper.py); anything
    else gets them gathered by np.asarray."""
    __slots__ = ("source", "indices", "shape", "dtype")

    def __init__(self, source, indices):
        self.source, self.indices = source, indices
        self.shape = (len(indices), *source.shape[1:])    # (read per batch: kept)
        self.dtype = source.dtype

    def __array__(self, dtype=None, copy=None):
        if copy is False:
            raise ValueError("Rows are gathered into a new array: a copy cannot be avoided")
        rows = np.take(self.source, self.indices, axis=0)
        return rows if dtype is None else rows.astype(dtype, copy=False)


def gathered(value):
    """`value`, with Rows gathered into an array."""
    return np.asarray(value) if type(value) is Rows else value
