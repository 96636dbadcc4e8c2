"""window_dims_last: TensorFlow's bilinear resize (a gather of each output
pixel's window, window dims first) and its gradient (a scatter of such
windows) read and write their windows index dims first, with the same values
(the scatter's adds to float rounding)."""
import numpy as np
import tensorflow as tf

from kerasjit.frontend.bridge import hlo_module
from kerasjit.hlo.evaluator import evaluate
from kerasjit.passes import Pipeline, dce, window_dims_last
from tests.support.hlo_args import random_args


def _resize_and_gradient(x, g):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tf.image.resize(x, (10, 12), method="bilinear")
    return y, tape.gradient(y, x, g)


def test_a_bilinear_resize_and_its_gradient_read_windows_where_they_lie():
    specs = tf.TensorSpec((2, 5, 4, 3)), tf.TensorSpec((2, 10, 12, 3))
    before = hlo_module(_resize_and_gradient, *specs)
    after = Pipeline([window_dims_last, dce], debug=True)(hlo_module(_resize_and_gradient, *specs))
    args = [np.nan_to_num(a) for a in random_args(before)]
    for want, got in zip(evaluate(before, args), evaluate(after, args), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    instructions = [i for c in after.computations for i in c.instructions]
    (gather,) = [i for i in instructions if i.opcode == "gather"]
    (scatter,) = [i for i in instructions if i.opcode == "scatter"]
    window = len(gather.attrs["offset_dims"])
    assert gather.attrs["offset_dims"] == tuple(range(gather.shape.rank - window,
                                                      gather.shape.rank))
    updates = scatter.operands[2].shape.rank
    window = len(scatter.attrs["update_window_dims"])
    assert scatter.attrs["update_window_dims"] == tuple(range(updates - window, updates))


def test_an_embeddings_gather_is_left_as_it_is():
    """Index dims first already (rows of a table per token)."""
    def lookup(table, ids):
        return tf.gather(table, ids)
    specs = tf.TensorSpec((7, 4)), tf.TensorSpec((3, 5), tf.int32)
    module = window_dims_last(hlo_module(lookup, *specs))
    assert not [i for c in module.computations for i in c.instructions
                if i.opcode == "transpose"]
