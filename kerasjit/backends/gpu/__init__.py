"""The GPU backend: the kernel IR as CUDA C, compiled by NVRTC and run through CuPy.

The HLO passes and lowering are the CPU backend's; cuda_render.py renders
the loop kernels, device.py launches them and runs GEMMs through cuBLAS,
executable.py keeps a cluster's buffers on the device. CuPy is imported
only when a GPU is asked for (backend="gpu", or "auto" with CuPy installed).
"""
import warnings

from ...kernels.lower import lower
from ...passes import optimize_as_configured
from ...runtime.arrays import host
from .cuda_render import kernel_names, render_program
from .device import GpuUnavailable, open_device
from .executable import GpuExecutable

__all__ = ["GpuBackend", "GpuUnavailable", "open_backend"]


class HostExecutable:
    """A cluster the GPU compiler rejected, run by the CPU backend on host copies."""

    def __init__(self, executable, reason):
        self.inner, self.reason = executable, reason
        self.program, self.kernels = executable.program, executable.kernels

    def __call__(self, args):
        return self.inner([host(a) for a in args])


def lowered(module, donate=None):
    """The KernelProgram this backend renders: convolutions as implicit GEMMs."""
    return lower(module, donate, implicit_gemm=True)


class GpuBackend:
    name = "gpu"
    races_tensorflow = False    # TensorFlow's own GPU kernels are not raced (yet)

    def __init__(self, device):
        self.device = device
        self._count = 0

    def compile(self, module, donate=None):
        """Optimise `module` (in place, as explain() shows it) and build its kernels for
        the device; a kernel the device's compiler rejects sends the cluster to the
        CPU backend with a warning naming the cause."""
        optimize_as_configured(module)
        program = lowered(module, donate)
        self._count += 1
        name = f"cluster{self._count}"
        source, kernels = render_program(program, name)
        try:
            functions = self.device.build(source, [n for n, _ in kernels])
        except Exception as e:      # NVRTC's log names the kernel and the line
            log = str(e).strip().splitlines() or [type(e).__name__]
            return self._on_cpu(module, donate, f"the GPU compiler rejected {name}: {log[0]}")
        by_step = {id(step): functions[n] for n, step in kernel_names(program, name)}
        return GpuExecutable(program, self.device, by_step, kernels)

    @staticmethod
    def _on_cpu(module, donate, reason):
        from ..cpu import BACKEND as CPU
        warnings.warn(f"kerasjit: {reason}; this cluster runs on the CPU backend",
                      RuntimeWarning, stacklevel=3)
        return HostExecutable(CPU.compile(module, donate), reason)


_OPENED = {}


def open_backend():
    """The GPU backend on the current CUDA device (opened once per process), or
    GpuUnavailable with the reason."""
    if "backend" not in _OPENED:
        try:
            _OPENED["backend"] = GpuBackend(open_device())
        except GpuUnavailable as e:
            _OPENED["backend"] = e
    if isinstance(_OPENED["backend"], GpuUnavailable):
        raise _OPENED["backend"]
    return _OPENED["backend"]
