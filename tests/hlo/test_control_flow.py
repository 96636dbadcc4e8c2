"""The evaluator on while, conditional and call: against values worked out by
hand and against TensorFlow (the bridge's loops and branches)."""
import numpy as np
import pytest
import tensorflow as tf

from kerasjit.hlo import parse_module
from kerasjit.hlo.evaluator import evaluate
from tests.support.bridge import bridge
from tests.support.loop_text import (CALLS, INDEX_CONDITIONAL, LIST_LOOP, NESTED,
                                     PRED_CONDITIONAL)


def _list_loop_reference(seq, w):
    acc, out = np.zeros(3, np.float32), seq.copy()
    for i in range(5):
        acc = acc * w + out[i]
        out[i] = acc
    return acc, out


def test_while_carries_its_state_and_writes_a_list():
    seq = np.arange(15, dtype=np.float32).reshape(5, 3) / 7
    w = np.array([0.5, -1.0, 2.0], np.float32)
    acc, out = evaluate(parse_module(LIST_LOOP), [seq, w])
    want_acc, want_out = _list_loop_reference(seq, w)
    np.testing.assert_allclose(acc, want_acc, rtol=1e-6)
    np.testing.assert_allclose(out, want_out, rtol=1e-6)


def test_nested_while_with_tuple_state():
    x, y = np.array([1, 2], np.float32), np.array([10, 20], np.float32)
    a, b = evaluate(parse_module(NESTED), [x, y])
    want_a, want_b = x.copy(), y.copy()
    for i in range(4):
        a2, b2 = want_b, want_a
        for _ in range(i, 3):
            a2, b2 = b2, a2 + b2
        want_a, want_b = a2, b2
    np.testing.assert_array_equal(a, want_a)
    np.testing.assert_array_equal(b, want_b)


@pytest.mark.parametrize("p, want", [(True, [2, -4, 6]), (False, [-1, 2, -3])])
def test_conditional_on_a_pred(p, want):
    x = np.array([1, -2, 3], np.float32)
    np.testing.assert_array_equal(evaluate(parse_module(PRED_CONDITIONAL), [np.bool_(p), x]),
                                  want)


@pytest.mark.parametrize("k, want", [(0, [2, -4, 6]), (1, [-1, 2, -3]), (2, [1, 4, 9]),
                                     (7, [1, 4, 9]), (-1, [1, 4, 9])])
def test_conditional_on_an_index_takes_the_last_branch_out_of_range(k, want):
    x = np.array([1, -2, 3], np.float32)
    np.testing.assert_array_equal(evaluate(parse_module(INDEX_CONDITIONAL), [np.int32(k), x]),
                                  want)


def test_call():
    x = np.array([1, -2, 3], np.float32)
    np.testing.assert_array_equal(evaluate(parse_module(CALLS), [x]), (2 * x) ** 2 + x)


def test_branch_computations_print_and_parse_back():
    module = parse_module(INDEX_CONDITIONAL)
    again = parse_module(str(module))
    assert str(again) == str(module)
    (cond,) = [i for i in again.entry.instructions if i.opcode == "conditional"]
    assert [c.name for c in cond.called_computations] == ["double", "negate", "square"]


def _rnn_with_grads(x, w, u):
    """A tanh RNN over x's time axis with tf.while_loop, and its gradients."""
    with tf.GradientTape() as tape:
        tape.watch([x, w, u])
        steps = tf.TensorArray(tf.float32, size=x.shape[0])

        def body(t, h, steps):
            h = tf.tanh(tf.matmul(x[t], w) + tf.matmul(h, u))
            return t + 1, h, steps.write(t, h)
        _, h, steps = tf.while_loop(lambda t, *_: t < x.shape[0], body,
                                    (0, tf.zeros([x.shape[1], u.shape[0]]), steps),
                                    maximum_iterations=x.shape[0])
        loss = tf.reduce_sum(steps.stack() ** 2) + tf.reduce_sum(h)
    return [loss, *tape.gradient(loss, [x, w, u])]


def _branches(p, k, x):
    picked = tf.switch_case(k, [lambda: x * 2, lambda: -x, lambda: tf.exp(x)])
    return tf.cond(p, lambda: picked + 1, lambda: picked * x)


def test_matches_tensorflow_on_a_loop_with_its_gradient():
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) / 2 for s in [(6, 4, 3), (3, 5), (5, 5)]]
    want = [np.asarray(v) for v in tf.function(_rnn_with_grads, jit_compile=True)(*args)]
    got = evaluate(bridge(_rnn_with_grads, *args), args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("p", [True, False])
@pytest.mark.parametrize("k", [0, 2, 5])
def test_matches_tensorflow_on_branches(p, k):
    x = np.linspace(-1, 1, 6, dtype=np.float32)
    args = [np.bool_(p), np.int32(k), x]
    want = tf.function(_branches, jit_compile=True)(*args).numpy()
    module = bridge(_branches, *args)
    assert any(i.opcode == "conditional" for c in module.computations for i in c.instructions)
    np.testing.assert_allclose(evaluate(module, args), want, rtol=1e-6)
