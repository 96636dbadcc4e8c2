"""Backends turn an HLO Module into an executable: list of arrays -> list of arrays.

Registered by name and imported lazily, so a CPU-only install never imports
a GPU toolkit.
"""
import functools
import importlib
import importlib.util

from ..errors import warn

_BACKENDS = {"reference": "kerasjit.backends.reference", "cpu": "kerasjit.backends.cpu",
             "gpu": "kerasjit.backends.gpu"}


def one_call_at_a_time(method):
    """For an executable's `__call__` and `run_steps`, under its `_turn` lock:
    its buffer table and temporaries serve all its calls, so calls from
    several threads (a server's predict) must take turns."""
    @functools.wraps(method)
    def call(self, *args):
        with self._turn:
            return method(self, *args)
    return call


def available():
    return sorted(_BACKENDS)


def get_backend(name):
    """A backend object from its name (a backend object passes through).

    "auto" is the GPU where CuPy is installed and runs kernels on a device,
    else the CPU. "gpu" without a usable GPU warns with the reason and gives
    the CPU backend.
    """
    if not isinstance(name, str):
        return name
    if name not in ("auto", *_BACKENDS):
        raise ValueError(f"unknown kerasjit backend {name!r}; choose one of "
                         f"{', '.join(['auto', *available()])}")
    if name == "gpu" or name == "auto" and importlib.util.find_spec("cupy") is not None:
        from . import gpu
        try:
            return gpu.open_backend()
        except gpu.GpuUnavailable as e:
            if name == "gpu":
                warn(f"kerasjit: no GPU backend: {e}; using the CPU backend")
    if name in ("auto", "gpu"):
        name = "cpu"
    return importlib.import_module(_BACKENDS[name]).BACKEND
