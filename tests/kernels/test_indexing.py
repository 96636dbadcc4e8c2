"""Index arithmetic of kernel expressions (kernels/indexing.py) against numpy."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kerasjit.kernels import indexing as ix
from kerasjit.kernels.ir import Const, Index, Op, S64, walk

_OPS = {"add": np.add, "multiply": np.multiply, "divide": np.floor_divide,
        "remainder": np.remainder}


def _value(expr, grid):
    if isinstance(expr, Const):
        return np.int64(expr.value)
    if isinstance(expr, Index):
        return grid[expr.dim]
    return _OPS[expr.opcode](*(_value(a, grid) for a in expr.args))


@st.composite
def reshapes(draw):
    """(out dims, in dims) of equal size, unit dims sprinkled in."""
    factors = draw(st.lists(st.sampled_from([2, 3, 4, 5]), min_size=1, max_size=5))
    def regroup():
        dims, current = [], 1
        for f in draw(st.permutations(factors)) if draw(st.booleans()) else factors:
            current *= f
            if draw(st.booleans()):
                dims.append(current)
                current = 1
        dims.append(current)
        for _ in range(draw(st.integers(0, 2))):
            dims.insert(draw(st.integers(0, len(dims))), 1)
        return dims
    return regroup(), regroup()


@settings(max_examples=200, deadline=None)
@given(reshapes())
def test_reshape_index_and_its_load_terms_match_numpy(dims):
    out_dims, in_dims = dims
    grid = np.indices(out_dims).reshape(len(out_dims), -1).astype(np.int64)
    index = ix.reshape_index(tuple(Index(S64, d) for d in range(len(out_dims))),
                             out_dims, in_dims)
    flat = np.ravel_multi_index(tuple(grid), out_dims)
    want = np.unravel_index(flat, in_dims)
    for got, expected in zip(index, want):
        np.testing.assert_array_equal(np.broadcast_to(_value(got, grid), expected.shape),
                                      expected)
    # the buffer's row-major offset, digits of one value read as that value
    offset = sum(_value(i, grid) * stride for i, stride in ix.load_terms(index, in_dims))
    np.testing.assert_array_equal(np.broadcast_to(offset, flat.shape), flat)


def test_split_dims_are_split_alone():
    """[64, 40, 64] <- [64, 40, 4, 16]: the last index alone is divided."""
    index = ix.reshape_index(tuple(Index(S64, d) for d in range(3)), (64, 40, 64),
                             (64, 40, 4, 16))
    assert [(type(i), i.dim) for i in index[:2]] == [(Index, 0), (Index, 1)]
    divisions = [n for i in index for n in walk(i)
                 if isinstance(n, Op) and n.opcode in ("divide", "remainder")]
    assert len(divisions) == 2 and all(n.args[0].dim == 2 for n in divisions)


def test_one_values_digits_are_read_as_that_value():
    """Dropout's random words [n, 4] read as [b, h, t, t]: the address is the
    element's own flat position, not (p // 4) * 4 + p % 4."""
    out_dims, in_dims = (6, 4, 5, 5), (150, 4)
    index = ix.reshape_index(tuple(Index(S64, d) for d in range(4)), out_dims, in_dims)
    terms = ix.load_terms(index, in_dims)
    assert len(terms) == 1 and terms[0][1] == 1
    assert not any(isinstance(n, Op) and n.opcode in ("divide", "remainder")
                   for n in walk(terms[0][0]))
    # With a leading dim of its own: [b, x // 4, x % 4] -> b * 600 + x.
    index = (Index(S64, 0), ix.div(Index(S64, 1), 4), ix.mod(Index(S64, 1), 4))
    assert [(type(e).__name__, s) for e, s in ix.load_terms(index, (3, 150, 4))] == \
        [("Index", 1), ("Index", 600)]
