"""The GPU backend: the kernel IR as CUDA C, compiled by NVRTC and run through CuPy.

The HLO passes, lowering and kernel passes are shared (compiler.py); cuda_render.py renders
the loop kernels, device.py launches them and runs GEMMs through cuBLAS,
executable.py keeps a cluster's buffers on the device. CuPy is imported
only when a GPU is asked for (backend="gpu", or "auto" with CuPy installed).
"""
from ...compiler import Backend
from ...errors import DeviceCompilerError
from ...kernels.target import Target
from .cuda_render import kernel_names, render_program
from .device import GpuUnavailable, open_device
from .executable import GpuExecutable

__all__ = ["GpuBackend", "GpuUnavailable", "open_backend"]


class GpuBackend(Backend):
    name = "gpu"
    races_tensorflow = False    # TensorFlow's own GPU kernels are not raced (yet)
    # (The CPU's thresholds: not measured with cuBLAS yet.)
    target = Target(implicit_gemm=True, implicit_dots=False, min_batched_product=1024,
                    patch_budget_bytes=64 << 20)

    def __init__(self, device):
        self.device = device
        self._count = 0

    @property
    def fallback(self):
        from ..cpu import BACKEND
        return BACKEND

    def build(self, program, key):
        """Kernels of kernel program `program` for the device."""
        self._count += 1
        name = f"cluster{self._count}"
        source, kernels = render_program(program, name)
        try:
            functions = self.device.build(source, [n for n, _ in kernels])
        except Exception as e:      # NVRTC's log names the kernel and the line
            log = str(e).strip().splitlines() or [type(e).__name__]
            raise DeviceCompilerError(f"the GPU compiler rejected {name}: {log[0]}") from e
        by_step = {id(step): functions[n] for n, step in kernel_names(program, name)}
        return GpuExecutable(program, self.device, by_step, kernels)


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
