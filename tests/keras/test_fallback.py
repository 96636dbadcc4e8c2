"""Per-cluster fallback: what the bridge cannot compile runs in TensorFlow."""
import gc
import logging
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasjit
from kerasjit import workloads
from kerasjit.frontend import functional
from kerasjit.frontend.plan import Planner
from kerasjit.step import CompiledStep

from tests.fuzz.fuzz_keras import compare

pytestmark = pytest.mark.tensorflow_reference


class RunTimeAxisExpand(keras.layers.Layer):
    """The seed's case: expand_dims on an axis drawn at run time (always 1 here)."""

    def call(self, x):
        axis = tf.random.uniform([], 1, 2, dtype=tf.int32)
        return tf.reshape(tf.expand_dims(x, axis), [-1, x.shape[-1]])


def expand_model():
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
                              RunTimeAxisExpand(), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def test_seed_runtime_axis_expand_dims_trains_split_between_tf_and_compiled():
    rng = np.random.default_rng(0)
    x, y = rng.random((64, 12), dtype=np.float32), rng.integers(0, 3, 64)
    keras.utils.set_random_seed(3)
    plain = expand_model()
    plain.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    keras.utils.set_random_seed(3)
    wrapped = kerasjit.wrap(expand_model(), backend="reference")
    wrapped.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(plain.get_weights(), wrapped.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6)

    explanation = kerasjit.explain(wrapped, x[:16], y[:16])
    fallback = [c for c in explanation.clusters if c.kind == "tensorflow"]
    compiled = [c for c in explanation.clusters if c.kind == "compiled"]
    assert any("ExpandDims" in c.ops and "compile-time constant" in c.reason for c in fallback)
    assert any("RandomUniformInt" in c.ops and "stateful random" in c.reason for c in fallback)
    assert sum(len(c.ops) for c in compiled) > 5 * sum(len(c.ops) for c in fallback)
    # Clusters downstream of the run-time shape were specialised when the step ran.
    assert all(c.hlo for c in compiled)
    text = str(explanation)
    assert "TensorFlow: " in text and "compile-time constant" in text


def augmenting_cnn():
    """Keras's image augmentation layers before a small CNN: stateless random
    draws from a seed variable, and a translation (ImageProjectiveTransformV3)
    that has no XLA kernel."""
    inputs = keras.Input((12, 12, 3))
    x = keras.layers.RandomFlip("horizontal_and_vertical")(inputs)
    x = keras.layers.RandomTranslation(0.1, 0.1)(x)
    x = keras.layers.RandomContrast(0.2)(x)
    x = keras.layers.RandomBrightness(0.2, value_range=(0, 1))(x)
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(4, activation="softmax")(x))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def test_augmentation_layers_train_as_plain_keras_around_the_op_xla_lacks():
    rng = np.random.default_rng(0)
    x, y = rng.random((64, 12, 12, 3), dtype=np.float32), rng.integers(0, 4, 64)
    runs = []
    for wrap in (lambda m: m, lambda m: kerasjit.wrap(m, backend="cpu", race=False,
                                                        background=False)):
        keras.utils.set_random_seed(5)
        model = wrap(augmenting_cnn())
        losses = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        runs.append((model, losses.history["loss"]))
    (plain, plain_loss), (wrapped, wrapped_loss) = runs
    np.testing.assert_allclose(wrapped_loss, plain_loss, rtol=1e-5)
    for a, b in zip(plain.get_weights(), wrapped.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    seeds = [[v.numpy() for v in m.variables if "seed_generator" in v.path]
             for m in (plain, wrapped)]
    assert len(seeds[0]) == 4 and all(np.array_equal(a, b) for a, b in zip(*seeds))
    clusters = kerasjit.explain(wrapped, x[:16], y[:16]).clusters
    [translation] = [c for c in clusters if c.kind == "tensorflow"]
    assert translation.ops == ["ImageProjectiveTransformV3"]
    assert translation.reason.endswith(": ImageProjectiveTransformV3 has no XLA kernel "
                                       "(XLA_CPU_JIT)"), translation.reason
    assert sum(c.kind == "compiled" for c in clusters) == 2


def test_jit_seed_reduction_matches_numpy():
    f = kerasjit.jit(lambda x, y, z: tf.reduce_sum(x + y * z), backend="reference")
    x, y, z = (np.random.default_rng(i).random(100, dtype=np.float32) for i in range(3))
    np.testing.assert_allclose(f(x, y, z), np.sum(x + y * z), rtol=1e-5)
    explanation = kerasjit.explain(f, x, y, z)
    assert [c.kind for c in explanation.clusters] == ["compiled"]
    assert "reduce(" in explanation.hlo and "multiply(" in explanation.hlo


def test_py_function_strings_and_one_arg_where_run_in_tensorflow():
    def f(x):
        doubled = tf.py_function(lambda t: t * 2.0, [x], tf.float32)
        doubled.set_shape(x.shape)
        label = tf.strings.as_string(tf.reduce_sum(x))
        positive = tf.cast(tf.shape(tf.where(x > 0.5))[0], tf.float32)
        return tf.reduce_sum(doubled + 1.0) + positive, label
    x = np.linspace(0, 1, 10, dtype=np.float32)
    jitted = kerasjit.jit(f, backend="reference")
    value, label = jitted(x)
    expected_value, expected_label = f(tf.constant(x))
    np.testing.assert_allclose(value, expected_value.numpy(), rtol=1e-6)
    assert label == expected_label.numpy()
    reasons = " ".join(c.reason for c in kerasjit.explain(jitted, x).clusters)
    for why in ("py_function", "string", "tf.where"):
        assert why in reasons


def test_the_next_step_of_the_same_graph_replays_the_kept_plan(compile_cache_dir, monkeypatch):
    """A plan (the partition, where the bridge moved nodes to TensorFlow, each
    cluster's boundary) is kept in the compile cache by the graph's digest: a
    step of the same graph, in this process or a later one, takes it without
    partitioning and computes the same."""
    def f(x):
        positive = tf.cast(tf.shape(tf.where(x > 0.5))[0], tf.float32)
        return tf.reduce_sum(tf.tanh(x) * 2.0) + positive, tf.strings.as_string(positive)
    x = np.linspace(0, 1, 10, dtype=np.float32)

    def clusters(jitted):
        return [(c.kind, c.reason, c.ops, c.hlo) for c in kerasjit.explain(jitted, x).clusters]
    first = kerasjit.jit(f, backend="reference")
    value, label = first(x)
    assert list(compile_cache_dir.glob("plan-*.kjt"))

    def partitioned(planner):
        raise AssertionError("partitioned again")
    monkeypatch.setattr(Planner, "_partition", partitioned)
    again = kerasjit.jit(f, backend="reference")
    replayed_value, replayed_label = again(x)
    assert replayed_value == value and replayed_label == label
    assert clusters(again) == clusters(first)
    assert {kind for kind, *_ in clusters(again)} == {"compiled", "tensorflow"}


def test_many_tensorflow_clusters_run_without_tensorflows_retracing_warning():
    """Each TensorFlow cluster traces on its first call; TensorFlow counts the
    traces of all functions of one code object together and, past five, would
    warn the user to change their code."""
    def f(x):
        for _ in range(7):
            count = tf.cast(tf.shape(tf.where(x > 0.5))[0], tf.float32)  # TensorFlow's
            x = tf.tanh(x) + count                                      # compiled
        return x
    x = np.linspace(0, 1, 10, dtype=np.float32)
    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    tf.get_logger().addHandler(handler)
    try:
        jitted = kerasjit.jit(f, backend="reference")
        for _ in range(2):
            np.testing.assert_allclose(jitted(x), f(x).numpy(), rtol=1e-6)
    finally:
        tf.get_logger().removeHandler(handler)
    kinds = [c.kind for c in kerasjit.explain(jitted, x).clusters]
    assert kinds.count("tensorflow") >= 7
    assert not [m for m in logged if "retracing" in m]


def test_runtime_shapes_are_specialised_up_to_a_cap_then_stay_in_tensorflow():
    def f(x, axis):
        axis = tf.identity(axis)
        y = tf.expand_dims(x, tf.random.uniform([], 0, 1, dtype=tf.int32) + axis)
        return tf.reduce_sum(tf.square(y + 1.0), axis=0)

    jitted = kerasjit.jit(f, backend="reference", max_shapes=2)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for axis in (0, 1):
            np.testing.assert_allclose(jitted(x, np.int32(axis)), f(x, axis).numpy())
    with pytest.warns(RuntimeWarning, match="more than 2 input shapes"):
        np.testing.assert_allclose(jitted(x, np.int32(2)), f(x, 2).numpy())


def test_a_cluster_the_cpu_compiler_cannot_build_runs_in_tensorflow_with_a_warning():
    def f(x):
        return tf.sort(x * 2.0) + 1.0       # the CPU compiler has no sort
    x = np.array([3.0, -1.0, 2.0, 0.5], np.float32)
    with pytest.warns(RuntimeWarning, match="runs in TensorFlow"):
        jitted = kerasjit.jit(f, backend="cpu")
        result = jitted(x)
    np.testing.assert_allclose(result, f(tf.constant(x)).numpy())
    clusters = kerasjit.explain(jitted, x).clusters
    assert any(c.kind == "tensorflow" and "'sort'" in c.reason for c in clusters)


class CountsSteps(keras.Model):
    """A train step that updates a variable by a scatter, which kerasjit cannot
    turn into dataflow: the whole step must run in TensorFlow."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2)
        self.steps_seen = tf.Variable([0.0, 0.0], trainable=False)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        self.steps_seen.scatter_nd_add([[1]], [1.0])
        return super().train_step(data)


def test_a_step_that_cannot_be_made_dataflow_runs_whole_in_tensorflow_with_a_warning():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 3)).astype(np.float32), rng.normal(size=(40, 2)).astype(np.float32)

    def fit(wrapped):
        keras.utils.set_random_seed(0)
        model = CountsSteps()
        model.compile(optimizer="sgd", loss="mse")
        if wrapped:
            model = kerasjit.wrap(model, race=False)
        history = model.fit(x, y, batch_size=8, epochs=2, validation_data=(x[:16], y[:16]),
                            shuffle=False, verbose=0).history
        return model, history
    plain, plain_history = fit(False)
    with pytest.warns(RuntimeWarning, match="train_step runs in TensorFlow: op ResourceScatterNdAdd"):
        wrapped, history = fit(True)
    assert history["loss"] == plain_history["loss"]
    # Validation, a compiled test step, saw each epoch's weights (up to rounding).
    np.testing.assert_allclose(history["val_loss"], plain_history["val_loss"], rtol=1e-6)
    for a, b in zip(wrapped.get_weights(), plain.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert wrapped.steps_seen.numpy().tolist() == [0.0, 10.0]
    # (predict is compiled: TensorFlow's kernels may round otherwise)
    np.testing.assert_allclose(wrapped.predict(x, verbose=0), plain.predict(x, verbose=0),
                               rtol=1e-6, atol=1e-7)
    step = wrapped._kerasjit.train
    [cluster] = next(iter(step.programs.values())).program.clusters
    assert cluster.kind == "tensorflow" and "ResourceScatterNdAdd" in cluster.reason


def _fit_embedding_model(optimizer, wrapped):
    x, y = workloads.token_data(48, 12, 300)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((12,), dtype="int32"), keras.layers.Embedding(300, 8),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse")
    if wrapped:
        model = kerasjit.wrap(model, race=False, background=False)
    return model, model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0), x, y


@pytest.mark.parametrize("optimizer", ["rmsprop", "adafactor"])
def test_a_sparse_update_branching_on_shapes_leaves_only_its_branch_to_tensorflow(optimizer):
    """RMSprop's and Adafactor's updates of an Embedding's sparse gradient
    branch on a cond whose results have no static shape: no select can pick
    between them, so that branch runs in TensorFlow and the rest compiles."""
    plain, plain_history, _, _ = _fit_embedding_model(optimizer, False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # no fallback of the whole step
        wrapped, history, x, y = _fit_embedding_model(optimizer, True)
    np.testing.assert_allclose(history.history["loss"], plain_history.history["loss"],
                               rtol=1e-6)
    for a, b in zip(wrapped.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    clusters = kerasjit.explain(wrapped, x[:16], y[:16]).clusters
    assert [c.kind for c in clusters].count("tensorflow") == 1
    assert all("no static shape" in c.reason for c in clusters if c.kind == "tensorflow")
    assert sum(c.kind == "compiled" for c in clusters) >= 1


def test_a_step_tensorflow_cannot_build_as_rewritten_runs_as_traced_with_a_warning(monkeypatch):
    """A program whose first call TensorFlow refuses to build (here: RMSprop's
    sparse branch if-converted regardless of its shapes, a select between
    slices of different lengths) falls back before any variable changed:
    TensorFlow runs the step."""
    monkeypatch.setattr(functional._Walker, "_shaped_alike", lambda self, n: True)
    plain, plain_history, _, _ = _fit_embedding_model("rmsprop", False)
    with pytest.warns(RuntimeWarning, match="TensorFlow runs the step: its first call failed"):
        wrapped, history, _, _ = _fit_embedding_model("rmsprop", True)
    assert history.history["loss"] == plain_history.history["loss"]
    for a, b in zip(wrapped.get_weights(), plain.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_loop_over_tensors_compiles_with_the_rest():
    def f(x):
        def body(i, total, seen):
            return i + 1, total * 1.5 + tf.reduce_sum(x), seen.write(i, total)
        _, total, seen = tf.while_loop(lambda i, *_: i < 4, body,
                                       (0, x * 2.0, tf.TensorArray(tf.float32, size=4)))
        return tf.nn.relu(total - 1.0), seen.stack() * 3.0    # a TensorList in between
    x = np.linspace(-1, 1, 6).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")             # nothing goes to TensorFlow unannounced
        jitted = kerasjit.jit(f, race=False)
        got = jitted(x)
    for g, w in zip(got, f(tf.constant(x))):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-6)
    assert [c.kind for c in kerasjit.explain(jitted, x).clusters] == ["compiled"]


def test_an_output_the_passes_fold_to_a_constant_compiles():
    f = kerasjit.jit(lambda x: (x * 3.0, tf.reduce_max(tf.range(5))), race=False)
    tripled, four = f(np.array([1.0, 2.0], np.float32))
    np.testing.assert_array_equal(tripled, [3.0, 6.0])
    assert four == 4 and four.dtype == np.int32
    assert all(c.kind == "compiled" for c in kerasjit.explain(f, np.ones(2, np.float32)).clusters)


def test_a_step_calling_functions_outlives_its_traced_graph(monkeypatch):
    """A step whose graph calls functions by name (Hinge's cond) trains the same
    after its trace is collected: what runs refers to none of the trace's
    functions. (The fuzzer's shrunk model, seed 0 model 36.)"""
    compiled = CompiledStep._compiled

    def trace_then_collect(self, *args):
        run = compiled(self, *args)
        gc.collect()
        return run
    monkeypatch.setattr(CompiledStep, "_compiled", trace_then_collect)

    def build():
        inputs = keras.Input(shape=(9, 2))
        x = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(inputs))
        model = keras.Model(inputs, x)
        model.compile(optimizer=keras.optimizers.SGD(), loss=keras.losses.Hinge(), metrics=[])
        return model
    rng = np.random.default_rng([0, 36])
    x = rng.normal(size=(3, 9, 2)).astype("float32")
    y = rng.integers(0, 2, size=(3, 2)).astype("float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)          # (the cond compiles too)
        outcome = compare(build, dict(x=x, y=y, batch_size=2, epochs=1, shuffle=False))
    assert outcome.kind == "match", outcome.describe()


def test_jit_returns_tensors_for_tensors_and_arrays_for_arrays():
    f = kerasjit.jit(lambda x: (tf.reduce_sum(x), x * 2), race=False)
    x = np.arange(4, dtype=np.float32)
    total, doubled = f(x)
    assert isinstance(total, np.ndarray) and isinstance(doubled, np.ndarray)
    total, doubled = f(tf.constant(x))
    assert isinstance(total, tf.Tensor) and isinstance(doubled, tf.Tensor)
    np.testing.assert_allclose(doubled.numpy(), x * 2)
    assert float(total) == 6.0


def test_jit_keeps_a_none_among_the_results():
    """A gradient of a value that does not depend on an input is None in
    TensorFlow's results, and in jit's."""
    def f(x, y):
        with tf.GradientTape() as tape:
            tape.watch([x, y])
            loss = tf.reduce_sum(tf.sin(x))
        return loss, tape.gradient(loss, [x, y])
    x, y = np.array([0.5, 1.0], np.float32), np.array([2.0], np.float32)
    loss, (dx, dy) = kerasjit.jit(f, race=False)(x, y)
    want_loss, (want_dx, _) = tf.function(f)(tf.constant(x), tf.constant(y))
    assert dy is None
    np.testing.assert_allclose(loss, want_loss.numpy(), rtol=1e-6)
    np.testing.assert_allclose(dx, want_dx.numpy(), rtol=1e-6)
    _, (_, dy) = kerasjit.jit(f, race=False)(tf.constant(x), tf.constant(y))
    assert dy is None


def test_jit_makes_python_control_flow_on_tensors_graph_ops():
    def f(x):
        total = tf.zeros_like(x[0])
        for i in tf.range(tf.shape(x)[0]):
            if tf.reduce_sum(x[i]) > 0:
                total += x[i]
        return total
    x = np.array([[1, 2], [-3, 1], [0.5, 0.5]], np.float32)
    np.testing.assert_allclose(kerasjit.jit(f, race=False)(x), [1.5, 2.5])


def test_a_truncated_normal_draws_tensorflows_numbers():
    """XLA's stateless truncated normal draws other numbers from the same
    seed: that op runs in TensorFlow, and says why."""
    def f(seed):
        return tf.random.stateless_truncated_normal([6], seed) * 2.0
    seed = np.array([1, 2], np.int32)
    jitted = kerasjit.jit(f, race=False)
    np.testing.assert_array_equal(jitted(seed), tf.function(f)(seed).numpy())
    reasons = [c.reason for c in kerasjit.explain(jitted, seed).clusters]
    assert any("other numbers" in r for r in reasons)
