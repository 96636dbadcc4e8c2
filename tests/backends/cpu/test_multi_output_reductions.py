"""A large row reduction computes the elementwise value it sums in its own loop
and stores it for that value's other readers (kernels/multi_output.py): a
convolution's bias gradient and the activation's gradient it sums, one pass
over memory instead of two. Checked against the reference evaluator, on 1, 2
and 7 threads."""
import numpy as np
import pytest
import tensorflow as tf

from kerasjit.backends.cpu import CpuBackend, parallel
from kerasjit.compiler import lower
from kerasjit.hlo.evaluator import evaluate
from kerasjit.kernels.ir import MultiOutputReduction, leaf_steps
from kerasjit.kernels.storage import writes
from kerasjit.passes import optimize_as_configured

from tests.support.bridge import bridge
from tests.support.structured_cases import rand
from tests.support.thread_counts import identical_on_any_thread_count


@pytest.fixture
def backend(no_compile_cache):       # build the code, not a cached object
    yield CpuBackend()
    parallel.set_threads(parallel.usable_cores())


def relu_gradient(a, g):
    return tf.where(a > 0, g, tf.zeros_like(g))


def bias_gradient(a, g):
    """The output gradient (kept: the filter gradient reads it) and its bias gradient."""
    d = relu_gradient(a, g)
    return d, tf.reduce_sum(d, axis=[0, 1, 2])


def bias_and_filter_gradient(a, g, x):
    """As a Dense layer's backward pass: a product reads the value between its
    producer and the reduction."""
    d = relu_gradient(a, g)
    return tf.matmul(x, d, transpose_a=True), tf.reduce_sum(d, axis=0)


def weighted_sum(a, g, x):
    """The reduction sums an expression of the value (BatchNormalization's sum of dy * x)."""
    d = relu_gradient(a, g)
    return tf.matmul(x, d, transpose_a=True), tf.reduce_sum(d * x, axis=0)


def row_max(a, g, x):
    d = relu_gradient(a, g)
    return tf.matmul(x, d, transpose_a=True), tf.reduce_max(d, axis=0)


FUSED = {
    "bias_gradient": (bias_gradient, (rand(32, 20, 20, 48), rand(32, 20, 20, 48, seed=1))),
    "bias_and_filter_gradient": (bias_and_filter_gradient,
                                 (rand(4096, 200), rand(4096, 200, seed=1),
                                  rand(4096, 24, seed=2))),
    "weighted_sum": (weighted_sum, (rand(8192, 96), rand(8192, 96, seed=1),
                                    rand(8192, 96, seed=2))),
    "row_max": (row_max, (rand(8192, 96), rand(8192, 96, seed=1), rand(8192, 24, seed=2))),
}
# Outputs exact whatever the grouping of their terms (a maximum), by position.
EXACT = {"row_max": (1,)}


def program_of(backend, module):
    """The kernel program of `module`, optimised in place (as compile() would)."""
    optimize_as_configured(module)
    return lower(module, backend.target, verify=True)


def fused_kernels(program):
    return [s for s in leaf_steps(program.steps) if isinstance(s, MultiOutputReduction)]


@pytest.mark.parametrize("name", FUSED)
def test_a_reduction_computes_and_stores_the_value_it_sums(name, backend):
    fn, args = FUSED[name]
    module = bridge(fn, *args)
    program = program_of(backend, module)
    (kernel,) = fused_kernels(program)
    (value, _, _), = kernel.term_stores
    # No other step writes the value: the reduction's loop is its only pass.
    assert [s.name for s in leaf_steps(program.steps) if value in writes(s)] == [kernel.name]

    executable = backend.compile(module, optimized=True)
    want = evaluate(module, list(args))
    got = identical_on_any_thread_count(executable, args)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape
        if i in EXACT.get(name, ()):
            assert np.array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-3)


NOT_FUSED = {
    # The row (channels) is not the value's innermost dim: its loop would store
    # the value a stride apart.
    "channels_first": (lambda a, g: (relu_gradient(a, g),
                                     tf.reduce_sum(relu_gradient(a, g), axis=[0, 2])),
                       (rand(64, 48, 400), rand(64, 48, 400, seed=1))),
    # Each element read by two terms (a sum of neighbours): stored twice.
    "overlapping_reads": (lambda a, g: (relu_gradient(a, g), tf.reduce_sum(
        relu_gradient(a, g)[:, 1:] + relu_gradient(a, g)[:, :-1], axis=[0, 1])),
                          (rand(256, 64, 128), rand(256, 64, 128, seed=1))),
    # A producer that transposes attention's keys, (batch, heads, depth, time) to
    # (batch, time, heads, depth): in the row's loop it would read them along
    # time a column at a time (a decoder's key bias gradient).
    "transposed_keys": (lambda a, g, x: (
        tf.einsum("btk,bthd->khd", x, tf.transpose(relu_gradient(a, g), [0, 3, 1, 2])),
        tf.reduce_sum(tf.transpose(relu_gradient(a, g), [0, 3, 1, 2]), axis=[0, 1])),
                        (rand(16, 4, 16, 40), rand(16, 4, 16, 40, seed=1),
                         rand(16, 40, 8, seed=2))),
    # Too small to be shared by threads: the producer keeps its own threads.
    "small": (bias_gradient, (rand(2, 5, 5, 16), rand(2, 5, 5, 16, seed=1))),
}


@pytest.mark.parametrize("name", NOT_FUSED)
def test_reductions_that_would_store_badly_are_left_apart(name, backend):
    fn, args = NOT_FUSED[name]
    module = bridge(fn, *args)
    assert not fused_kernels(program_of(backend, module))
    got = backend.compile(module, optimized=True)(list(args))
    for g, w in zip(got, evaluate(module, list(args))):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-3)
