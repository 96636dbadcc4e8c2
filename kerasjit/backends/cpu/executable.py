"""A compiled cluster as a Python callable: buffers in, one native call, buffers out."""
import ctypes

import numpy as np

from ...hlo.shape import DTYPES

_ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class CpuExecutable:
    def __init__(self, program, address, kernels):
        self.program, self.kernels = program, kernels   # kernels: [(name, LLVM IR)]
        self._entry = _ENTRY(address)
        self._arrays = [None] * len(program.buffers)
        for buf in program.buffers:   # temps and constants live as long as the executable
            if buf.role == "temp":
                self._arrays[buf.id] = np.empty(buf.dims, DTYPES[buf.dtype])
            elif buf.role == "constant":
                self._arrays[buf.id] = np.asarray(buf.data, DTYPES[buf.dtype], order="C")
        self._table = (ctypes.c_void_p * len(program.buffers))()
        for i, a in enumerate(self._arrays):
            if a is not None:
                self._table[i] = a.ctypes.data

    @property
    def buffer_bytes(self):
        return sum(a.nbytes for a in self._arrays if a is not None)

    def __call__(self, args):
        program, table = self.program, self._table
        keep = []
        for bid, arg in zip(program.params, args):
            buf = program.buffers[bid]
            a = np.asarray(arg, DTYPES[buf.dtype], order="C")   # (ascontiguousarray makes 0-d 1-d)
            if a.shape != tuple(buf.dims):
                raise ValueError(f"parameter {buf.name}: expected shape {buf.dims}, got {a.shape}")
            keep.append(a)
            table[bid] = a.ctypes.data
        outputs = []
        for bid in program.outputs:   # fresh: callers keep outputs as state across calls
            buf = program.buffers[bid]
            out = np.empty(buf.dims, DTYPES[buf.dtype])
            table[bid] = out.ctypes.data
            outputs.append(out)
        self._entry(ctypes.addressof(table))
        return outputs
