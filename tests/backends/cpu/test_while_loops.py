"""While loops compiled by the CPU backend against the evaluator: tuple and
nested state, a list written step by step, a loop-carried random state, and
TensorFlow's own loops (a recurrent net and its gradient) through the bridge."""
import numpy as np
import pytest

from kerasjit.hlo import parse_module
from tests.hlo.test_control_flow import _rnn_with_grads
from tests.support.bridge import bridge
from tests.support.cpu_check import check
from tests.support.loop_text import LIST_LOOP, NESTED, RNG_LOOP


def test_list_loop():
    seq = np.arange(15, dtype=np.float32).reshape(5, 3) / 7
    check(parse_module(LIST_LOOP), [seq, np.array([0.5, -1.0, 2.0], np.float32)])


def test_nested_loops_with_a_swap():
    check(parse_module(NESTED), [np.array([1, 2], np.float32), np.array([10, 20], np.float32)])


def test_loop_carried_random_state():
    check(parse_module(RNG_LOOP), [np.array([42, 7, 0], np.uint64)])


@pytest.mark.tensorflow_reference
def test_recurrent_net_and_its_gradient():
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(s).astype(np.float32) / 2 for s in [(7, 4, 3), (3, 5), (5, 5)]]
    check(bridge(_rnn_with_grads, *args), args, rtol=2e-5, atol=1e-5)
