"""Large loop kernels run on several threads, with results bit-identical to
the reference evaluator (each element's arithmetic does not depend on which
thread computes it), whatever the thread count."""
import numpy as np
import pytest
import tensorflow as tf

from kerasjit.backends.cpu import CpuBackend, parallel
from kerasjit.hlo.evaluator import evaluate

from tests.support.bridge import bridge
from tests.support.dtype_values import values
from tests.support.structured_cases import rand


@pytest.fixture
def backend(no_compile_cache):       # build the code, not a cached object
    yield CpuBackend()
    parallel.set_threads(parallel.usable_cores())


def split_kernels(executable):
    """Names of the kernels the renderer split across threads."""
    return [name for name, source in executable.kernels[1:] if f'@"{name}_task"' in source]


def assert_identical(module, executable, args):
    want = evaluate(module, args)
    want = list(want) if isinstance(want, tuple) else [want]
    got = executable(args)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w)


def multi_output(a, b):            # one loop, several stores (an optimizer's m, v, w)
    return a * b + 1.5, tf.sqrt(tf.abs(a - b)) / (b * b + 1.0), tf.maximum(a, b)


LARGE = {
    "multi_output": (multi_output, (rand(401, 333), rand(401, 333, seed=1))),
    # Row-accumulating reductions over a middle dimension: split over the rows.
    # (Exact ones: numpy sums floats pairwise, the kernels in index order.)
    "max_rows": (lambda x: tf.reduce_max(x, axis=1), (rand(67, 129, 130),)),
    "int_sum_rows": (lambda x: tf.reduce_sum(x, axis=1),
                     (values("s32", (67, 129, 130), np.random.default_rng(3)),)),
}


@pytest.mark.parametrize("threads", [1, 2, 7])   # 7: more parts than cores, uneven rows
@pytest.mark.parametrize("name", LARGE)
def test_large_kernels_are_split_and_identical(name, threads, backend):
    fn, args = LARGE[name]
    module = bridge(fn, *args)
    executable = backend.compile(module)
    assert split_kernels(executable)
    assert parallel.SPLIT_SYMBOL in executable.kernels[0][1]       # the entry starts threads
    parallel.set_threads(threads)
    assert_identical(module, executable, list(args))


SMALL = {
    "small_elementwise": (multi_output, (rand(8, 9), rand(8, 9, seed=1))),
    "small_rows": (lambda x: tf.reduce_max(x, axis=1), (rand(4, 5, 6),)),
    # Large, but with no loop outside the reduction to split (one summation order).
    "sum_to_scalar": (lambda x: tf.reduce_sum(x), (rand(2000, 600),)),
    "sum_over_batch": (lambda x: tf.reduce_sum(x, axis=0), (rand(2000, 600),)),
    # Large, but beside an sgemm big enough to run threaded (blas.SINGLE_THREAD_MNK),
    # whose OpenBLAS threads keep the other cores busy.
    "beside_matmul": (lambda a, b, x: (tf.matmul(a, b), tf.tanh(x)),
                      (rand(256, 256), rand(256, 256), rand(512, 512))),
}


@pytest.mark.parametrize("name", SMALL)
def test_small_whole_or_beside_blas_kernels_stay_on_one_thread(name, backend):
    fn, args = SMALL[name]
    module = bridge(fn, *args)
    executable = backend.compile(module)
    assert not split_kernels(executable)
    assert parallel.SPLIT_SYMBOL not in executable.kernels[0][1]
    got, want = executable(list(args)), evaluate(module, list(args))
    want = list(want) if isinstance(want, tuple) else [want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4)


def test_a_large_kernel_beside_a_small_matmul_is_split(backend):
    # The matmul (64x128x128 multiply-adds, below blas.SINGLE_THREAD_MNK) runs on the
    # calling thread alone, so no OpenBLAS thread spins and the tanh loop may split.
    args = (rand(64, 128), rand(128, 128), rand(512, 512))
    module = bridge(lambda a, b, x: (tf.matmul(a, b), tf.tanh(x)), *args)
    executable = backend.compile(module)
    assert split_kernels(executable)
    got, want = executable(list(args)), evaluate(module, list(args))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_beside_convolutions_every_sgemm_runs_alone_and_the_rest_is_split(backend):
    # The convolution (an implicit GEMM, ~16M multiply-adds) outweighs the matmul
    # (~8M, which OpenBLAS would thread): the matmul runs on the calling thread,
    # so the convolution and the tanh loop take both cores.
    args = (rand(8, 34, 34, 32), rand(3, 3, 32, 64), rand(128, 256), rand(256, 256),
            rand(512, 512))
    module = bridge(lambda x, w, a, b, t: (tf.nn.conv2d(x, w, 1, "VALID"), tf.matmul(a, b),
                                           tf.tanh(t)), *args)
    executable = backend.compile(module)
    assert len(split_kernels(executable)) == 2
    got, want = executable(list(args)), evaluate(module, list(args))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
