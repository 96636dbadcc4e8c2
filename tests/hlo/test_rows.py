"""Row-wise modules (hlo/rows.py): which TensorFlow functions of a batch make
each output row from the same input row alone, by the same program at every
batch size, read off the bridge's HLO at two batch sizes."""
import numpy as np
import pytest
import tensorflow as tf

from kerasjit.frontend.bridge import hlo_module
from kerasjit.hlo.rows import rows_independent

RNG = np.random.default_rng(0)
W = tf.constant(RNG.standard_normal((6, 5)).astype(np.float32))
K = tf.constant(RNG.standard_normal((3, 3, 2, 4)).astype(np.float32))
TABLE = tf.constant(RNG.standard_normal((10, 3)).astype(np.float32))


ROW_WISE = {
    "dense softmax": (lambda x: tf.nn.softmax(x @ W), (6,), tf.float32),
    "conv, bias, relu, max-pool": (
        lambda x: tf.nn.max_pool2d(tf.nn.relu(tf.nn.conv2d(x, K, 1, "SAME") + 0.5), 2, 2, "VALID"),
        (8, 8, 2), tf.float32),
    "embedding and mean over its positions": (
        lambda ids: tf.reduce_mean(tf.gather(TABLE, ids), axis=1), (7,), tf.int32),
    "flatten, transposes": (
        lambda x: tf.transpose(tf.transpose(tf.reshape(x, (-1, 12)))), (3, 4), tf.float32),
    "dense over a sequence (rows of positions merged for a matmul)": (
        lambda x: tf.nn.relu(tf.reshape(tf.reshape(x, (-1, 6)) @ W, (-1, 4, 5))), (4, 6),
        tf.float32),
    "self-attention": (
        lambda x: tf.nn.softmax(tf.einsum("bqd,bkd->bqk", x, x)) @ x, (4, 6), tf.float32),
    "a constant per row": (lambda x: x[:, :1] * 0 + tf.ones_like(x[:, :1]), (6,), tf.float32),
}

MIXING = {
    "a mean over the batch": (lambda x: x - tf.reduce_mean(x, axis=0), (6,)),
    "divided by the batch size": (
        lambda x: x / tf.cast(tf.shape(x)[0], tf.float32), (6,)),
    "the row's position": (
        lambda x: x * tf.cast(tf.range(tf.shape(x)[0]), tf.float32)[:, None], (6,)),
    "a count of rows": (lambda x: x + tf.reduce_sum(tf.ones_like(x[:, :1])), (6,)),
    "a product over the batch": (lambda x: tf.transpose(x) @ x, (6,)),
    "rows reversed": (lambda x: tf.reverse(x, [0]), (6,)),
    "a row dropped": (lambda x: x[1:], (6,)),
    "rows merged": (lambda x: tf.reshape(x, (-1,)), (6,)),
    "next row's difference": (lambda x: x[1:] - x[:-1], (6,)),
    "rows split in two halves": (lambda x: tf.reshape(x, (2, -1)), (6,)),
    "a sum over merged rows' positions": (
        lambda x: tf.reduce_sum(tf.reshape(x, (-1, 6)), axis=0), (4, 6)),
}


def _modules(fn, shape, dtype, sizes=(8, 5)):
    return [hlo_module(fn, tf.TensorSpec((n, *shape), dtype)) for n in sizes]


@pytest.mark.parametrize("name", list(ROW_WISE))
def test_row_wise_functions_are_recognised(name):
    fn, shape, dtype = ROW_WISE[name]
    at_8, at_5 = _modules(fn, shape, dtype)
    assert rows_independent(at_8, at_5, {0})


@pytest.mark.parametrize("name", list(MIXING))
def test_functions_whose_rows_meet_or_count_are_not(name):
    fn, shape = MIXING[name]
    at_8, at_5 = _modules(fn, shape, tf.float32)
    assert not rows_independent(at_8, at_5, {0})


def test_only_the_row_parameters_hold_rows():
    """x's rows scale by w's: w has rows too, so x alone as the row input is
    not row-wise (its rows meet w's by position), both together are."""
    at_8, at_5 = [hlo_module(lambda x, w: x * w, tf.TensorSpec((n, 3), tf.float32),
                             tf.TensorSpec((n, 3), tf.float32)) for n in (8, 5)]
    assert rows_independent(at_8, at_5, {0, 1})
    assert not rows_independent(at_8, at_5, {0})


def test_an_input_check_verdict_is_an_and_of_per_row_conditions():
    """A step's input checks' verdict (all rows' indices in range) is the AND
    of its splits' verdicts; a condition of the batch as a whole is not."""
    per_row = lambda ids: (tf.gather(TABLE, ids), tf.reduce_all(ids < 10))     # noqa: E731
    at_8, at_5 = _modules(per_row, (4,), tf.int32)
    assert not rows_independent(at_8, at_5, {0})
    assert rows_independent(at_8, at_5, {0}, verdict=1)
    whole = lambda ids: (tf.gather(TABLE, ids), tf.reduce_sum(ids) < 100)     # noqa: E731
    at_8, at_5 = _modules(whole, (4,), tf.int32)
    assert not rows_independent(at_8, at_5, {0}, verdict=1)


@pytest.mark.parametrize("sizes", [(1, 5), (5, 1)])
def test_a_batch_of_one_is_no_proof_that_a_value_is_the_same_for_every_row(sizes):
    """At one row every dim of extent one looks the same throughout: random
    numbers per row must not pass for a constant."""
    fn = lambda x: x + tf.random.stateless_uniform(tf.shape(x), seed=[1, 2])  # noqa: E731
    assert not rows_independent(*_modules(fn, (6,), tf.float32, sizes), {0})


@pytest.mark.parametrize("sizes", [(5, 8), (8, 5)])
def test_a_slice_whole_at_one_batch_size_only_is_not_row_wise(sizes):
    fn = lambda x: x[:6] * 2.0       # noqa: E731
    assert not rows_independent(*_modules(fn, (3,), tf.float32, sizes), {0})
