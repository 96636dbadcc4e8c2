"""kerasjit: compile Keras train steps through HLO, falling back to TensorFlow per cluster.

    model = kerasjit.wrap(model)      # then model.fit(...) as usual
"""
import importlib

from .quiet_start import load_tensorflow

load_tensorflow()       # before anything else loads it: its routine start-up lines left out

from .explain import explain  # noqa: E402
from .step import jit  # noqa: E402
from .wrap import wrap  # noqa: E402

__version__ = "0.1.0"
__all__ = ["wrap", "jit", "explain", "kernel_profile", "JitProfiler", "report"]


def __getattr__(name):
    # Measurement and reporting load on first use: the compiler never needs them, and
    # kerasjit.callbacks lives in callbacks/, which only an install maps in (setup.cfg).
    if name == "JitProfiler":
        from .callbacks import JitProfiler
        return JitProfiler
    if name == "kernel_profile":
        from .backends.cpu.profile import kernel_profile
        return kernel_profile
    if name == "report":
        return importlib.import_module(".report", __name__)
    raise AttributeError(f"module 'kerasjit' has no attribute {name!r}")
