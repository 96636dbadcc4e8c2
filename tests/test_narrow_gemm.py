"""Narrow GEMMs (one side <= 16): generated vector code against the evaluator,
in every operand layout, at sizes no vector width divides, at each vector
width the code generator emits for (AVX-512, AVX, SSE)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kerasjit.backends.cpu import CpuBackend, engine, narrow_gemm
from kerasjit.hlo import parse_module
from kerasjit.hlo.evaluator import evaluate
from kerasjit.kernels.ir import GemmCall


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
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m) if lhs_transposed else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if rhs_transposed else (k, n)).astype(np.float32)
    module = dot_module(m, n, k, lhs_transposed, rhs_transposed)
    executable = CpuBackend().compile(module)
    got = executable([a, b])[0]
    np.testing.assert_allclose(got, evaluate(module, [a, b]), rtol=1e-4, atol=1e-4 * np.sqrt(k))
    return executable


@pytest.fixture(autouse=True)
def no_cache(monkeypatch):
    monkeypatch.setenv("KERASJIT_CACHE_DIR", "")


@settings(max_examples=25, deadline=None)
@given(narrow=st.sampled_from([1, 2, 3, 10, 15, 16]), wide=st.sampled_from([1, 5, 17, 33, 100]),
       k=st.sampled_from([1, 3, 16, 17, 70]), narrow_side=st.sampled_from("mn"),
       lhs_transposed=st.booleans(), rhs_transposed=st.booleans(), seed=st.integers(0, 99))
def test_narrow_products_match_evaluator(narrow, wide, k, narrow_side, lhs_transposed,
                                         rhs_transposed, seed):
    m, n = (narrow, wide) if narrow_side == "m" else (wide, narrow)
    check_product(m, n, k, lhs_transposed, rhs_transposed, seed)


@pytest.mark.parametrize("lanes", [8, 4])
@pytest.mark.parametrize("layout", [(False, False), (True, False), (True, True), (False, True)])
def test_narrower_vector_units(lanes, layout, monkeypatch):
    """AVX and SSE hosts get 8- and 4-float vectors (and 12 accumulators)."""
    monkeypatch.setattr(engine, "vector_lanes", lambda: lanes)
    for m, n, k in [(37, 10, 29), (10, 37, 29), (9, 16, 5)]:
        check_product(m, n, k, *layout)


def test_classifier_products_take_the_narrow_kernels():
    """A Dense(10) head's forward (rows) and weight gradient (columns) products,
    and the form each layout gets; A @ B^T and wide or chunked products stay
    with sgemm."""
    forward = narrow_gemm.plan(GemmCall("f", 0, 1, 2, 100, 10, 784, False, False))
    gradient = narrow_gemm.plan(GemmCall("g", 0, 1, 2, 784, 10, 100, True, False))
    assert (forward.form, forward.swapped) == ("rows", False)
    assert (gradient.form, gradient.swapped) == ("columns", False)
    swapped = narrow_gemm.plan(GemmCall("s", 0, 1, 2, 10, 784, 100, False, False))
    assert (swapped.form, swapped.swapped, swapped.c_strides) == ("columns", True, (1, 784))
    assert narrow_gemm.plan(GemmCall("t", 0, 1, 2, 100, 10, 784, False, True)) is None
    assert narrow_gemm.plan(GemmCall("w", 0, 1, 2, 100, 64, 784, False, False)) is None
    assert narrow_gemm.plan(GemmCall("big", 0, 1, 2, 100000, 10, 784, False, False)) is None
    assert narrow_gemm.plan(GemmCall("c", 0, 1, 2, 100, 10, 784, False, False,
                                     out_rows_per_chunk=100)) is None
    executable = check_product(100, 10, 784, False, False)
    listing = dict(executable.kernels)
    assert any("llvm.fma.v" in source for source in listing.values())
