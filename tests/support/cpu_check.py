"""check: an HLO module compiled by the CPU backend against the reference evaluator."""
import numpy as np

from kerasjit.backends.cpu import BACKEND
from kerasjit.hlo.evaluator import evaluate


def check(module, args, rtol=1e-5, atol=1e-6):
    # BACKEND is looked up here at each call: a test may monkeypatch this
    # module's BACKEND (e.g. with a fresh CpuBackend, for no in-memory cache).
    got = BACKEND.compile(module)(args)
    want = evaluate(module, args)
    want = list(want) if isinstance(want, tuple) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        else:
            np.testing.assert_array_equal(g, w)
