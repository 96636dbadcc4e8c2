"""Dots as batched, strided GEMMs (hlo/gemm.py): any arrangement of
batch, contracting and free dims in either operand, compiled (as generated
narrow kernels and as sgemm calls), against the evaluator; the GPU device's
cuBLAS calls for them, on a host stand-in for cuBLAS; and which arrangements
are read in place."""
import ctypes
import dataclasses
import os
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kerasjit.backends.cpu import CpuBackend, narrow_gemm
from kerasjit.backends.gpu.device import CupyDevice
from kerasjit.compiler import lower
from kerasjit.hlo import parse_module
from kerasjit.hlo.evaluator import evaluate
from kerasjit.kernels.ir import GemmCall

from tests.support.gemm import gemm_call
from tests.support.targets import CPU


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


@pytest.mark.parametrize("narrow", [True, False], ids=["narrow-kernels", "sgemm"])
@settings(max_examples=40, deadline=None)
@given(dots(), st.integers(0, 2**32 - 1))
def test_any_dot_matches_evaluator(narrow, dot, seed):
    """(Products of any size as GEMMs: the layouts are what is tested, by the
    generated narrow kernels and by sgemm.)"""
    lhs, rhs, attrs, out = dot
    rng = np.random.default_rng(seed)
    args = [rng.standard_normal(lhs).astype(np.float32),
            rng.standard_normal(rhs).astype(np.float32)]
    module = _module(lhs, rhs, attrs, out)
    want = evaluate(module, args)
    backend = CpuBackend()
    backend.target = dataclasses.replace(backend.target, min_batched_product=0)
    with mock.patch.object(narrow_gemm, "NARROW", narrow_gemm.NARROW if narrow else 0), \
            mock.patch.dict(os.environ, {"KERASJIT_CACHE_DIR": ""}):
        got = backend.compile(module)(args)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


class HostCublas:
    """cuBLAS's sgemm and sgemmStridedBatched on host memory: column-major
    matrices at raw addresses, alpha and beta through pointers, as CuPy's
    bindings take them."""

    @staticmethod
    def _matrix(address, rows, columns, lead):
        flat = np.frombuffer((ctypes.c_float * (lead * (columns - 1) + rows)).from_address(
            address), np.float32)
        return np.lib.stride_tricks.as_strided(flat, (rows, columns), (4, 4 * lead))

    def sgemm(self, handle, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        self.sgemmStridedBatched(handle, trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0,
                                 beta, c, ldc, 0, 1)

    def sgemmStridedBatched(self, handle, trans_a, trans_b, m, n, k, alpha, a, lda, step_a, b,
                            ldb, step_b, beta, c, ldc, step_c, count):
        alpha, beta = (ctypes.c_float.from_address(p).value for p in (alpha, beta))
        for i in range(count):
            op_a = self._matrix(a + 4 * i * step_a, *((k, m) if trans_a else (m, k)), lda)
            op_b = self._matrix(b + 4 * i * step_b, *((n, k) if trans_b else (k, n)), ldb)
            out = self._matrix(c + 4 * i * step_c, m, n, ldc)
            product = alpha * ((op_a.T if trans_a else op_a) @ (op_b.T if trans_b else op_b))
            out[...] = product + beta * out if beta else product    # (beta 0: C is not read)


def _on_device(array):
    return SimpleNamespace(data=SimpleNamespace(ptr=array.ctypes.data), itemsize=array.itemsize)


@settings(max_examples=40, deadline=None)
@given(dots(), st.integers(0, 2**32 - 1))
def test_gpu_cublas_calls_compute_the_dot(dot, seed):
    lhs, rhs, attrs, out = dot
    call = gemm_call(lhs, rhs, attrs)
    if call is None:            # (a layout BLAS cannot read: the loop kernel's)
        return
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal(lhs).astype(np.float32), rng.standard_normal(rhs).astype(np.float32)
    got = np.full(out, np.nan, np.float32)
    device = object.__new__(CupyDevice)
    device.cublas, device.handle = HostCublas(), None
    device._scalars = {v: np.full(1, v, np.float32) for v in (0.0, 1.0)}
    device.gemm(call, *(_on_device(x) for x in (got, a, b)), 0)
    np.testing.assert_allclose(got, evaluate(_module(lhs, rhs, attrs, out), [a, b]),
                               rtol=1e-5, atol=1e-5)


def test_attention_layout_is_read_in_place():
    """Scores of [b, t, heads, d] queries and keys: batch levels (b, heads),
    rows t apart by heads*d, the keys read transposed."""
    call = gemm_call([2, 20, 3, 16], [2, 24, 3, 16],
                       {"lhs_batch_dims": [0, 2], "rhs_batch_dims": [0, 2],
                        "lhs_contracting_dims": [3], "rhs_contracting_dims": [3]})
    assert (call.m, call.n, call.k) == (20, 24, 16)
    assert (call.lhs_transposed, call.rhs_transposed, call.lda, call.ldb) == (False, True, 48, 48)
    assert call.batch == ((2, 960, 1152, 1440), (3, 16, 16, 480))
    assert list(call.batch_offsets())[:4] == [(0, 0, 0), (16, 16, 480), (32, 32, 960),
                                              (960, 1152, 1440)]


def test_small_batched_products_stay_loops():
    """A BLAS call per batch index costs more than a tiny product or a
    matrix x vector: those stay loop kernels (unbatched ones need no calls)."""
    attrs = {"lhs_batch_dims": [0], "rhs_batch_dims": [0],
             "lhs_contracting_dims": [2], "rhs_contracting_dims": [1]}
    least = CPU.min_batched_product
    assert gemm_call([4096, 4, 4], [4096, 4, 4], attrs, least) is None
    assert gemm_call([1024, 1, 64], [1024, 64, 40], attrs) is None
    assert gemm_call([64, 32, 32], [64, 32, 32], attrs, least) is not None
    assert gemm_call([1, 4, 4], [1, 4, 4], attrs, least) is not None   # no batch left


def test_batch_levels_laid_out_together_are_one():
    """[batch, heads, t, d] x [batch, heads, d, t]: 64 x 4 products one level apart."""
    call = gemm_call([64, 4, 40, 16], [64, 4, 16, 40],
                       {"lhs_batch_dims": [0, 1], "rhs_batch_dims": [0, 1],
                        "lhs_contracting_dims": [3], "rhs_contracting_dims": [2]})
    assert call.batch == ((256, 640, 640, 1600),)


def test_dense_on_a_sequence_is_one_packed_gemm():
    call = gemm_call([8, 5, 7], [7, 3],
                       {"lhs_contracting_dims": [2], "rhs_contracting_dims": [0]})
    assert (call.m, call.n, call.k, call.lda, call.ldb, call.batch) == (40, 3, 7, 0, 0, ())


def test_layouts_blas_cannot_read_are_refused():
    # Free dims split by the contracting one: no single row stride.
    assert gemm_call([4, 3, 5], [3, 2],
                       {"lhs_contracting_dims": [1], "rhs_contracting_dims": [0]}) is None
    # The batch dim innermost: neither matrix dim is contiguous.
    assert gemm_call([3, 4, 2], [2, 4, 6],
                       {"lhs_batch_dims": [2], "rhs_batch_dims": [0],
                        "lhs_contracting_dims": [1], "rhs_contracting_dims": [1]}) is None


@pytest.mark.parametrize("features", [10, 96], ids=["narrow", "sgemm"])
def test_a_reshaped_operand_is_read_in_place(features):
    """A Flatten before a Dense layer moves no element: the GEMM reads the
    pooled value's buffer as it is, no kernel copies it first."""
    module = parse_module(f"""HloModule flatten_dense
%max (x: f32[], y: f32[]) -> f32[] {{
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %m = f32[] maximum(f32[] %x, f32[] %y)
}}
ENTRY %e (a: f32[8,6,6,4], w: f32[36,{features}]) -> f32[8,{features}] {{
  %a = f32[8,6,6,4] parameter(0)
  %w = f32[36,{features}] parameter(1)
  %low = f32[] constant(-inf)
  %pool = f32[8,3,3,4] reduce-window(f32[8,6,6,4] %a, f32[] %low), window={{size=1x2x2x1 stride=1x2x2x1}}, to_apply=%max
  %flat = f32[8,36] reshape(f32[8,3,3,4] %pool)
  ROOT %d = f32[8,{features}] dot(f32[8,36] %flat, f32[36,{features}] %w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}
""")
    program = lower(module, CPU)
    assert [type(s).__name__ for s in program.steps] == ["LoopKernel", "GemmCall"]
    (gemm,) = [s for s in program.steps if isinstance(s, GemmCall)]
    assert gemm.lhs == program.steps[0].stores[0][0]     # the pooled buffer itself
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((8, 6, 6, 4)).astype(np.float32),
            rng.standard_normal((36, features)).astype(np.float32)]
    with mock.patch.dict(os.environ, {"KERASJIT_CACHE_DIR": ""}):
        got = CpuBackend().compile(module)(args)[0]
    np.testing.assert_allclose(got, evaluate(module, args), rtol=1e-5, atol=1e-5)
