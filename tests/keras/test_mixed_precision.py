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
