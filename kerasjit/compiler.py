"""The compile driver: HLO module -> HLO passes -> lowering -> kernel-IR passes -> a backend.

    Backend.compile(module)
      optimize_as_configured     HLO passes, in place (explain() shows the module as compiled;
                                 the planner's modules come optimised, from the cache)
      backend.cached(key)        code built before for the same module, if the backend keeps any
      lower                      kernel IR: fusion decisions, loop kernels, GEMM calls
        KERNEL_PASSES            each followed by the kernel-IR verifier with KERASJIT_DEBUG=1
      backend.build(program)     render, compile, load: the Executable

Where a device's own compiler rejects generated code, the cluster runs on the
backend's fallback (the CPU for the GPU) with a warning naming the cause.
"""
import abc
import contextlib
import functools
import gc
import os

from .arrays import host
from .cancel import checkpoint
from .errors import DeviceCompilerError, NotCached, warn
from .kernels.aliasing import alias_donated
from .kernels.collapse import collapse_loops
from .kernels.epilogues import fuse_epilogues
from .kernels.lower import lower_module
from .kernels.multi_output import fuse_reduction_producers
from .kernels.split_dims import split_loops
from .kernels.split_reductions import split_reductions
from .kernels.storage import assign_storage
from .kernels.unread import drop_unread_stores
from .kernels.verifier import verify_kernels
from .passes import optimize_as_configured


def kernel_passes(target, donate=None):
    """The kernel-IR passes after lowering for `target`, in order. donate:
    {parameter index: output index} whose memory the caller gives up."""
    return [functools.partial(alias_donated, donate=donate),    # updates written in place
            drop_unread_stores,                                # temporaries nothing reads
            *([fuse_epilogues] if target.implicit_gemm else []),   # bias/activation into GEMMs
            *([split_reductions] if target.split_reductions else []),  # rows shared by threads
            *([fuse_reduction_producers] if target.multi_output_reductions else []),  # one pass
            assign_storage,                                    # temporaries share memory
            split_loops,                                       # runs a reshape splits, looped
            collapse_loops]                                    # flat loops where dims only address


def lower(module, target, donate=None, verify=None):
    """The KernelProgram a backend with `target` (kernels/target.py) builds of
    optimised `module`: lowered, then the kernel passes. verify: the kernel-IR
    verifier after lowering and each pass (default: with KERASJIT_DEBUG=1)."""
    if verify is None:
        verify = bool(os.environ.get("KERASJIT_DEBUG"))
    check = verify_kernels if verify else (lambda program: None)
    program = lower_module(module, target)
    check(program)
    for kernel_pass in kernel_passes(target, donate):
        program = kernel_pass(program)
        check(program)
    return program


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off while a cluster builds: lowering
    and rendering allocate enough to set off full collections, each a walk over
    every object TensorFlow and Keras hold (a third of a second of the MNIST
    CNN's build). What the build leaves is collected afterwards, as usual."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Executable(abc.ABC):
    """A compiled cluster: a list of arrays in, a list of arrays out."""
    program = None      # the KernelProgram it runs (explain(), the profiler)
    kernels = ()        # (name, source) of each generated function (explain())
    buffer_bytes = 0    # memory its buffers hold between calls
    multi_step = False  # whether it has run_steps: n steps in one call (runtime/program.py)
    cache_key = None    # what the backend's compile cache keeps its code under, if it does

    @abc.abstractmethod
    def __call__(self, args):
        """The outputs of one run on `args`."""


class Backend(abc.ABC):
    name = None
    races_tensorflow = False    # whether a compiled cluster must beat TensorFlow's (race.py)
    fallback = None             # the backend a cluster its device compiler rejects runs on
    target = None               # what lowering asks of it (kernels/target.py)
    optimizes = True            # whether it runs the HLO passes on what it compiles

    def compile(self, module, donate=None, optimized=False, only_cached=False):
        """`module` optimised in place (unless `optimized`: the HLO passes ran
        already) and built. donate: {parameter index: output index} whose memory
        the caller gives up (kernels/aliasing.py). `only_cached`: NotCached
        unless the backend's cache holds its code."""
        checkpoint()
        if not optimized:
            optimize_as_configured(module)
            checkpoint()
        try:
            return self.compile_optimized(module, donate, only_cached)
        except DeviceCompilerError as e:
            if self.fallback is None:
                raise
            warn(f"kerasjit: {e}; this cluster runs on the {self.fallback.name.upper()} backend")
            return OnHost(self.fallback.compile_optimized(module, donate), str(e))

    def compile_optimized(self, module, donate, only_cached=False):
        key = self.cache_key(module, donate)
        executable = self.cached(key)
        if executable is None and only_cached:
            raise NotCached(f"the {self.name} backend holds no code for this module")
        if executable is None:
            with _collector_paused():
                program = lower(module, self.target, donate)
                checkpoint()
                executable = self.build(program, key)
        return executable

    def cache_key(self, module, donate):
        """What identifies the code this backend builds of optimised `module`
        (None: it keeps no code)."""
        return None

    def cached(self, key):
        """The Executable built before under `key`, or None."""
        return None

    def build(self, program, key):
        """The Executable of kernel program `program` (kept under `key`)."""
        raise NotImplementedError(f"the {self.name} backend builds no kernel programs")


class OnHost(Executable):
    """A cluster run by a host backend on host copies of its arguments."""

    def __init__(self, executable, reason):
        self.inner, self.reason = executable, reason
        self.program, self.kernels = executable.program, executable.kernels

    def __call__(self, args):
        return self.inner([host(a) for a in args])
