"""Wrapped models train like plain Keras: weights and logs after 5 steps.

The yardstick is Keras+XLA on the same model and data: kerasjit may be no
further from plain Keras than XLA is (XLA's own rounding differs slightly;
both are float32 rounding noise that Adam amplifies on near-zero gradients,
so "as far" is read as within a factor of 2, with a floor of NOISE_FLOOR: where
XLA runs TensorFlow's own convolution kernels its distance is near zero, while
a different summation order moves a weight by ~1e-6 over the 5 steps),
and with dropout it must match exactly, since kerasjit reproduces
TensorFlow's own random stream (XLA's masks differ).
"""
import keras
import numpy as np
import pytest

import kerasjit
from kerasjit import workloads

pytestmark = pytest.mark.tensorflow_reference

STEPS = 5
NOISE_FLOOR = 2e-6


BACKENDS = ["reference", "cpu"]


def train(build, x, y, batch, mode):
    """mode: "plain", "xla", or a kerasjit backend name."""
    keras.utils.set_random_seed(42)
    model = build(jit_compile=(mode == "xla"))
    if mode in BACKENDS:
        model = kerasjit.wrap(model, backend=mode, race=False)   # the compiler, always
    history = model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    if mode in BACKENDS:      # parity must come from compiled code, not from a fallback
        clusters = kerasjit.explain(model, x[:batch], y[:batch]).clusters
        assert [c.kind for c in clusters] == ["compiled"], [c.reason for c in clusters]
    return model.get_weights(), history.history


def max_weight_diff(a, b):
    return max(float(np.max(np.abs(p - q))) for p, q in zip(a, b))


def images(shape, classes):
    return lambda n: workloads.classification_data(n, shape, classes)


CASES = {
    "softmax_regression": (workloads.softmax_regression, images((784,), 10), 100),
    "mlp_no_dropout": (lambda **k: workloads.mlp(dropout=0, **k), images((784,), 10), 64),
    "conv_bn": (workloads.conv_bn, images((28, 28, 1), 10), 32),
    "mnist_cnn": (lambda **k: workloads.mnist_cnn(dropout=0, **k), images((28, 28, 1), 10), 32),
    "elephant_cnn": (lambda **k: workloads.elephant_cnn(image_size=40, **k),
                     images((40, 40, 3), 1), 16),
    # An embedding: a gather, and a scatter-add in its gradient.
    "text_cnn": (lambda **k: workloads.text_cnn(vocab=300, length=20, dropout=0, **k),
                 lambda n: workloads.token_data(n, 20, 300), 16),
    # Recurrent layers: a while loop over time, and one over its gradient.
    "text_lstm": (lambda **k: workloads.text_rnn("LSTM", vocab=300, length=12, units=16, **k),
                  lambda n: workloads.token_data(n, 12, 300), 16),
    "text_gru": (lambda **k: workloads.text_rnn("GRU", vocab=300, length=12, units=16, **k),
                 lambda n: workloads.token_data(n, 12, 300), 16),
    "stacked_masked_rnn": (lambda **k: _stacked_rnn(**k), lambda n: _padded_tokens(n), 16),
    # Max-pooling over overlapping windows (3x3, stride 2): its gradient searches
    # each window once, then gathers at each position from the windows covering it.
    "pooling_cnn": (workloads.pooling_cnn, images((32, 32, 3), 10), 16),
    # Attention's einsums and Dense on a sequence: batched, strided GEMMs.
    "text_transformer": (lambda **k: workloads.text_transformer(vocab=300, length=20, dropout=0,
                                                                **k),
                         lambda n: workloads.token_data(n, 20, 300), 16),
    # An embedding trained by plain SGD: its sparse gradient scattered into the table.
    "embedding_sgd": (lambda **k: _embedding_classifier("sgd", **k),
                      lambda n: workloads.token_data(n, 12, 300), 16),
    # Residual blocks: BatchNormalization, a strided 3x3 convolution and a 1x1
    # stride-2 projection on the shortcut, added; SGD with Nesterov momentum.
    "small_resnet": (lambda **k: workloads.small_resnet(image_size=16, widths=(8, 16), **k),
                     images((16, 16, 3), 10), 16),
    # MobileNet's strided convolutions: a depthwise one (a group per channel)
    # after a strided 3x3, each input gradient by phase.
    "strided_depthwise": (lambda **k: _strided_depthwise(**k), images((12, 12, 3), 10), 16),
    # Transposed convolutions (a generator's, a U-Net decoder's): each a convolution
    # over its input dilated by the stride, forward and in the gradient, by phase.
    "strided_transposed": (lambda **k: _strided_transposed(**k), images((6, 6, 3), 10), 16),
    # UpSampling2D, bilinear (a gather of each pixel's window, and a scatter in
    # its gradient) and nearest, with the encoder's features concatenated.
    "mini_unet": (lambda **k: workloads.mini_unet(image_size=8, widths=(4, 8, 8), **k),
                  lambda n: workloads.mask_data(n, 8), 8),
    # Causal self-attention, gelu, AdamW, a logits head on every position.
    "gpt_decoder": (lambda **k: workloads.gpt_decoder(vocab=200, length=16, width=32, heads=2,
                                                      **k),
                    lambda n: workloads.next_token_data(n, 16, 200), 8),
}


def _stacked_rnn(jit_compile=False):
    """Masked (mask_zero) tokens through a Bidirectional LSTM returning sequences,
    then a SimpleRNN: the mask selects between new and old states in each loop."""
    model = keras.Sequential([
        keras.Input((10,), dtype="int32"), keras.layers.Embedding(50, 8, mask_zero=True),
        keras.layers.Bidirectional(keras.layers.LSTM(6, return_sequences=True)),
        keras.layers.SimpleRNN(5), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="adam", loss="categorical_crossentropy", jit_compile=jit_compile)
    return model


def _strided_depthwise(jit_compile=False):
    model = keras.Sequential([
        keras.Input((12, 12, 3)), keras.layers.Conv2D(8, 3, strides=2, padding="same"),
        keras.layers.BatchNormalization(), keras.layers.ReLU(6.0),
        keras.layers.DepthwiseConv2D(3, strides=2, padding="same"),
        keras.layers.BatchNormalization(), keras.layers.ReLU(6.0), keras.layers.Conv2D(16, 1),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer="adam", loss="categorical_crossentropy", jit_compile=jit_compile)
    return model


def _strided_transposed(jit_compile=False):
    model = keras.Sequential([
        keras.Input((6, 6, 3)), keras.layers.Conv2DTranspose(8, 3, strides=2, padding="same"),
        keras.layers.BatchNormalization(), keras.layers.ReLU(),
        keras.layers.Conv2DTranspose(4, 4, strides=(2, 1)), keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer="adam", loss="categorical_crossentropy", jit_compile=jit_compile)
    return model


def _embedding_classifier(optimizer, jit_compile=False):
    model = keras.Sequential([keras.Input((12,), dtype="int32"), keras.layers.Embedding(300, 8),
                              keras.layers.GlobalAveragePooling1D(),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=optimizer, loss="binary_crossentropy", jit_compile=jit_compile)
    return model


def _padded_tokens(n):
    """Token ids with each sequence's tail padded with 0 (masked), and 3 classes."""
    x, y = workloads.token_data(n, 10, 50)
    x[np.arange(10) >= np.random.default_rng(2).integers(3, 11, (n, 1))] = 0
    return x, np.eye(3, dtype=np.float32)[(y[:, 0] + (x[:, 0] % 2)).astype(int)]


@pytest.mark.parametrize("name", CASES)
def test_parity_with_plain_keras_within_xla_distance(name):
    build, data, batch = CASES[name]
    x, y = data(STEPS * batch)
    plain_w, plain_h = train(build, x, y, batch, "plain")
    xla_w, _ = train(build, x, y, batch, "xla")
    xla_distance = max_weight_diff(plain_w, xla_w)
    for backend in BACKENDS:
        jit_w, jit_h = train(build, x, y, batch, backend)
        ours = max_weight_diff(plain_w, jit_w)
        assert ours <= max(2 * xla_distance, NOISE_FLOOR), (backend, ours, xla_distance)
        assert plain_h.keys() == jit_h.keys()
        for key in plain_h:
            np.testing.assert_allclose(jit_h[key], plain_h[key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_masks_match_plain_keras_exactly(backend):
    x, y = workloads.classification_data(STEPS * 64, (784,), 10)
    plain_w, plain_h = train(workloads.mlp, x, y, 64, "plain")
    jit_w, jit_h = train(workloads.mlp, x, y, 64, backend)
    # A different mask moves weights by ~1e-2 (as XLA's does); rounding alone is ~1e-7.
    assert max_weight_diff(plain_w, jit_w) < 1e-6
    np.testing.assert_allclose(jit_h["loss"], plain_h["loss"], rtol=1e-6)


@pytest.mark.parametrize("noise", [lambda: keras.layers.GaussianNoise(0.3),
                                   lambda: keras.layers.GaussianDropout(0.3)],
                         ids=["gaussian_noise", "gaussian_dropout"])
def test_normal_noise_matches_plain_keras_exactly(noise):
    def build(jit_compile=False):
        model = keras.Sequential([keras.Input((7,)), keras.layers.Dense(9, activation="relu"),
                                  noise(), keras.layers.Dense(3, activation="softmax")])
        model.compile(optimizer="adam", loss="categorical_crossentropy", jit_compile=jit_compile)
        return model
    x, y = workloads.classification_data(STEPS * 16, (7,), 3)
    plain_w, plain_h = train(build, x, y, 16, "plain")
    jit_w, jit_h = train(build, x, y, 16, "cpu")
    # TensorFlow's own Box-Muller on the same Philox bits (XLA's sampler: ~1e-2 apart)
    assert max_weight_diff(plain_w, jit_w) < 1e-6
    np.testing.assert_allclose(jit_h["loss"], plain_h["loss"], rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_evaluate_and_predict_match_plain_keras(backend):
    x, y = workloads.classification_data(200, (784,), 10)
    keras.utils.set_random_seed(0)
    plain = workloads.mlp()
    keras.utils.set_random_seed(0)
    wrapped = kerasjit.wrap(workloads.mlp(), backend=backend, race=False)
    np.testing.assert_allclose(wrapped.evaluate(x, y, batch_size=64, verbose=0),
                               plain.evaluate(x, y, batch_size=64, verbose=0), rtol=1e-5)
    np.testing.assert_allclose(wrapped.predict(x, batch_size=64, verbose=0),
                               plain.predict(x, batch_size=64, verbose=0), atol=1e-6)
