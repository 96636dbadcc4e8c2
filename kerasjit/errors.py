"""The errors kerasjit raises and how it warns, in one place (imports nothing of kerasjit)."""
import os
import sys
import warnings

_HERE = os.path.dirname(os.path.abspath(__file__))


class HloParseError(ValueError):
    """HLO text that does not parse."""


class HloVerifyError(ValueError):
    """An HLO module that breaks an invariant of the IR."""


class PassError(RuntimeError):
    """An HLO pass failed or left an invalid module (names the pass)."""


class Unsupported(NotImplementedError):
    """An HLO feature a compiler does not generate code for (the cluster falls back)."""


class UnsupportedGraph(NotImplementedError):
    """The step uses a TensorFlow feature kerasjit cannot turn into dataflow."""


class GpuUnavailable(RuntimeError):
    """Why kerasjit cannot use a GPU here."""


class DeviceCompilerError(RuntimeError):
    """A device's own compiler (NVRTC) rejected generated code; names the kernel."""


class NotCached(Exception):
    """A compile asked to use only the compile cache met a stage it does not hold."""


class KernelVerifyError(ValueError):
    """A kernel program that breaks an invariant of the kernel IR (names the step)."""


def warn(message, category=RuntimeWarning):
    """Warn, the warning attributed to the first caller outside kerasjit, Keras
    and TensorFlow: the user's line that led to it, not kerasjit's own."""
    internal = [_HERE, os.path.join(os.path.dirname(_HERE), "callbacks")] + [
        os.path.dirname(os.path.abspath(sys.modules[m].__file__))
        for m in ("keras", "tensorflow", "optree") if getattr(sys.modules.get(m), "__file__", None)]
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(
            tuple(internal)):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level + 1)
