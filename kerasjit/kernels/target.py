"""What lowering asks of the backend it lowers for: the forms its libraries run well."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    implicit_gemm: bool         # convolutions as ImplicitGemm steps (else patch matrix x GEMM)
    implicit_dots: bool         # dots too, where they read so (dot_implicit.py; else GEMM calls)
    min_batched_product: int    # a batched dot with a smaller M*N*K stays a loop kernel
    patch_budget_bytes: int     # a patch matrix is built and multiplied in slices this large
    split_reductions: bool = False  # large reductions into a row in parts threads share
    strided_features: bool = False  # an ImplicitGemm reads B transposed where it lies (no copy)
    multi_output_reductions: bool = False  # a row reduction computes and stores its operand
