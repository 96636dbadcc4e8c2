"""The GPU backend: GpuBackend and GpuExecutable on two devices.

"host" is an emulation of the device (support/cuda_host.py) that runs the very
CUDA C the backend generates, so CI checks the runtime without a GPU. "cuda" is the
real one through CuPy (NVRTC, cuBLAS, CUDA graphs, pinned uploads): those
tests are marked `gpu` and skipped where no GPU can be used, unless
KERASJIT_REQUIRE_GPU=1 (examples/gpu_check.py sets it) makes that a failure.
"""
import dataclasses
import importlib.util
import os
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasjit
from kerasjit import workloads
from kerasjit.backends import get_backend
from kerasjit.backends import gpu
from kerasjit.backends.gpu import GpuBackend, cuda_implicit_gemm
from kerasjit.compiler import OnHost
from kerasjit.backends.gpu.device import CupyDevice
from kerasjit.backends.gpu.executable import GpuExecutable
from kerasjit.frontend.bridge import hlo_module
from kerasjit.hlo import parse_module
from kerasjit.hlo.evaluator import evaluate
from kerasjit.arrays import host

from tests.support.cuda_host import HostDevice
from tests.hlo.test_control_flow import _rnn_with_grads
from tests.support.loop_text import LIST_LOOP, NESTED, RNG_LOOP
from tests.support.structured_cases import DOT_CONV_POOL, LOOP_ONLY, rand


@pytest.fixture(scope="module", params=["host", pytest.param("cuda", marks=pytest.mark.gpu)])
def backend(request, tmp_path_factory):
    if request.param == "host":
        return GpuBackend(HostDevice(tmp_path_factory.mktemp("gpu")))
    try:
        return gpu.open_backend()
    except gpu.GpuUnavailable as e:
        if os.environ.get("KERASJIT_REQUIRE_GPU"):
            pytest.fail(f"KERASJIT_REQUIRE_GPU is set but: {e}")
        pytest.skip(f"no GPU: {e}")


def check_against_evaluator(backend, fn, args):
    module = hlo_module(fn, *[tf.constant(a) for a in args])
    want = evaluate(module, [np.asarray(a) for a in args])
    want = list(want) if isinstance(want, tuple) else [want]
    executable = backend.compile(module)
    assert isinstance(executable, GpuExecutable)
    for _ in range(3):          # the first call runs, the second captures, the third replays
        got = [host(g) for g in executable([np.asarray(a) for a in args])]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    return executable


@pytest.mark.parametrize("name", [*LOOP_ONLY, *DOT_CONV_POOL])
def test_structured_ops_match_evaluator(backend, name):
    check_against_evaluator(backend, *{**LOOP_ONLY, **DOT_CONV_POOL}[name])


def test_convolutions_in_many_chunks(backend, monkeypatch):
    """Chunked GEMMs: each chunk's offsets, and beta = 1 after the first chunk
    (convolutions as patch matrices: the path of layouts no implicit GEMM takes)."""
    monkeypatch.setattr(backend, "target", dataclasses.replace(
        backend.target, implicit_gemm=False, patch_budget_bytes=2048))
    executable = check_against_evaluator(backend, *DOT_CONV_POOL["conv_valid_stride2"])
    chunks = {launch[-1] for launch in executable._launches if launch[0] == "gemm"}
    assert len(chunks) > 2


@pytest.mark.parametrize("name", ["filter_gradient", "conv_bias_relu"])
def test_long_contractions_split_over_a_block(backend, monkeypatch, name):
    """A convolution whose contraction is long and whose tiles are few (a filter
    gradient) takes a block per tile, the threads summing in shared memory; edge tiles
    and a fused epilogue included."""
    monkeypatch.setattr(cuda_implicit_gemm, "SPLIT_DEPTH", 16)
    cases = {
        "filter_gradient": (lambda x, w: tf.gradients(tf.reduce_sum(
            tf.nn.conv2d(x, w, 1, "VALID") ** 2), w)[0],
            (rand(3, 9, 8, 5), rand(3, 3, 5, 6, seed=1))),
        "conv_bias_relu": (lambda x, w, b: tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME") + b),
                           (rand(2, 6, 5, 3), rand(3, 3, 3, 7, seed=1), rand(7, seed=2))),
    }
    executable = check_against_evaluator(backend, *cases[name])
    assert any("part[" in source for _, source in executable.kernels)


def test_launches_are_replayed_after_the_first_call(backend):
    fn, args = LOOP_ONLY["avgpool_grad"]
    executable = check_against_evaluator(backend, fn, args)
    assert executable._graph is not None
    if isinstance(backend.device, HostDevice):
        before = backend.device.launches
        executable([np.asarray(a) for a in args])
        assert backend.device.launches - before == len(executable._launches)


def test_clusters_with_gemms_are_not_captured(backend):
    """CuPy's cuBLAS calls refuse a capturing stream: such clusters launch step by step."""
    executable = check_against_evaluator(backend, *DOT_CONV_POOL["matmul"])
    assert executable._graph is None


def test_a_failed_capture_ends_it_and_gives_no_graph():
    class Stream:
        capturing = False

        def begin_capture(self):
            self.capturing = True

        def end_capture(self):
            self.capturing = False
            return "graph"

    def launches():
        raise RuntimeError("operation not permitted when stream is capturing")
    device = object.__new__(CupyDevice)     # no GPU needed: capture only uses the stream
    device.stream = Stream()
    assert device.capture(launches) is None and not device.stream.capturing
    assert device.capture(lambda: None) == "graph"


def test_donated_variable_stays_in_place(backend):
    """An update written over its variable's buffer comes back as that buffer, and
    passing it back costs no copy."""
    module = hlo_module(lambda w, g: (w - 0.1 * g, tf.reduce_sum(g)),
                        tf.constant(np.ones((4, 3), np.float32)),
                        tf.constant(np.full((4, 3), 2.0, np.float32)))
    executable = backend.compile(module, donate={0: 0})
    assert executable.program.aliases == {0: 0}
    w = np.ones((4, 3), np.float32)
    g = np.full((4, 3), 2.0, np.float32)
    first, total = executable([w, g])
    second, _ = executable([first, g])
    assert second is first
    np.testing.assert_allclose(host(second), 1 - 2 * 0.2, rtol=1e-6)   # two updates
    assert float(host(total)) == 24.0
    np.testing.assert_array_equal(w, 1.0)       # the caller's array is not written


def test_wrong_shape_is_named(backend):
    module = hlo_module(lambda x: x * 2, tf.constant(np.ones((2, 3), np.float32)))
    executable = backend.compile(module)
    with pytest.raises(ValueError, match=r"expected shape \(2, 3\), got \(3, 2\)"):
        executable([np.ones((3, 2), np.float32)])


def test_rejected_kernel_runs_on_the_cpu_backend(tmp_path):
    class Rejecting(HostDevice):
        def build(self, source, names):
            raise RuntimeError("NVRTC_ERROR_COMPILATION: kernel cluster1_0 line 12")
    rejecting = GpuBackend(Rejecting(tmp_path))
    fn, args = DOT_CONV_POOL["matmul"]
    module = hlo_module(fn, *[tf.constant(a) for a in args])
    with pytest.warns(RuntimeWarning, match="GPU compiler rejected cluster1: NVRTC_ERROR"
                                            ".*runs on the CPU backend"):
        executable = rejecting.compile(module)
    assert isinstance(executable, OnHost)
    np.testing.assert_allclose(executable(list(args))[0], args[0] @ args[1], rtol=1e-5)


@pytest.mark.parametrize("build", [workloads.softmax_regression,
                                   lambda: workloads.mlp(dropout=0.5)])
def test_wrapped_model_trains_as_plain_keras(backend, build):
    x, y = workloads.classification_data(96, (784,), 10)
    keras.utils.set_random_seed(0)
    plain = build()
    keras.utils.set_random_seed(0)
    wrapped = kerasjit.wrap(build(), backend=backend)
    wrapped.set_weights(plain.get_weights())
    keras.utils.set_random_seed(1)
    want = plain.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history
    keras.utils.set_random_seed(1)
    got = wrapped.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-4)
    for g, w in zip(wrapped.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(wrapped.predict(x[:40], verbose=0),
                               plain.predict(x[:40], verbose=0), rtol=1e-4, atol=1e-6)
    executables = wrapped._kerasjit.train.executables()
    assert executables and all(isinstance(e, GpuExecutable) for e in executables)


# ------------------------------------------------------- choosing the backend
def test_gpu_without_cupy_warns_and_uses_the_cpu(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(gpu, "_OPENED", {})
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "cupy" else real(name, *a))
    with pytest.warns(RuntimeWarning, match="no GPU backend: CuPy is not installed .*ctk"):
        chosen = get_backend("gpu")
    assert chosen.name == "cpu"


def test_gpu_with_a_broken_cupy_warns_and_uses_the_cpu(monkeypatch, tmp_path):
    """CuPy installed but CUDA unusable (no driver, no device): a clear reason."""
    fake = tmp_path / "cupy"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "class _Runtime:\n"
        "    @staticmethod\n"
        "    def getDeviceCount():\n"
        "        raise RuntimeError('cudaErrorInsufficientDriver: CUDA driver version is "
        "insufficient for CUDA runtime version')\n"
        "class cuda:\n"
        "    runtime = _Runtime\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.setattr(gpu, "_OPENED", {})
    with pytest.warns(RuntimeWarning, match="CUDA has no usable device here .*InsufficientDriver"):
        assert get_backend("gpu").name == "cpu"
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # "auto" falls back quietly
        assert get_backend("auto").name == "cpu"


def test_cpu_only_install_never_imports_cupy():
    code = ("import importlib.util, sys\n"
            "real = importlib.util.find_spec\n"      # as where CuPy is not installed
            "importlib.util.find_spec = lambda n, *a: None if n == 'cupy' else real(n, *a)\n"
            "import keras, kerasjit\n"
            "from kerasjit import workloads\n"
            "m = kerasjit.wrap(workloads.softmax_regression())\n"
            "assert m._kerasjit.backend.name == 'cpu'\n"
            "assert 'cupy' not in sys.modules, 'cupy imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]



@pytest.mark.parametrize("text", [LIST_LOOP, NESTED, RNG_LOOP], ids=["list", "nested", "rng"])
def test_while_loops_run_their_launches_until_the_condition_fails(backend, text):
    module = parse_module(text)
    args = ([np.arange(15, dtype=np.float32).reshape(5, 3) / 7,
             np.array([0.5, -1.0, 2.0], np.float32)] if text is LIST_LOOP else
            [np.array([1, 2], np.float32), np.array([10, 20], np.float32)] if text is NESTED else
            [np.array([42, 7, 0], np.uint64)])
    want = evaluate(parse_module(text), args)
    executable = backend.compile(module)
    assert isinstance(executable, GpuExecutable)
    for _ in range(3):                 # (never captured: the host reads each condition)
        for g, w in zip([host(g) for g in executable(list(args))], want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_recurrent_net_and_its_gradient(backend):
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(s).astype(np.float32) / 2 for s in [(7, 4, 3), (3, 5), (5, 5)]]
    check_against_evaluator(backend, _rnn_with_grads, args)
