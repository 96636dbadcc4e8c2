"""The threads split kernels run on: one pool per process, in native code.

`kerasjit_split(task, table, chunk, extent)` runs `task` (a split kernel's
thread entry, parallel.call_split) on rows [0, extent) cut into one part per
thread, the parts run by the caller and the pool's workers. A thread
started per part and call (as kernels once did) cost more than a mid-size
kernel's share saves: a transformer's step of ~90 kernels ran faster on one
thread than split. A pooled worker takes its part within a cache line's
transfer while it spins, and sleeps on a condition variable once no work
came for a while (reports/tuning-measurements.md).

Workers are started on first use (as many as `kerasjit_threads` asks, less
one). The caller publishes a job, wakes them, and claims parts as they do,
one at a time, until none is left; it then waits only for parts running on
workers. A worker that is slow to wake (the machine busy) leaves its part
to whoever is free: the caller runs the job alone at worst, never waits
for a thread that has not started. The pool serves one call at a time: a
second thread calling in meanwhile runs its kernel whole, on itself. After
a fork the child starts a pool of its own. Parts and their rows are those
of the thread count, whoever runs them, so results are bit-identical to one
thread.
"""
import threading

import llvmlite.binding as llvm
from llvmlite import ir

from . import engine
from .llvm_types import I1, I32, I64, PTR, run_time_loop, while_loop

SPLIT_SYMBOL = "kerasjit_split"
THREADS_SYMBOL = "kerasjit_threads"     # the thread count (parallel.set_threads)

PART = ir.LiteralStructType([PTR, I64, I64, I64])     # table, chunk, lo, hi
TASK = ir.FunctionType(PTR, [PTR])                    # a pthread start routine
# (`task` typed as a function pointer: llvmlite calls through no other kind)
SPLIT = ir.FunctionType(ir.VoidType(), [TASK.as_pointer(), PTR, I64, I64])

MAX_WORKERS = 255       # (a job's parts: 16 bits of the claims word)
# Idle checks a worker makes before it sleeps: a `pause` each, 31 ns on the
# benchmark's AMD EPYC, so ~0.25 ms: the gap between a step's kernels and
# the short Python work between calls, not a whole step of TensorFlow's.
SPIN = 1 << 13
# Checks the caller makes for its workers' parts before it yields its core
# between checks (a worker descheduled on a busy machine).
CALLER_SPIN = 1 << 16
# glibc's pthread_mutex_t is 40 bytes, pthread_cond_t 48; zeros initialise both
# (as PTHREAD_MUTEX_INITIALIZER / PTHREAD_COND_INITIALIZER do, musl's too).
SYNC_BYTES = 64

_linked = []
_link_lock = threading.Lock()


def link():
    """Compile the pool into this process once; split kernels link to it."""
    with _link_lock:        # (a background compile and the main thread may both ask)
        if not _linked:
            code = engine.object_code(engine.optimize(str(_module()), unroll=False))
            address = engine.load_objects([code], SPLIT_SYMBOL)
            llvm.add_symbol(SPLIT_SYMBOL, address)
            _linked.append(address)


def declare_split(module):
    """`kerasjit_split` as declared in a kernel module."""
    fn = module.globals.get(SPLIT_SYMBOL)
    return fn if fn is not None else ir.Function(module, SPLIT, SPLIT_SYMBOL)


def _global(module, name, ty, align=8):
    g = ir.GlobalVariable(module, ty, name)
    g.initializer = ir.Constant(ty, None)
    g.linkage = "internal"
    g.align = align
    return g


class _Pool:
    """The pool's module under construction: its state and helpers."""

    def __init__(self):
        self.module = m = ir.Module(name="kerasjit_pool")
        fn = lambda name, result, args: ir.Function(m, ir.FunctionType(result, args), name)
        self.create = fn("pthread_create", I32, [PTR, PTR, PTR, PTR])
        self.detach = fn("pthread_detach", I32, [I64])
        self.lock, self.unlock, self.broadcast = (
            fn(f"pthread_{n}", I32, [PTR]) for n in ("mutex_lock", "mutex_unlock",
                                                     "cond_broadcast"))
        self.wait = fn("pthread_cond_wait", I32, [PTR, PTR])
        self.getpid = fn("getpid", I32, [])
        self.yield_ = fn("sched_yield", I32, [])
        self.memset = fn("llvm.memset.p0.i64", ir.VoidType(), [PTR, ir.IntType(8), I64, I1])
        x86 = engine.is_x86()
        self.pause = fn("llvm.x86.sse2.pause", ir.VoidType(), []) if x86 else None
        self.fp_mode = [fn(f"llvm.x86.sse.{n}", ir.VoidType(), [PTR])
                        for n in ("stmxcsr", "ldmxcsr")] if x86 else None
        self.threads = ir.GlobalVariable(m, I64, THREADS_SYMBOL)
        g = lambda name, ty=I64: _global(m, name, ty)
        self.pid, self.busy = g("pool_pid", I32), g("pool_busy", I32)
        self.workers, self.sleepers, self.claims, self.done = (
            g(f"pool_{n}") for n in ("workers", "sleepers", "claims", "done"))
        # the job's fields, written before its `claims` word is
        self.job = {name: g(f"job_{name}", ty) for name, ty in (
            ("task", I64), ("table", I64), ("chunk", I64), ("extent", I64), ("fp_mode", I32))}
        sync = ir.ArrayType(ir.IntType(8), SYNC_BYTES)
        self.mutex, self.cond = _global(m, "pool_mutex", sync, 64), _global(m, "pool_cond", sync, 64)

    # ------------------------------------------------------------ helpers
    @staticmethod
    def atomic_load(b, ptr, ty=I64, ordering="acquire"):
        return b.load_atomic(ptr, ordering, _size(ty), typ=ty)

    @staticmethod
    def atomic_store(b, value, ptr, ordering="release"):
        # (an exchange: llvmlite's store_atomic wants a typed pointer)
        b.atomic_rmw("xchg", ptr, value, ordering)

    def relax(self, b):
        if self.pause is not None:
            b.call(self.pause, [])

    def spin_until(self, b, fn, ready, spins, then):
        """Check `ready()` up to `spins` times (relaxing between); then, while
        still not ready, `then()` between checks. Leaves `b` after."""
        check, relax, slow, done = (fn.append_basic_block(n) for n in
                                    ("check", "relax", "slow", "ready"))
        pre = b.block
        b.branch(check)
        b.position_at_end(check)
        count = b.phi(I64)
        count.add_incoming(ir.Constant(I64, 0), pre)
        b.cbranch(ready(), done, relax)
        b.position_at_end(relax)
        self.relax(b)
        nxt = b.add(count, ir.Constant(I64, 1))
        count.add_incoming(nxt, b.block)
        b.cbranch(b.icmp_unsigned("<", nxt, ir.Constant(I64, spins)), check, slow)
        b.position_at_end(slow)
        then()
        b.cbranch(ready(), done, slow)
        b.position_at_end(done)

    def run_parts(self, b, fn, generation, part, mode):
        """Claim and run parts of job `generation` until none is left: a
        claim is a compare-and-swap of the `claims` word, {generation:32,
        parts:16, next part:16}; a part's rows are [extent * k / parts,
        extent * (k + 1) / parts). `part`, `mode`: room for a PART and an
        MXCSR value (None: the caller's own mode stays)."""
        claim, run, done = (fn.append_basic_block(n) for n in ("claim", "run", "claimed"))
        b.branch(claim)
        b.position_at_end(claim)
        word = self.atomic_load(b, self.claims)
        field = lambda shift: b.and_(b.lshr(word, ir.Constant(I64, shift)),
                                     ir.Constant(I64, 0xFFFF))
        k, parts = field(0), field(16)
        current = b.icmp_unsigned("==", b.lshr(word, ir.Constant(I64, 32)), generation)
        left = b.and_(current, b.icmp_unsigned("<", k, parts))
        take = fn.append_basic_block("take")
        b.cbranch(left, take, done)
        b.position_at_end(take)
        won = b.extract_value(b.cmpxchg(self.claims, word, b.add(word, ir.Constant(I64, 1)),
                                        "acq_rel", "acquire"), 1)
        b.cbranch(won, run, claim)
        b.position_at_end(run)
        # (the fields stay as they are until every part of the job is done)
        job = {name: self.atomic_load(b, g, g.value_type, "monotonic")
               for name, g in self.job.items()}
        if mode is not None and self.fp_mode:     # the caller's: denormals flushed (codegen.py)
            b.store(job["fp_mode"], mode)
            b.call(self.fp_mode[1], [mode])
        rows = [b.sdiv(b.mul(job["extent"], x), parts) for x in (k, b.add(k, ir.Constant(I64, 1)))]
        for i, value in enumerate([b.inttoptr(job["table"], PTR), job["chunk"]] + rows):
            b.store(value, b.gep(part, [ir.Constant(I32, 0), ir.Constant(I32, i)]))
        b.call(b.inttoptr(job["task"], TASK.as_pointer()), [part])
        b.atomic_rmw("add", self.done, ir.Constant(I64, 1), "release")
        b.branch(claim)
        b.position_at_end(done)

    # ------------------------------------------------------------ functions
    def worker(self):
        """void *pool_worker(arg): wait for a job, help run its parts, for ever."""
        fn = ir.Function(self.module, TASK, "pool_worker")
        fn.linkage = "internal"
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        seen, mode, part = b.alloca(I64), b.alloca(I32), b.alloca(PART)
        b.store(ir.Constant(I64, 0), seen)
        loop = fn.append_basic_block("wait")
        b.branch(loop)
        b.position_at_end(loop)
        last = b.load(seen, typ=I64)

        def generation():
            word = self.atomic_load(b, self.claims, ordering="seq_cst")
            return b.lshr(word, ir.Constant(I64, 32))

        def new_job():
            return b.icmp_unsigned("!=", generation(), last)

        def sleep():
            b.call(self.lock, [self.mutex])
            b.atomic_rmw("add", self.sleepers, ir.Constant(I64, 1), "seq_cst")
            while_loop(b, fn, lambda: b.not_(new_job()),
                       lambda: b.call(self.wait, [self.cond, self.mutex]))
            b.atomic_rmw("sub", self.sleepers, ir.Constant(I64, 1), "seq_cst")
            b.call(self.unlock, [self.mutex])
        self.spin_until(b, fn, new_job, SPIN, sleep)
        now = generation()
        b.store(now, seen)
        self.run_parts(b, fn, now, part, mode)
        b.branch(loop)
        return fn

    def split(self, worker):
        fn = ir.Function(self.module, SPLIT, SPLIT_SYMBOL)
        task, table, chunk, extent = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        one, zero = ir.Constant(I64, 1), ir.Constant(I64, 0)
        part, thread_id, mode = b.alloca(PART), b.alloca(I64), b.alloca(I32)
        n = b.load(self.threads, typ=I64)
        n = b.select(b.icmp_signed("<", extent, n), extent, n)       # no empty parts
        n = b.select(b.icmp_signed(">", n, ir.Constant(I64, MAX_WORKERS + 1)),
                     ir.Constant(I64, MAX_WORKERS + 1), n)
        whole, pooled, claim = (fn.append_basic_block(x) for x in ("whole", "pooled", "claim"))
        b.cbranch(b.icmp_signed("<=", n, one), whole, claim)
        b.position_at_end(claim)
        claimed = b.extract_value(
            b.cmpxchg(self.busy, ir.Constant(I32, 0), ir.Constant(I32, 1), "acquire", "monotonic"),
            1)
        b.cbranch(claimed, pooled, whole)       # (busy: another thread's kernel has the pool)

        b.position_at_end(whole)
        for i, value in enumerate([table, chunk, zero, extent]):
            b.store(value, b.gep(part, [ir.Constant(I32, 0), ir.Constant(I32, i)]))
        b.call(task, [part])
        b.ret_void()

        b.position_at_end(pooled)
        pid = b.call(self.getpid, [])
        with b.if_then(b.icmp_signed("!=", b.load(self.pid, typ=I32), pid)):
            # a new process (or a fork's child, whose workers did not come along)
            for g in (self.workers, self.sleepers):
                b.store(zero, g)
            for sync in (self.mutex, self.cond):
                b.call(self.memset, [sync, ir.Constant(ir.IntType(8), 0),
                                     ir.Constant(I64, SYNC_BYTES), ir.Constant(I1, 0)])
            b.store(pid, self.pid)

        def start(i):
            rc = b.call(self.create, [thread_id, ir.Constant(PTR, None), worker,
                                      ir.Constant(PTR, None)])
            with b.if_then(b.icmp_signed("==", rc, ir.Constant(I32, 0))):
                b.call(self.detach, [b.load(thread_id, typ=I64)])
                b.store(b.add(i, one), self.workers)
        run_time_loop(b, fn, b.load(self.workers, typ=I64), b.sub(n, one), start)
        for name, value in (("task", b.ptrtoint(task, I64)), ("table", b.ptrtoint(table, I64)),
                            ("chunk", chunk), ("extent", extent)):
            self.atomic_store(b, value, self.job[name], "monotonic")
        if self.fp_mode:
            b.call(self.fp_mode[0], [mode])
            self.atomic_store(b, b.load(mode, typ=I32), self.job["fp_mode"], "monotonic")
        self.atomic_store(b, zero, self.done, "monotonic")
        generation = b.add(b.lshr(b.load(self.claims, typ=I64), ir.Constant(I64, 32)), one)
        generation = b.and_(generation, ir.Constant(I64, 0xFFFFFFFF))
        self.atomic_store(b, b.or_(b.shl(generation, ir.Constant(I64, 32)),
                                   b.shl(n, ir.Constant(I64, 16))), self.claims, "seq_cst")
        sleeping = self.atomic_load(b, self.sleepers, ordering="seq_cst")
        with b.if_then(b.icmp_signed(">", sleeping, zero)):
            b.call(self.lock, [self.mutex])
            b.call(self.broadcast, [self.cond])
            b.call(self.unlock, [self.mutex])
        self.run_parts(b, fn, generation, part, None)
        # (every part is claimed: wait for those still running on workers)
        self.spin_until(b, fn, lambda: b.icmp_signed(
            "==", self.atomic_load(b, self.done), n), CALLER_SPIN,
            lambda: b.call(self.yield_, []))
        self.atomic_store(b, ir.Constant(I32, 0), self.busy)
        b.ret_void()
        return fn


def _size(ty):
    return 4 if ty == I32 else 8       # (the state's types: i32, i64, ptr)


def _module():
    pool = _Pool()
    pool.split(pool.worker())
    return pool.module
