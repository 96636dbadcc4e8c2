"""The CPU backend: HLO passes -> fused kernels -> LLVM (llvmlite) -> one native call per cluster.

KERASJIT_DEBUG=1 runs the HLO and kernel-IR verifiers after every pass; KERASJIT_DUMP_DIR=path
writes the module after each pass there; KERASJIT_PROFILE_KERNELS=1 times every
kernel (kerasjit.kernel_profile()).
"""
import dataclasses
import threading

from ...cancel import checkpoint
from ...compiler import Backend
from ...kernels.ir import LoopKernel, leaf_steps
from ...kernels.target import Target
from . import cache, engine, parallel, profile, thread_pool, workers
from .blas import register_blas_symbols
from .codegen import long_running, render_program
from .executable import CpuExecutable
from .module_split import split_module

def has_long_loops(program):
    """Whether a loop kernel of `program` gains from LLVM's loop unrolling
    (codegen.long_running): the module is then optimised with it, and only
    those kernels' loops are unrolled."""
    return any(long_running(k) for k in leaf_steps(program.steps) if isinstance(k, LoopKernel))


# Modules shorter than this compile in one piece: in two, the LLVM time saved
# (~a tenth of a second on one of 50 kB) no longer outweighs a second module's
# fixed costs.
SPLIT_FROM_CHARS = 50_000


def _interruptibly(fn):
    """fn(), made on a thread of its own while this one waits: Python runs a
    Ctrl-C's handler only between calls into C, and LLVM's can take seconds;
    the wait takes it at once (the thread finishes its call, unused)."""
    result, done = [], threading.Event()

    def call():
        try:
            result.append((True, fn()))
        except BaseException as e:          # raised again on the waiting thread
            result.append((False, e))
        done.set()
    threading.Thread(target=call, name="kerasjit-llvm", daemon=True).start()
    done.wait()
    ok, value = result[0]
    if not ok:
        raise value
    return value


def _object_code(llvm_ir, name, unroll):
    """The object code of program `name`'s module, compiled by the compile
    workers (in parts, side by side, where it is long enough)."""
    def here(text):     # (no worker took it, or its worker died: LLVM aborted there)
        return _interruptibly(lambda: engine.object_code(
            engine.optimize(text, unroll, loop_vectorize=False)))
    texts = [llvm_ir] if len(llvm_ir) < SPLIT_FROM_CHARS else split_module(
        llvm_ir, f"{name}_", f"{name}_entry", workers.pool.parallelism())
    return workers.pool.compile(texts, unroll, here)


def _record(program, name, blas_threads_local, timed):
    """What the cache keeps of kernel program `program`: its native code."""
    llvm_ir, kernels, counters = render_program(
        program, name, blas_threads_local, engine.vector_lanes(), engine.is_x86(), timed)
    checkpoint()
    # What the executable needs of the program; expressions live in the code now.
    return {"program": dataclasses.replace(program, steps=[]),
            "objects": _object_code(llvm_ir, name, has_long_loops(program)),
            "entry": f"{name}_entry", "kernels": cache.Listings.of(kernels),
            "cores_free": parallel.cores_free(program.steps, blas_threads_local),
            "counters": counters and (counters.global_name, counters.labels, counters.flops)}


class CpuBackend(Backend):
    name = "cpu"
    races_tensorflow = True     # a compiled cluster keeps its place only if faster (race.py)
    # Batched products under 1024 (M*N*K) cost an sgemm call per batch index as
    # much as a loop; a patch matrix goes to sgemm in few large calls, since each
    # call synchronises the threads it is split over, which stalls under CPU
    # contention (reports/tuning-measurements.md).
    target = Target(implicit_gemm=True, implicit_dots=True, min_batched_product=1024,
                    patch_budget_bytes=64 << 20, split_reductions=True, strided_features=True,
                    multi_output_reductions=True)

    def __init__(self):
        self.loaded = {}    # cache key -> (record, entry address) linked into this process

    def cache_key(self, module, donate):
        """The module's code, this host and how its sgemm and timing run."""
        host = (f"{engine.host_description()} blas-threads-local:{register_blas_symbols()}"
                f"{' kernel-profile' if profile.enabled() else ''} {self.target}")
        return cache.cache_key(module, host, donate)

    def cached(self, key):
        """Code built for `key` in this process (shared) or on disk (loaded)."""
        if key not in self.loaded:
            record = cache.load(key)
            if record is None:
                return None
            self._load(key, record)
        return self._executable(key)

    def build(self, program, key):
        """Native code for kernel program `program`, kept in the compile cache."""
        record = _record(program, f"cluster_{key[:16]}", register_blas_symbols(),
                         profile.enabled())
        cache.store(key, record)
        self._load(key, record)
        return self._executable(key)

    def _load(self, key, record):
        thread_pool.link()         # (what split kernels call)
        address = engine.load_objects(record["objects"], record["entry"])
        if record.get("counters"):
            global_name, labels, flops = record["counters"]
            profile.register(record["entry"].removesuffix("_entry"), labels, flops,
                             engine.global_address(global_name))
        self.loaded[key] = (record, address)

    def _executable(self, key):
        record, address = self.loaded[key]
        executable = CpuExecutable(record["program"], address, record["kernels"],
                                   record["cores_free"])
        executable.cache_key = key
        return executable


BACKEND = CpuBackend()
