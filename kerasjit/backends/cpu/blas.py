"""BLAS for generated code: scipy's sgemm, reached through its C function pointer.

scipy.linalg.cython_blas exports each BLAS routine as a PyCapsule holding a
C pointer (numba uses the same door); we register that address under a
symbol name the JIT links generated calls against.
"""
import ctypes

import llvmlite.binding as llvm

SGEMM_SYMBOL = "kerasjit_sgemm"
THREADS_LOCAL_SYMBOL = "kerasjit_blas_threads_local"
# A GEMM below this many multiply-adds runs on one thread; from it on, kerasjit's
# threads split it (parallel.gemm_parts): threads slow smaller calls
# (reports/tuning-measurements.md).
SINGLE_THREAD_MNK = 1 << 23
_threads_local_found = None   # whether the thread-count setter exists, once registered


def _capsule_pointer(capsule):
    name = ctypes.pythonapi.PyCapsule_GetName
    name.restype, name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get(capsule, name(capsule))


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _threads_local(sgemm_address):
    """Address of OpenBLAS's `openblas_set_num_threads_local` in the library that
    holds scipy's sgemm, or None (another BLAS, or an OpenBLAS before 0.3.27)."""
    try:
        libc = ctypes.CDLL(None)
        libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        info = _DlInfo()
        if not libc.dladdr(sgemm_address, ctypes.byref(info)) or not info.dli_fname:
            return None
        setter = getattr(ctypes.CDLL(info.dli_fname.decode()), "openblas_set_num_threads_local")
        return ctypes.cast(setter, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


def register_blas_symbols():
    """Make SGEMM_SYMBOL (and THREADS_LOCAL_SYMBOL where the BLAS has it)
    resolvable by the JIT, once per process. Returns whether generated code may
    set OpenBLAS's thread count for the calling thread."""
    global _threads_local_found
    if _threads_local_found is None:
        from scipy.linalg import cython_blas
        sgemm = _capsule_pointer(cython_blas.__pyx_capi__["sgemm"])
        llvm.add_symbol(SGEMM_SYMBOL, sgemm)
        setter = _threads_local(sgemm)
        if setter:
            llvm.add_symbol(THREADS_LOCAL_SYMBOL, setter)
        _threads_local_found = bool(setter)
    return _threads_local_found
