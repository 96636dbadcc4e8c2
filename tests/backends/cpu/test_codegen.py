"""What the CPU renderer makes of a kernel program: one function per kernel
identity, LLVM's loop unrolling only where a kernel runs long, and costly
reduction terms computed ahead of their fold."""
import dataclasses
import re

import numpy as np
import pytest
import tensorflow as tf

from kerasjit.backends.cpu import CpuBackend, codegen
from kerasjit.backends.cpu.codegen import LONG_LOOP, render_program
from kerasjit.backends.cpu.executable import CpuExecutable
from kerasjit.backends.cpu import engine
from kerasjit.kernels.identity import identity
from kerasjit.kernels.ir import S64, Buffer, Index, KernelProgram, Load, LoopKernel, Op
from kerasjit.hlo.evaluator import evaluate
from kerasjit.kernels.storage import assign_storage

from tests.support.bridge import bridge


def _tanh_kernel(name, source, target, dims):
    index = tuple(Index(S64, d) for d in range(len(dims)))
    return LoopKernel(name, dims, [(target, Op("f32", "tanh", (Load("f32", source, index),)))])


def _program(small_dims, long_dims):
    """tanh of params 0, 1 (small) and 2 (long) into outputs 3, 4, 5."""
    buffers = [Buffer(i, "f32", dims, role) for i, (dims, role) in enumerate(
        [(small_dims, "param"), (small_dims, "param"), (long_dims, "param"),
         (small_dims, "output"), (small_dims, "output"), (long_dims, "output")])]
    steps = [_tanh_kernel("first", 0, 3, small_dims), _tanh_kernel("second", 1, 4, small_dims),
             _tanh_kernel("long", 2, 5, long_dims)]
    return assign_storage(KernelProgram(buffers, steps, [0, 1, 2], [3, 4, 5]))


def test_kernels_computing_the_same_over_other_buffers_share_one_function():
    program = _program((3, 5), (4, 4))
    first, second, _ = program.steps
    assert identity(first, program.buffers, [0, 3]) == identity(second, program.buffers, [1, 4])
    assert identity(first, program.buffers, [0, 3]) != identity(
        _program((5, 3), (4, 4)).steps[0], _program((5, 3), (4, 4)).buffers, [0, 3])
    text, kernels, _ = render_program(program, "shared")
    (first_fn, _), (second_fn, _), (long_fn, _) = kernels[1:]
    assert first_fn == second_fn != long_fn
    assert len(re.findall(r'^define internal void @"shared_k\d+"', text, flags=re.M)) == 2
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(b.dims).astype(np.float32) for b in program.buffers[:3]]
    outputs = _run_compiled(program, args)
    for arg, out in zip(args, outputs):
        np.testing.assert_allclose(out, np.tanh(arg), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("long_dims, rolled", [
    ((1 << 11, LONG_LOOP >> 11), 1),        # rows of 128: the innermost loop left rolled
    ((LONG_LOOP >> 10, 1 << 10), 0)])       # rows of 1024: none
def test_only_long_running_kernels_have_their_loops_unrolled(long_dims, rolled):
    """Short kernels' loops are never unrolled; a long one's are, but for an
    innermost loop short enough that LLVM would unroll it whole (and then
    vectorise across rows, with gathers, instead of along them)."""
    program = _program((3, 5), long_dims)
    text, kernels, _ = render_program(program, "unroll")
    disabled = set(re.findall(r'^(!\d+) = !\{ !"llvm.loop.unroll.disable" \}$', text, flags=re.M))
    loops = dict(re.findall(r"^(!\d+) = distinct !\{ !\d+, (!\d+) \}$", text, flags=re.M))

    def loops_kept_as_they_are(function):
        body = text[text.index(f'define internal void @"{function}"('):]
        body = body[:body.index("\n}")]
        marked = [loops[m] for m in re.findall(r"!llvm.loop (!\d+)", body)]
        assert set(marked) <= disabled
        return len(marked)
    (small, _), (long, _) = kernels[1], kernels[3]
    assert loops_kept_as_they_are(small) >= 1 and loops_kept_as_they_are(long) == rolled


def _run_compiled(program, args):
    """Run `program` compiled on `args` (its code made and linked here)."""
    text, kernels, _ = render_program(program, "run_codegen_test")
    objects = [engine.object_code(engine.optimize(text))]
    address = engine.load_objects(objects, "run_codegen_test_entry")
    return CpuExecutable(dataclasses.replace(program, steps=[]), address, kernels)(args)


def test_costly_terms_are_computed_ahead_and_folded_in_the_same_order(monkeypatch,
                                                                      no_compile_cache):
    # A softmax's denominator: exp of each element, summed along the row. Its
    # terms go into a row on the stack first (vectorised), then fold in index
    # order: bit-identical to folding each term as it is computed.
    x = np.random.default_rng(0).standard_normal((37, 300)).astype(np.float32)
    module = bridge(lambda x: tf.reduce_sum(tf.exp(x), axis=1), x)
    ahead = CpuBackend().compile(module)
    assert any("alloca float, i64 300" in source for _, source in ahead.kernels)
    monkeypatch.setattr(codegen, "TERM_ROW_BYTES", 0)
    in_turn = CpuBackend().compile(module)
    assert not any("alloca float, i64 300" in source for _, source in in_turn.kernels)
    got = ahead([x])[0]
    np.testing.assert_array_equal(got, in_turn([x])[0])
    np.testing.assert_allclose(got, evaluate(module, [x]), rtol=1e-5)


@pytest.mark.parametrize("terms, reassociated", [(codegen.REASSOCIATE_FROM, True),
                                                 (codegen.REASSOCIATE_FROM // 4, False)])
def test_long_float_sums_may_be_added_in_any_order(terms, reassociated, no_compile_cache):
    """A row sum of many terms lets LLVM keep vectors of partial sums (its
    add is `reassoc`), and is right to float rounding; a short one adds in
    index order, bit for bit."""
    x = np.random.default_rng(0).standard_normal((300, terms)).astype(np.float32)
    module = bridge(lambda x: tf.reduce_sum(x * x, axis=1), x)
    executable = CpuBackend().compile(module)
    code = "\n".join(source for _, source in executable.kernels)
    assert ("fadd reassoc" in code) == reassociated
    got = executable([x])[0]
    np.testing.assert_allclose(got, evaluate(module, [x]), rtol=1e-5)
    if not reassociated:
        in_order = np.zeros(len(x), np.float32)
        for k in range(terms):
            in_order = in_order + x[:, k] * x[:, k]
        assert np.array_equal(got, in_order)
