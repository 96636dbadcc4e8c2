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
        # Temporaries live in shared slots (kernels/storage.py) for the executable's life.
        self._slots = [np.empty(n, np.uint8) for n in program.slot_bytes]
        for buf in program.buffers:
            if buf.role == "temp":
                memory = self._slots[program.storage[buf.id]][:buf.nbytes]
                self._arrays[buf.id] = memory.view(DTYPES[buf.dtype]).reshape(buf.dims)
            elif buf.role == "constant":
                self._arrays[buf.id] = np.asarray(buf.data, DTYPES[buf.dtype], order="C")
        self._table = (ctypes.c_void_p * len(program.buffers))()
        for i, a in enumerate(self._arrays):
            if a is not None:
                self._table[i] = a.ctypes.data

    @property
    def buffer_bytes(self):
        """Bytes of the executable's own memory: temporaries' slots and constants."""
        return sum(s.nbytes for s in self._slots) + sum(
            a.nbytes for b, a in zip(self.program.buffers, self._arrays) if b.role == "constant")

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
