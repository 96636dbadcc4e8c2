"""Control flow compiled by the CPU backend against the evaluator: while loops
with tuple and nested state, a list written step by step, a loop-carried
random state, conditionals (made selects), and TensorFlow's own loops and
branches (a recurrent net and its gradient, a cond inside a loop) through
the bridge."""
import numpy as np
import pytest
import tensorflow as tf

from kerasjit.backends.cpu import BACKEND
from kerasjit.hlo import parse_module
from tests.hlo.test_control_flow import _rnn_with_grads
from tests.support.bridge import bridge
from tests.support.cpu_check import check
from tests.support.loop_text import (INDEX_CONDITIONAL, LIST_LOOP, NESTED, PRED_CONDITIONAL,
                                     RNG_LOOP, accumulating_loop)


def test_list_loop():
    seq = np.arange(15, dtype=np.float32).reshape(5, 3) / 7
    check(parse_module(LIST_LOOP), [seq, np.array([0.5, -1.0, 2.0], np.float32)])


@pytest.mark.parametrize("read_row", ["add(s32[] %a.i, s32[] %a.zero)",
                                      "subtract(s32[] %a.four, s32[] %a.i)"])
def test_list_items_read_updated_and_stored_back(read_row):
    seq = np.arange(15, dtype=np.float32).reshape(5, 3) / 7
    check(parse_module(accumulating_loop(read_row)), [seq, np.array([0.5, -1.0, 2.0], np.float32)])


def test_nested_loops_with_a_swap():
    check(parse_module(NESTED), [np.array([1, 2], np.float32), np.array([10, 20], np.float32)])


def test_loop_carried_random_state():
    check(parse_module(RNG_LOOP), [np.array([42, 7, 0], np.uint64)])


@pytest.mark.tensorflow_reference
def test_recurrent_net_and_its_gradient():
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(s).astype(np.float32) / 2 for s in [(7, 4, 3), (3, 5), (5, 5)]]
    check(bridge(_rnn_with_grads, *args), args, rtol=2e-5, atol=1e-5)


@pytest.mark.parametrize("p", [True, False])
def test_conditional_on_a_pred(p):
    check(parse_module(PRED_CONDITIONAL), [np.bool_(p), np.array([1, -2, 3], np.float32)])


@pytest.mark.parametrize("k", [0, 1, 2, 9])
def test_conditional_on_an_index(k):
    check(parse_module(INDEX_CONDITIONAL), [np.int32(k), np.array([1, -2, 3], np.float32)])


def _clipped_steps(x):
    """A loop whose step branches on its running total."""
    def body(t, total):
        step = tf.cond(total < 2.0, lambda: x[t] * 2.0, lambda: -x[t] / 2.0)
        return t + 1, total + tf.reduce_sum(step)
    return tf.while_loop(lambda t, _: t < x.shape[0], body, (0, 0.0),
                         maximum_iterations=x.shape[0])[1]


@pytest.mark.tensorflow_reference
def test_cond_inside_a_loop():
    x = np.linspace(-1, 2, 12, dtype=np.float32).reshape(6, 2)
    module = bridge(_clipped_steps, x)
    check(module, [x])
    np.testing.assert_allclose(BACKEND.compile(bridge(_clipped_steps, x))([x])[0],
                               tf.function(_clipped_steps)(x).numpy(), rtol=1e-6)


def _started_from_a_value_it_also_reads(x):
    """A loop whose carried value starts as a value its body also reads
    (captured): the state holds one value twice, one leaf changing."""
    h = x + 1.0
    return tf.while_loop(lambda k, v: k < 3, lambda k, v: (k + 1, tf.tanh(v) * 0.9 + h * 0.1),
                         (0, h))[1]


@pytest.mark.tensorflow_reference
def test_a_loop_state_holding_one_value_twice_keeps_the_leaf_passed_on():
    x = np.linspace(-1, 2, 12, dtype=np.float32).reshape(4, 3)
    check(bridge(_started_from_a_value_it_also_reads, x), [x])
    np.testing.assert_allclose(BACKEND.compile(bridge(_started_from_a_value_it_also_reads, x))(
        [x])[0], tf.function(_started_from_a_value_it_also_reads)(x).numpy(), rtol=1e-6)
