"""The JIT: optimise LLVM IR for the host CPU and load it into this process.

KERASJIT_CPU=avx2 (or avx512) generates code for that x86-64 level instead of
the host's own CPU: an AVX2-only machine's code, run and timed on one with
AVX-512 (x86-64-v3: AVX2 and FMA, 8 floats a vector; x86-64-v4: AVX-512).
Imports nothing of kerasjit's: the compile workers load this file alone.
"""
import functools
import os
import threading

import llvmlite.binding as llvm

_lock = threading.Lock()
_state = {}

# KERASJIT_CPU's values: LLVM's CPU, the vector ISA, the feature it needs here.
_LEVELS = {"avx2": ("x86-64-v3", "AVX2", "avx2"), "avx512": ("x86-64-v4", "AVX-512", "avx512f")}


def _level():
    """KERASJIT_CPU's level, or None for the host's own CPU."""
    chosen = os.environ.get("KERASJIT_CPU", "")
    if not chosen:
        return None
    if chosen not in _LEVELS:
        raise ValueError(f"KERASJIT_CPU={chosen!r}: expected one of {', '.join(_LEVELS)}")
    if not llvm.get_host_cpu_features().get(_LEVELS[chosen][2]):
        raise ValueError(f"KERASJIT_CPU={chosen}: this CPU has no {_LEVELS[chosen][1]}")
    return _LEVELS[chosen]


# LLVM's loop vectoriser keeps to 256-bit vectors on AVX-512 CPUs unless told (older
# Xeons clock down for 512-bit ones): whole 512-bit vectors ran the LSTM's step 5-10%
# faster on a Sapphire Rapids, the other steps level or faster
# (reports/tuning-measurements.md).
WHOLE_VECTORS = "-prefer-256-bit"


def _target():
    """The CPU and features code is generated for."""
    level = _level()
    cpu, features = level[0] if level else llvm.get_host_cpu_name(), \
        "" if level else llvm.get_host_cpu_features().flatten()
    return cpu, ",".join(f for f in (features, WHOLE_VECTORS) if f)


def _jit():
    """One MCJIT engine per process, for the target CPU and its features."""
    if not _state:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        target = llvm.Target.from_default_triple()
        cpu, features = _target()
        machine = target.create_target_machine(cpu=cpu, features=features, opt=3, jit=True)
        backing = llvm.parse_assembly("")
        _state.update(machine=machine, engine=llvm.create_mcjit_compiler(backing, machine))
    return _state


def host_cpu_name():
    """The CPU code is generated for (KERASJIT_CPU's level, else the host's)."""
    return _target()[0]


def host_isa():
    """The widest vector instructions code uses (the host's, or KERASJIT_CPU's),
    and whether TensorFlow turns its oneDNN kernels on by default on the host
    (its x86 rule: AVX-512 VNNI/BF16, AVX-VNNI or AMX)."""
    features = llvm.get_host_cpu_features()
    level = _level()
    isa = level[1] if level else next(
        (name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"))
         if features.get(flag)), "SSE")
    onednn = any(features.get(f) for f in ("avx512vnni", "avx512bf16", "avxvnni", "amx-tile"))
    return isa, onednn


def _cache_bytes(level, default):
    """The host's per-core data cache of `level` (Linux's sysfs; `default`
    where it is not to be read)."""
    root = "/sys/devices/system/cpu/cpu0/cache"

    def read(index, name):
        with open(os.path.join(root, index, name)) as f:
            return f.read().strip()
    try:
        for index in sorted(os.listdir(root)):
            if read(index, "level") == str(level) and read(index, "type") != "Instruction":
                size = read(index, "size")
                scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
                return int(size.rstrip("KM")) * scale
    except (OSError, ValueError):
        pass
    return default


@functools.cache
def l1_cache_bytes():
    """The per-core L1 data cache (read once): what a blocked kernel's
    innermost loops keep their operands in."""
    return _cache_bytes(1, 32 << 10)


@functools.cache
def l2_cache_bytes():
    """The per-core L2 cache (read once): how much of an operand a blocked
    kernel keeps near."""
    return _cache_bytes(2, 1 << 20)


def host_description():
    """CPU name, features and L1 and L2 sizes code is generated for: part of
    every compile-cache key."""
    _jit()
    return ":".join(_target()) + f":L1={l1_cache_bytes()}:L2={l2_cache_bytes()}"


def is_x86():
    return llvm.get_process_triple().startswith(("x86_64", "i686", "i386"))


def vector_lanes():
    """f32 lanes of the widest vector registers code uses (AVX-512: 16, AVX: 8)."""
    isa = host_isa()[0]
    return 16 if isa == "AVX-512" else 8 if isa in ("AVX2", "AVX") else 4


def optimize(llvm_ir, unroll=True, loop_vectorize=True):
    """Textual LLVM IR -> optimised ModuleRef (O3, vectorisers on). Without
    `unroll`, loops are vectorised but not unrolled: for short loops unrolling
    gains nothing and costs optimiser time (reports/tuning-measurements.md).
    Without `loop_vectorize`, only the SLP vectoriser runs: slower code, but
    none of the loop vectoriser's assertions, which abort the process."""
    state = _jit()
    module = llvm.parse_assembly(str(llvm_ir))
    module.verify()
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    tuning.loop_vectorization = loop_vectorize
    tuning.slp_vectorization = True
    tuning.loop_unrolling = unroll
    builder = llvm.create_pass_builder(state["machine"], tuning)
    builder.getModulePassManager().run(module, builder)
    module.triple = llvm.get_process_triple()
    return module


def object_code(module):
    """Native object code of an optimised module (what the compile cache keeps)."""
    return _jit()["machine"].emit_object(module)


def load_objects(codes, entry):
    """Link object code (the parts of one module: module_split.py) into this
    process; the address of its `entry` function."""
    with _lock:
        state = _jit()
        for code in codes:
            state["engine"].add_object_file(llvm.ObjectFileRef.from_data(code))
        state["engine"].finalize_object()
        address = state["engine"].get_function_address(entry)
    if not address:
        raise RuntimeError(f"kerasjit: linked object has no symbol {entry}")
    return address


def global_address(name):
    """Address of a global variable of a loaded object."""
    with _lock:
        return _jit()["engine"].get_global_value_address(name)
