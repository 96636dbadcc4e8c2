"""A small classifier with batch normalization and its data: 12 features, 4 classes.

model() builds the same network from the same seed each time; `named` gives
every layer, the model and the optimizer a name of their own, so that a
second copy in one process has the names a first run's copy has in a
process of its own (a step identity holds them).
"""
import keras
import numpy as np


def model(activation="tanh", named=False):
    keras.utils.set_random_seed(3)
    name = (lambda n: n) if named else (lambda n: None)
    built = keras.Sequential([keras.Input((12,), name=name("x")),
                              keras.layers.Dense(16, activation=activation, name=name("hidden")),
                              keras.layers.BatchNormalization(name=name("norm")),
                              keras.layers.Dense(4, activation="softmax", name=name("out"))],
                             name=name("m"))
    built.compile(optimizer=keras.optimizers.Adam(0.01, name=name("opt")),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return built


def data(n=256):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 12)).astype(np.float32), rng.integers(0, 4, n)
