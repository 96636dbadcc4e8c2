"""Structured ops (TensorFlow functions with their inputs) that every backend
is checked on against the evaluator. LOOP_ONLY programs have no GEMM, so the
CUDA renderer's tests run them through the C++ harness alone; DOT_CONV_POOL
adds dots, every convolution form and pooling gradients."""
import numpy as np
import tensorflow as tf


def rand(*dims, seed=0):
    return np.random.default_rng(seed).standard_normal(dims).astype(np.float32)


def eighths(*dims, seed=0):
    """Multiples of 1/8 in [-2, 2]: their sums are exact in any order."""
    return (np.random.default_rng(seed).integers(-16, 17, dims) / 8).astype(np.float32)


LOOP_ONLY = {
    "reductions": (lambda x: (tf.reduce_sum(x, 0), tf.reduce_max(x, [1, 2]), tf.reduce_mean(x),
                              tf.argmax(x, 1), tf.reduce_min(x, 2)), (rand(3, 4, 5),)),
    # All-NaN rows and columns: index 0, as in TensorFlow's kernels.
    "nan_argmax": (lambda x: (tf.argmax(x, 1), tf.argmin(x, 1), tf.argmax(x, 0)),
                   (np.where(np.isin(np.arange(20).reshape(4, 5), [*range(5), 7, 11, 12, 17]),
                             np.float32(np.nan), rand(4, 5)),)),
    "avgpool_grad": (lambda x: tf.gradients(tf.reduce_sum(
        tf.nn.avg_pool2d(x, 3, 2, "SAME") ** 2), x)[0], (rand(2, 7, 7, 2),)),
    "softmax_xent": (lambda x, y: tf.nn.softmax_cross_entropy_with_logits(y, x),
                     (rand(6, 10), np.eye(10, dtype=np.float32)[np.arange(6)])),
    "indexing": (lambda x: (tf.transpose(x, [2, 0, 1])[:, ::-1, 1:4], tf.reverse(x, [1]),
                            tf.pad(x, [[1, 0], [0, 2], [1, 1]]), tf.concat([x, 2 * x], 1),
                            tf.reshape(x, [4, 15]), tf.tile(x, [1, 2, 1]),
                            tf.cumsum(x, axis=1)), (rand(3, 4, 5),)),
    "dynamic_slice": (lambda x, i: tf.slice(x, [i, 1], [2, 3]), (rand(5, 6), np.int32(2))),
    # Thousands of terms per element (a block per element on the GPU).
    "long_reductions": (lambda x, n: (
        tf.reduce_sum(x), tf.reduce_sum(x, 0), tf.reduce_max(x, [0, 2]), tf.argmin(x, 0),
        tf.reduce_sum(x * x, [0, 1]), tf.reduce_any(x > 1.9), tf.reduce_sum(n)),
        (eighths(1100, 2, 3), np.arange(-1000, 1048, dtype=np.int32))),
    # XLA clamps a start that would put the slice outside (here -3 and 12).
    "gather": (lambda p, i, q, j: (
        tf.gather(p, i), tf.gather(p, i[0], axis=1), tf.gather_nd(p, j),
        tf.gather(q, i[:, :2] % 3, axis=1, batch_dims=1)),
        (rand(10, 5), np.array([[0, 9, 3, -3], [4, 12, 1, 1], [2, 2, 8, 0]], np.int32),
         rand(3, 6, 2, seed=1), np.array([[1, 2], [9, 4], [0, 0]], np.int64))),
    # Repeated and out-of-range (skipped) indices; an embedding's gradient.
    "scatter": (lambda t, i, u, p, g: (
        tf.tensor_scatter_nd_add(t, i, u), tf.tensor_scatter_nd_max(t, i, u),
        tf.math.unsorted_segment_sum(u, i[:, 0], 6),
        tf.gradients(tf.reduce_sum(tf.gather(p, g) ** 2), p)[0]),
        (rand(6, 3), np.array([[1], [4], [1], [7], [0]], np.int32), rand(5, 3, seed=1),
         rand(8, 4, seed=2), np.array([[0, 3], [3, 3], [7, 1]], np.int32))),
    "philox_u32": (lambda k, c: tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=[5, 7], key=k, counter=c, alg=1, dtype=tf.uint32),
        (np.array([12345], np.uint64), np.array([2**64 - 3, 5], np.uint64))),
    "philox_u64": (lambda k, c: tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=[3, 3], key=k, counter=c, alg=1, dtype=tf.uint64),
        (np.array([99], np.uint64), np.array([7, 0], np.uint64))),
    # Counters whose low word wraps within the bits (the carry into the high word).
    "philox_u32_carry": (lambda k, c: tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=[6, 10], key=k, counter=c, alg=1, dtype=tf.uint32),
        (np.array([12345], np.uint64), np.array([2**64 - 3, 5], np.uint64))),
    "philox_u64_carry": (lambda k, c: tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=[3, 2], key=k, counter=c, alg=1, dtype=tf.uint64),
        (np.array([99], np.uint64), np.array([2**64 - 2, 0], np.uint64))),
}


def depthwise_and_grads(stride):
    def fn(x, w):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([x, w])
            y = tf.nn.depthwise_conv2d(x, w, [1, stride, stride, 1], "SAME")
            loss = tf.reduce_sum(y * y)
        return y, tape.gradient(loss, x), tape.gradient(loss, w)
    return fn


def _with_grads(fn, *args):
    """fn(*args) and the gradient of the sum of its squares for each argument."""
    with tf.GradientTape() as tape:
        tape.watch(args)
        y = fn(*args)
        loss = tf.reduce_sum(y * y)
    return (y, *tape.gradient(loss, args))


def conv_and_grads(strides, padding, dilations=1):
    def fn(x, w):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([x, w])
            y = tf.nn.conv2d(x, w, strides, padding, dilations=dilations)
            loss = tf.reduce_sum(y * y)
        return y, tape.gradient(loss, x), tape.gradient(loss, w)
    return fn


DOT_CONV_POOL = {
    "matmul": (lambda a, b: tf.matmul(a, b), (rand(5, 7), rand(7, 3))),
    "matmul_transposed": (lambda a, b: tf.matmul(a, b, transpose_a=True, transpose_b=True),
                          (rand(7, 5), rand(3, 7))),
    "batch_matmul": (lambda a, b: tf.matmul(a, b), (rand(2, 5, 7), rand(2, 7, 3))),
    # Dots read in place as (batched, strided) GEMMs: Dense on a sequence and
    # its gradients, attention's einsums (heads between sequence and features,
    # two batch dims), a contraction over two dims, a vector times a matrix;
    # batch_matmul's products are small enough to stay a loop kernel.
    "dense_on_sequence": (lambda x, w: _with_grads(lambda x, w: tf.matmul(x, w), x, w),
                          (rand(2, 5, 7), rand(7, 3, seed=1))),
    "attention_einsums": (lambda q, k, v: _with_grads(lambda q, k, v: tf.einsum(
        "bhqk,bkhd->bqhd", tf.nn.softmax(tf.einsum("bqhd,bkhd->bhqk", q, k)), v), q, k, v),
        (rand(2, 20, 3, 16), rand(2, 24, 3, 16, seed=1), rand(2, 24, 3, 16, seed=2))),
    "einsum_dense": (lambda x, w: _with_grads(lambda x, w: tf.einsum("abc,cde->abde", x, w),
                                              x, w), (rand(3, 5, 4), rand(4, 2, 3, seed=1))),
    "batch_matmul_transposed": (lambda a, b: tf.matmul(a, b, transpose_a=True,
                                                       transpose_b=True),
                                (rand(2, 3, 16, 24), rand(2, 3, 20, 16, seed=1))),
    "two_dim_contraction": (lambda a, b: tf.einsum("btc,btd->cd", a, b),
                            (rand(3, 5, 4), rand(3, 5, 6, seed=1))),
    "vector_matrix": (lambda a, b: tf.tensordot(a, b, 1), (rand(7), rand(7, 3, seed=1))),
    "int_matmul": (lambda a, b: tf.matmul(a, b),
                   (np.arange(12, dtype=np.int32).reshape(3, 4), np.ones((4, 2), np.int32))),
    "conv_same_stride1": (conv_and_grads(1, "SAME"), (rand(2, 9, 9, 3), rand(3, 3, 3, 4))),
    "conv_valid_stride2": (conv_and_grads(2, "VALID"), (rand(2, 11, 10, 3), rand(5, 5, 3, 2))),
    "conv_dilated": (conv_and_grads(1, "SAME", 2), (rand(1, 9, 9, 2), rand(3, 3, 2, 3))),
    "depthwise": (lambda x, w: tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME"),
                  (rand(2, 6, 6, 3), rand(3, 3, 3, 2))),
    # Its filter gradient is a convolution with batch groups.
    "depthwise_and_grads": (depthwise_and_grads(2), (rand(2, 7, 6, 3), rand(3, 3, 3, 2))),
    "maxpool_and_grad": (lambda x: tf.gradients(tf.reduce_sum(
        tf.nn.max_pool2d(x, 2, 2, "VALID") ** 2), x)[0], (rand(2, 8, 9, 3),)),
    "maxpool_same_grad": (lambda x: tf.gradients(tf.reduce_sum(
        tf.nn.max_pool2d(x, 3, 2, "SAME") ** 2), x)[0], (rand(1, 7, 7, 2),)),
    # Disjoint windows (stride >= size), padded and with gaps between them, over
    # values with ties (as after a relu): the first of equal maxima takes the gradient.
    "maxpool_disjoint_grads": (lambda x: [tf.gradients(tf.reduce_sum(
        tf.nn.max_pool2d(x, size, stride, padding) ** 2), x)[0]
        for size, stride, padding in ((2, 2, "SAME"), (2, 3, "VALID"), (3, 3, "SAME"))],
        (np.round(rand(2, 7, 8, 3) * 2).astype(np.float32),)),
    # Overlapping windows (stride < size), each position gathering from the windows
    # that cover it: padded, 1 to 3 windows a dim, over values with ties; in 3-d too.
    "maxpool_overlapping_grads": (lambda x: [tf.gradients(tf.reduce_sum(
        tf.nn.max_pool2d(x, size, stride, padding) ** 2), x)[0]
        for size, stride, padding in ((3, 2, "VALID"), (3, 1, "SAME"), (4, 2, "SAME"),
                                      ((3, 2), (2, 1), "SAME"))],
        (np.round(rand(2, 9, 8, 3) * 2).astype(np.float32),)),
    "maxpool3d_overlapping_grad": (lambda x: tf.gradients(tf.reduce_sum(
        tf.nn.max_pool3d(x, 3, 2, "SAME") ** 2), x)[0],
        (np.round(rand(1, 6, 5, 7, 2) * 2).astype(np.float32),)),
}


# A window walking the weights backwards (rhs_reversal; the bridge reverses
# weights with a reverse op instead) and negative padding, in HLO text.
REVERSED_WINDOW = ("""HloModule reversed_window
ENTRY %e (x: f32[2,6,3], k: f32[3,3,4]) -> f32[2,4,4] {
  %x = f32[2,6,3] parameter(0)
  %k = f32[3,3,4] parameter(1)
  ROOT %c = f32[2,4,4] convolution(f32[2,6,3] %x, f32[3,3,4] %k), window={size=3 pad=1_-1 rhs_reversal=1}, dim_labels=b0f_0io->b0f
}
""", (rand(2, 6, 3), rand(3, 3, 4, seed=1)))
