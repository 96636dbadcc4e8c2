"""Large loop kernels and matrix products run on several threads, with results bit-identical to
the reference evaluator (each element's arithmetic does not depend on which
thread computes it), whatever the thread count."""
import dataclasses
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf

from kerasjit.backends.cpu import CpuBackend, parallel, thread_pool
from kerasjit.backends.cpu.blas import SGEMM_SYMBOL
from kerasjit.hlo.evaluator import evaluate

from tests.support.bridge import bridge
from tests.support.dtype_values import values
from tests.support.structured_cases import rand
from tests.support.thread_counts import identical_on_any_thread_count
from tests.support.targets import PATCHES


@pytest.fixture
def backend(no_compile_cache):       # build the code, not a cached object
    yield CpuBackend()
    parallel.set_threads(parallel.usable_cores())


@pytest.fixture
def sgemm_backend(backend):
    """The CPU backend with every dot a GEMM call (as transposed and batched
    ones are; others are implicit GEMMs: test_implicit_gemm.py)."""
    backend.target = dataclasses.replace(backend.target, implicit_dots=False)
    return backend


def split_kernels(executable):
    """Names of the kernels the renderer split across threads."""
    return [name for name, source in executable.kernels[1:] if f'@"{name}_task"' in source]


def split_products(executable):
    """Names of the split kernels that are sgemm calls."""
    sources = dict(executable.kernels)
    return [name for name in split_kernels(executable) if SGEMM_SYMBOL in sources[name]]


def expected(module, args):
    """The reference evaluator's outputs of `module`, as a list."""
    want = evaluate(module, args)
    return list(want) if isinstance(want, tuple) else [want]


def assert_identical(module, executable, args):
    want = expected(module, args)
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
    assert thread_pool.SPLIT_SYMBOL in executable.kernels[0][1]       # the entry starts threads
    parallel.set_threads(threads)
    assert_identical(module, executable, list(args))


SMALL = {
    "small_elementwise": (multi_output, (rand(8, 9), rand(8, 9, seed=1))),
    "small_rows": (lambda x: tf.reduce_max(x, axis=1), (rand(4, 5, 6),)),
    # Large, but a float product, whose rounding depends on how its terms group.
    "product_over_batch": (lambda x: tf.reduce_prod(1 + x / 1000, axis=0), (rand(2000, 600),)),
}


@pytest.mark.parametrize("name", SMALL)
def test_small_or_whole_reductions_stay_on_one_thread(name, backend):
    fn, args = SMALL[name]
    module = bridge(fn, *args)
    executable = backend.compile(module)
    assert not split_kernels(executable)
    assert thread_pool.SPLIT_SYMBOL not in executable.kernels[0][1]
    got, want = executable(list(args)), expected(module, list(args))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4)


# Large reductions into a row or a scalar, with no loop outside the reduction for
# threads to split: reduced in a fixed number of parts that threads share, then folded.
IN_PARTS = {
    "sum_over_batch": (lambda x: tf.reduce_sum(x, axis=0), (rand(2000, 600),)),
    "sum_to_scalar": (lambda x: tf.reduce_sum(x), (rand(2000, 600),)),
    "bias_gradient": (lambda x: tf.reduce_sum(x, axis=[0, 1, 2]), (rand(128, 26, 26, 32),)),
    "mean_over_an_odd_batch": (lambda x: tf.reduce_mean(x, axis=0), (rand(1001, 999),)),
}
# ... exactly where the combiner's result does not depend on the grouping.
EXACT_IN_PARTS = {
    "max_over_batch": (lambda x: tf.reduce_max(x, axis=0), (rand(2000, 600),)),
    "min_to_scalar": (lambda x: tf.reduce_min(x), (rand(2000, 600),)),
    "int_sum_over_batch": (lambda x: tf.reduce_sum(x, axis=0),
                           (values("s32", (2000, 600), np.random.default_rng(4)),)),
}


@pytest.mark.parametrize("name", [*IN_PARTS, *EXACT_IN_PARTS])
def test_large_reductions_into_a_row_are_shared_by_threads(name, backend):
    fn, args = {**IN_PARTS, **EXACT_IN_PARTS}[name]
    module = bridge(fn, *args)
    executable = backend.compile(module)
    assert split_kernels(executable)
    got = identical_on_any_thread_count(executable, args)
    if name in EXACT_IN_PARTS:
        assert_identical(module, executable, list(args))
    else:
        for g, w in zip(got, expected(module, list(args))):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-3)


def test_a_large_kernel_beside_a_small_matmul_is_split(sgemm_backend):
    backend = sgemm_backend
    # The matmul (64x128x128 multiply-adds, below blas.SINGLE_THREAD_MNK) runs on the
    # calling thread alone, and the tanh loop splits.
    args = (rand(64, 128), rand(128, 128), rand(512, 512))
    module = bridge(lambda a, b, x: (tf.matmul(a, b), tf.tanh(x)), *args)
    executable = backend.compile(module)
    assert len(split_kernels(executable)) == 1
    got, want = executable(list(args)), expected(module, list(args))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


LARGE_PRODUCTS = {
    # Each from blas.SINGLE_THREAD_MNK multiply-adds on: split over kerasjit's threads
    # (along the product's longer side, or its batch indices), each calling sgemm alone.
    "rows": (lambda a, b: tf.matmul(a, b), (rand(301, 256), rand(256, 160))),
    "rows_transposed_lhs": (lambda a, b: tf.matmul(a, b, transpose_a=True),
                            (rand(256, 301), rand(256, 160))),
    "rows_transposed_rhs": (lambda a, b: tf.matmul(a, b, transpose_b=True),
                            (rand(301, 256), rand(160, 256))),
    "columns": (lambda a, b: tf.matmul(a, b), (rand(96, 256), rand(256, 401))),
    "columns_transposed_rhs": (lambda a, b: tf.matmul(a, b, transpose_b=True),
                               (rand(96, 256), rand(401, 256))),
    "columns_transposed_lhs": (lambda a, b: tf.matmul(a, b, transpose_a=True),
                               (rand(256, 96), rand(256, 401))),
    "batched": (lambda a, b: tf.matmul(a, b), (rand(7, 96, 128), rand(7, 128, 112))),
    "beside_a_loop": (lambda a, b, x: (tf.matmul(a, b), tf.tanh(x)),
                      (rand(256, 256), rand(256, 256), rand(512, 512))),
}


@pytest.mark.parametrize("threads", [1, 2, 7])
@pytest.mark.parametrize("name", LARGE_PRODUCTS)
def test_large_matmuls_split_over_our_threads(name, threads, sgemm_backend):
    backend = sgemm_backend
    fn, args = LARGE_PRODUCTS[name]
    module = bridge(fn, *args)
    executable = backend.compile(module)
    assert len(split_products(executable)) == 1
    assert len(split_kernels(executable)) == len(args) - 1     # (and the tanh loop)
    parallel.set_threads(threads)
    got, want = executable(list(args)), expected(module, list(args))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-4)


ATTENTION_PRODUCTS = {
    # Many small products (attention's, per batch and head): whole products to each
    # thread from parallel.MIN_WORK multiply-adds on, though each is far below
    # blas.SINGLE_THREAD_MNK; as generated narrow kernels and as sgemm calls.
    "narrow": (lambda p, v: tf.matmul(p, v), (rand(47, 40, 40), rand(47, 40, 16))),
    "sgemm": (lambda q, k: tf.matmul(q, k, transpose_b=True), (rand(47, 40, 24),
                                                               rand(47, 40, 24))),
}


@pytest.mark.parametrize("threads", [1, 2, 7])
@pytest.mark.parametrize("name", ATTENTION_PRODUCTS)
def test_many_small_products_split_by_product_and_identical(name, threads, backend):
    fn, args = ATTENTION_PRODUCTS[name]
    module = bridge(fn, *args)
    executable = backend.compile(module)
    assert len(split_kernels(executable)) == 1
    parallel.set_threads(threads)
    got = executable(list(args))
    parallel.set_threads(1)                 # (each product whole on one thread: identical)
    assert np.array_equal(got[0], executable(list(args))[0])
    np.testing.assert_allclose(got[0], expected(module, list(args))[0], rtol=1e-5, atol=1e-4)


def test_a_chunked_accumulating_product_splits_each_chunk(backend):
    # A convolution as patch matrices in chunks, each chunk's product adding into
    # the output (beta = 1 after the first): every thread's rows accumulate alike.
    backend.target = dataclasses.replace(PATCHES, patch_budget_bytes=1 << 20)
    args = (rand(4, 30, 30, 64), rand(3, 3, 64, 96))
    module = bridge(lambda x, w: tf.nn.conv2d(x, w, 1, "VALID"), *args)
    executable = backend.compile(module)
    assert split_products(executable)
    parallel.set_threads(3)
    np.testing.assert_allclose(executable(list(args))[0], evaluate(module, list(args)),
                               rtol=1e-4, atol=1e-3)


def test_beside_convolutions_the_sgemm_and_the_loops_split(sgemm_backend):
    backend = sgemm_backend
    # The convolution (an implicit GEMM, ~16M multiply-adds), the matmul (~8M) and
    # the tanh loop each split across the cores; no OpenBLAS thread spins.
    args = (rand(8, 34, 34, 32), rand(3, 3, 32, 64), rand(128, 256), rand(256, 256),
            rand(512, 512))
    module = bridge(lambda x, w, a, b, t: (tf.nn.conv2d(x, w, 1, "VALID"), tf.matmul(a, b),
                                           tf.tanh(t)), *args)
    executable = backend.compile(module)
    assert len(split_kernels(executable)) == 3 and len(split_products(executable)) == 1
    got, want = executable(list(args)), expected(module, list(args))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------- the thread pool

def test_kernels_called_from_several_threads_at_once_are_identical(backend):
    """The pool serves one call at a time; a thread calling in meanwhile runs
    its kernel whole on itself: every result is as on one thread."""
    fn, args = LARGE["multi_output"]
    module = bridge(fn, *args)
    executable = backend.compile(module)
    want = expected(module, list(args))
    parallel.set_threads(2)
    wrong = []

    def calls():
        for _ in range(40):
            got = executable(list(args))
            wrong.extend(i for i, (g, w) in enumerate(zip(got, want)) if not np.array_equal(g, w))
    callers = [threading.Thread(target=calls) for _ in range(4)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join()
    assert not wrong


# Runs a split kernel (starting the pool), then the `case`'s part; prints "ok" if
# every result was the reference evaluator's.
_POOL_SCRIPT = """
import os, sys
import numpy as np
import tensorflow as tf
from kerasjit.backends.cpu import CpuBackend, parallel
from kerasjit.hlo.evaluator import evaluate
from tests.support.bridge import bridge
from tests.support.structured_cases import rand

if {one_core}:      # threads the pool starts inherit it: they share the caller's core
    os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}})
parallel.set_threads(2)
args = [rand(401, 333), rand(401, 333, seed=1)]
module = bridge(lambda a, b: (a * b + 1.5, tf.sqrt(tf.abs(a - b))), *args)
executable = CpuBackend().compile(module)
want = evaluate(module, args)
same = lambda: all(np.array_equal(g, w) for g, w in zip(executable(args), want))
assert same()
if {fork}:
    child = os.fork()
    if child == 0:          # the pool's workers did not come along: a new pool
        os._exit(0 if all(same() for _ in range(20)) else 1)
    assert os.waitpid(child, 0)[1] == 0, "wrong results in the forked child"
assert all(same() for _ in range(200))
print("ok")
"""


@pytest.mark.parametrize("case", ["fork", "one_core"])
def test_the_pool_after_a_fork_and_on_a_single_core(case, tmp_path):
    """A fork's child runs split kernels on a pool of its own; with the pool's
    threads on the caller's one core (a busy machine), the caller runs the
    parts its worker does not get to, and every result is right."""
    script = _POOL_SCRIPT.format(fork=case == "fork", one_core=case == "one_core")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                              os.path.dirname(os.path.abspath(__file__))))),
                          env=dict(os.environ, KERASJIT_CACHE_DIR=str(tmp_path)))
    assert done.returncode == 0 and done.stdout.split() == ["ok"], done.stderr[-3000:]
