"""KERASJIT_PROFILE_KERNELS: time per compiled kernel, without changing results."""
import numpy as np
import pytest
import tensorflow as tf

import kerasjit
from kerasjit.backends.cpu import profile as kernel_profiling


def relu_layer(x, w):
    # (an implicit GEMM with the bias and relu as its epilogue, then a loop kernel
    # taking each row's maximum)
    return tf.reduce_max(tf.nn.relu(tf.matmul(x, w, transpose_b=True) + 1.0), axis=1)


X = np.random.default_rng(0).normal(size=(64, 200)).astype(np.float32)
W = np.random.default_rng(1).normal(size=(96, 200)).astype(np.float32)


def clusters(profile):
    return set(profile["cluster"])


def test_every_kernel_of_a_profiled_cluster_is_timed_and_counted(monkeypatch):
    before = clusters(kerasjit.kernel_profile())
    monkeypatch.setenv("KERASJIT_PROFILE_KERNELS", "1")
    f = kerasjit.jit(relu_layer, race=False)     # (racing, some calls would run in TF)
    for _ in range(3):
        np.testing.assert_allclose(f(X, W), relu_layer(X, W).numpy(), rtol=1e-5, atol=1e-4)
    profile = kerasjit.kernel_profile()
    mine = profile[profile["cluster"].isin(clusters(profile) - before)]
    assert list(mine.columns) == ["cluster", "kernel", "calls", "seconds", "share", "gflops"]
    # (64 rows against a contraction of 200: W^T read in place, as dot products)
    (product,) = mine[mine["kernel"].str.contains("GEMM 64x96x200, dot products")].itertuples()
    assert product.gflops == pytest.approx(2 * 64 * 96 * 200 * 3 / product.seconds / 1e9)
    others = mine[mine.index != product.Index]
    assert len(others) >= 1 and others["gflops"].isna().all()     # the maxima: no rate
    assert (mine["calls"] == 3).all() and (mine["seconds"] > 0).all()
    assert list(profile["seconds"]) == sorted(profile["seconds"], reverse=True)
    assert abs(profile["share"].sum() - 1) < 1e-9
    kerasjit.kernel_profile(reset=True)
    assert (kerasjit.kernel_profile()["calls"] == 0).all()
    f(X, W)
    again = kerasjit.kernel_profile()
    assert (again[again["cluster"].isin(set(mine["cluster"]))]["calls"] == 1).all()


def test_without_the_variable_nothing_is_timed(monkeypatch):
    monkeypatch.delenv("KERASJIT_PROFILE_KERNELS", raising=False)
    before = clusters(kerasjit.kernel_profile())
    f = kerasjit.jit(lambda x, w: tf.nn.sigmoid(tf.matmul(x, w, transpose_b=True)), race=False)
    f(X, W)
    assert clusters(kerasjit.kernel_profile()) == before


def test_an_empty_profile_says_why(monkeypatch):
    monkeypatch.delenv("KERASJIT_PROFILE_KERNELS", raising=False)
    monkeypatch.setattr(kernel_profiling, "_loaded", {})
    with pytest.warns(RuntimeWarning, match="no kernel was timed: set KERASJIT_PROFILE_KERNELS=1"):
        assert kerasjit.kernel_profile().empty
