"""Captures: a wrapped model's clusters saved with one call's arguments, replayed on a
backend against the evaluator without TensorFlow; a wrong result is named, rounding that
decides an output is not."""
import os
import subprocess
import sys

import numpy as np
import pytest

from kerasjit import capture
from kerasjit.backends import get_backend
from kerasjit.backends.gpu import GpuBackend
from kerasjit.compiler import Backend, Executable
from tests.support.cuda_host import HostDevice

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def softmax_capture(tmp_path_factory):
    path = tmp_path_factory.mktemp("capture") / "softmax_regression.npz"
    assert capture.save(path, capture.record_workload("softmax_regression"),
                        {"workload": "softmax_regression"}) == 3    # fit, evaluate, predict
    return str(path)


def test_a_recorded_workload_replays_on_the_cpu(softmax_capture):
    rows = capture.replay(softmax_capture, get_backend("cpu"), repeats=2)
    assert [capture.verdict(r) for r in rows] == ["ok"] * 3
    assert all(r["kernels"] > 0 and r["ms"] > 0 and r["workload"] == "softmax_regression"
               for r in rows)


def test_replay_on_the_host_emulated_gpu(softmax_capture, tmp_path):
    rows = capture.replay(softmax_capture, GpuBackend(HostDevice(tmp_path)), repeats=1)
    assert [(capture.verdict(r), r["on"]) for r in rows] == [("ok", "GpuExecutable")] * 3


def test_replay_needs_no_tensorflow(softmax_capture):
    blocked = ("import importlib.abc, runpy, sys\n"
               "class Block(importlib.abc.MetaPathFinder):\n"
               "    def find_spec(self, name, path, target=None):\n"
               "        if name.split('.')[0] in ('tensorflow', 'keras'):\n"
               "            raise ImportError(name)\n"
               "sys.meta_path.insert(0, Block())\n"
               f"sys.argv = ['capture', 'replay', {softmax_capture!r}]\n"
               "runpy.run_module('kerasjit.capture', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", blocked], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "3 ok, 0 close, 0 MISMATCH, 0 FAILED of 3 clusters" in done.stdout


class _OffByATenth(Backend):
    """The CPU backend, with every float output 0.1 too large."""
    name, target = "cpu", get_backend("cpu").target

    def compile(self, module, donate=None, optimized=False, only_cached=False):
        inner = get_backend("cpu").compile(module, donate, optimized, only_cached)

        class Wrong(Executable):
            kernels = inner.kernels

            def __call__(self, args):
                return [o + np.asarray(0.1, o.dtype) if o.dtype.kind == "f" else o
                        for o in (np.asarray(v) for v in inner(args))]
        return Wrong()


def test_a_wrong_result_is_a_mismatch_and_fails_the_command(softmax_capture, monkeypatch):
    rows = capture.replay(softmax_capture, _OffByATenth())
    assert [capture.verdict(r) for r in rows] == ["MISMATCH"] * 3
    monkeypatch.setattr("kerasjit.backends.get_backend", lambda name: _OffByATenth())
    assert capture.main(["replay", softmax_capture]) == 1


def test_large_float_arguments_are_drawn_within_their_range(tmp_path, monkeypatch):
    monkeypatch.setattr(capture, "SAVED_FLOAT_BYTES", 64)
    variance = np.random.default_rng(0).random((8, 16), np.float32) ** 2    # >= 0, 512 bytes
    labels = np.arange(100, dtype=np.int64)
    cluster = {"hlo": "HloModule m", "donate": {0: 0}, "optimized": True,
               "args": [variance, labels, np.float32(3.0)]}
    capture.save(tmp_path / "c.npz", [cluster, {"hlo": "never ran"}])
    (loaded,), _ = capture.load(tmp_path / "c.npz")
    drawn, kept, scalar = loaded["args"]
    assert drawn.shape == variance.shape and drawn.dtype == np.float32
    assert variance.min() <= drawn.min() and drawn.max() <= variance.max()
    assert not np.array_equal(drawn, variance)
    np.testing.assert_array_equal(kept, labels)
    assert scalar == 3.0 and loaded["donate"] == {0: 0} and loaded["optimized"]


def test_an_output_rounding_can_move_is_checked_no_closer_than_it_moves():
    want = np.array([1e-3, -1e-3, 0.5], np.float32)     # an update whose sign rounding decides
    got = np.array([-1e-3, -1e-3, 0.5], np.float32)
    assert capture._error(got, want)[0] > 1
    worst, off = capture._error(got, want, spread=np.array([2e-3, 0.0, 0.0]))
    assert worst <= 1 and off == 0
    assert capture._error(got.astype(np.float64), want) == (float("inf"), 1.0)
