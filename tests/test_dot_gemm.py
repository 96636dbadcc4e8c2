"""Dots as batched, strided GEMMs (kernels/dot_gemm.py): any arrangement of
batch, contracting and free dims in either operand, compiled, against the
evaluator; and which arrangements are read in place."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kerasjit.backends.cpu import BACKEND
from kerasjit.hlo import parse_module
from kerasjit.hlo.evaluator import evaluate
from kerasjit.kernels.dot_gemm import dot_as_gemm


def _shape(dims):
    return f"f32[{','.join(map(str, dims))}]"


def _dims_text(dims):
    return "{" + ",".join(map(str, dims)) + "}"


@st.composite
def dots(draw):
    """(lhs dims, rhs dims, dot attributes): roles of each operand's dims in a
    random order, extents 1 to 5 (unit dims and sizes no vector divides)."""
    extent = st.integers(1, 5)
    batch = draw(st.lists(extent, max_size=2))
    contracting = draw(st.lists(extent, min_size=1, max_size=2))
    free = [draw(st.lists(extent, max_size=2)) for _ in range(2)]
    operands = []
    for side in range(2):
        roles = ([("b", i, e) for i, e in enumerate(batch)]
                 + [("k", i, e) for i, e in enumerate(contracting)]
                 + [("f", i, e) for i, e in enumerate(free[side])])
        roles = draw(st.permutations(roles))
        operands.append(roles)
    attrs = {}
    for side, roles in zip(("lhs", "rhs"), operands):
        for kind, name in (("b", "batch"), ("k", "contracting")):
            by_index = sorted((i, pos) for pos, (r, i, _) in enumerate(roles) if r == kind)
            attrs[f"{side}_{name}_dims"] = [pos for _, pos in by_index]
    lhs_dims, rhs_dims = ([e for _, _, e in roles] for roles in operands)
    out = batch + [e for r, _, e in operands[0] if r == "f"] + \
        [e for r, _, e in operands[1] if r == "f"]
    return lhs_dims, rhs_dims, attrs, out


def _module(lhs, rhs, attrs, out):
    text = ", ".join(f"{name}={_dims_text(v)}" for name, v in attrs.items())
    return parse_module(f"""HloModule dot
ENTRY %e (a: {_shape(lhs)}, b: {_shape(rhs)}) -> {_shape(out)} {{
  %a = {_shape(lhs)} parameter(0)
  %b = {_shape(rhs)} parameter(1)
  ROOT %d = {_shape(out)} dot({_shape(lhs)} %a, {_shape(rhs)} %b), {text}
}}
""")


@settings(max_examples=40, deadline=None)
@given(dots(), st.integers(0, 2**32 - 1))
def test_any_dot_matches_evaluator(dot, seed):
    lhs, rhs, attrs, out = dot
    rng = np.random.default_rng(seed)
    args = [rng.standard_normal(lhs).astype(np.float32),
            rng.standard_normal(rhs).astype(np.float32)]
    module = _module(lhs, rhs, attrs, out)
    want = evaluate(module, args)
    got = BACKEND.compile(module)(args)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_attention_layout_is_read_in_place():
    """Scores of [b, t, heads, d] queries and keys: batch levels (b, heads),
    rows t apart by heads*d, the keys read transposed."""
    call = dot_as_gemm("scores", [2, 5, 3, 4], [2, 6, 3, 4],
                       {"lhs_batch_dims": [0, 2], "rhs_batch_dims": [0, 2],
                        "lhs_contracting_dims": [3], "rhs_contracting_dims": [3]})
    assert (call.m, call.n, call.k) == (5, 6, 4)
    assert (call.lhs_transposed, call.rhs_transposed, call.lda, call.ldb) == (False, True, 12, 12)
    assert call.batch == ((2, 60, 72, 90), (3, 4, 4, 30))
    assert list(call.batch_offsets())[:4] == [(0, 0, 0), (4, 4, 30), (8, 8, 60), (60, 72, 90)]


def test_dense_on_a_sequence_is_one_packed_gemm():
    call = dot_as_gemm("dense", [8, 5, 7], [7, 3],
                       {"lhs_contracting_dims": [2], "rhs_contracting_dims": [0]})
    assert (call.m, call.n, call.k, call.lda, call.ldb, call.batch) == (40, 3, 7, 0, 0, ())


def test_layouts_blas_cannot_read_are_refused():
    # Free dims split by the contracting one: no single row stride.
    assert dot_as_gemm("split", [4, 3, 5], [3, 2],
                       {"lhs_contracting_dims": [1], "rhs_contracting_dims": [0]}) is None
    # The batch dim innermost: neither matrix dim is contiguous.
    assert dot_as_gemm("strided", [3, 4, 2], [2, 4, 6],
                       {"lhs_batch_dims": [2], "rhs_batch_dims": [0],
                        "lhs_contracting_dims": [1], "rhs_contracting_dims": [1]}) is None
