"""The CPU backend: HLO passes -> fused kernels -> LLVM (llvmlite) -> one native call per cluster.

KERASJIT_DEBUG=1 runs the HLO verifier after every pass; KERASJIT_DUMP_DIR=path
writes the module after each pass there; KERASJIT_PROFILE_KERNELS=1 times every
kernel (kerasjit.kernel_profile()).
"""
import dataclasses
import math

from ... import __version__
from ...kernels.ir import LoopKernel, Reduce, leaf_steps, walk
from ...kernels.lower import lower
from ...passes import optimize, optimize_as_configured
from . import cache, engine, parallel, profile
from .blas import register_blas_symbols
from .codegen import render_program
from .executable import CpuExecutable

# Iterations from which loops gain from unrolling. Measured: without unrolling
# the elephant CNN's step (kernels of up to ~10^8 iterations) took 3x as long;
# the softmax regression's and MLP's (up to ~2*10^5) ran as fast and compiled
# in a third of the optimiser's time.
LONG_LOOP = 1 << 22


def has_long_loops(program):
    """Whether a loop kernel runs LONG_LOOP innermost iterations or more (its
    elements times its longest reduction)."""
    def work(kernel):
        folds = [math.prod(n.extents) for _, e in kernel.stores for n in walk(e)
                 if isinstance(n, Reduce)]
        return math.prod(kernel.dims) * max(folds, default=1)
    return any(work(k) >= LONG_LOOP for k in leaf_steps(program.steps)
               if isinstance(k, LoopKernel))


class CpuBackend:
    name = "cpu"
    races_tensorflow = True     # a compiled cluster keeps its place only if faster (race.py)

    def __init__(self):
        self.loaded = {}    # cache key -> (record, entry address) linked into this process

    def compile(self, module, donate=None):
        """Optimise `module` (in place: explain() shows what was compiled) and build it,
        or take the native code from the compile cache. donate: {parameter index:
        output index} whose memory the caller gives up (kernels/aliasing.py)."""
        blas_threads_local = register_blas_symbols()
        timed = profile.enabled()
        host = (f"{engine.host_description()} blas-threads-local:{blas_threads_local}"
                f"{' kernel-profile' if timed else ''}")
        key = cache.cache_key(module, host, __version__, donate)
        if key in self.loaded:          # same HLO again in this process: share the code
            optimize(module)
            record, address = self.loaded[key]
            return CpuExecutable(record["program"], address, record["kernels"],
                                 record["cores_free"])
        record = cache.load(key)
        if record is None:
            optimize_as_configured(module)
            program = lower(module, donate, implicit_gemm=True)
            name = f"cluster_{key[:16]}"
            threading = parallel.sgemm_threading(program.steps, blas_threads_local)
            llvm_ir, kernels, counters = render_program(
                program, name, blas_threads_local, engine.vector_lanes(), engine.is_x86(), timed,
                threading)
            code = engine.object_code(engine.optimize(llvm_ir, has_long_loops(program)))
            # What the executable needs of the program; expressions live in the code now.
            record = {"program": dataclasses.replace(program, steps=[]),
                      "object": code, "entry": f"{name}_entry", "kernels": kernels,
                      "cores_free": threading[1],
                      "counters": counters and (counters.global_name, counters.labels)}
            cache.store(key, record)
        else:
            optimize(module)     # explain() shows the HLO as compiled either way
        address = engine.load_object(record["object"], record["entry"])
        if record.get("counters"):
            global_name, labels = record["counters"]
            profile.register(record["entry"].removesuffix("_entry"), labels,
                             engine.global_address(global_name))
        self.loaded[key] = (record, address)
        return CpuExecutable(record["program"], address, record["kernels"],
                             record["cores_free"])


BACKEND = CpuBackend()
