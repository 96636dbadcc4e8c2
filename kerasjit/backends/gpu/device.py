"""The GPU as the executable sees it, through CuPy: memory, NVRTC kernels, cuBLAS, graphs.

Everything runs on one blocking stream of the device's own, so CuPy's copies
on the legacy default stream (`.get()`) wait for its work; CuPy's per-thread
default stream would not, so that setting is refused. Input batches go
through pinned staging buffers, so their upload overlaps the host's work.
"""
import importlib.util
import os

import numpy as np

from ...kernels.ir import GemmCall
from .cuda_render import THREADS     # per block; the kernels' grid-stride loops take any grid
from ...errors import GpuUnavailable

NVRTC_OPTIONS = ("--std=c++17",)
BLOCKS_PER_SM = 32              # enough resident blocks to hide memory latency


class CupyDevice:
    def __init__(self, cupy):
        from cupy_backends.cuda.libs import cublas
        self.xp, self.cublas = cupy, cublas
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        self.name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        self.arch = f"sm_{props['major']}{props['minor']}"
        self.max_blocks = props["multiProcessorCount"] * BLOCKS_PER_SM
        self.stream = cupy.cuda.Stream(non_blocking=False)
        self.handle = cupy.cuda.device.get_cublas_handle()
        # cuBLAS reads alpha and beta through host pointers when it is called.
        self._scalars = {v: np.full(1, v, np.float32) for v in (0.0, 1.0)}

    def __str__(self):
        return f"{self.name} ({self.arch})"

    # ------------------------------------------------------------- memory
    def upload(self, data, dtype):
        with self.stream:
            return self.xp.asarray(np.asarray(data, dtype))

    @staticmethod
    def pointer(array):
        return array.data.ptr

    def copy_into(self, target, value, staging):
        """value (a host or device array) into the device array `target`. A host
        array goes through a pinned buffer kept in `staging` (the caller's dict,
        so the buffers live as long as the caller's device arrays)."""
        if hasattr(value, "__cuda_array_interface__"):
            self.xp.copyto(target, self.xp.asarray(value), casting="same_kind")
            return
        value = np.ascontiguousarray(value, target.dtype)
        staged = staging.get(target.data.ptr)
        if staged is None or staged[0].nbytes != value.nbytes:
            import cupyx
            staged = (cupyx.empty_pinned(value.shape, value.dtype),
                      self.xp.cuda.Event(disable_timing=True))
            staging[target.data.ptr] = staged
        pinned, copied = staged
        copied.synchronize()    # its previous upload has left the staging buffer
        pinned.reshape(value.shape)[...] = value
        target.set(pinned.reshape(target.shape), stream=self.stream)
        copied.record(self.stream)

    def synchronize(self):
        """Wait until the device has done all that was asked of it."""
        self.stream.synchronize()

    def ordered(self):
        """Context in which CuPy's own operations go to the device's stream."""
        return self.stream

    # ------------------------------------------------------------ kernels
    def build(self, source, names):
        """{name: kernel} from CUDA C source, compiled by NVRTC for this device."""
        module = self.xp.RawModule(code=source, options=NVRTC_OPTIONS)
        return {n: module.get_function(n) for n in names}

    def launch(self, kernel, threads, table, chunk):
        blocks = max(1, min(-(-threads // THREADS), self.max_blocks))
        kernel((blocks,), (THREADS,), (table, np.int64(chunk)))

    def gemm(self, call: GemmCall, out, lhs, rhs, chunk):
        """`call` on device arrays: one cuBLAS call, or for a batched product one
        strided-batched call per index of its batch levels but the innermost."""
        trans_b, trans_a, m, n, k, ld_b, ld_a, ld_c = call.column_major()
        out_stride, rhs_stride = call.chunk_strides()
        item = out.itemsize
        alpha, beta = (self._scalars[v].ctypes.data for v in (1.0, call.beta(chunk)))
        rhs_at = rhs.data.ptr + item * chunk * rhs_stride
        out_at = out.data.ptr + item * chunk * out_stride
        if not call.batch:             # column-major: C^T = op(B)^T op(A)^T, B first
            self.cublas.sgemm(self.handle, int(trans_b), int(trans_a), m, n, k,  # _N 0, _T 1
                              alpha, rhs_at, ld_b, lhs.data.ptr, ld_a, beta, out_at, ld_c)
            return
        count, step_a, step_b, step_c = call.batch[-1]
        for a, b, c in call.batch_offsets(call.batch[:-1]):
            self.cublas.sgemmStridedBatched(
                self.handle, int(trans_b), int(trans_a), m, n, k, alpha,
                rhs_at + item * b, ld_b, step_b, lhs.data.ptr + item * a, ld_a, step_a,
                beta, out_at + item * c, ld_c, step_c, count)

    # ------------------------------------------------------------- graphs
    def capture(self, launches):
        """`launches()` recorded as a CUDA graph (not run), or None where capturing
        fails (the caller then launches them itself: nothing ran while capturing)."""
        try:
            self.stream.begin_capture()
        except Exception:
            return None
        try:
            launches()
        except Exception:
            try:
                self.stream.end_capture()
            except Exception:
                pass
            return None
        try:
            return self.stream.end_capture()
        except Exception:
            return None

    def replay(self, graph):
        graph.launch(self.stream)

    def self_test(self):
        """Compile, launch and multiply once: a CuPy that does not match the driver,
        or a missing NVRTC or cuBLAS library, fails here rather than mid-training."""
        with self.stream:
            kernel = self.build('extern "C" __global__ void kj_probe(float* x) '
                                '{ x[threadIdx.x] = 2.0f * threadIdx.x; }', ["kj_probe"])["kj_probe"]
            x = self.xp.zeros(32, self.xp.float32)
            kernel((1,), (32,), (x,))
            out = self.xp.zeros(1, self.xp.float32)
            self.cublas.sgemm(self.handle, 0, 1, 1, 1, 32, self._scalars[1.0].ctypes.data,
                              x.data.ptr, 1, x.data.ptr, 1, self._scalars[0.0].ctypes.data,
                              out.data.ptr, 1)
            got = float(out.get()[0])
        want = float(sum((2 * i) ** 2 for i in range(32)))
        if got != want:
            raise RuntimeError(f"a test multiply gave {got}, not {want}")


def open_device():
    """The current CUDA device through CuPy, checked; GpuUnavailable says why not.
    Without CuPy installed, CuPy is not imported at all."""
    if importlib.util.find_spec("cupy") is None:
        raise GpuUnavailable('CuPy is not installed (pip install "cupy-cuda12x[ctk]")')
    if os.environ.get("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM") == "1":
        raise GpuUnavailable("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1: results read on the "
                             "per-thread default stream would not wait for kerasjit's stream")
    try:
        import cupy
    except Exception as e:
        raise GpuUnavailable(f"CuPy failed to import: {e}") from e
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        raise GpuUnavailable(f"CUDA has no usable device here ({type(e).__name__}: {e})") from e
    if count == 0:
        raise GpuUnavailable("CuPy sees no CUDA device")
    try:
        for library in ("cublas", "nvrtc"):     # loading them finds the CUDA libraries
            importlib.import_module(f"cupy_backends.cuda.libs.{library}")
    except ImportError as e:
        raise GpuUnavailable(f"CUDA libraries missing ({e}); pip install "
                             '"cupy-cuda12x[ctk]" or install the CUDA toolkit') from e
    try:
        device = CupyDevice(cupy)
        device.self_test()
    except Exception as e:
        raise GpuUnavailable(f"CuPy cannot run kernels on this GPU ({type(e).__name__}: {e}); "
                             "is the CuPy build made for this CUDA driver?") from e
    return device
