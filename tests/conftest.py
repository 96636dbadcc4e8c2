import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# Compiles are waited for, so that a test's steps run the compiled code; the
# tests of tiered execution ask for compiles in the background themselves.
os.environ.setdefault("KERASJIT_BACKGROUND", "0")

# tests/ and its folders are packages (each has an __init__.py): pytest puts the
# repository root on sys.path, test modules are tests.<folder>.test_<name>, and
# shared helpers are imported from tests.support.


@pytest.fixture
def no_compile_cache(monkeypatch):
    """Compiles generate their code: the compile cache is off (KERASJIT_CACHE_DIR empty)."""
    monkeypatch.setenv("KERASJIT_CACHE_DIR", "")


@pytest.fixture
def compile_cache_dir(tmp_path, monkeypatch):
    """A private compile-cache directory for this test (not created yet)."""
    path = tmp_path / "cache"
    monkeypatch.setenv("KERASJIT_CACHE_DIR", str(path))
    return path
