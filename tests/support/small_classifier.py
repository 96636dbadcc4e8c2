"""A small classifier and its data: 90 samples of 6 features, 3 one-hot classes.

model(wrapped) builds the same two-layer network from the same seed each time,
plain or through kerasjit.wrap (with wrap_kwargs), so that plain and wrapped
training can be compared.
"""
import keras
import numpy as np

import kerasjit

X = np.random.default_rng(0).normal(size=(90, 6)).astype(np.float32)
Y = keras.utils.to_categorical(np.random.default_rng(1).integers(0, 3, 90), 3)


def model(wrapped, steps_per_execution=1, optimizer=lambda: keras.optimizers.SGD(0.1),
          **wrap_kwargs):
    keras.utils.set_random_seed(3)
    m = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="relu"),
                          keras.layers.Dense(3, activation="softmax")])
    m.compile(optimizer=optimizer(), loss="categorical_crossentropy", metrics=["accuracy"],
              steps_per_execution=steps_per_execution)
    return kerasjit.wrap(m, **wrap_kwargs) if wrapped else m
