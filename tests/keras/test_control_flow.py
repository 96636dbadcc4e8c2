"""Steps with control flow compile whole: a recurrent layer's time loop reads
its weights as variables, yet the train, test and predict steps are each one
compiled cluster, and they give plain Keras's results."""
import keras
import numpy as np
import pytest

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


def test_a_loop_that_updates_a_variable_says_why_it_runs_in_tensorflow():
    counter = keras.Variable(0.0)

    def step(x):
        import tensorflow as tf

        def body(i, total):
            counter.assign_add(1.0)
            return i + 1, total + x[i]
        return tf.while_loop(lambda i, _: i < 3, body, (0, 0.0))[1]
    with pytest.warns(RuntimeWarning, match="only read them|cannot turn into dataflow"):
        out = kerasjit.jit(step, race=False)(np.arange(4, dtype=np.float32))
    assert float(np.asarray(out)) == 3.0
