"""A compiled cluster on a device: its buffers resident there, kernels launched in order.

Buffers have fixed device addresses for the executable's life and their
table is uploaded once, so every call's launches are the same: after the first
call they are captured as one CUDA graph and replayed (not for clusters with
GEMMs: CuPy's cuBLAS calls refuse a capturing stream; nor with while loops,
whose condition the host reads on each iteration). Arguments are copied
into the parameter buffers, except a donated array this executable handed
out; outputs are copied out, except donated ones. `device` (device.py)
supplies memory, kernels and cuBLAS; tests use a host emulation of it.
"""
import threading

from ...compiler import Executable
from ...hlo.shape import DTYPES
from ...kernels.ir import ChunkLoop, GemmCall, WhileLoop
from .. import one_call_at_a_time
from .cuda_render import launch_threads


class GpuExecutable(Executable):
    def __init__(self, program, device, functions, kernels):
        """functions: id(LoopKernel) -> the device's compiled function;
        kernels: [(name, CUDA C)] for explain()."""
        self.program, self.device, self.kernels = program, device, kernels
        self._turn = threading.Lock()
        xp = device.xp
        slots = [xp.empty(n, xp.uint8) for n in program.slot_bytes]
        self._arrays = []
        for buf in program.buffers:
            dtype = DTYPES[buf.dtype]
            if buf.role == "temp":
                memory = slots[program.storage[buf.id]][:buf.nbytes]
                self._arrays.append(memory.view(dtype).reshape(buf.dims))
            elif buf.role == "constant":
                self._arrays.append(device.upload(buf.data, dtype))
            else:
                self._arrays.append(xp.empty(tuple(buf.dims), dtype))
        for o, p in program.aliases.items():      # written over its parameter
            self._arrays[program.outputs[o]] = self._arrays[program.params[p]]
        self._slots = slots
        self._table = device.upload([device.pointer(a) for a in self._arrays], "uint64")
        self._flat = [a.reshape(-1) for a in self._arrays]
        self._launches = self._schedule(program.steps, functions)
        self._graph, self._calls = None, 0
        # CuPy refuses cuBLAS calls while a stream is being captured, and a
        # graph cannot branch: a cluster with GEMMs or loops launches its
        # steps one by one.
        self._capturable = not any(launch[0] in ("gemm", "while") for launch in self._launches)
        self._staging = {}      # pinned upload buffers, per parameter buffer

    @property
    def buffer_bytes(self):
        return sum(s.nbytes for s in self._slots) + sum(
            a.nbytes for b, a in zip(self.program.buffers, self._arrays) if b.role == "constant")

    def _schedule(self, steps, functions, chunk=0):
        """The call's launches in order: ("kernel", function, threads wanted, chunk),
        ("gemm", GemmCall, chunk) and ("while", test's launches, condition buffer,
        body's launches); ChunkLoops unrolled."""
        launches = []
        for step in steps:
            if isinstance(step, ChunkLoop):
                for c in range(step.count):
                    launches += self._schedule(step.steps, functions, c)
            elif isinstance(step, WhileLoop):
                launches.append(("while", self._schedule(step.test, functions, chunk),
                                 step.condition, self._schedule(step.body, functions, chunk)))
            elif isinstance(step, GemmCall):
                launches.append(("gemm", step, chunk))
            else:
                launches.append(("kernel", functions[id(step)], launch_threads(step), chunk))
        return launches

    def _launch_all(self, launches=None):
        device, flat = self.device, self._flat
        for launch in self._launches if launches is None else launches:
            if launch[0] == "while":      # the host reads the condition each iteration
                _, test, condition, body = launch
                self._launch_all(test)
                while bool(flat[condition][0]):
                    self._launch_all(body)
                    self._launch_all(test)
            elif launch[0] == "gemm":
                _, call, chunk = launch
                device.gemm(call, flat[call.out], flat[call.lhs], flat[call.rhs], chunk)
            else:
                _, function, threads, chunk = launch
                device.launch(function, threads, self._table, chunk)

    def _run(self):
        # The first call loads the kernels and sets up cuBLAS; the second is captured.
        self._calls += 1
        if self._graph is None and self._calls == 2 and self._capturable:
            self._graph = self.device.capture(self._launch_all)
        if self._graph is not None:
            self.device.replay(self._graph)
        else:
            self._launch_all()

    def _copy_in(self, bid, value):
        target = self._arrays[bid]
        if value is target:     # a donated buffer handed out by the last call
            return
        buf = self.program.buffers[bid]
        if tuple(value.shape) != tuple(buf.dims):
            raise ValueError(f"parameter {buf.name}: expected shape {tuple(buf.dims)}, "
                             f"got {tuple(value.shape)}")
        self.device.copy_into(target, value, self._staging)

    @one_call_at_a_time
    def __call__(self, args):
        program = self.program
        with self.device.ordered():
            for bid, value in zip(program.params, args):
                self._copy_in(bid, value)
            self._run()
            return [self._arrays[bid] if o in program.aliases else self._arrays[bid].copy()
                    for o, bid in enumerate(program.outputs)]
