"""A compiled cluster as a Python callable: buffers in, one native call, buffers out."""
import ctypes
import threading
from typing import NamedTuple

import numpy as np

from ...hlo.shape import DTYPES
from .. import one_call_at_a_time
from ...arrays import Rows
from ...compiler import Executable
from .stepper import RING, gather_record, run_steps

_ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _address(a):
    """Where `a`'s data starts: through the buffer protocol, cheaper than
    `a.ctypes.data` (paid per new batch; reports/tuning-measurements.md);
    read-only and empty arrays, which it refuses, take the long way."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data


class _Gather(NamedTuple):
    """A per-step input the driver gathers from Rows (stepper.py)."""
    ring: np.ndarray        # RING buffers of the parameter's shape, the steps' in turn
    indices: np.ndarray     # every step's row indices (the driver reads them: kept alive)
    record: list            # the driver's gather record


class CpuExecutable(Executable):
    multi_step = True

    def __init__(self, program, address, kernels, cores_free=False):
        """cores_free: the program leaves a core free (no OpenBLAS threads spin
        beside it), so a thread may gather the next step's batch meanwhile."""
        self.program, self.kernels = program, kernels   # kernels: [(name, LLVM IR)]
        self._gather_ahead = cores_free
        self._entry = _ENTRY(address)
        self._turn = threading.Lock()
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
        # more than the identity test that skips it. A bound parameter passed the checks.
        self._bound = [None] * len(program.buffers)
        self._specs = [(tuple(b.dims), DTYPES[b.dtype]) for b in program.buffers]
        self._donated = [(p, program.params[p]) for p in sorted(set(program.aliases.values()))]
        # Per output: (buffer id, index of the parameter donated to it, own buffer).
        # Small outputs (a step's loss and metrics) are written to buffers of the
        # executable's own and copied out: cheaper than a new array to bind per call.
        self._plan = [(bid, program.aliases.get(o),
                       self._new_output(bid) if o not in program.aliases
                       and program.buffers[bid].nbytes <= 4096 else None)
                      for o, bid in enumerate(program.outputs)]

    @property
    def buffer_bytes(self):
        """Bytes of the executable's own memory: temporaries' slots and constants."""
        return sum(s.nbytes for s in self._slots) + sum(
            a.nbytes for b, a in zip(self.program.buffers, self._arrays) if b.role == "constant")

    def _param(self, bid, arg):
        shape, dtype = self._specs[bid]
        a = np.asarray(arg, dtype, order="C")   # (ascontiguousarray makes 0-d 1-d)
        if a.shape != shape:
            raise ValueError(f"parameter {self.program.buffers[bid].name}: expected shape "
                             f"{shape}, got {a.shape}")
        return a

    def _new_output(self, bid, leading=()):
        shape, dtype = self._specs[bid]
        return np.empty(leading + shape, dtype)

    def _bind(self, bids, arrays):
        bound, table = self._bound, self._table
        for bid, a in zip(bids, arrays):
            if bound[bid] is not a:
                table[bid] = _address(a)
                bound[bid] = a

    def _params(self, args, per_step=()):
        """Checked parameter arrays (for indices in `per_step`, a list: one per
        step). A donated one, whose buffer becomes an output's, is copied if it
        is read-only or passed for another parameter too."""
        bound = self._bound
        params = [[self._param(bid, a) for a in arg] if p in per_step else
                  arg if bound[bid] is arg else self._param(bid, arg)
                  for p, (bid, arg) in enumerate(zip(self.program.params, args))]
        repeated = self._donated and len(set(map(id, params))) < len(params)
        for p, bid in self._donated:
            a = params[p]
            if repeated and sum(x is a for x in params) > 1 or (
                    bound[bid] is not a and not a.flags.writeable):
                params[p] = a.copy()
        return params

    def _outputs(self, params, own=False):
        """Per output: its donated parameter's array, else (with `own`) the
        executable's own small buffer, else a fresh array."""
        return [params[p] if p is not None else small if own and small is not None
                else self._new_output(bid) for bid, p, small in self._plan]

    @one_call_at_a_time
    def __call__(self, args):
        params = self._params(args)
        self._bind(self.program.params, params)
        # Outputs callers keep (the variables' new values) go to fresh arrays, small
        # ones to the executable's own buffers, copied out after the call.
        outputs = self._outputs(params, own=True)
        self._bind(self.program.outputs, outputs)   # (a donated one is bound already)
        self._entry(self._table_address)
        return [out if small is None else small.copy()
                for (_, _, small), out in zip(self._plan, outputs)]

    @one_call_at_a_time
    def run_steps(self, n, args, per_step, carried, stacked_outputs):
        """The cluster `n` times in one native call.

        args: per parameter, its value (for indices in `per_step`, a list of n
        values: step s reads the s-th, in place, without stacking copies; Rows
        are gathered by the driver, stepper.py).
        carried: parameter index -> output index whose value the parameter
        takes from the step before (variables). Outputs in `stacked_outputs`
        come back with a leading [n] axis (every step's value); the others hold
        the last step's. A donated parameter is updated in place, so it needs
        no carrying.
        """
        program, steps = self.program, np.arange(n, dtype=np.int64)
        gathers = {p: g for p in per_step if (g := self._gather(program.params[p], args[p]))}
        params = self._params([gathers[p].ring[0] if p in gathers else a
                               for p, a in enumerate(args)], set(per_step) - set(gathers))
        # Two alternating sets for outputs kept from the last step only: a step
        # reads the previous step's set (carried variables) and writes the other.
        sets = [self._outputs(params) for _ in range(min(n, 2))]
        stacked = {o: self._new_output(program.outputs[o], (n,)) for o in stacked_outputs}
        slots, rows = [], []

        def patch(bid, pointers):
            slots.append(bid)
            rows.append(np.broadcast_to(pointers, (n,)))
        for p, (bid, a) in enumerate(zip(program.params, params)):
            if p in gathers:      # step s reads ring buffer s % RING
                ring = gathers[p].ring
                patch(bid, _address(ring) + steps % RING * (ring.nbytes // RING))
            elif p in per_step:
                patch(bid, [_address(x) for x in a])
            elif p in carried and carried[p] not in program.aliases:
                written = [_address(s[carried[p]]) for s in sets]
                patch(bid, np.concatenate([[_address(a)], np.resize(written, n - 1)]))
            else:
                patch(bid, _address(a))
        for o, bid in enumerate(program.outputs):
            if o in stacked:
                out = stacked[o]
                patch(bid, _address(out) + steps * (out.nbytes // n))
            elif o not in program.aliases:
                patch(bid, np.resize([_address(s[o]) for s in sets], n))
        pointers = np.ascontiguousarray(np.stack(rows), dtype=np.int64)
        slots = np.asarray(slots, np.int64)
        records = np.array([g.record for g in gathers.values()], np.int64)
        self._bound = [None] * len(self._bound)   # the table holds the last step's now
        run_steps()(ctypes.cast(self._entry, ctypes.c_void_p), self._table_address, n,
                    len(slots), slots.ctypes.data, pointers.ctypes.data, len(records),
                    records.ctypes.data, int(self._gather_ahead))
        last = sets[(n - 1) % 2]
        return [stacked[o] if o in stacked else last[o] for o in range(len(program.outputs))]

    def _gather(self, bid, values):
        """The _Gather where every step's value of parameter buffer `bid` is
        Rows of one source laid out as the parameter, else None (also where an
        index is out of range: gathering in numpy then raises the error)."""
        shape, dtype = self._specs[bid]
        source = getattr(values[0], "source", None)
        if source is None or source.dtype != dtype or not source.flags.c_contiguous \
                or source.shape[1:] != shape[1:] or not shape or not all(
                    type(v) is Rows and v.source is source and len(v.indices) == shape[0]
                    for v in values):
            return None
        indices = np.concatenate([v.indices for v in values]).astype(np.int64, copy=False)
        if indices.size and not 0 <= indices.min() <= indices.max() < len(source):
            return None
        ring = np.empty((RING, *shape), dtype)
        return _Gather(ring, indices, gather_record(
            ring=_address(ring), source=source.ctypes.data,
            row_bytes=ring.nbytes // RING // max(1, shape[0]), indices=indices.ctypes.data,
            rows=shape[0]))
