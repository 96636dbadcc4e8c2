"""A compiled cluster as a Python callable: buffers in, one native call, buffers out."""
import ctypes

import numpy as np

from ...hlo.shape import DTYPES
from .stepper import run_steps

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
        self._table_address = ctypes.addressof(self._table)
        for i, a in enumerate(self._arrays):
            if a is not None:
                self._table[i] = a.ctypes.data
        # Buffer id -> the array whose address the table holds. Variables updated in
        # place come back as the same arrays every step, and fetching an address costs
        # more (~2 us) than the identity test that skips it.
        self._bound = {}
        # Small outputs (a step's loss and metrics) are written to buffers of the
        # executable's own and copied out: cheaper than a new array to bind per call.
        self._small = {o: self._new_output(bid) for o, bid in enumerate(program.outputs)
                       if o not in program.aliases and program.buffers[bid].nbytes <= 4096}

    def _bind(self, bid, a):
        if self._bound.get(bid) is not a:
            self._table[bid] = a.ctypes.data
            self._bound[bid] = a

    @property
    def buffer_bytes(self):
        """Bytes of the executable's own memory: temporaries' slots and constants."""
        return sum(s.nbytes for s in self._slots) + sum(
            a.nbytes for b, a in zip(self.program.buffers, self._arrays) if b.role == "constant")

    def _param(self, bid, arg):
        buf = self.program.buffers[bid]
        a = np.asarray(arg, DTYPES[buf.dtype], order="C")   # (ascontiguousarray makes 0-d 1-d)
        if a.shape != tuple(buf.dims):
            raise ValueError(f"parameter {buf.name}: expected shape {tuple(buf.dims)}, "
                             f"got {a.shape}")
        return a

    def _new_output(self, bid, leading=()):
        buf = self.program.buffers[bid]
        return np.empty(leading + tuple(buf.dims), DTYPES[buf.dtype])

    def _params(self, args, per_step=()):
        """Checked parameter arrays (for indices in `per_step`, a list: one per
        step). A donated one, whose buffer becomes an output's, is copied if it
        is read-only or passed for another parameter too."""
        program, bound = self.program, self._bound
        params = [[self._param(bid, a) for a in arg] if p in per_step else
                  arg if bound.get(bid) is arg else self._param(bid, arg)   # checked before
                  for p, (bid, arg) in enumerate(zip(program.params, args))]
        repeated = len({id(a) for a in params}) < len(params)
        for p in program.aliases.values():
            a = params[p]
            if not a.flags.writeable or repeated and sum(x is a for x in params) > 1:
                params[p] = a.copy()
        return params

    def _outputs(self, params, make):
        """Per output: its donated parameter's array, else make(output index)."""
        aliases = self.program.aliases
        return [params[aliases[o]] if o in aliases else make(o)
                for o in range(len(self.program.outputs))]

    def __call__(self, args):
        program = self.program
        params = self._params(args)
        for bid, a in zip(program.params, params):
            self._bind(bid, a)
        # The other outputs go to fresh arrays (callers keep them as state), small
        # ones to the executable's own buffers, copied out after the call.
        small = self._small
        outputs = self._outputs(params, lambda o: small[o] if o in small else
                                self._new_output(program.outputs[o]))
        for o, (bid, out) in enumerate(zip(program.outputs, outputs)):
            if o not in program.aliases:
                self._bind(bid, out)
        self._entry(self._table_address)
        return [small[o].copy() if o in small else out for o, out in enumerate(outputs)]

    def run_steps(self, n, args, per_step, carried, stacked_outputs):
        """The cluster `n` times in one native call.

        args: per parameter, its value (for indices in `per_step`, a list of n
        values: step s reads the s-th, in place, without stacking copies).
        carried: parameter index -> output index whose value the parameter
        takes from the step before (variables). Outputs in `stacked_outputs` come back with a leading [n]
        axis (every step's value); the others hold the last step's. A donated
        parameter is updated in place, so it needs no carrying.
        """
        program, steps = self.program, np.arange(n, dtype=np.int64)
        params = self._params(args, per_step)
        # Two alternating sets for outputs kept from the last step only: a step
        # reads the previous step's set (carried variables) and writes the other.
        sets = [self._outputs(params, lambda o: self._new_output(program.outputs[o]))
                for _ in range(min(n, 2))]
        stacked = {o: self._new_output(program.outputs[o], (n,)) for o in stacked_outputs}
        slots, rows = [], []

        def patch(bid, pointers):
            slots.append(bid)
            rows.append(np.broadcast_to(pointers, (n,)))
        for p, (bid, a) in enumerate(zip(program.params, params)):
            if p in per_step:
                patch(bid, [x.ctypes.data for x in a])
            elif p in carried and carried[p] not in program.aliases:
                written = [s[carried[p]].ctypes.data for s in sets]
                patch(bid, np.concatenate([[a.ctypes.data], np.resize(written, n - 1)]))
            else:
                patch(bid, a.ctypes.data)
        for o, bid in enumerate(program.outputs):
            if o in stacked:
                out = stacked[o]
                patch(bid, out.ctypes.data + steps * (out.nbytes // n))
            elif o not in program.aliases:
                patch(bid, np.resize([s[o].ctypes.data for s in sets], n))
        pointers = np.ascontiguousarray(np.stack(rows), dtype=np.int64)
        slots = np.asarray(slots, np.int64)
        self._bound = {}          # the table now holds the last step's pointers
        run_steps()(ctypes.cast(self._entry, ctypes.c_void_p), self._table_address, n,
                    len(slots), slots.ctypes.data, pointers.ctypes.data)
        last = sets[(n - 1) % 2]
        return [stacked[o] if o in stacked else last[o] for o in range(len(program.outputs))]
