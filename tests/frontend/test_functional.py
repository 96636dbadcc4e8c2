"""functionalize: variables become values, called functions are inlined and
branches if-converted, with the variables each branch changes picked by its
condition. Checked by running the compiled step against TensorFlow's."""
import numpy as np
import pytest
import tensorflow as tf

import kerasjit

pytestmark = pytest.mark.tensorflow_reference


def _run_both(make_step, *args):
    """(compiled results and variable values, TensorFlow's) of the step that
    make_step() returns with its variables (built afresh for each)."""
    outcomes = []
    for compiled in (True, False):
        step, variables = make_step()
        fn = kerasjit.jit(step, race=False) if compiled else tf.function(step)
        results = [np.asarray(fn(*a)) for a in args]
        outcomes.append((results, [v.numpy() for v in variables]))
        if compiled:
            kinds = [c.kind for c in kerasjit.explain(fn, *args[0]).clusters]
            assert kinds == ["compiled"], kinds
    return outcomes


def _branchy():
    total, count = tf.Variable(np.zeros(3, np.float32)), tf.Variable(0)

    def step(x, flag):
        def accumulate():
            total.assign_add(x)
            return tf.reduce_sum(total)

        def reset():
            count.assign_add(1)
            total.assign(x * 2)
            return -tf.reduce_sum(x)
        out = tf.cond(flag, accumulate, reset)
        return out + tf.reduce_sum(total) + tf.cast(count, tf.float32)
    return step, [total, count]


def test_cond_updating_variables_in_its_branches():
    x = np.array([1, 2, 3], np.float32)
    args = [(x, np.bool_(f)) for f in (True, True, False, True, False)]
    (got, got_vars), (want, want_vars) = _run_both(_branchy, *args)
    np.testing.assert_allclose(got, want)
    for g, w in zip(got_vars, want_vars):
        np.testing.assert_allclose(g, w)


def _cases():
    state = tf.Variable(np.ones(2, np.float32))

    def step(k, x):
        def branch(scale):
            def run():
                state.assign(state * scale + x)
                return state * 1.0
            return run
        return tf.switch_case(k, [branch(2.0), branch(-1.0), branch(0.5)])
    return step, [state]


def test_switch_case_out_of_range_takes_the_last_branch():
    x = np.array([0.5, -1], np.float32)
    args = [(np.int32(k), x) for k in (0, 2, 1, 7, -3, 0)]
    (got, got_vars), (want, want_vars) = _run_both(_cases, *args)
    np.testing.assert_allclose(got, want)
    np.testing.assert_allclose(got_vars[0], want_vars[0])


def _nested():
    v = tf.Variable(np.float32(1.0))

    @tf.function
    def inner(x):
        v.assign_add(tf.reduce_sum(x))
        return x * v

    @tf.function(jit_compile=True)
    def outer(x):
        return inner(x) + inner(2 * x)

    def step(x):
        return outer(x) - v
    return step, [v]


def test_nested_functions_updating_a_variable_are_inlined():
    x = np.array([1, -0.5], np.float32)
    (got, got_vars), (want, want_vars) = _run_both(_nested, (x,), (x,))
    np.testing.assert_allclose(got, want)
    np.testing.assert_allclose(got_vars[0], want_vars[0])


def _looped():
    total, scale = tf.Variable(np.zeros(2, np.float32)), tf.Variable(np.float32(0.5))

    def step(x):
        def body(i, acc):
            def grow():
                total.assign_add(x * scale)
                return acc + tf.reduce_sum(total)

            def shrink():
                scale.assign(scale * 2.0)
                return acc - 1.0
            return i + 1, tf.cond(i % 2 == 0, grow, shrink)
        return tf.while_loop(lambda i, _: i < 5, body, (0, 0.0))[1] + scale
    return step, [total, scale]


def test_loop_assigning_variables_in_a_branch_of_its_body():
    x = np.array([1, -0.5], np.float32)
    (got, got_vars), (want, want_vars) = _run_both(_looped, (x,), (x,))
    np.testing.assert_allclose(got, want)
    for g, w in zip(got_vars, want_vars):
        np.testing.assert_allclose(g, w)
