"""One graph constant per value while kerasjit traces (frontend/trace_constants.py)."""
import keras
import numpy as np
import tensorflow as tf

from kerasjit.frontend.trace_constants import interned_constants


def traced(fn, interned=True):
    """The graph of fn() traced by tf.function, within interned_constants or not."""
    def body():
        if not interned:
            return fn()
        with interned_constants():
            return fn()
    return tf.function(body, autograph=False).get_concrete_function().graph


def constants(graph):
    return [op for op in graph.get_operations() if op.type == "Const"]


def test_equal_values_share_one_constant_and_other_values_do_not():
    made = {}

    def fn():
        made["a"], made["b"] = tf.constant(0.9), tf.constant(0.9)
        made["shape"], made["shape_again"] = tf.constant([2, 3]), tf.constant((2, 3))
        made["others"] = [tf.constant(v) for v in (-0.0, 0.0, 1, 1.0, True)]
        made["float64"] = tf.constant(0.9, tf.float64)
        with tf.control_dependencies([made["a"]]):
            made["ordered"] = tf.constant(0.9)
        return made["a"]
    graph = traced(fn)
    assert made["a"] is made["b"] and made["shape"] is made["shape_again"]
    distinct = [made["a"], made["shape"], *made["others"], made["float64"], made["ordered"]]
    assert len({id(t) for t in distinct}) == len(distinct) == len(constants(graph))
    assert made["ordered"].op.control_inputs == [made["a"].op]
    np.testing.assert_array_equal([tf.get_static_value(t) for t in made["others"]],
                                  [-0.0, 0.0, 1, 1.0, True])
    assert np.signbit(tf.get_static_value(made["others"][0]))


def test_outside_the_block_and_in_another_graph_each_use_makes_its_own():
    def fn():
        return tf.constant(0.5) + tf.constant(0.5)
    assert len(constants(traced(fn, interned=False))) == 2
    assert len(constants(traced(fn))) == 1

    made = []

    def with_a_branch():
        x = tf.constant(0.5)
        made.append(x)

        def doubled():
            made.append(tf.constant(0.5))
            return x * made[-1]
        return tf.cond(x > 0, doubled, lambda: x)
    graph = traced(with_a_branch)
    outer, inner = made
    assert outer.graph is graph and inner.graph is not graph


def test_each_device_scope_keeps_its_own():
    made = []

    def fn():
        for device in ("/cpu:0", "/cpu:0", None):
            with tf.device(device):
                made.append(tf.constant(0.25))
        return made[0]
    traced(fn)
    assert made[0] is made[1] and made[2] is not made[0]


def test_adams_update_of_many_weights_holds_each_hyperparameter_once():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    optimizer = keras.optimizers.Adam(beta_1=0.85)
    optimizer.build(model.trainable_variables)

    def step():
        grads = [tf.ones_like(v) for v in model.trainable_variables]
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return tf.constant(0)

    def betas(graph):
        return [op for op in constants(graph)
                if np.isclose(tf.make_ndarray(op.get_attr("value")), 0.85).all()]
    assert len(betas(traced(step, interned=False))) == 4
    assert len(betas(traced(step))) == 1
