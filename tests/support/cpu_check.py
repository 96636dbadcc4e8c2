"""check: an HLO module compiled by the CPU backend against the reference evaluator."""
from kerasjit.backends.cpu import BACKEND
from kerasjit.hlo.evaluator import evaluate

from tests.support.outputs import assert_outputs_match


def check(module, args, rtol=1e-5, atol=1e-6):
    # BACKEND is looked up here at each call: a test may monkeypatch this
    # module's BACKEND (e.g. with a fresh CpuBackend, for no in-memory cache).
    got = BACKEND.compile(module)(args)
    want = evaluate(module, args)
    assert_outputs_match(got, list(want) if isinstance(want, tuple) else [want], rtol, atol)
