"""Steps with control flow compile whole: a recurrent layer's time loop reads
its weights as variables, an optimizer's branches update them, a grouped
convolution is a nested function; yet each step is one compiled cluster,
giving plain Keras's results."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasjit
from kerasjit import workloads

pytestmark = pytest.mark.tensorflow_reference


def _kinds(step, *batch):
    return [c.kind for c in kerasjit.explain(step, *batch).clusters]


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "SimpleRNN"])
def test_recurrent_steps_compile_whole_and_match_plain_keras(cell):
    x, y = workloads.token_data(96, 9, 200)
    keras.utils.set_random_seed(1)
    plain = workloads.text_rnn(cell, vocab=200, length=9, units=8)
    keras.utils.set_random_seed(1)
    wrapped = kerasjit.wrap(workloads.text_rnn(cell, vocab=200, length=9, units=8), race=False)
    for model in (plain, wrapped):
        model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    state = wrapped._kerasjit
    assert _kinds(state.train, (x[:32], y[:32])) == ["compiled"]
    assert _kinds(state.test, (x[:32], y[:32])) == ["compiled"]
    assert _kinds(state.predict, (x[:32],)) == ["compiled"]
    for got, want in zip(wrapped.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(wrapped.predict(x, batch_size=32, verbose=0),
                               plain.predict(x, batch_size=32, verbose=0), atol=1e-6)
    np.testing.assert_allclose(wrapped.evaluate(x, y, batch_size=32, verbose=0),
                               plain.evaluate(x, y, batch_size=32, verbose=0), rtol=1e-5)


def _dense(shape=(8,)):
    return [keras.Input(shape), keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(3, activation="softmax")]


SETUPS = {
    "gradient_accumulation": (_dense, lambda: keras.optimizers.Adam(
        gradient_accumulation_steps=2)),
    "ema_overwrite": (_dense, lambda: keras.optimizers.Adam(use_ema=True,
                                                             ema_overwrite_frequency=3)),
    "warmup_schedule": (_dense, lambda: keras.optimizers.Adam(
        keras.optimizers.schedules.CosineDecay(0.0, 100, warmup_target=1e-2, warmup_steps=4))),
    "grouped_convolution": (lambda: [keras.Input((8, 8, 4)), keras.layers.Conv2D(4, 3, groups=2),
                                     keras.layers.Flatten(),
                                     keras.layers.Dense(3, activation="softmax")], lambda: "adam"),
}


@pytest.mark.parametrize("name", SETUPS)
def test_branches_and_nested_functions_compile_whole_and_match_plain_keras(name):
    layers, optimizer = SETUPS[name]

    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(layers())
        model.compile(optimizer=optimizer(), loss="categorical_crossentropy",
                      metrics=["accuracy"])
        return model
    shape = build().input_shape[1:]
    x = np.random.default_rng(0).standard_normal((96, *shape)).astype(np.float32)
    y = np.eye(3, dtype=np.float32)[np.random.default_rng(1).integers(0, 3, 96)]
    plain, wrapped = build(), kerasjit.wrap(build(), race=False)
    want = plain.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
    got = wrapped.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
    assert _kinds(wrapped._kerasjit.train, (x[:16], y[:16])) == ["compiled"]
    for a, b in zip(wrapped.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    # (the optimizer's own state too: accumulators, EMA copies, iteration count)
    for a, b in zip(wrapped.optimizer.variables, plain.optimizer.variables):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


class CountedLoop(keras.layers.Layer):
    """Counts its loop's iterations in a variable: a loop that assigns one,
    which kerasjit makes loop-carried state."""

    def build(self, shape):
        self.turns = self.add_weight(shape=(), initializer="zeros", trainable=False)
        self.scale = self.add_weight(shape=shape[1:], initializer="ones")

    def call(self, x):
        def body(i, total):
            self.turns.assign_add(1.0)
            return i + 1, total + x * self.scale * self.turns
        return tf.while_loop(lambda i, _: i < 3, body, (0, x), maximum_iterations=3)[1]


def test_a_loop_assigning_a_variable_compiles_and_matches_plain_keras():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(48, 4)).astype(np.float32)
    y = keras.utils.to_categorical(rng.integers(0, 3, 48), 3)

    def build():
        keras.utils.set_random_seed(5)
        model = keras.Sequential([keras.Input((4,)), CountedLoop(),
                                  keras.layers.Dense(3, activation="softmax")])
        model.compile(optimizer="adam", loss="categorical_crossentropy", metrics=["accuracy"])
        return model
    plain, wrapped = build(), kerasjit.wrap(build(), race=False)
    want = plain.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
    got = wrapped.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
    assert _kinds(wrapped._kerasjit.train, (x[:16], y[:16])) == ["compiled"]
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    for a, b in zip(wrapped.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert float(wrapped.layers[0].turns.numpy()) == 3 * 6 == float(plain.layers[0].turns.numpy())


def test_a_loop_reading_the_value_it_starts_from_predicts_as_plain_keras():
    """A loop whose carried value starts as a value its body also reads: the
    loop's state holds that value twice, once passed on unchanged."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 10)).astype(np.float32), rng.normal(size=(16, 4)).astype(np.float32)

    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((10,))
        h = keras.layers.Dense(4)(inputs)
        out = keras.layers.Lambda(lambda h: keras.ops.while_loop(
            lambda k, v: k < 3, lambda k, v: (k + 1, keras.ops.tanh(v) * 0.9 + h * 0.1),
            (0, h))[1])(h)
        model = keras.Model(inputs, out)
        model.compile(optimizer="sgd", loss="mse")
        return model
    plain, wrapped = build(), kerasjit.wrap(build(), race=False)
    np.testing.assert_allclose(wrapped.predict(x, verbose=0), plain.predict(x, verbose=0),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(wrapped.evaluate(x, y, verbose=0), plain.evaluate(x, y, verbose=0),
                               rtol=1e-5)
    assert _kinds(wrapped._kerasjit.predict, (x,)) == ["compiled"]
