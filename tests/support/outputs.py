"""Compiled outputs against the evaluator's: same shapes and types, floats
within a tolerance (NaN where NaN), everything else exactly."""
import numpy as np


def assert_outputs_match(got, want, rtol=1e-5, atol=1e-6):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        else:
            np.testing.assert_array_equal(g, w)
