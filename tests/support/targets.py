"""The lowering targets tests use: the CPU backend's, the same with
convolutions as patch matrices times GEMM, and the same with transposed
weights copied features-innermost (as for the GPU) instead of read at a stride."""
import dataclasses

from kerasjit.backends.cpu import CpuBackend

CPU = CpuBackend.target
PATCHES = dataclasses.replace(CPU, implicit_gemm=False)
COPIED_TRANSPOSES = dataclasses.replace(CPU, strided_features=False)
