"""The reference workloads (seed models) with deterministic synthetic data.

Shared by tests, examples and benchmarks so that every comparison trains the
same models on the same data. No downloads: data is generated from a seed.
"""
import keras
import numpy as np


def softmax_regression(jit_compile=False):
    """Seed-002: 784 -> 10 softmax regression, SGD(0.5), batch 100."""
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(10, activation="softmax")],
                             name="softmax_regression")
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="categorical_crossentropy",
                  metrics=["accuracy"], jit_compile=jit_compile)
    return model


def _dropout(rate):
    return [keras.layers.Dropout(rate)] if rate else []


def _adam_classifier(name, layers, loss, jit_compile):
    model = keras.Sequential(layers, name=name)
    model.compile(optimizer="adam", loss=loss, metrics=["accuracy"], jit_compile=jit_compile)
    return model


def mlp(dropout=0.5, jit_compile=False):
    """784-256-10 MLP with Dropout, Adam."""
    return _adam_classifier("mlp", [
        keras.Input((784,)), keras.layers.Dense(256, activation="relu"), *_dropout(dropout),
        keras.layers.Dense(10, activation="softmax")], "categorical_crossentropy", jit_compile)


def mnist_cnn(dropout=0.5, jit_compile=False):
    """The Keras examples' MNIST convnet: two 3x3 Conv2D + 2x2 MaxPooling2D,
    Dropout, softmax; Adam, batch 128."""
    return _adam_classifier("mnist_cnn", [
        keras.Input((28, 28, 1)), keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(2), keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(2), keras.layers.Flatten(), *_dropout(dropout),
        keras.layers.Dense(10, activation="softmax")], "categorical_crossentropy", jit_compile)


def pooling_cnn(jit_compile=False):
    """Two 3x3 Conv2D, each followed by max-pooling over overlapping 3x3
    windows with stride 2 (VALID, then SAME), as in ResNet's and AlexNet's
    stems; 32x32x3 inputs, softmax; Adam."""
    return _adam_classifier("pooling_cnn", [
        keras.Input((32, 32, 3)), keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(3, strides=2), keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(3, strides=2, padding="same"), keras.layers.Flatten(),
        keras.layers.Dense(10, activation="softmax")], "categorical_crossentropy", jit_compile)


def conv_bn(image_size=28, jit_compile=False):
    """Conv2D + BatchNorm + MaxPool CNN, SGD with momentum."""
    model = keras.Sequential([
        keras.Input((image_size, image_size, 1)),
        keras.layers.Conv2D(8, 3, padding="same"),
        keras.layers.BatchNormalization(),
        keras.layers.ReLU(),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(10, activation="softmax"),
    ], name="conv_bn")
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                  loss="categorical_crossentropy", metrics=["accuracy"],
                  jit_compile=jit_compile)
    return model


def elephant_cnn(image_size=150, jit_compile=False):
    """Seed-003: the African/Asian elephant classifier (sigmoid, binary cross-entropy)."""
    model = keras.Sequential([
        keras.Input((image_size, image_size, 3)),
        keras.layers.Conv2D(64, (5, 5), activation="relu"),
        keras.layers.MaxPooling2D(pool_size=(2, 2)),
        keras.layers.Conv2D(32, (5, 5), activation="relu"),
        keras.layers.MaxPooling2D(pool_size=(2, 2)),
        keras.layers.Conv2D(16, (5, 5), activation="relu"),
        keras.layers.MaxPooling2D(pool_size=(2, 2)),
        keras.layers.Flatten(),
        keras.layers.Dense(126, activation="relu"),
        keras.layers.Dense(52, activation="relu"),
        keras.layers.Dense(1, activation="sigmoid"),
    ], name="elephant_cnn")
    model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"],
                  jit_compile=jit_compile)
    return model


def text_cnn(vocab=1000, length=40, dropout=0.3, jit_compile=False):
    """A small text classifier: Embedding (a gather; its gradient a scatter-add),
    Conv1D, global max pooling, Dropout, sigmoid; Adam."""
    return _adam_classifier("text_cnn", [
        keras.Input((length,), dtype="int32"), keras.layers.Embedding(vocab, 32),
        keras.layers.Conv1D(32, 5, activation="relu"), keras.layers.GlobalMaxPooling1D(),
        *_dropout(dropout), keras.layers.Dense(1, activation="sigmoid")],
        "binary_crossentropy", jit_compile)


def text_rnn(cell="LSTM", vocab=1000, length=40, units=64, jit_compile=False):
    """A recurrent text classifier: Embedding, one `cell` layer (LSTM, GRU,
    SimpleRNN: a time loop and its gradient's loop), sigmoid; Adam."""
    return _adam_classifier(f"text_{cell.lower()}", [
        keras.Input((length,), dtype="int32"), keras.layers.Embedding(vocab, 32),
        getattr(keras.layers, cell)(units), keras.layers.Dense(1, activation="sigmoid")],
        "binary_crossentropy", jit_compile)


def convnext_block(image_size=32, width=32, classes=10, jit_compile=False):
    """A ConvNeXt-style network: a 4x4 stride-4 stem, one block (a 7x7 grouped
    convolution with a group per channel, as keras.applications' ConvNeXt
    builds it; LayerNormalization; a 4x-wide gelu MLP; a residual), pooling,
    softmax; AdamW."""
    images = keras.Input((image_size, image_size, 3))
    x = keras.layers.Conv2D(width, 4, strides=4)(images)
    y = keras.layers.Conv2D(width, 7, padding="same", groups=width)(x)
    y = keras.layers.LayerNormalization(epsilon=1e-6)(y)
    y = keras.layers.Dense(4 * width, activation="gelu")(y)
    x = x + keras.layers.Dense(width)(y)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(images, keras.layers.Dense(classes, activation="softmax")(x),
                        name="convnext_block")
    model.compile(optimizer="adamw", loss="categorical_crossentropy", metrics=["accuracy"],
                  jit_compile=jit_compile)
    return model


def small_resnet(image_size=32, widths=(16, 32, 64), classes=10, jit_compile=False):
    """A ResNet for 32x32 images in the form of He et al.'s CIFAR networks: a
    3x3 stem, then a stage per width of one basic block (two 3x3 Conv2D with
    BatchNormalization and ReLU, added to the block's input or, where the
    stage halves the size, to its 1x1 stride-2 projection), global average
    pooling, softmax; SGD with Nesterov momentum."""
    def normalized(x, filters, kernel, strides=1, relu=True):
        x = keras.layers.Conv2D(filters, kernel, strides=strides, padding="same",
                                use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        return keras.layers.ReLU()(x) if relu else x

    images = keras.Input((image_size, image_size, 3))
    x = normalized(images, widths[0], 3)
    for stage, width in enumerate(widths):
        strides = 1 if stage == 0 else 2
        shortcut = x if strides == 1 else normalized(x, width, 1, strides, relu=False)
        y = normalized(normalized(x, width, 3, strides), width, 3, relu=False)
        x = keras.layers.ReLU()(keras.layers.Add()([shortcut, y]))
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(images, keras.layers.Dense(classes, activation="softmax")(x),
                        name="small_resnet")
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
                  loss="categorical_crossentropy", metrics=["accuracy"],
                  jit_compile=jit_compile)
    return model


def mini_unet(image_size=32, widths=(16, 32, 64), jit_compile=False):
    """A U-Net for per-pixel binary masks: two 3x3 Conv2D + 2x2 MaxPooling2D
    levels down, a bottleneck, then up by UpSampling2D (bilinear, then
    nearest), each concatenated with its level's features and convolved; a
    sigmoid per pixel; Adam."""
    images = keras.Input((image_size, image_size, 3))
    skips, x = [], images
    for width in widths[:-1]:
        x = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(x)
        skips.append(x)
        x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Conv2D(widths[-1], 3, padding="same", activation="relu")(x)
    for width, skip, interpolation in zip(widths[-2::-1], skips[::-1], ("bilinear", "nearest")):
        x = keras.layers.UpSampling2D(2, interpolation=interpolation)(x)
        x = keras.layers.Concatenate()([x, skip])
        x = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(x)
    model = keras.Model(images, keras.layers.Conv2D(1, 1, activation="sigmoid")(x),
                        name="mini_unet")
    model.compile(optimizer="adam", loss="binary_crossentropy", jit_compile=jit_compile)
    return model


def dcgan_generator(latent=32, jit_compile=False):
    """A DCGAN-style generator: Dense to 8x8x64, two Conv2DTranspose (4x4,
    stride 2, each a convolution over its input dilated by 2) with
    BatchNormalization and ReLU, a 3x3 Conv2D to a 32x32 RGB image in tanh;
    trained to images by mean squared error, Adam."""
    model = keras.Sequential([
        keras.Input((latent,)), keras.layers.Dense(8 * 8 * 64), keras.layers.Reshape((8, 8, 64)),
        keras.layers.Conv2DTranspose(64, 4, strides=2, padding="same"),
        keras.layers.BatchNormalization(), keras.layers.ReLU(),
        keras.layers.Conv2DTranspose(32, 4, strides=2, padding="same"),
        keras.layers.BatchNormalization(), keras.layers.ReLU(),
        keras.layers.Conv2D(3, 3, padding="same", activation="tanh")], name="dcgan_generator")
    model.compile(optimizer="adam", loss="mse", jit_compile=jit_compile)
    return model


def latent_image_data(n, latent=32, seed=0):
    """Random latent vectors and random 32x32 RGB images in [-1, 1]."""
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, latent)).astype(np.float32),
            rng.uniform(-1, 1, (n, 32, 32, 3)).astype(np.float32))


def mask_data(n, image_size=32, seed=0):
    """Random images and a per-pixel mask: where the first channel is positive."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, image_size, image_size, 3)).astype(np.float32)
    return x, (x[..., :1] > 0).astype(np.float32)


def under_policy(policy, build):
    """`build` with Keras's global dtype policy (e.g. "mixed_float16") set
    while it builds the model, and restored after."""
    def built(*args, **kwargs):
        before = keras.mixed_precision.global_policy()
        keras.mixed_precision.set_global_policy(policy)
        try:
            return build(*args, **kwargs)
        finally:
            keras.mixed_precision.set_global_policy(before)
    return built


def text_transformer(vocab=1000, length=40, width=64, heads=4, dropout=0.1, jit_compile=False):
    """A one-block transformer encoder over tokens: Embedding, MultiHeadAttention
    (einsums with batch dims: batched GEMMs) and a Dense feed-forward on the
    sequence, residuals with LayerNormalization, average pooling, sigmoid; Adam."""
    tokens = keras.Input((length,), dtype="int32")
    x = keras.layers.Embedding(vocab, width)(tokens)
    attended = keras.layers.MultiHeadAttention(heads, width // heads, dropout=dropout)(x, x)
    x = keras.layers.LayerNormalization()(x + attended)
    fed = keras.layers.Dense(width)(keras.layers.Dense(2 * width, activation="relu")(x))
    x = keras.layers.LayerNormalization()(x + fed)
    x = keras.layers.GlobalAveragePooling1D()(x)
    model = keras.Model(tokens, keras.layers.Dense(1, activation="sigmoid")(x),
                        name="text_transformer")
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"],
                  jit_compile=jit_compile)
    return model


def gpt_decoder(vocab=1000, length=40, width=64, heads=4, blocks=2, jit_compile=False):
    """A GPT-style language model: token and position embeddings, `blocks`
    pre-LayerNorm decoder blocks (causal MultiHeadAttention, a gelu
    feed-forward, residuals), a final LayerNorm and a `vocab`-wide head that
    predicts the next token at every position; AdamW."""
    tokens = keras.Input((length,), dtype="int32")
    x = keras.layers.Embedding(vocab, width)(tokens)
    x = x + keras.layers.Embedding(length, width)(keras.ops.arange(length))
    for _ in range(blocks):
        normed = keras.layers.LayerNormalization()(x)
        x = x + keras.layers.MultiHeadAttention(heads, width // heads)(
            normed, normed, use_causal_mask=True)
        normed = keras.layers.LayerNormalization()(x)
        x = x + keras.layers.Dense(width)(keras.layers.Dense(4 * width, activation="gelu")(normed))
    logits = keras.layers.Dense(vocab)(keras.layers.LayerNormalization()(x))
    model = keras.Model(tokens, logits, name="gpt_decoder")
    model.compile(optimizer=keras.optimizers.AdamW(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=jit_compile)
    return model


def next_token_data(n, length, vocab, seed=0):
    """Token sequences from a random first-order Markov chain (so there is a
    next token to learn) and, as labels, each position's next token."""
    rng = np.random.default_rng(seed)
    successors = rng.integers(0, vocab, (vocab, 4))
    tokens = np.empty((n, length + 1), np.int32)
    tokens[:, 0] = rng.integers(0, vocab, n)
    for t in range(length):
        tokens[:, t + 1] = successors[tokens[:, t], rng.integers(0, 4, n)]
    return tokens[:, :-1], tokens[:, 1:]


def token_data(n, length, vocab, seed=0):
    """Token ids in [0, vocab) and a label that depends on which tokens occur."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, vocab, (n, length)).astype(np.int32)
    score = rng.standard_normal(vocab)[x].sum(axis=1)
    return x, (score > np.median(score)).astype(np.float32).reshape(n, 1)


def classification_data(n, input_shape, classes, seed=0):
    """Inputs in [0, 1) and labels that depend on them (so models can learn)."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, *input_shape), dtype=np.float32)
    x[rng.random(x.shape) < 0.8] = 0.0      # mostly-dark pixels, like digit images
    score = x.reshape(n, -1) @ rng.standard_normal(int(np.prod(input_shape))).astype(np.float32)
    if classes == 1:
        return x, (score > np.median(score)).astype(np.float32).reshape(n, 1)
    bins = np.quantile(score, np.linspace(0, 1, classes + 1)[1:-1])
    labels = np.digitize(score, bins)
    return x, np.eye(classes, dtype=np.float32)[labels]
