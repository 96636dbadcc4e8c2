"""NVRTC, the compiler CuPy's RawModule uses, called through ctypes: it needs no
GPU, so CI checks that the GPU backend's sources compile exactly as the
device will compile them (kerasjit/backends/gpu/device.py's options)."""
import ctypes
import glob
import os

import pytest

from kerasjit.backends.gpu.device import NVRTC_OPTIONS


def _library():
    import nvidia.cuda_nvrtc
    found = glob.glob(os.path.join(list(nvidia.cuda_nvrtc.__path__)[0], "**",
                                   "libnvrtc.so.*[0-9]"), recursive=True)
    if not found:
        pytest.fail("libnvrtc not found in nvidia-cuda-nvrtc-cu12 (pip install -e '.[test]')")
    return ctypes.CDLL(found[0])


def compile_cuda(source, arch):
    """PTX of `source` for `arch` (e.g. "sm_90"); raises with NVRTC's log."""
    lib = _library()
    program = ctypes.c_void_p()
    status = lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), b"kernels.cu",
                                    0, None, None)
    assert status == 0, f"nvrtcCreateProgram: {status}"
    try:
        options = [o.encode() for o in (*NVRTC_OPTIONS, f"--gpu-architecture={arch}")]
        status = lib.nvrtcCompileProgram(program, len(options),
                                         (ctypes.c_char_p * len(options))(*options))
        if status != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(program, log)
            raise RuntimeError(log.value.decode(errors="replace")[-4000:])
        size = ctypes.c_size_t()
        lib.nvrtcGetPTXSize(program, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetPTX(program, ptx)
        return ptx.value.decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))
