"""Structured ops (TensorFlow functions with their inputs) that every backend
is checked on against the evaluator. Their programs have no GEMM, so the CUDA
tests' C++ harness runs them too; each backend's tests add their own."""
import numpy as np
import tensorflow as tf


def rand(*dims, seed=0):
    return np.random.default_rng(seed).standard_normal(dims).astype(np.float32)


LOOP_ONLY = {
    "reductions": (lambda x: (tf.reduce_sum(x, 0), tf.reduce_max(x, [1, 2]), tf.reduce_mean(x),
                              tf.argmax(x, 1), tf.reduce_min(x, 2)), (rand(3, 4, 5),)),
    "avgpool_grad": (lambda x: tf.gradients(tf.reduce_sum(
        tf.nn.avg_pool2d(x, 3, 2, "SAME") ** 2), x)[0], (rand(2, 7, 7, 2),)),
    "softmax_xent": (lambda x, y: tf.nn.softmax_cross_entropy_with_logits(y, x),
                     (rand(6, 10), np.eye(10, dtype=np.float32)[np.arange(6)])),
    "indexing": (lambda x: (tf.transpose(x, [2, 0, 1])[:, ::-1, 1:4], tf.reverse(x, [1]),
                            tf.pad(x, [[1, 0], [0, 2], [1, 1]]), tf.concat([x, 2 * x], 1),
                            tf.reshape(x, [4, 15]), tf.tile(x, [1, 2, 1]),
                            tf.cumsum(x, axis=1)), (rand(3, 4, 5),)),
    "dynamic_slice": (lambda x, i: tf.slice(x, [i, 1], [2, 3]), (rand(5, 6), np.int32(2))),
    "philox_u32": (lambda k, c: tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=[5, 7], key=k, counter=c, alg=1, dtype=tf.uint32),
        (np.array([12345], np.uint64), np.array([2**64 - 3, 5], np.uint64))),
    "philox_u64": (lambda k, c: tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=[3, 3], key=k, counter=c, alg=1, dtype=tf.uint64),
        (np.array([99], np.uint64), np.array([7, 0], np.uint64))),
}
