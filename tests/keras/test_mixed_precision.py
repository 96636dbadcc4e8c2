"""Keras's mixed precision policies compile whole: f16 or bf16 layers (and
mixed_float16's loss scaling, whose branches are if-converted) in one
compiled cluster, trained as close to plain Keras as Keras+XLA comes; their
16-bit dropout masks and noise are TensorFlow's own."""
import keras
import numpy as np
import pytest

import kerasjit

pytestmark = pytest.mark.tensorflow_reference


@pytest.fixture
def policy(request):
    keras.mixed_precision.set_global_policy(request.param)
    yield request.param
    keras.mixed_precision.set_global_policy("float32")


def _train(mode, x, y):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((12, 12, 1)), keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.MaxPooling2D(), keras.layers.Flatten(), keras.layers.Dropout(0.2),
        keras.layers.GaussianNoise(0.1), keras.layers.Dense(3),
        keras.layers.Activation("softmax", dtype="float32")])
    model.compile(optimizer="adam", loss="categorical_crossentropy", jit_compile=mode == "xla")
    if mode == "kerasjit":
        model = kerasjit.wrap(model, race=False)
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    return model


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"], indirect=True)
def test_mixed_precision_compiles_whole_within_xla_distance(policy):
    x = np.random.default_rng(0).standard_normal((64, 12, 12, 1)).astype(np.float32)
    y = np.eye(3, dtype=np.float32)[np.random.default_rng(1).integers(0, 3, 64)]
    plain, xla, ours = (_train(mode, x, y) for mode in ("plain", "xla", "kerasjit"))
    assert [c.kind for c in kerasjit.explain(ours, x[:16], y[:16]).clusters] == ["compiled"]

    def distance(model):
        return max(float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))
                   for a, b in zip(model.get_weights(), plain.get_weights()))
    assert distance(ours) <= max(2 * distance(xla), 1e-6), (distance(ours), distance(xla))


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"], indirect=True)
def test_a_dilated_convolution_trains_as_in_plain_keras(policy):
    """TensorFlow builds a dilated Conv1D from SpaceToBatchND and BatchToSpaceND
    (a transpose between reshapes); with Flatten after it, a 16-bit step once
    trained on NaNs (an index miscompiled)."""
    rng = np.random.default_rng(8)
    x, y = rng.random((48, 10, 3), dtype=np.float32), rng.integers(0, 3, 48)

    def train(wrapped):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((10, 3)),
            keras.layers.Conv1D(8, 3, dilation_rate=2, padding="causal", activation="relu"),
            keras.layers.Flatten(), keras.layers.Dense(3, activation="softmax", dtype="float32")])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
        if wrapped:
            kerasjit.wrap(model, race=False, background=False)
        return model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history["loss"]
    np.testing.assert_allclose(train(True), train(False), rtol=1e-3)
