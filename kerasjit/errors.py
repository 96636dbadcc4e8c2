"""The errors kerasjit raises, in one place (imports nothing of kerasjit)."""


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


class KernelVerifyError(ValueError):
    """A kernel program that breaks an invariant of the kernel IR (names the step)."""
