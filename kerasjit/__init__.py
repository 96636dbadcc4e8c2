"""kerasjit: compile Keras train steps through HLO, falling back to TensorFlow per cluster.

    model = kerasjit.wrap(model)      # then model.fit(...) as usual
"""
import importlib

from .quiet_start import install as _quiet_start

_quiet_start()     # TensorFlow, whoever loads it next, without its routine start-up lines

__version__ = "0.1.0"
__all__ = ["wrap", "jit", "explain", "kernel_profile", "JitProfiler", "report"]
# Loaded on first use: importing kerasjit loads no TensorFlow (a command's --help
# answers at once), and kerasjit.callbacks lives in callbacks/, which only an
# install maps in (setup.cfg).
_LAZY = {"wrap": (".wrap", "wrap"), "jit": (".step", "jit"), "explain": (".explain", "explain"),
         "JitProfiler": (".callbacks", "JitProfiler"),
         "kernel_profile": (".backends.cpu.profile", "kernel_profile")}


def __getattr__(name):
    if name in _LAZY:
        module, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module, __name__), attribute)
        # (bound here for good: importing submodule kerasjit.wrap set `wrap` to it)
        globals()[name] = value
        return value
    if name == "report":
        return importlib.import_module(".report", __name__)
    raise AttributeError(f"module 'kerasjit' has no attribute {name!r}")
