"""values: random arrays of an HLO dtype, integer ones starting with edge values."""
import numpy as np

from kerasjit.hlo.shape import DTYPES


def values(dtype, dims, rng, positive=False):
    np_type = DTYPES[dtype]
    if dtype == "pred":
        return rng.random(dims) < 0.5
    if np_type.kind == "f":
        x = rng.standard_normal(dims) * 3
        return (np.abs(x) + 0.1 if positive else x).astype(np_type)
    info = np.iinfo(np_type)
    special = np.array([0, 1, info.max, info.min, 31, 32, 33, 64], dtype=np_type)
    x = rng.integers(max(info.min, -100), min(info.max, 100), size=dims, endpoint=True)
    x = x.astype(np_type)
    flat = x.reshape(-1)
    flat[: min(flat.size, special.size)] = special[: flat.size]
    return x
