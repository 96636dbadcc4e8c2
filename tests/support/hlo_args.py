"""random_args: arguments for an HLO module's parameters, floats including -0.0, 0.0, inf, NaN."""
import numpy as np


def random_args(module, seed=0):
    rng = np.random.default_rng(seed)
    args = []
    for p in module.entry.parameters:
        dtype = p.shape.numpy_dtype
        if p.shape.dtype == "pred":
            value = rng.random(p.shape.dims) < 0.5
        elif dtype.kind in "iu":
            value = rng.integers(-5 if dtype.kind == "i" else 0, 6, p.shape.dims)
        else:
            value = rng.standard_normal(p.shape.dims)
            flat = value.reshape(-1)
            flat[:4] = [-0.0, 0.0, np.inf, np.nan][:flat.size]
        args.append(np.asarray(value, dtype=dtype))
    return args
