"""A warm start of a model of Keras's own classes: its compiled step rebuilt
from the compile cache by the model's step identity, without TensorFlow's
trace (seconds for a large CNN)."""
import ast
import subprocess
import sys
import textwrap
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasjit
from kerasjit.step_identity import step_identity
from tests.support import bn_classifier

pytestmark = pytest.mark.tensorflow_reference     # (compared with plain Keras's kernels)


_data = bn_classifier.data


def _model(activation="tanh"):
    """The same model each call, every name given (bn_classifier)."""
    return bn_classifier.model(activation, named=True)


def _train_step_run(model):
    (run,) = model._kerasjit.train.programs.values()
    return run


def _trained_once(x, y):
    """A first run's model, trained until its compiled step is kept (and so its recipe)."""
    earlier = kerasjit.wrap(_model(), background=True, race=False)
    earlier.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    earlier._kerasjit.train.wait()
    earlier.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    return earlier


def test_a_warm_start_rebuilds_the_compiled_step_untraced_and_trains_as_keras(compile_cache_dir):
    x, y = _data()
    _trained_once(x, y)
    assert list(compile_cache_dir.glob("recipe-*.kjt"))
    plain = _model()
    expected = plain.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history
    model = kerasjit.wrap(_model(), background=True, race=False)
    compiled = []
    watch = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: compiled.append(
        [c.kind for c in _train_step_run(model).program.clusters] == ["compiled"]))
    history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0,
                        callbacks=[watch]).history
    assert compiled == [True] * 16
    assert _train_step_run(model).trace.traces == 0
    (event,) = model._kerasjit.compile_events
    assert "rebuilt from the compile cache" in event.what and not event.background
    for key in expected:
        np.testing.assert_allclose(history[key], expected[key], rtol=2e-4, atol=2e-5)
    for ours, theirs in zip(model.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(model.evaluate(x, y, verbose=0), plain.evaluate(x, y, verbose=0),
                               rtol=2e-4, atol=2e-5)


def _augmenting_cnn():
    """A CNN whose step holds ops TensorFlow runs (RandomRotation's image
    transform): a step of several clusters, compiled and TensorFlow's."""
    keras.backend.clear_session()       # (the same names in every copy)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.RandomFlip("horizontal"),
                              keras.layers.RandomRotation(0.1), keras.layers.Conv2D(4, 3),
                              keras.layers.MaxPooling2D(), keras.layers.Flatten(),
                              keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_a_step_of_several_clusters_is_rebuilt_with_its_tensorflow_clusters(compile_cache_dir):
    """TensorFlow's clusters come back from the GraphDefs the recipe keeps;
    the compiled convolution's cluster races TensorFlow's as it did cold."""
    x = np.random.default_rng(0).random((128, 16, 16, 3)).astype(np.float32)
    y = np.arange(128) % 2
    plain = _augmenting_cnn()
    expected = plain.fit(x, y, batch_size=16, epochs=6, shuffle=False, verbose=0).history["loss"]
    kinds = {}
    for run in ("cold", "warm"):
        model = kerasjit.wrap(_augmenting_cnn(), background=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # (TensorFlow may win a race here)
            model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
            model._kerasjit.train.wait()
            # (40 steps: the clusters' races and then the step's verdict decide)
            losses = model.fit(x, y, batch_size=16, epochs=5, shuffle=False,
                               verbose=0).history["loss"]
        kinds[run] = [c.kind for c in _train_step_run(model).program.clusters]
    assert "tensorflow" in kinds["warm"] and len(kinds["warm"]) > 2
    assert _train_step_run(model).trace.traces == 0
    assert any("rebuilt" in e[2] for e in model._kerasjit.compile_events)
    np.testing.assert_allclose(losses, expected[1:], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(model.predict(x, verbose=0), plain.predict(x, verbose=0),
                               rtol=1e-4, atol=1e-5)


def test_a_step_whose_tensorflow_cluster_calls_a_function_is_traced_again(compile_cache_dir):
    """RMSprop's update of an Embedding's sparse gradient leaves a cond to
    TensorFlow, its branches functions that only the step's trace registers:
    such a step keeps no recipe, and its warm start trains as Keras."""
    x = np.random.default_rng(0).integers(0, 300, (48, 12)).astype(np.int32)
    y = np.random.default_rng(1).normal(size=(48, 1)).astype(np.float32)

    def embedding_model():
        keras.backend.clear_session()
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((12,), dtype="int32"),
                                  keras.layers.Embedding(300, 8),
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
        model.compile(optimizer="rmsprop", loss="mse")
        return model
    expected = embedding_model().fit(x, y, batch_size=16, epochs=2, shuffle=False,
                                     verbose=0).history["loss"]
    for run in ("cold", "warm"):
        model = kerasjit.wrap(embedding_model(), background=False, race=False)
        losses = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history["loss"]
        np.testing.assert_allclose(losses, expected, rtol=1e-5, atol=1e-6)
    assert "tensorflow" in [c.kind for c in _train_step_run(model).program.clusters]
    assert _train_step_run(model).trace.traces == 1


def test_a_rebuilt_step_given_inputs_that_fail_its_checks_raises_as_keras(compile_cache_dir):
    """The input checks (a label past the classes) run TensorFlow's step,
    traced only now, which raises Keras's error; no weight moved (batch
    normalization's moving statistics may: TensorFlow updates them before the
    loss fails, as in plain Keras)."""
    x, y = _data(64)
    _trained_once(x, y)
    model = kerasjit.wrap(_model(), background=True, race=False)
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    run = _train_step_run(model)
    assert run.trace.traces == 0 and run.program.checked
    before = [w.numpy() for w in model.trainable_weights]
    bad = y.copy()
    bad[3] = 9
    with pytest.raises(tf.errors.InvalidArgumentError, match="label"):
        model.fit(x, bad, batch_size=32, epochs=1, shuffle=False, verbose=0)
    assert run.trace.traces == 1
    for now, then in zip(model.trainable_weights, before, strict=True):
        np.testing.assert_array_equal(now.numpy(), then)


def test_a_recipe_whose_code_is_gone_compiles_as_a_cold_start(compile_cache_dir):
    """The recipe holds no code: where the cache lost the step's optimised
    module, the step is traced and compiled again, and trains as Keras."""
    x, y = _data()
    _trained_once(x, y)
    for stored in compile_cache_dir.glob("optimized-*.kjt"):
        stored.unlink()
    plain = _model()
    plain.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    model = kerasjit.wrap(_model(), background=False, race=False)
    model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    assert _train_step_run(model).trace.traces == 1
    for ours, theirs in zip(model.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=2e-4, atol=2e-5)


def _built(model):
    model._symbolic_build(data_batch=_data(8))     # (its metrics' and optimizer's variables)
    return model


def test_equal_models_have_one_identity_and_a_changed_config_another():
    first, second = step_identity(_built(_model())), step_identity(_built(_model()))
    assert first is not None and first.text == second.text
    assert step_identity(_built(_model(activation="relu"))).text != first.text
    frozen = _model()
    frozen.get_layer("norm").trainable = False
    assert step_identity(_built(frozen)).text != first.text
    changed = _model()
    changed.get_layer("norm").epsilon = 0.1     # (the config reads it back: so does the step)
    assert step_identity(_built(changed)).text != first.text


def test_values_a_layer_holds_outside_its_config_are_in_the_identity():
    """An adapted Normalization's mean and variance are constants of the
    trace: adapted to other data, the model is another."""
    def adapted(data):
        norm = keras.layers.Normalization(name="norm")
        norm.adapt(data)
        model = keras.Sequential([keras.Input((12,), name="x"), norm,
                                  keras.layers.Dense(4, activation="softmax", name="out")],
                                 name="m")
        model.compile(optimizer=keras.optimizers.Adam(name="opt"),
                      loss="sparse_categorical_crossentropy")
        return step_identity(_built(model)).text
    x, _ = _data(64)
    assert adapted(x) == adapted(x) != adapted(2 * x)


def test_an_optimizer_setting_outside_its_config_is_in_the_identity():
    def decaying(excluded):
        model = _model()
        model.compile(optimizer=keras.optimizers.AdamW(0.01, name="opt"),
                      loss="sparse_categorical_crossentropy")
        model.optimizer.exclude_from_weight_decay(var_names=excluded)
        return step_identity(_built(model)).text
    assert decaying(["bias"]) == decaying(["bias"]) != decaying(["gamma"])


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(4)

    def call(self, x):
        return self.dense(x)


class _Schedule(keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
        return 0.01 / (1.0 + tf.cast(step, "float32"))


def _users_loss(y_true, y_pred):
    return keras.losses.sparse_categorical_crossentropy(y_true, y_pred)


def _with(layers=(), loss="sparse_categorical_crossentropy", metrics=(), optimizer="adam",
          model=None):
    if model is None:
        model = keras.Sequential([keras.Input((12,)), *layers,
                                  keras.layers.Dense(4, activation="softmax")])
    model.compile(optimizer=optimizer, loss=loss, metrics=list(metrics))
    return model


class _Penalty(keras.regularizers.Regularizer):
    def __call__(self, weights):
        return 0.01 * tf.reduce_sum(tf.abs(weights))


def _users_activation(t):
    return t * tf.sigmoid(t)


@pytest.mark.parametrize("case", ["lambda layer", "loss function", "metric function",
                                  "learning-rate schedule", "subclassed model",
                                  "train_step of the instance", "activation function",
                                  "regularizer class", "metric wrapping a function"])
def test_a_model_with_code_of_the_users_own_has_no_identity(case):
    """Only its trace can tell what such a step computes: no recipe."""
    model = {
        "lambda layer": lambda: _with([keras.layers.Lambda(lambda t: 2 * t)]),
        "loss function": lambda: _with(loss=_users_loss),
        "metric function": lambda: _with(metrics=[lambda y_true, y_pred: y_pred[:, 0]]),
        "learning-rate schedule": lambda: _with(optimizer=keras.optimizers.SGD(_Schedule())),
        "subclassed model": lambda: _with(model=Subclassed()),
        "train_step of the instance": lambda: _with(),
        "activation function": lambda: _with([keras.layers.Dense(8, activation=_users_activation)]),
        "regularizer class": lambda: _with([keras.layers.Dense(8, kernel_regularizer=_Penalty())]),
        "metric wrapping a function": lambda: _with(
            metrics=[keras.metrics.MeanMetricWrapper(_users_loss, name="users")]),
    }[case]()
    if case == "train_step of the instance":
        model.train_step = model.train_step
    assert step_identity(_built(model)) is None
    assert step_identity(_built(_with())) is not None


def test_a_script_run_again_starts_from_its_recipe_and_trains_alike(compile_cache_dir):
    """The user's case: the same script twice, each in a process of its own
    (dropout's random bits included); the second traces no train step."""
    script = textwrap.dedent("""
        import keras, numpy as np, kerasjit
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dropout(0.3), keras.layers.Dense(3)])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        rng = np.random.default_rng(0)
        x, y = rng.random((320, 20), dtype=np.float32), rng.integers(0, 3, 320)
        kerasjit.wrap(model, race=False, background=True)
        model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=2)
        model._kerasjit.train.wait()
        losses = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history["loss"]
        print("losses", repr(losses))
        print("traces", [run.trace.traces for run in model._kerasjit.train.programs.values()])
        print("rebuilt", any("rebuilt" in e.what for e in model._kerasjit.compile_events))
    """)

    def run():
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        said = dict(line.split(" ", 1) for line in done.stdout.splitlines()
                    if line.startswith(("losses", "traces", "rebuilt")))
        return said, done.stdout
    (cold, cold_out), (warm, warm_out) = run(), run()
    assert cold["rebuilt"] == "False" and warm["rebuilt"] == "True"
    said = "kerasjit: train_step: rebuilt from the compile cache for inputs [(32, 20), (32,)] in"
    assert said in warm_out and said not in cold_out
    assert warm["traces"] == "[0]"
    # (the cold run's first epoch ran in TensorFlow while the step compiled)
    np.testing.assert_allclose(ast.literal_eval(warm["losses"]), ast.literal_eval(cold["losses"]),
                               rtol=1e-4)
