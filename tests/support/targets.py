"""The lowering targets tests use: the CPU backend's, and the same with
convolutions as patch matrices times GEMM."""
import dataclasses

from kerasjit.backends.cpu import CpuBackend

CPU = CpuBackend.target
PATCHES = dataclasses.replace(CPU, implicit_gemm=False)
