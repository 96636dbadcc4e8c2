"""Narrow GEMMs (one side <= 16): generated vector code against the evaluator,
in every operand layout, with row blocks and vector tails of every kind, at
each vector width the code generator emits for (AVX-512, AVX, SSE)."""
import itertools

import numpy as np
import pytest

from kerasjit.backends.cpu import CpuBackend, engine, narrow_gemm
from kerasjit.hlo import parse_module
from kerasjit.hlo.evaluator import evaluate
from kerasjit.kernels.ir import GemmCall

from tests.support.gemm import gemm_call

pytestmark = pytest.mark.usefixtures("no_compile_cache")

LAYOUTS = list(itertools.product([False, True], repeat=2))   # (lhs, rhs) transposed
# (m, n, k): N narrow, M narrow, both; sizes around block and lane boundaries. With
# 16 lanes a "columns" block is 24 // n vectors: 385 x 1 and 257 x 2 run full blocks
# and a tail, 24 x 13 splits N over blocks of 12 columns at 8 lanes.
SHAPES = [(1, 1, 1), (5, 3, 7), (33, 16, 17), (17, 1, 40), (385, 1, 7), (257, 2, 7),
          (100, 10, 70), (24, 13, 5), (49, 15, 9), (3, 200, 35), (16, 33, 17), (9, 16, 5)]
# Wider N, B's rows along K: A @ B^T as the "packed" form (B^T copied to the stack), for
# an N up to 64 (65: sgemm).
PACKED_SHAPES = [(40, 40, 16), (17, 64, 9), (50, 33, 64), (70, 65, 3), (23, 17, 2)]


def dot_module(m, n, k, lhs_transposed, rhs_transposed):
    a = f"f32[{k},{m}]" if lhs_transposed else f"f32[{m},{k}]"
    b = f"f32[{n},{k}]" if rhs_transposed else f"f32[{k},{n}]"
    return parse_module(f"""HloModule narrow
ENTRY %e (a: {a}, b: {b}) -> f32[{m},{n}] {{
  %a = {a} parameter(0)
  %b = {b} parameter(1)
  ROOT %d = f32[{m},{n}] dot({a} %a, {b} %b), lhs_contracting_dims={{{0 if lhs_transposed else 1}}}, rhs_contracting_dims={{{1 if rhs_transposed else 0}}}
}}
""")


def check_product(m, n, k, lhs_transposed, rhs_transposed, seed=0):
    """Compiled product == evaluator; generated vector code wherever plan() takes it."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m) if lhs_transposed else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if rhs_transposed else (k, n)).astype(np.float32)
    module = dot_module(m, n, k, lhs_transposed, rhs_transposed)
    executable = CpuBackend().compile(module)
    got = executable([a, b])[0]
    np.testing.assert_allclose(got, evaluate(module, [a, b]), rtol=1e-4, atol=1e-4 * np.sqrt(k))
    dot = module.entry.root       # (a unit dim's layout is either: as the lowering reads it)
    narrow = narrow_gemm.plan(gemm_call(*(x.shape.dims for x in dot.operands), dot.attrs))
    generated = any("llvm.fma.v" in source for _, source in executable.kernels)
    assert generated == (narrow is not None)
    return executable


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_narrow_products_match_evaluator(shape, layout, monkeypatch):
    monkeypatch.setattr(engine, "vector_lanes", lambda: 16)
    check_product(*shape, *layout, seed=sum(shape))


@pytest.mark.parametrize("lanes", [16, 8])
@pytest.mark.parametrize("shape", PACKED_SHAPES)
def test_wider_batched_products_with_transposed_rhs(shape, lanes, monkeypatch):
    """(Unbatched, such a product is an implicit GEMM reading B at a stride:
    the packed form serves batched ones, attention's.)"""
    monkeypatch.setattr(engine, "vector_lanes", lambda: lanes)
    m, n, k = shape
    module = parse_module(f"""HloModule packed
ENTRY %e (a: f32[3,{m},{k}], b: f32[3,{n},{k}]) -> f32[3,{m},{n}] {{
  %a = f32[3,{m},{k}] parameter(0)
  %b = f32[3,{n},{k}] parameter(1)
  ROOT %d = f32[3,{m},{n}] dot(f32[3,{m},{k}] %a, f32[3,{n},{k}] %b), lhs_batch_dims={{0}}, rhs_batch_dims={{0}}, lhs_contracting_dims={{2}}, rhs_contracting_dims={{2}}
}}
""")
    dot = module.entry.root
    call = gemm_call(*(x.shape.dims for x in dot.operands), dot.attrs,
                     CpuBackend.target.min_batched_product)      # (None: a loop, so small)
    gemm = call and narrow_gemm.plan(call)
    assert gemm is None or gemm.form == "packed"
    assert (gemm is not None) == (call is not None and n <= narrow_gemm.PACKED_N)
    rng = np.random.default_rng(sum(shape))
    args = [rng.standard_normal((3, m, k)).astype(np.float32),
            rng.standard_normal((3, n, k)).astype(np.float32)]
    executable = CpuBackend().compile(module)
    np.testing.assert_allclose(executable(args)[0], evaluate(module, args), rtol=1e-4,
                               atol=1e-4 * np.sqrt(k))
    assert any("llvm.fma.v" in source for _, source in executable.kernels) == (gemm is not None)


@pytest.mark.parametrize("lanes", [8, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_narrower_vector_units(lanes, layout, monkeypatch):
    """AVX and SSE hosts get 8- and 4-float vectors (and 12 accumulators)."""
    monkeypatch.setattr(engine, "vector_lanes", lambda: lanes)
    for m, n, k in [(37, 10, 29), (10, 37, 29), (9, 16, 5), (24, 13, 5), (100, 15, 3)]:
        check_product(m, n, k, *layout)


def test_attention_scores_are_packed_products_read_in_place():
    """Queries times keys per batch and head, [b, t, h, d] both: each product
    reads its rows h * d apart, the keys' copied to the stack transposed."""
    module = parse_module("""HloModule scores
ENTRY %e (q: f32[3,20,2,16], k: f32[3,24,2,16]) -> f32[3,2,20,24] {
  %q = f32[3,20,2,16] parameter(0)
  %k = f32[3,24,2,16] parameter(1)
  ROOT %d = f32[3,2,20,24] dot(f32[3,20,2,16] %q, f32[3,24,2,16] %k), lhs_batch_dims={0,2}, rhs_batch_dims={0,2}, lhs_contracting_dims={3}, rhs_contracting_dims={3}
}
""")
    dot = module.entry.root
    gemm = narrow_gemm.plan(gemm_call(*(x.shape.dims for x in dot.operands), dot.attrs, 0))
    assert gemm.form == "packed" and (gemm.a_ld, gemm.b_ld) == (32, 32)
    rng = np.random.default_rng(2)
    args = [rng.standard_normal((3, 20, 2, 16)).astype(np.float32),
            rng.standard_normal((3, 24, 2, 16)).astype(np.float32)]
    np.testing.assert_allclose(CpuBackend().compile(module)(args)[0], evaluate(module, args),
                               rtol=1e-4, atol=1e-4)


def test_a_gram_matrix_reads_one_buffer_as_both_operands():
    module = parse_module("""HloModule gram
ENTRY %e (x: f32[50,7]) -> f32[7,7] {
  %x = f32[50,7] parameter(0)
  ROOT %d = f32[7,7] dot(f32[50,7] %x, f32[50,7] %x), lhs_contracting_dims={0}, rhs_contracting_dims={0}
}
""")
    x = np.random.default_rng(5).standard_normal((50, 7)).astype(np.float32)
    np.testing.assert_allclose(CpuBackend().compile(module)([x])[0], x.T @ x, rtol=1e-4, atol=1e-4)


# Attention's products per (batch, head), heads between the sequence and feature
# dims: softmax(scores) @ values ([b, h, t, s] x [b, s, h, d], the values' rows
# h * d apart), and queries @ a narrow projection ([b, t, h, d] x [b, h, d, n],
# the queries' rows h * d apart).
STRIDED = {
    "values": ([2, 3, 20, 24], [2, 24, 3, 16], [2, 3, 20, 16],
               {"lhs_batch_dims": [0, 1], "rhs_batch_dims": [0, 2],
                "lhs_contracting_dims": [3], "rhs_contracting_dims": [1]}),
    "queries": ([2, 20, 3, 16], [2, 3, 16, 8], [2, 3, 20, 8],
                {"lhs_batch_dims": [0, 2], "rhs_batch_dims": [0, 1],
                 "lhs_contracting_dims": [3], "rhs_contracting_dims": [2]}),
}


@pytest.mark.parametrize("case", STRIDED)
def test_batched_products_with_strided_rows(case):
    """One generated kernel run per batch index, reading rows in place."""
    lhs, rhs, out, attrs = STRIDED[case]
    call = gemm_call(lhs, rhs, attrs)
    assert call.count == 6 and (call.lda or call.ldb) == 48 and narrow_gemm.plan(call)
    shape = lambda dims: f"f32[{','.join(map(str, dims))}]"   # noqa: E731
    dims = ", ".join(f"{name}={{{','.join(map(str, v))}}}" for name, v in attrs.items())
    module = parse_module(f"""HloModule strided
ENTRY %e (a: {shape(lhs)}, b: {shape(rhs)}) -> {shape(out)} {{
  %a = {shape(lhs)} parameter(0)
  %b = {shape(rhs)} parameter(1)
  ROOT %d = {shape(out)} dot({shape(lhs)} %a, {shape(rhs)} %b), {dims}
}}
""")
    rng = np.random.default_rng(7)
    args = [rng.standard_normal(lhs).astype(np.float32), rng.standard_normal(rhs).astype(np.float32)]
    executable = CpuBackend().compile(module)
    assert any("llvm.fma.v" in source for _, source in executable.kernels)
    np.testing.assert_allclose(executable(args)[0], evaluate(module, args), rtol=1e-4, atol=1e-4)


def test_which_products_take_the_narrow_kernels():
    """A Dense(10) head's forward (rows) and weight gradient (columns) products
    and the form each layout gets; A @ B^T, wide, large, empty, chunked and
    accumulating products stay with sgemm."""
    def plan(m, n, k, lhs_t=False, rhs_t=False, **chunking):
        return narrow_gemm.plan(GemmCall("g", 0, 1, 2, m, n, k, lhs_t, rhs_t, **chunking))
    forward, gradient = plan(100, 10, 784), plan(784, 10, 100, lhs_t=True)
    assert (forward.form, forward.swapped) == ("rows", False)
    assert (gradient.form, gradient.swapped) == ("columns", False)
    swapped = plan(10, 784, 100)
    assert (swapped.form, swapped.swapped, swapped.c_strides) == ("columns", True, (1, 784))
    for rejected in [plan(100, 10, 784, rhs_t=True), plan(100, 64, 784), plan(100000, 10, 784),
                     plan(100, 10, 0), plan(100, 10, 784, out_rows_per_chunk=100),
                     plan(100, 10, 784, rhs_rows_per_chunk=10),
                     plan(100, 10, 784, accumulate=True)]:
        assert rejected is None
