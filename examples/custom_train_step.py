"""A keras.Model subclass with its own train_step, trained through kerasjit.

kerasjit compiles whatever `train_step` does (here: a Huber loss, gradient
clipping by global norm, and a hand-kept loss metric), so the wrapped model
learns exactly what the plain one learns:

    python examples/custom_train_step.py [--epochs 5] [--backend auto]
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kerasjit  # noqa: E402  (first: TensorFlow loads without its routine log lines)
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


class ClippedRegressor(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(64, activation="relu")
        self.head = keras.layers.Dense(1)
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def call(self, x):
        return self.head(self.hidden(x))

    @property
    def metrics(self):
        return [self.loss_tracker]     # reset by Keras at each epoch

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = keras.losses.Huber()(y, self(x, training=True))
        grads = tape.gradient(loss, self.trainable_variables)
        grads, _ = tf.clip_by_global_norm(grads, 1.0)
        self.optimizer.apply(grads, self.trainable_variables)
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}


def build():
    keras.utils.set_random_seed(0)
    model = ClippedRegressor()
    model.compile(optimizer=keras.optimizers.Adam(0.01))
    model(np.zeros((1, 16), np.float32))     # create the weights now, from this seed
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2048, 16), dtype=np.float32)
    y = (x @ rng.standard_normal((16, 1), dtype=np.float32) + 0.1 * np.sin(8 * x[:, :1]))
    plain, wrapped = build(), kerasjit.wrap(build(), backend=args.backend)
    for name, model in (("plain Keras", plain), ("kerasjit", wrapped)):
        history = model.fit(x, y, batch_size=64, epochs=args.epochs, shuffle=False, verbose=0)
        print(f"{name:>12}: loss per epoch {np.round(history.history['loss'], 4).tolist()}")
    diff = max(float(np.max(np.abs(a - b)))
               for a, b in zip(plain.get_weights(), wrapped.get_weights()))
    print(f"max |weight difference| plain vs kerasjit: {diff:.2e}")
    print(kerasjit.explain(wrapped, x[:64], y[:64]))


if __name__ == "__main__":
    main()
