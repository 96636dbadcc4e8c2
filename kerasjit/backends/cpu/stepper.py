"""Several steps in one native call: a loop that re-points a cluster's buffer
table between calls of its entry, and gathers shuffled batches on the way.

Everything that changes from step to step is a buffer pointer (batch,
variables, outputs); the caller precomputes them as a [slots, steps] matrix,
so n steps cost one ctypes call and no Python per step.

A shuffled batch (arrays.Rows) is copied row by row into one of RING
buffers. Where the caller allows it (a core left free: no OpenBLAS threads
spinning), one thread per call gathers step s + 1's rows while step s runs;
the two meet through counters (steps gathered, steps done), waiting by
yielding. Otherwise the loop gathers each step's rows before running it.
"""
import ctypes

from llvmlite import ir

from . import engine
from .llvm_types import I1, I32, I64, PTR, run_time_loop
from .parallel import TASK, pthreads

_NAME = "kerasjit_run_steps"
RING = 2                # gathered batches in flight: the one a step reads, the next
# A gather record's i64 fields, in order (gather_record builds one).
_GATHER = ("ring", "source", "row_bytes", "indices", "rows")
# The gathering thread's context: the driver's arguments it needs, and the counters.
_CONTEXT = ("gathers", "count", "steps", "gathered", "done")
_I8 = ir.IntType(8)
_driver = None


def gather_record(ring, source, row_bytes, indices, rows):
    """One gather for the driver: step s copies rows `indices[s * rows:][:rows]`
    of `source` (rows of `row_bytes`) into ring buffer s % RING (addresses)."""
    fields = {"ring": ring, "source": source, "row_bytes": row_bytes, "indices": indices,
              "rows": rows}
    return [fields[f] for f in _GATHER]


class _Builder:
    """The driver's module under construction, with its few helpers."""

    def __init__(self):
        self.module = ir.Module(name=_NAME)
        m = self.module
        self.memcpy = ir.Function(m, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I1]),
                                  "llvm.memcpy.p0.p0.i64")
        self.yield_ = ir.Function(m, ir.FunctionType(I32, []), "sched_yield")
        self.create, self.join, self.threads = pthreads(m)

    @staticmethod
    def at(b, base, i, kind=I64):
        return b.load(b.gep(base, [i], source_etype=kind), typ=kind)

    def gather(self, b, fn, gathers, g, s):
        """Step s's rows of each of the g gathers into its ring buffer."""
        zero = ir.Constant(I64, 0)

        def one(i):
            def field(name, kind=I64):
                return self.at(b, gathers, b.add(b.mul(i, ir.Constant(I64, len(_GATHER))),
                                                 ir.Constant(I64, _GATHER.index(name))), kind)
            ring, src, indices = (field(f, PTR) for f in ("ring", "source", "indices"))
            row_bytes, rows = field("row_bytes"), field("rows")
            slot = b.urem(s, ir.Constant(I64, RING))
            dest = b.gep(ring, [b.mul(b.mul(slot, rows), row_bytes)], source_etype=_I8)
            first = b.mul(s, rows)

            def row(r):
                source = self.at(b, indices, b.add(first, r))
                b.call(self.memcpy, [b.gep(dest, [b.mul(r, row_bytes)], source_etype=_I8),
                                     b.gep(src, [b.mul(source, row_bytes)], source_etype=_I8),
                                     row_bytes, ir.Constant(I1, 0)])
            run_time_loop(b, fn, zero, rows, row)
        run_time_loop(b, fn, zero, g, one)

    def wait_until(self, b, fn, ready):
        """Spin (yielding the core) until `ready()` (an i1 built at each try)."""
        check, wait, done = (fn.append_basic_block(x) for x in ("check", "wait", "go"))
        b.branch(check)
        b.position_at_end(check)
        b.cbranch(ready(), done, wait)
        b.position_at_end(wait)
        b.call(self.yield_, [])
        b.branch(check)
        b.position_at_end(done)

    def counter(self, b, where):
        return b.load_atomic(where, "acquire", 8, typ=I64)

    def publish(self, b, value, where):
        b.store_atomic(value, where, "release", 8)

    def producer(self):
        """`ptr gatherer(ptr context)`: context {gathers, g, n, &gathered, &done};
        gathers steps 0..n-1 in order, at most RING ahead of the steps done."""
        fn = ir.Function(self.module, TASK, f"{_NAME}_gatherer")
        fn.linkage = "internal"
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        context = fn.args[0]
        gathers, g, n, gathered, done = (self.at(b, context, ir.Constant(I64, f))
                                         for f in range(len(_CONTEXT)))
        gathers = b.inttoptr(gathers, PTR)
        # (atomics in llvmlite want typed pointers)
        gathered, done = (b.inttoptr(x, I64.as_pointer()) for x in (gathered, done))

        def step(s):
            self.wait_until(b, fn, lambda: b.icmp_signed(
                "<", b.sub(s, self.counter(b, done)), ir.Constant(I64, RING)))
            self.gather(b, fn, gathers, g, s)
            self.publish(b, b.add(s, ir.Constant(I64, 1)), gathered)
        run_time_loop(b, fn, ir.Constant(I64, 0), n, step)
        b.ret(ir.Constant(PTR, None))
        return fn

    def driver(self):
        """void run_steps(entry, table, n, k, slots, pointers, g, gathers, ahead):
        for s < n:
            step s's rows of the g gathers (by a thread gathering ahead, if
            `ahead` allows one and the process may use more than one core)
            for j < k: table[slots[j]] = pointers[j * n + s]
            entry(table)"""
        gatherer = self.producer()
        # A typed pointer: llvmlite takes an indirect call's signature from its callee's type.
        entry_type = ir.FunctionType(ir.VoidType(), [PTR]).as_pointer()
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [
            entry_type, PTR, I64, I64, PTR, PTR, I64, PTR, I64]), _NAME)
        entry, table, n, k, slots, pointers, g, gathers, ahead = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        zero, one = ir.Constant(I64, 0), ir.Constant(I64, 1)
        gathered, done, thread = (b.alloca(I64) for _ in range(3))
        context = b.alloca(I64, size=len(_CONTEXT))
        for f, value in enumerate((gathers, g, n, gathered, done)):
            if isinstance(value.type, ir.PointerType):
                value = b.ptrtoint(value, I64)
            b.store(value, b.gep(context, [ir.Constant(I64, f)], source_etype=I64))
        b.store(zero, gathered)
        b.store(zero, done)
        # A thread to gather ahead where there is something to gather and a core for it.
        helped = b.alloca(I1)
        b.store(ir.Constant(I1, 0), helped)
        wanted = b.and_(b.and_(b.icmp_signed(">", g, zero), b.icmp_signed("!=", ahead, zero)),
                        b.icmp_signed(">", b.load(self.threads, typ=I64), one))
        with b.if_then(wanted):
            rc = b.call(self.create, [thread, ir.Constant(PTR, None), gatherer, context])
            b.store(b.icmp_signed("==", rc, ir.Constant(I32, 0)), helped)
        ahead = b.load(helped, typ=I1)

        def step(s):
            with b.if_else(ahead) as (threaded, alone):
                with threaded:
                    self.wait_until(b, fn, lambda: b.icmp_signed(
                        ">", self.counter(b, gathered), s))
                with alone:
                    self.gather(b, fn, gathers, g, s)
            run_time_loop(b, fn, zero, k, lambda j: b.store(
                self.at(b, pointers, b.add(b.mul(j, n), s), PTR),
                b.gep(table, [self.at(b, slots, j)], source_etype=PTR)))
            b.call(entry, [table])
            self.publish(b, b.add(s, one), done)
        run_time_loop(b, fn, zero, n, step)
        with b.if_then(ahead):
            b.call(self.join, [b.load(thread, typ=I64), ir.Constant(PTR, None)])
        b.ret_void()
        return self.module


_DRIVER = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                           ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                           ctypes.c_void_p, ctypes.c_int64)


def run_steps():
    """The driver as a ctypes function (built and linked once per process)."""
    global _driver
    if _driver is None:
        module = engine.optimize(_Builder().driver())
        _driver = _DRIVER(engine.load_objects([engine.object_code(module)], _NAME))
    return _driver
