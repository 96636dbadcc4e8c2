"""Keras behaves the same under wrap: fit's arguments, callbacks, the fast
array input path and steps_per_execution.

Each test runs the same setup on a plain Keras model and on a wrapped copy
(same seed) and compares what a user sees: histories, callback calls, files
written, printed progress, weights.
"""
import csv

import keras
import numpy as np
import pytest
import tensorflow as tf

import kerasjit
from kerasjit.runtime import feed

from tests.support.small_classifier import X, Y, model

pytestmark = pytest.mark.tensorflow_reference


def close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-6)


def same_history(plain, wrapped):
    assert plain.history.keys() == wrapped.history.keys()
    assert plain.epoch == wrapped.epoch
    for key in plain.history:
        close(plain.history[key], wrapped.history[key])


def fit_both(x=X, y=Y, steps_per_execution=1, callbacks=lambda: [],
             optimizer=lambda: keras.optimizers.SGD(0.1), race=True, **kwargs):
    kwargs = {"batch_size": 16, "epochs": 3, "shuffle": False, "verbose": 0, **kwargs}
    out = []
    for wrapped in (False, True):
        m = model(wrapped, steps_per_execution, optimizer, race=race)
        cbs = callbacks()
        out.append((m, m.fit(x, y, callbacks=cbs, **kwargs), cbs))
    return out


class CallRecorder(keras.callbacks.Callback):
    """Every callback method Keras calls, with its batch/epoch argument and log keys."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __getattribute__(self, name):
        attr = super().__getattribute__(name)
        if name.startswith("on_"):
            def record(*args, **kwargs):
                logs = kwargs.get("logs", args[-1] if args else None)
                step = args[0] if args and not isinstance(args[0], dict) else None
                self.calls.append((name, step, tuple(sorted(logs or {}))))
                return attr(*args, **kwargs)
            return record
        return attr


@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_callbacks_are_called_in_keras_order_with_keras_logs(steps_per_execution):
    (_, hp, (plain,)), (_, hw, (wrapped,)) = fit_both(
        steps_per_execution=steps_per_execution, callbacks=lambda: [CallRecorder()],
        validation_data=(X[:30], Y[:30]))
    assert wrapped.calls == plain.calls
    same_history(hp, hw)


@pytest.mark.parametrize("kwargs", [
    {"validation_split": 0.2},
    {"validation_data": (X[:40], Y[:40]), "validation_batch_size": 7},
    {"sample_weight": np.linspace(0.1, 2.0, 90).astype(np.float32)},
    {"class_weight": {0: 0.3, 1: 1.0, 2: 2.5}},
    {"initial_epoch": 2, "epochs": 4},
    {"batch_size": 13},                           # a partial last batch
    {"steps_per_epoch": 3},
], ids=lambda k: ",".join(k))
def test_fit_arguments_train_like_keras(kwargs):
    (mp, hp, _), (mw, hw, _) = fit_both(**kwargs)
    same_history(hp, hw)
    for a, b in zip(mp.get_weights(), mw.get_weights()):
        close(a, b)


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_steps_per_execution_gives_the_same_training_and_runs_natively(
        steps_per_execution, monkeypatch):
    calls = []
    original = kerasjit.runtime.program.Program.run_steps

    def spy(self, stacked, state, keep_all=False):
        result = original(self, stacked, state, keep_all)
        calls.append((len(stacked[0]), result is not None))
        return result
    monkeypatch.setattr(kerasjit.runtime.program.Program, "run_steps", spy)
    (mp, hp, _), (mw, hw, _) = fit_both(steps_per_execution=steps_per_execution,
                                        optimizer=lambda: keras.optimizers.Adam(0.01),
                                        race=False)     # every execution native from the start
    same_history(hp, hw)
    for a, b in zip(mp.get_weights(), mw.get_weights()):
        close(a, b)
    if steps_per_execution == 1:
        assert calls == []
    else:   # 90 samples / 16 = 5 full batches + 1 partial per epoch: [3 full], [2 full] + [1]
        assert (3, True) in calls and (2, True) in calls and all(ok for _, ok in calls)


@pytest.mark.parametrize("steps_per_execution", [1, 4])
def test_evaluate_and_predict_match_keras(steps_per_execution):
    results = []
    for wrapped in (False, True):
        m = model(wrapped, steps_per_execution)
        m.fit(X, Y, batch_size=16, epochs=1, shuffle=False, verbose=0)
        results.append((m.evaluate(X, Y, batch_size=7, verbose=0),
                        m.evaluate(X, Y, batch_size=7, verbose=0, return_dict=True),
                        m.predict(X, batch_size=7, verbose=0),
                        m.predict_on_batch(X[:5])))
    (ep, dp, pp, bp), (ew, dw, pw, bw) = results
    close(ep, ew)
    assert dp.keys() == dw.keys()
    assert pw.shape == pp.shape == (90, 3) and isinstance(pw, np.ndarray)
    close(pp, pw)
    close(bp, bw)


def test_arrays_take_the_numpy_path_and_datasets_the_tf_data_path(monkeypatch):
    built = []
    original = feed.ArrayEpochIterator.__init__

    def spy(self, *args, **kwargs):
        built.append(type(kwargs["x"]).__name__)
        original(self, *args, **kwargs)
    monkeypatch.setattr(feed.ArrayEpochIterator, "__init__", spy)
    m = model(True)
    m.fit(X, Y, batch_size=16, epochs=1, verbose=0, validation_data=(X[:20], Y[:20]))
    m.evaluate(tf.constant(X), tf.constant(Y), verbose=0)
    m.predict(X, verbose=0)
    assert built == ["ndarray", "ndarray", "EagerTensor", "ndarray"]
    built.clear()
    dataset = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)
    m.fit(dataset, epochs=1, verbose=0)
    assert built == []
    # Plain Keras models are never affected, not even while a wrapped one is fitting.
    plain = model(False)
    plain.fit(X, Y, batch_size=16, epochs=1, verbose=0)
    assert built == []


def test_datasets_generators_and_pydatasets_train_like_keras():
    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return X[16 * i:16 * i + 16], Y[16 * i:16 * i + 16]

    def generator():
        while True:
            for i in range(6):
                yield X[16 * i:16 * i + 16], Y[16 * i:16 * i + 16]
    inputs = [
        lambda: (tf.data.Dataset.from_tensor_slices((X, Y)).batch(16), {}),
        lambda: (Batches(), {}),
        lambda: (generator(), {"steps_per_epoch": 6}),
    ]
    for make in inputs:
        histories = []
        for wrapped in (False, True):
            data, kwargs = make()
            histories.append(model(wrapped).fit(data, epochs=2, verbose=0, **kwargs))
        same_history(*histories)


def _batches_seen(shuffle):
    """Row ids of every batch of a 2-epoch wrapped fit, via a recording train step."""
    seen = []

    class Recording(keras.Model):
        def train_step(self, data):
            x, _ = data
            tf.py_function(lambda ids: seen.append(ids.numpy().astype(int).tolist()),
                           [x[:, 0]], [])
            return super().train_step(data)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    m = Recording(inputs, keras.layers.Dense(3, activation="softmax")(inputs))
    m.compile(optimizer="sgd", loss="categorical_crossentropy")
    ids = np.tile(np.arange(90, dtype=np.float32)[:, None], (1, 6))
    kerasjit.wrap(m).fit(ids, Y, batch_size=16, epochs=2, shuffle=shuffle, verbose=0)
    return seen


def test_shuffle_follows_keras_semantics():
    in_order = [list(range(i, min(i + 16, 90))) for i in range(0, 90, 16)]
    assert _batches_seen(False) == in_order * 2
    epochs = _batches_seen(True)
    first, second = sum(epochs[:6], []), sum(epochs[6:], [])
    assert sorted(first) == sorted(second) == list(range(90))
    assert first != list(range(90)) and first != second
    by_batch = _batches_seen("batch")
    assert [sorted(b) for b in by_batch] == in_order * 2     # shuffled within each batch
    assert by_batch != in_order * 2


def test_checkpoints_at_epoch_and_batch_frequency_hold_keras_weights(tmp_path):
    saved = {}
    for wrapped in (False, True):
        for freq in ("epoch", 5):
            path = tmp_path / f"{wrapped}_{freq}.weights.h5"
            m = model(wrapped)
            m.fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=[
                keras.callbacks.ModelCheckpoint(str(path), save_weights_only=True,
                                                save_freq=freq)])
            m.load_weights(str(path))
            saved[wrapped, freq] = m.get_weights()
    for freq in ("epoch", 5):
        for a, b in zip(saved[False, freq], saved[True, freq]):
            close(a, b)
    # save_freq=5 saved last after the 10th of 12 batches, not at the end of training
    assert not np.allclose(saved[True, 5][0], saved[True, "epoch"][0])


def test_csv_logger_and_progress_bar_show_keras_values(tmp_path, capsys):
    rows = []
    for wrapped in (False, True):
        path = tmp_path / f"{wrapped}.csv"
        model(wrapped).fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=1,
                           callbacks=[keras.callbacks.CSVLogger(str(path))])
        with open(path) as f:
            rows.append(list(csv.DictReader(f)))
    plain, wrapped = rows
    assert [r.keys() for r in plain] == [r.keys() for r in wrapped]
    for p, w in zip(plain, wrapped):
        numbers = [k for k, v in p.items() if v != "NA"]
        assert [k for k, v in w.items() if v != "NA"] == numbers
        close([float(p[k]) for k in numbers], [float(w[k]) for k in numbers])
    out = capsys.readouterr().out
    assert out.count("6/6") >= 4 and out.count("Epoch 2/2") == 2


def test_a_callback_list_is_taken_as_keras_takes_it():
    """fit(callbacks=CallbackList(...)): Keras uses the list as given; a callback in
    it reading the weights at an epoch's end sees the trained ones."""
    class Weights(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seen = []

        def on_epoch_end(self, epoch, logs=None):
            self.seen.append(self.model.get_weights()[0].copy())
    seen = []
    for wrapped in (False, True):
        m = model(wrapped, race=False)
        watcher = Weights()
        callbacks = keras.callbacks.CallbackList([watcher], add_history=True, model=m)
        given = list(callbacks.callbacks)
        m.fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
        assert callbacks.callbacks == given         # the list is left as it was given
        seen.append(watcher.seen)
    for plain, wrapped in zip(*seen):
        close(plain, wrapped)


@pytest.mark.parametrize("sequential", [False, True])
def test_models_with_named_outputs_weighted_losses_and_metrics_train_like_keras(sequential):
    """Losses, loss weights and metrics per named output (a dict), or one output
    of a Sequential model with several metrics: the same history keys and values
    as plain Keras, and the same metric variables after fit."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(48, 6)).astype("float32")
    labels, target = rng.integers(0, 3, 48), rng.normal(size=(48, 2)).astype("float32")
    results = []
    for wrapped in (False, True):
        keras.utils.set_random_seed(7)
        if sequential:
            m = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(3)])
            m.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(2)])
            y = labels
        else:
            inputs = keras.Input((6,))
            hidden = keras.layers.Dense(8, activation="relu")(inputs)
            m = keras.Model(inputs, {"kind": keras.layers.Dense(3, name="kind")(hidden),
                                     "size": keras.layers.Dense(2, name="size")(hidden)})
            m.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss={"kind": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                            "size": "mse"},
                      loss_weights={"kind": 1.0, "size": 0.5},
                      metrics={"kind": ["accuracy"], "size": ["mae"]})
            y = {"kind": labels, "size": target}
        if wrapped:
            kerasjit.wrap(m, backend="cpu", race=False, background=False)
        history = m.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        results.append((history, [v.numpy() for v in m.metrics_variables]))
    (plain, plain_state), (wrapped, wrapped_state) = results
    same_history(plain, wrapped)
    assert len(plain_state) == len(wrapped_state)
    for p, w in zip(plain_state, wrapped_state):
        close(p, w)


def test_per_output_losses_weigh_a_partial_last_batch_by_its_size():
    """A named output's loss in `evaluate` is the mean over all samples, the
    partial last batch counted once per sample, as one batch of all of them
    gives it. (Plain Keras counts that batch as one sample here: its step,
    retraced for the new size with the batch dim unknown, has no size to
    weigh it by; its total loss, which reads the size at run time, agrees.)"""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(50, 6)).astype("float32")
    y = {"kind": rng.integers(0, 3, 50), "size": rng.normal(size=(50, 1)).astype("float32")}
    keras.utils.set_random_seed(7)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    m = keras.Model(inputs, {"kind": keras.layers.Dense(3, name="kind")(hidden),
                             "size": keras.layers.Dense(1, name="size")(hidden)})
    m.compile(optimizer="adam", loss={"kind": "sparse_categorical_crossentropy", "size": "mse"})
    whole = m.evaluate(x, y, batch_size=50, verbose=0, return_dict=True)
    kerasjit.wrap(m, backend="cpu", race=False, background=False)
    batched = m.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)    # 16, 16, 16, 2
    assert batched.keys() == whole.keys() >= {"kind_loss", "size_loss", "loss"}
    for key in whole:
        close(batched[key], whole[key])
