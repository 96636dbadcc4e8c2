"""BLAS for generated code: scipy's sgemm, reached through its C function pointer.

scipy.linalg.cython_blas exports each BLAS routine as a PyCapsule holding a
C pointer (numba uses the same door); we register that address under a
symbol name the JIT links generated calls against.
"""
import ctypes

import llvmlite.binding as llvm

SGEMM_SYMBOL = "kerasjit_sgemm"
_registered = False


def _capsule_pointer(capsule):
    name = ctypes.pythonapi.PyCapsule_GetName
    name.restype, name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get(capsule, name(capsule))


def register_blas_symbols():
    """Make SGEMM_SYMBOL resolvable by the JIT (once per process)."""
    global _registered
    if not _registered:
        from scipy.linalg import cython_blas
        llvm.add_symbol(SGEMM_SYMBOL, _capsule_pointer(cython_blas.__pyx_capi__["sgemm"]))
        _registered = True
