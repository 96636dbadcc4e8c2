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
    """`value` as an array with shape and dtype, left where it is."""
    return value if on_device(value) else np.asarray(value)
