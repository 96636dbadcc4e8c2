"""All-reduces: computed in the step where it holds every member, else left to
TensorFlow, all members of one in one cluster."""
import numpy as np
import pytest
from tensorflow.python.ops import collective_ops

import kerasjit

A = np.array([1.0, -2.0, 3.5], np.float32)
B = np.array([0.5, 4.0, -1.0], np.float32)


@pytest.mark.parametrize("merge, final, expected", [
    ("Add", "Id", A + B), ("Add", "Div", (A + B) / 2), ("Max", "Id", np.maximum(A, B))])
def test_an_all_reduce_whose_members_are_all_in_the_step_is_compiled(merge, final, expected):
    def step(a, b):
        reduce = dict(group_size=2, group_key=5, instance_key=9, merge_op=merge, final_op=final)
        return collective_ops.all_reduce_v2(a * 2, **reduce) + 1, \
            collective_ops.all_reduce_v2(b * 2, **reduce) - 1
    fn = kerasjit.jit(step, race=False)
    first, second = fn(A, B)
    np.testing.assert_allclose(first, 2 * expected + 1, rtol=1e-6)
    np.testing.assert_allclose(second, 2 * expected - 1, rtol=1e-6)
    assert [c.kind for c in kerasjit.explain(fn, A, B).clusters] == ["compiled"]


def test_an_all_reduce_with_members_elsewhere_stays_in_tensorflow():
    # (a worker's member of an all-reduce across workers: not run here, its
    # partners are other processes)
    def step(a, b):
        return collective_ops.all_reduce_v2(a * b, group_size=2, group_key=5, instance_key=9) + 1
    clusters = kerasjit.explain(kerasjit.jit(step, race=False), A, B).clusters
    assert [c.kind for c in clusters] == ["compiled", "tensorflow", "compiled"]
    assert clusters[0].ops == ["Mul"] and clusters[1].ops == ["CollectiveReduceV2"]
