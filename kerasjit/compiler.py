"""The compile driver: an HLO module -> the HLO passes -> a backend's executable.

The passes run here, once, in place (explain() shows the module as
compiled); a backend builds the optimised module (Backend.build). Where a
device's own compiler rejects generated code, the cluster runs on the
backend's fallback (the CPU for the GPU) with a warning naming the cause.
"""
import abc

from .arrays import host
from .cancel import checkpoint
from .errors import DeviceCompilerError, warn
from .passes import optimize_as_configured


class Executable(abc.ABC):
    """A compiled cluster: a list of arrays in, a list of arrays out."""
    program = None      # the KernelProgram it runs (explain(), the profiler)
    kernels = ()        # (name, source) of each generated function (explain())
    buffer_bytes = 0    # memory its buffers hold between calls
    multi_step = False  # whether it has run_steps: n steps in one call (runtime/program.py)

    @abc.abstractmethod
    def __call__(self, args):
        """The outputs of one run on `args`."""


class Backend(abc.ABC):
    name = None
    races_tensorflow = False    # whether a compiled cluster must beat TensorFlow's (race.py)
    fallback = None             # the backend a cluster its device compiler rejects runs on

    def compile(self, module, donate=None):
        """`module` optimised in place and built. donate: {parameter index:
        output index} whose memory the caller gives up (kernels/aliasing.py)."""
        checkpoint()
        optimize_as_configured(module)
        checkpoint()
        try:
            return self.build(module, donate)
        except DeviceCompilerError as e:
            if self.fallback is None:
                raise
            warn(f"kerasjit: {e}; this cluster runs on the {self.fallback.name.upper()} backend")
            return OnHost(self.fallback.build(module, donate), str(e))

    @abc.abstractmethod
    def build(self, module, donate):
        """The Executable of optimised `module`."""


class OnHost(Executable):
    """A cluster run by a host backend on host copies of its arguments."""

    def __init__(self, executable, reason):
        self.inner, self.reason = executable, reason
        self.program, self.kernels = executable.program, executable.kernels

    def __call__(self, args):
        return self.inner([host(a) for a in args])
