"""The persistent compile cache: hits skip code generation, bad entries rebuild."""
import glob
import os

import numpy as np
import pytest
import tensorflow as tf

import kerasjit.backends.cpu as cpu
from kerasjit.frontend.bridge import hlo_module


def fn(x, w):
    return tf.nn.relu(tf.matmul(x, w)) * 2.0 + 1.0


ARGS = [np.random.default_rng(0).standard_normal((6, 5)).astype(np.float32),
        np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)]
EXPECTED = fn(*ARGS).numpy()


@pytest.fixture
def backend(tmp_path, monkeypatch):
    monkeypatch.setenv("KERASJIT_CACHE_DIR", str(tmp_path))
    return cpu.CpuBackend()     # a fresh backend: nothing linked in this process yet


def compile_with(backend):
    return backend.compile(hlo_module(fn, *ARGS))


def test_second_compile_is_a_cache_hit(backend, tmp_path, monkeypatch):
    np.testing.assert_allclose(compile_with(backend)(ARGS)[0], EXPECTED, rtol=1e-6)
    assert len(glob.glob(str(tmp_path / "*.pkl"))) == 1

    def no_codegen(*_):
        raise AssertionError("code was generated despite a cache entry")
    monkeypatch.setattr(cpu, "lower", no_codegen)
    fresh = cpu.CpuBackend()
    executable = compile_with(fresh)
    np.testing.assert_allclose(executable(ARGS)[0], EXPECTED, rtol=1e-6)
    assert executable.kernels                 # explain() still shows the kernels


@pytest.mark.parametrize("damage", [b"", b"not a pickle", None])
def test_corrupt_entry_is_rebuilt(backend, tmp_path, damage):
    compile_with(backend)
    (entry,) = glob.glob(str(tmp_path / "*.pkl"))
    if damage is None:                         # flip bytes inside: checksum mismatch
        data = bytearray(open(entry, "rb").read())
        data[len(data) // 2] ^= 0xFF
        damage = bytes(data)
    with open(entry, "wb") as f:
        f.write(damage)
    executable = compile_with(cpu.CpuBackend())
    np.testing.assert_allclose(executable(ARGS)[0], EXPECTED, rtol=1e-6)
    assert os.path.getsize(entry) > 1000      # rewritten with a good entry


def test_empty_cache_dir_disables_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERASJIT_CACHE_DIR", "")
    monkeypatch.chdir(tmp_path)
    np.testing.assert_allclose(compile_with(cpu.CpuBackend())(ARGS)[0], EXPECTED, rtol=1e-6)
    assert not os.listdir(tmp_path)
