"""Convolutions as implicit GEMMs (kernels/conv_implicit.py, backends/cpu/implicit_gemm.py).

Every blocking the generated code has is exercised against the evaluator:
features past one block of vectors (and a masked tail), output rows in full
blocks and a short one, a contraction cut into slices, row blocks split over
threads, windows that pad, stride, dilate and (in the input gradient) run
reversed over an operand with zeros between its elements (a strided
convolution's output gradient). Convolutions this form does not take still compile, as patches
and sgemm.
"""
import math
import re

import numpy as np
import pytest
import tensorflow as tf
from llvmlite import ir

from kerasjit.backends.cpu import CpuBackend, codegen, engine, implicit_gemm, parallel
from kerasjit.backends.cpu.codegen import render_program
from kerasjit.kernels.ir import GemmCall, ImplicitGemm, LoopKernel, leaf_steps
from kerasjit.hlo import parse_module
from kerasjit.hlo.evaluator import evaluate
from kerasjit.compiler import lower
from kerasjit.kernels import split_reductions
from kerasjit.passes import optimize_as_configured

from tests.support import cpu_check
from tests.support.bridge import bridge
from tests.support.cpu_check import check
from tests.support.structured_cases import REVERSED_WINDOW, conv_and_grads, rand
from tests.support.targets import COPIED_TRANSPOSES, CPU

CASES = {
    # 84 features: full blocks of vectors and a short one ending in a masked
    # vector (64 + 16 + 4 on AVX-512, 5 x 16 + 4 on AVX2); 29 output columns:
    # full blocks of rows and a short one.
    "wide_features": (conv_and_grads(1, "VALID"), (rand(2, 6, 31, 5), rand(3, 3, 5, 84))),
    "same_padding": (conv_and_grads(1, "SAME"), (rand(3, 9, 8, 6), rand(3, 3, 6, 16))),
    "stride_2": (conv_and_grads(2, "SAME"), (rand(2, 11, 10, 3), rand(5, 5, 3, 7))),
    "dilated": (conv_and_grads(1, "VALID", 2), (rand(1, 12, 11, 4), rand(3, 3, 4, 20))),
    "conv1d": (lambda x, w: conv_and_grads(1, "SAME")(x[:, None], w[None]),
               (rand(4, 17, 8), rand(5, 8, 12))),
    # 37 -> 21 features: the input gradient's weights copy runs in tiles
    # (codegen.TILE), cut short at both edges
    "many_channels": (conv_and_grads(1, "SAME"), (rand(2, 7, 6, 37), rand(2, 1, 37, 21))),
    # 6 output rows against a contraction of 3 x 3 x 37: the input gradient reads
    # the weights' 40 features at a stride (blocks of dot products, the last one
    # short, over 37 features in vectors and a masked part)
    "few_rows": (conv_and_grads(1, "SAME"), (rand(1, 3, 2, 40), rand(3, 3, 40, 37))),
    # 15 output rows: blocks of dot products of 4 rows and of 3
    "odd_rows": (conv_and_grads(1, "SAME"), (rand(1, 5, 3, 20), rand(3, 3, 20, 18))),
}


def implicit_steps(fn, args):
    module = bridge(fn, *args)
    optimize_as_configured(module)
    return [s for s in leaf_steps(lower(module, CPU).steps)
            if isinstance(s, (ImplicitGemm, GemmCall))]


def check_compiled(fn, args):
    check(bridge(fn, *args), [np.asarray(a) for a in args], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", CASES)
def test_convolutions_and_gradients_as_implicit_gemms_match_evaluator(name):
    fn, args = CASES[name]
    steps = implicit_steps(fn, args)
    # forward, both gradients; a stride-2 input gradient a GEMM per output phase
    # (passes/dilated_convolutions.py)
    assert [type(s) for s in steps] == [ImplicitGemm] * (2 + 4 if name == "stride_2" else 3)
    check_compiled(fn, args)


@pytest.mark.parametrize("name", ["wide_features", "same_padding", "many_channels"])
def test_sliced_contractions_and_threads_match_evaluator(name, monkeypatch, no_compile_cache):
    # The code differs from what the same HLO compiled to before: no cache, in
    # memory (a fresh backend for check) or on disk.
    monkeypatch.setattr(cpu_check, "BACKEND", CpuBackend())
    monkeypatch.setattr(implicit_gemm, "SLICE_BYTES", 256)    # every contraction sliced,
    monkeypatch.setattr(implicit_gemm, "L1_SLICE_BYTES", 256)
    monkeypatch.setattr(implicit_gemm, "SMALL_C_BYTES", 0)      # its C taken as large:
    monkeypatch.setattr(implicit_gemm, "GROUP_C_BYTES", 4096)  # its blocks in groups
    monkeypatch.setattr(implicit_gemm, "SPLIT_WORK", 0)       # every one split over threads,
    monkeypatch.setattr(parallel, "MIN_WORK", 0)    # and loop kernels (a tiled copy's outer dim)
    fn, args = CASES[name]
    check_compiled(fn, args)


@pytest.mark.parametrize("name, stride", [
    ("few_rows", 37), ("odd_rows", 18), ("transposed_rhs", 150), ("transposed_rhs_heads", 40),
    ("many_channels", None)])
def test_an_input_gradients_weights_are_read_where_they_lie_where_rows_are_few(name, stride):
    """dY W^T (a convolution's or a Dense layer's input gradient) reads W's
    features at a stride, the contraction contiguous, and its window reversed:
    no copy of W, transposed or reversed. With many rows against the
    contraction, the copy and the usual blocks are faster: W is copied."""
    fn, args = CASES[name] if name in CASES else DOTS[name]
    module = bridge(fn, *args)
    optimize_as_configured(module)
    steps = list(leaf_steps(lower(module, CPU).steps))
    weights = args[-1].shape
    copies = [s for s in steps if isinstance(s, LoopKernel)
              and math.prod(s.dims) == math.prod(weights)]
    strided = [s.b_feature_stride for s in steps if isinstance(s, ImplicitGemm)
               and s.b_feature_stride != 1]
    if stride is None:
        assert len(copies) == 1 and copies[0].transposes and not strided
    else:
        assert not copies and strided == [stride]
    check_compiled(fn, args)


@pytest.mark.parametrize("lanes", [16, 8])
def test_dot_product_blocks_split_over_threads_match_evaluator(lanes, monkeypatch,
                                                               no_compile_cache):
    """Blocks of 4 rows by 6 features on AVX-512, 2 by 6 on AVX2."""
    monkeypatch.setattr(engine, "vector_lanes", lambda: lanes)
    monkeypatch.setattr(cpu_check, "BACKEND", CpuBackend())
    monkeypatch.setattr(implicit_gemm, "SPLIT_WORK", 0)
    for fn, args in (CASES["few_rows"], CASES["odd_rows"], DOTS["transposed_rhs_heads"]):
        check_compiled(fn, args)


@pytest.mark.parametrize("name, transposed", [("many_channels", (2, 1, 21, 37)),
                                              ("transposed_rhs", None)])
def test_where_weights_are_not_read_at_a_stride_they_are_copied_in_tiles(
        name, transposed, monkeypatch, no_compile_cache):
    """The copy with output features innermost reads the weights a whole row
    apart: it runs in square tiles (and the copy of a Dense layer's W^T too)."""
    monkeypatch.setattr(CpuBackend, "target", COPIED_TRANSPOSES)
    monkeypatch.setattr(cpu_check, "BACKEND", CpuBackend())
    fn, args = CASES[name] if name in CASES else DOTS[name]
    module = bridge(fn, *args)
    optimize_as_configured(module)
    copies = [s for s in leaf_steps(lower(module, COPIED_TRANSPOSES).steps)
              if isinstance(s, LoopKernel) and s.transposes]
    assert len(copies) == 1
    if transposed is not None:
        assert copies[0].dims == transposed
    assert codegen.tiled(copies[0])
    check_compiled(fn, args)


def test_an_epilogue_updates_each_row_in_vectors_without_run_time_checks():
    """A convolution's bias and ReLU run over each block's rows in place in C,
    vectorised: the element is read and written through one pointer, so LLVM
    needs no run-time check that the two do not overlap (which failed for an
    update in place, and sent every row but the first to scalar code). Rows of
    32 output positions: blocks of 11 and 10 rows."""
    fn = lambda x, w, b: tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME") + b)  # noqa: E731
    args = (rand(2, 32, 32, 3), rand(3, 3, 3, 32), rand(32))
    module = bridge(fn, *args)
    optimize_as_configured(module)
    program = lower(module, CPU)
    assert [s.epilogue is not None for s in leaf_steps(program.steps)
            if isinstance(s, ImplicitGemm)] == [True]
    text, _, _ = render_program(program, "epilogue_test", lanes=engine.vector_lanes())
    optimized = str(engine.optimize(text))
    assert re.search(r"@llvm\.maximum\.v\d+f32\(", optimized)       # the ReLU in vectors
    assert not re.search(r"@llvm\.maximum\.f32\(", optimized)        # and nowhere one by one
    check_compiled(fn, args)


def test_layouts_it_does_not_take_compile_as_patches_and_sgemm():
    def channels_first(x, w):
        return tf.nn.conv2d(x, w, 1, "SAME", data_format="NCHW")
    x, w = rand(2, 3, 7, 7), rand(3, 3, 3, 4)
    steps = implicit_steps(channels_first, (x, w))
    assert steps and not any(isinstance(s, ImplicitGemm) for s in steps)
    check_compiled(channels_first, (x, w))


def conv_bias_relu_and_grads(x, w, bias):
    with tf.GradientTape() as tape:
        tape.watch([x, w, bias])
        y = tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME") + bias)     # Conv2D(activation="relu")
        loss = tf.reduce_sum(tf.nn.max_pool2d(y, 2, 2, "VALID") ** 2)
    return [loss, *tape.gradient(loss, [x, w, bias])]


def conv1d_bias_relu_and_grads(x, w, bias):
    with tf.GradientTape() as tape:
        tape.watch([x, w, bias])     # (TensorFlow's conv1d: a conv2d between reshapes)
        y = tf.nn.relu(tf.nn.conv1d(x, w, 1, "VALID") + bias)
        loss = tf.reduce_sum(tf.reduce_max(y, axis=1) ** 2)
    return [loss, *tape.gradient(loss, [x, w, bias])]


BIAS_RELU = (rand(2, 10, 9, 3), rand(3, 3, 3, 20), rand(20))
EPILOGUES = {"conv2d": (conv_bias_relu_and_grads, BIAS_RELU, (2, 10, 9, 20)),
             "conv1d": (conv1d_bias_relu_and_grads, (rand(3, 17, 5), rand(4, 5, 24), rand(24)),
                        (3, 14, 24))}


@pytest.mark.parametrize("name", EPILOGUES)
def test_bias_and_activation_run_as_the_convolutions_epilogue(name):
    fn, args, activation = EPILOGUES[name]
    module = bridge(fn, *args)
    optimize_as_configured(module)
    program = lower(module, CPU)
    # The forward convolution stores the activation's output (its gradients, the
    # reshapes that follow them, which are epilogues too).
    assert any(isinstance(s, ImplicitGemm) and s.epilogue is not None
               and program.buffers[s.out].dims == activation for s in program.steps)
    assert not any(isinstance(s, LoopKernel) and s.dims == activation
                   and "maximum" in s.name for s in leaf_steps(program.steps))
    check_compiled(fn, args)


def filter_gradient(x, w):
    with tf.GradientTape() as tape:
        tape.watch(w)
        loss = tf.reduce_sum(tf.nn.conv2d(x, w, 1, "SAME") ** 2)
    return tape.gradient(loss, w)


# Few sums over a long contraction: (fn, args, the product's m, k and runs).
LONG_CONTRACTIONS = {
    # a filter gradient (after the forward convolution its loss reads): 27 sums
    # of 1536 products, the batch cut into 6 runs, each sliced
    "filter_gradient": (filter_gradient, (rand(6, 16, 16, 3), rand(3, 3, 3, 5)),
                        (27, 6 * 16 * 16, 6)),
    # a Dense layer's input gradient dY W^T, W's features at a stride: blocks of
    # dot products over one contraction level, which the runs cut
    "dense_input_gradient": (lambda g, w: tf.matmul(g, w, transpose_b=True),
                             (rand(20, 3000), rand(96, 3000)), (20, 3000, 8)),
}


@pytest.mark.parametrize("name", LONG_CONTRACTIONS)
def test_few_sums_over_a_long_contraction_run_in_parts_each_thread_streams_its_own(
        name, monkeypatch, no_compile_cache):
    """Its contraction cut into runs, each summed into its own copy of the
    result by the threads that take it, the copies added in order after;
    threads whose blocks end inside a run (4 threads over 6 runs). The
    result matches the evaluator and is the same bits on any thread count:
    which thread sums a run changes no order of addition."""
    monkeypatch.setattr(split_reductions, "MIN_STREAMED_BYTES", 0)
    monkeypatch.setattr(implicit_gemm, "L1_SLICE_BYTES", 256)
    monkeypatch.setattr(implicit_gemm, "SPLIT_WORK", 0)
    fn, args, (m, k, parts) = LONG_CONTRACTIONS[name]
    module = bridge(fn, *args)
    optimize_as_configured(module)
    program = lower(module, CPU)
    gemm = [s for s in program.steps if isinstance(s, ImplicitGemm)][-1]
    assert (gemm.m, gemm.k, gemm.parts) == (m, k, parts)
    assert program.buffers[gemm.out].dims[0] == parts
    want = evaluate(module, [np.asarray(a) for a in args])
    want = want[-1] if isinstance(want, tuple) else want
    results = []
    try:
        for threads in (1, 2, 4):
            parallel.set_threads(threads)
            got = CpuBackend().compile(module)([np.asarray(a) for a in args])[-1]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
            results.append(got)
    finally:
        parallel.set_threads(parallel.usable_cores())
    assert all(np.array_equal(r, results[0]) for r in results)


def test_a_short_contraction_or_many_sums_stay_whole():
    """Where the copies of C would cost more than the operands once more per
    thread (a forward convolution's many rows; a small gradient)."""
    args = (rand(6, 16, 16, 3), rand(3, 3, 3, 5))
    assert [s.parts for s in implicit_steps(conv_and_grads(1, "SAME"), args)] == [1, 1, 1]
    big = (rand(32, 64, 64, 3), rand(3, 3, 3, 16))
    forward, input_gradient, weights_gradient = implicit_steps(conv_and_grads(1, "SAME"), big)
    assert (forward.parts, input_gradient.parts, weights_gradient.parts) == (1, 1, 8)


def test_a_long_contraction_into_a_large_output_runs_slice_by_slice_in_groups_of_blocks():
    """Blocks of 6 rows by 4 vectors of 16 features take their slice of B
    from L1 and their partial sums from L2: a group's part of C fits
    GROUP_C_BYTES (the whole of C does not)."""
    forward, *_ = implicit_steps(conv_and_grads(1, "VALID"),
                                 (rand(16, 40, 40, 64), rand(5, 5, 64, 64)))
    plan = implicit_gemm._Emitter(ir.Module(), forward, "g", 16).plan
    extents = [e for e, _, _ in plan.depth]
    assert plan.slices > 1
    assert plan.slice * math.prod(extents[plan.level + 1:]) * plan.width * 4 \
        <= implicit_gemm.L1_SLICE_BYTES
    block_bytes = (plan.rows + 1) * plan.width * 4
    assert forward.m * forward.n * 4 > implicit_gemm.GROUP_C_BYTES
    assert 1 < plan.group < plan.total and plan.group * block_bytes <= implicit_gemm.GROUP_C_BYTES


def test_an_epilogue_runs_once_the_last_slice_is_summed(monkeypatch, no_compile_cache):
    monkeypatch.setattr(cpu_check, "BACKEND", CpuBackend())
    monkeypatch.setattr(implicit_gemm, "SLICE_BYTES", 256)
    monkeypatch.setattr(implicit_gemm, "L1_SLICE_BYTES", 256)
    monkeypatch.setattr(implicit_gemm, "SMALL_C_BYTES", 0)
    monkeypatch.setattr(implicit_gemm, "GROUP_C_BYTES", 4096)
    monkeypatch.setattr(implicit_gemm, "SPLIT_WORK", 0)
    check_compiled(conv_bias_relu_and_grads, BIAS_RELU)


def test_a_convolution_read_elsewhere_too_keeps_its_output():
    def returned_too(x, w, bias):
        y = tf.nn.conv2d(x, w, 1, "SAME")
        return y, tf.nn.relu(y + bias)
    steps = implicit_steps(returned_too, BIAS_RELU)
    assert [s.epilogue for s in steps] == [None]
    check_compiled(returned_too, BIAS_RELU)


def padded_copies(fn, args):
    """The names of the loop kernels that make padded copies, in the program
    for fn(*args), checked against the evaluator."""
    check_compiled(fn, args)
    module = bridge(fn, *args)
    optimize_as_configured(module)
    return [s.name for s in leaf_steps(lower(module, CPU).steps)
            if isinstance(s, LoopKernel) and s.name.startswith("pad_")]


def test_a_filter_gradient_reads_the_padded_copy_its_forward_made():
    # SAME, stride 1: the forward and the filter gradient pad x alike; the input
    # gradient pads the output gradient.
    copies = padded_copies(conv_and_grads(1, "SAME"), CASES["same_padding"][1])
    assert len(copies) == 2 and not any("BackpropFilter" in c for c in copies)
    # Two convolutions of one input: a copy per padding.
    def two_convolutions(x, w, v):
        return tf.nn.conv2d(x, w, 1, "SAME"), tf.nn.conv2d(x, v, 1, "SAME")
    x = rand(2, 6, 7, 4)
    assert len(padded_copies(two_convolutions, (x, rand(3, 3, 4, 5), rand(3, 3, 4, 6)))) == 1
    assert len(padded_copies(two_convolutions, (x, rand(3, 3, 4, 5), rand(5, 5, 4, 6)))) == 2


def dense_reshape_conv1d_gradient(x, w1, w2):
    # Dense(16, relu) -> Reshape((16, 1)) -> Conv1D: the input gradient's
    # convolution has one feature, and the relu gradient reads it reshaped.
    with tf.GradientTape() as tape:
        tape.watch(w1)
        h = tf.nn.relu(tf.matmul(x, w1))
        y = tf.nn.conv1d(tf.reshape(h, [-1, 16, 1]), w2, 1, "SAME")
        loss = tf.reduce_sum(y * y)
    return tape.gradient(loss, w1)


@pytest.mark.parametrize("fn, args", [
    (dense_reshape_conv1d_gradient, (rand(3, 5), rand(5, 16, seed=1), rand(3, 1, 4, seed=2))),
    # One feature, dropped after the convolution; a unit dim after the features.
    (lambda x, w, b: tf.nn.relu(tf.squeeze(tf.nn.conv2d(x, w, 1, "SAME"), -1) + b),
     (rand(2, 6, 7, 3), rand(3, 3, 3, 1), rand(7))),
    (lambda x, w, b: tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME")[..., None] + b),
     (rand(2, 6, 7, 3), rand(3, 3, 3, 5), rand(5, 1)))])
def test_a_consumer_whose_last_dim_is_not_the_features_is_no_epilogue(fn, args):
    check_compiled(fn, args)


def test_a_reversed_window_walks_the_weights_backwards():
    text, args = REVERSED_WINDOW
    gemm, = [s for s in lower(parse_module(text), CPU).steps
             if isinstance(s, ImplicitGemm)]
    assert gemm.b_offset > 0
    check(parse_module(text), list(args), rtol=1e-5, atol=1e-5)


def test_the_contraction_loops_are_left_unrolled_by_llvm():
    # (Each step is already a block of FMAs: LLVM's unrolling of them cost
    # compile time and gained nothing.) The loop metadata must name itself,
    # or LLVM ignores it.
    fn, args = CASES["same_padding"]
    module = bridge(fn, *args)
    optimize_as_configured(module)
    text, _, _ = render_program(lower(module, CPU))
    nodes = re.findall(r"^(!\d+) = distinct !\{ (!\d+), (!\d+) \}$", text, flags=re.M)
    assert nodes and all(node == first for node, first, _ in nodes)
    disabled = {m for m in re.findall(r'^(!\d+) = !\{ !"llvm.loop.unroll.disable" \}$',
                                      text, flags=re.M)}
    assert {option for _, _, option in nodes} <= disabled
    assert re.search(r"!llvm.loop " + nodes[0][0] + r"\b", text)


# ------------------------------------------------------------------ dots

DOTS = {
    # a Dense layer: its bias and relu become the GEMM's epilogue
    "dense_relu": (lambda x, w: tf.nn.relu(tf.matmul(x, w) + 0.5), (rand(70, 200), rand(200, 96))),
    # its kernel's gradient: x read transposed (rows along x's columns)
    "transposed_lhs": (lambda x, g: tf.matmul(x, g, transpose_a=True),
                       (rand(300, 40), rand(300, 72))),
    # Dense on a sequence: rows over two dims, features past four vectors
    "sequence": (lambda x, w: tf.einsum("btc,cd->btd", x, w), (rand(3, 37, 24), rand(24, 81))),
    # attention's projection: the rhs's two free dims, the heads and their width
    "heads": (lambda x, w: tf.einsum("btc,chd->bthd", x, w), (rand(2, 19, 32), rand(32, 4, 8))),
    # two contracting dims (an output projection over heads and width)
    "two_contractions": (lambda x, w: tf.einsum("bthd,hdc->btc", x, w),
                         (rand(2, 19, 4, 8), rand(4, 8, 40))),
    # a Dense layer's input gradient, dY W^T: W's features read at a stride
    "transposed_rhs": (lambda g, w: tf.matmul(g, w, transpose_b=True),
                       (rand(20, 150), rand(96, 150))),
    # ... over heads (W's two free dims read as one, at a stride)
    "transposed_rhs_heads": (lambda g, w: tf.einsum("btd,chd->bthc", g, w),
                             (rand(1, 17, 40), rand(20, 3, 40))),
}


@pytest.mark.parametrize("name", DOTS)
def test_dots_as_implicit_gemms_match_evaluator(name):
    fn, args = DOTS[name]
    steps = implicit_steps(fn, args)
    assert steps and all(isinstance(s, ImplicitGemm) for s in steps)
    if name == "dense_relu":
        assert steps[0].epilogue is not None
    check_compiled(fn, args)


def test_a_transposed_rhs_is_copied_once_for_all_its_products(monkeypatch, no_compile_cache):
    """W^T read by two products (two Dense layers' input gradients off one
    weight), where it is copied: one copy with its features innermost serves both."""
    monkeypatch.setattr(CpuBackend, "target", COPIED_TRANSPOSES)
    monkeypatch.setattr(cpu_check, "BACKEND", CpuBackend())
    fn, args = (lambda a, b, w: (tf.matmul(a, w, transpose_b=True),
                                 tf.matmul(b, w, transpose_b=True)),
                (rand(64, 50), rand(40, 50), rand(96, 50)))
    module = bridge(fn, *args)
    optimize_as_configured(module)
    kinds = [type(s).__name__ for s in leaf_steps(lower(module, COPIED_TRANSPOSES).steps)]
    assert kinds == ["LoopKernel", "ImplicitGemm", "ImplicitGemm"]
    check_compiled(fn, args)


@pytest.mark.parametrize("fn, args", [
    (lambda x, w: tf.matmul(x, w), (rand(64, 50), rand(50, 10))),     # narrow: 10 features
    (lambda a, b: tf.matmul(a, b), (rand(6, 40, 30), rand(6, 30, 50)))])   # batched
def test_dots_it_does_not_take_stay_gemm_calls(fn, args):
    steps = implicit_steps(fn, args)
    assert steps and all(isinstance(s, GemmCall) for s in steps)
    check_compiled(fn, args)
