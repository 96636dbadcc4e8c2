"""The CPU backend: HLO -> fused kernels -> LLVM (llvmlite) -> one native call per cluster."""
from ...kernels.lower import lower
from . import engine
from .blas import register_blas_symbols
from .codegen import render_program
from .executable import CpuExecutable


class CpuBackend:
    name = "cpu"

    def compile(self, module):
        program = lower(module)
        register_blas_symbols()
        name = "cluster_" + "".join(c if c.isalnum() else "_" for c in module.name)[:40]
        llvm_ir = render_program(program, name)
        optimized = engine.optimize(llvm_ir)
        address = engine.load(optimized, f"{name}_entry")
        return CpuExecutable(program, address, str(llvm_ir))


BACKEND = CpuBackend()
