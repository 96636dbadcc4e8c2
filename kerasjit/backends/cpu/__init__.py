"""The CPU backend: HLO passes -> fused kernels -> LLVM (llvmlite) -> one native call per cluster.

KERASJIT_DEBUG=1 runs the HLO verifier after every pass; KERASJIT_DUMP_DIR=path
writes the module after each pass there.
"""
import os

from ...kernels.lower import lower
from ...passes import optimize
from . import engine
from .blas import register_blas_symbols
from .codegen import render_program
from .executable import CpuExecutable


class CpuBackend:
    name = "cpu"

    def compile(self, module):
        """Optimise `module` (in place: explain() shows what was compiled) and build it."""
        optimize(module, debug=bool(os.environ.get("KERASJIT_DEBUG")),
                 dump_dir=os.environ.get("KERASJIT_DUMP_DIR"))
        program = lower(module)
        register_blas_symbols()
        name = "cluster_" + "".join(c if c.isalnum() else "_" for c in module.name)[:40]
        llvm_module, kernels = render_program(program, name)
        optimized = engine.optimize(llvm_module)
        address = engine.load(optimized, f"{name}_entry")
        return CpuExecutable(program, address, kernels)


BACKEND = CpuBackend()
