"""Keras variables hold the compiled state whenever anyone can look.

Between steps kerasjit keeps the training variables as arrays; these tests
check every point where a user or a callback can observe them: per-batch
callbacks, epoch ends, validation, the return from fit, train_on_batch, and
an interrupted fit (which keeps the last completed step).
"""
import keras
import numpy as np
import pytest

import kerasjit
from kerasjit import workloads

pytestmark = pytest.mark.tensorflow_reference

X, Y = workloads.classification_data(96, (20,), 3)


def model(wrapped, backend="cpu"):
    keras.utils.set_random_seed(5)
    m = keras.Sequential([keras.Input((20,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(3, activation="softmax")])
    m.compile(optimizer="adam", loss="categorical_crossentropy", metrics=["accuracy"])
    return kerasjit.wrap(m, backend=backend) if wrapped else m


class WeightSpy(keras.callbacks.Callback):
    """Reads the first kernel after every batch and epoch, as a user callback might."""

    def __init__(self):
        super().__init__()
        self.batches, self.epochs = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append(self.model.get_weights()[0].copy())

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(self.model.get_weights()[0].copy())


class EpochSpy(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append([w.copy() for w in self.model.get_weights()])


def fit_both(spies_factory=lambda: [WeightSpy()], **kwargs):
    results = []
    for wrapped in (False, True):
        m = model(wrapped)
        spies = spies_factory()
        history = m.fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0,
                        callbacks=spies, **kwargs)
        results.append((m, spies, history))
    return results


def test_epoch_logs_come_from_current_metric_variables():
    (_, _, ha), (_, _, hb) = fit_both(spies_factory=lambda: [EpochSpy()])
    assert min(hb.history["loss"]) > 0
    for key in ha.history:
        np.testing.assert_allclose(hb.history[key], ha.history[key], rtol=1e-5)


def test_a_callback_reading_weights_each_batch_sees_each_step():
    (plain, [a], _), (wrapped, [b], _) = fit_both()
    assert len(a.batches) == len(b.batches) == 12
    for p, q in zip(a.batches + a.epochs, b.batches + b.epochs):
        np.testing.assert_allclose(p, q, atol=1e-6)


def test_a_lambda_callback_sees_and_changes_the_weights_each_batch():
    """LambdaCallback sets its batch hooks on the instance, not its class:
    what it reads is each step's weights, what it assigns the next step uses."""
    results = []
    for wrapped in (False, True):
        m, seen = model(wrapped), []

        def look(batch, logs, m=m, seen=seen):
            seen.append(m.get_weights()[0].copy())
            if batch == 2:
                m.layers[1].kernel.assign(np.zeros((8, 3), np.float32))
        history = m.fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=[
            keras.callbacks.LambdaCallback(on_train_batch_end=look),
            keras.callbacks.LambdaCallback(
                on_batch_end=lambda batch, logs, m=m, seen=seen: seen.append(m.get_weights()[2]))])
        results.append((seen, history.history["loss"], m.get_weights()))
    (want_seen, want_loss, want), (got_seen, got_loss, got) = results
    assert len(got_seen) == len(want_seen) == 24
    for p, q in zip(want_seen, got_seen):
        np.testing.assert_allclose(q, p, atol=1e-6)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    for p, q in zip(want, got):
        np.testing.assert_allclose(q, p, atol=1e-6)


def test_epoch_callbacks_and_validation_see_current_weights():
    (plain, [a], ha), (wrapped, [b], hb) = fit_both(
        spies_factory=lambda: [EpochSpy()], validation_split=0.25)
    for pe, qe in zip(a.epochs, b.epochs):
        for p, q in zip(pe, qe):
            np.testing.assert_allclose(p, q, atol=1e-6)
    np.testing.assert_allclose(hb.history["val_loss"], ha.history["val_loss"], rtol=1e-5)
    for p, q in zip(plain.get_weights(), wrapped.get_weights()):
        np.testing.assert_allclose(p, q, atol=1e-6)


def test_only_batch_observers_cost_a_sync_per_batch():
    wrapped = model(True)
    flushes = []
    store = wrapped._kerasjit.store
    original = store.flush
    store.flush = lambda: (flushes.append(1), original())[1]
    wrapped.fit(X, Y, batch_size=16, epochs=2, verbose=0,
                callbacks=[kerasjit.JitProfiler(), keras.callbacks.EarlyStopping("loss", patience=5)])
    quiet = len(flushes)
    flushes.clear()
    wrapped.fit(X, Y, batch_size=16, epochs=2, verbose=0, callbacks=[WeightSpy()])
    # A few per epoch and at fit's edges, against one more for each of the 12 batches.
    assert quiet <= 10 and len(flushes) >= quiet + 12


def test_learning_rate_changed_by_a_callback_is_used():
    schedule = keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.1 / (epoch + 1))
    (plain, _, _), (wrapped, _, _) = fit_both(spies_factory=lambda: [schedule])
    for p, q in zip(plain.get_weights(), wrapped.get_weights()):
        np.testing.assert_allclose(p, q, atol=1e-6)


class Interrupt(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 3:
            raise KeyboardInterrupt


def test_interrupted_fit_keeps_the_last_completed_step():
    finals = []
    for wrapped in (False, True):
        m = model(wrapped)
        with pytest.raises(KeyboardInterrupt):
            m.fit(X, Y, batch_size=16, epochs=1, shuffle=False, verbose=0,
                  callbacks=[Interrupt()])
        finals.append(m.get_weights())
    for p, q in zip(*finals):
        np.testing.assert_allclose(p, q, atol=1e-6)


def test_train_on_batch_leaves_variables_current():
    plain, wrapped = model(False), model(True)
    for m in (plain, wrapped):
        for i in range(3):
            m.train_on_batch(X[i * 16:(i + 1) * 16], Y[i * 16:(i + 1) * 16])
    for p, q in zip(plain.get_weights(), wrapped.get_weights()):
        np.testing.assert_allclose(p, q, atol=1e-6)


@pytest.mark.parametrize("calls", [3, 30])    # (30: past the eager reads and writes)
def test_writes_between_train_on_batch_calls_reach_the_next_step(calls):
    """Between two calls the step keeps the variables' arrays, unless someone
    wrote the variable meanwhile: Keras's assign, set_weights, TensorFlow's
    assign_add on the variable beneath, the optimizer's step count."""
    plain, wrapped = model(False), model(True)
    for m in (plain, wrapped):
        for i in range(calls):
            m.train_on_batch(X[i % 6 * 16:][:16], Y[i % 6 * 16:][:16])
            if i % 4 == 1:
                kernel = m.layers[0].kernel
                kernel.assign(kernel.numpy() * 0.5)
            if i % 4 == 2:
                m.layers[1].bias.value.assign_add(np.full(3, 0.25, np.float32))
                m.set_weights([w + 0.01 for w in m.get_weights()])
            if i % 5 == 3:
                m.optimizer.iterations.assign(1)
    for p, q in zip(plain.get_weights() + [v.numpy() for v in plain.optimizer.variables],
                    wrapped.get_weights() + [v.numpy() for v in wrapped.optimizer.variables]):
        np.testing.assert_allclose(p, q, atol=1e-5)


def test_train_on_batch_reuses_the_arrays_of_variables_nobody_wrote():
    """A loop of train_on_batch calls reads no weight back from TensorFlow:
    the arrays the step updates stay the step's own (no copy per call)."""
    m = model(True)
    store = m._kerasjit.store
    for i in range(3):
        m.train_on_batch(X[:16], Y[:16])
    kernels = {id(v.value): v.value for v in m.trainable_variables if len(v.shape) == 2}
    arrays = {key: store.values[key] for key in kernels}
    for i in range(3):
        m.train_on_batch(X[:16], Y[:16])
        assert all(store.values[key] is arrays[key] for key in kernels)
    m.layers[0].kernel.assign(m.layers[0].kernel.numpy())
    m.train_on_batch(X[:16], Y[:16])
    first = id(m.layers[0].kernel.value)
    assert store.values[first] is not arrays[first]
    assert all(store.values[key] is arrays[key] for key in kernels if key != first)


def test_early_stopping_restores_best_weights_like_keras():
    def spies():
        return [keras.callbacks.EarlyStopping(monitor="loss", patience=1,
                                              restore_best_weights=True, min_delta=10)]
    (plain, _, ha), (wrapped, _, hb) = fit_both(spies_factory=spies)
    assert len(ha.history["loss"]) == len(hb.history["loss"])
    for p, q in zip(plain.get_weights(), wrapped.get_weights()):
        np.testing.assert_allclose(p, q, atol=1e-6)


class Countdown(keras.metrics.Metric):
    """A metric whose reset is its own: it starts from 10, not from zero."""

    def __init__(self, name="countdown"):
        super().__init__(name=name)
        self.left = self.add_variable(shape=(), initializer="zeros", name="left")
        self.reset_state()

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.left.assign_sub(1.0)

    def reset_state(self):
        self.left.assign(10.0)

    def result(self):
        return self.left


@pytest.mark.parametrize("calls", [3, 20])    # (20: past the eager writes)
def test_on_batch_calls_reset_the_metrics_before_each_step(calls):
    """train_on_batch and test_on_batch report each batch's metrics alone, as
    plain Keras does: Keras's zeroing resets (accuracy, the loss tracker, true
    positives, a sum) and a metric's own reset alike, and the metric variables
    hold that batch's state once the call returns."""
    def build(wrapped):
        keras.utils.set_random_seed(5)
        m = keras.Sequential([keras.Input((20,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
        m.compile(optimizer="adam", loss="categorical_crossentropy",
                  metrics=["accuracy", keras.metrics.TruePositives(), keras.metrics.AUC(),
                           Countdown()])
        return kerasjit.wrap(m, backend="cpu") if wrapped else m
    logs, states = [], []
    for wrapped in (False, True):
        m, seen = build(wrapped), []
        for i in range(calls):
            batch = X[i % 6 * 16:][:16], Y[i % 6 * 16:][:16]
            seen.append(m.train_on_batch(*batch))
            seen.append(m.test_on_batch(*batch))
            if i == 1:      # a user's reset between calls reaches Keras's variables
                m.reset_metrics()
                seen.append([v.numpy() for v in m.metrics[1].variables])
        logs.append(seen)
        states.append([v.numpy() for metric in m.metrics for v in metric.variables])
    for p, q in zip(*logs):
        np.testing.assert_allclose(np.hstack(p), np.hstack(q), rtol=1e-5, atol=1e-6)
    for p, q in zip(*states):
        np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("calls", [3, 20])
def test_models_sharing_layers_see_each_others_updates(calls):
    """Two wrapped models with a shared encoder (multi-task, a GAN's generator
    inside the combined model), trained in turn: each call starts from the
    encoder as the other model's last call left it, as in plain Keras."""
    def build(wrapped):
        keras.utils.set_random_seed(7)
        encoder = keras.Sequential([keras.Input((20,)), keras.layers.Dense(8, activation="tanh")])
        heads = []
        for units, loss in ((3, "categorical_crossentropy"), (1, "mse")):
            m = keras.Sequential([encoder, keras.layers.Dense(units)])
            m.compile(optimizer=keras.optimizers.Adam(0.01), loss=loss)
            heads.append(kerasjit.wrap(m, backend="cpu") if wrapped else m)
        return encoder, heads
    results = []
    for wrapped in (False, True):
        encoder, (a, b) = build(wrapped)
        losses = []
        for i in range(calls):
            batch = X[i % 6 * 16:][:16]
            losses.append(a.train_on_batch(batch, Y[i % 6 * 16:][:16]))
            losses.append(b.train_on_batch(batch, batch[:, :1]))
        a.fit(X, Y, batch_size=32, epochs=1, verbose=0, shuffle=False)
        losses.append(b.evaluate(X, X[:, :1], batch_size=32, verbose=0))
        results.append((losses, encoder.get_weights() + a.get_weights() + b.get_weights()))
    # (float noise grows over ~50 Adam steps, more so beside TensorFlow's kernels
    # without oneDNN; a stale shared variable moves the losses by 1e-2 and more)
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-3, atol=1e-4)
    for p, q in zip(results[0][1], results[1][1]):
        np.testing.assert_allclose(p, q, rtol=1e-3, atol=1e-4)
