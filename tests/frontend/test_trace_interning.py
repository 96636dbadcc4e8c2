"""What kerasjit's trace makes once: constants, pure ops and variable reads
(frontend/trace_interning.py)."""
import keras
import numpy as np
import tensorflow as tf

from kerasjit.frontend.trace_interning import interned_trace


def traced(fn, interned=True):
    """The graph of fn() traced by tf.function, within interned_trace or not."""
    def body():
        if not interned:
            return fn()
        with interned_trace():
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


def ops_of(graph, op_type):
    return [op for op in graph.get_operations() if op.type == op_type]


def test_a_pure_op_made_again_with_the_same_inputs_is_the_first():
    made = {}

    def fn():
        x = tf.range(4.0)
        made["a"], made["b"] = tf.sin(x) * 2.0, tf.sin(x) * 2.0
        made["other_attrs"] = tf.cast(x, tf.float64), tf.cast(x, tf.float16)
        made["other_input"] = tf.sin(x + 1.0)
        with tf.control_dependencies([made["a"]]):
            made["ordered"] = tf.sin(x)
        with tf.GradientTape() as tape:     # a tape keeps an entry per op made
            tape.watch(x)
            made["taped"] = tf.sin(x), tf.sin(x)
        return made["a"]
    graph = traced(fn)
    assert made["a"] is made["b"]
    assert made["other_attrs"][0] is not made["other_attrs"][1]
    assert made["ordered"] is not made["other_input"]
    assert made["taped"][0] is not made["taped"][1]
    assert len(ops_of(graph, "Sin")) == 5   # a and b, x + 1, the ordered one, two taped


def test_a_traced_pure_op_shared_computes_what_each_would():
    x = tf.Variable([0.5, -1.0, 2.0])

    @tf.function(autograph=False)
    def fn():
        with interned_trace():
            with tf.GradientTape() as tape:
                y = tf.reduce_sum(tf.sin(x) * tf.sin(x))
            g = tape.gradient(y, x)
            return g, tf.exp(g) + tf.exp(g)
    g, z = fn()
    np.testing.assert_allclose(g, 2 * np.sin(x.numpy()) * np.cos(x.numpy()), rtol=1e-6)
    np.testing.assert_allclose(z, 2 * np.exp(g.numpy()), rtol=1e-6)


def test_a_variable_is_read_again_only_after_an_op_that_takes_it():
    v = tf.Variable(1.0)
    made = {}

    @tf.function(autograph=False)
    def writes_it():
        v.assign_add(10.0)
        return tf.constant(0)

    def fn():
        made["first"], made["again"] = v.read_value(), v + 0.0
        v.assign_add(1.0)
        made["after_write"] = v + 0.0
        writes_it()                         # a call that may write: it takes v's handle
        made["after_call"] = v + 0.0
        made["still"] = v + 0.0
        return made["first"], made["again"], made["after_write"], made["after_call"], made["still"]
    graph = traced(fn)
    reads = ops_of(graph, "ReadVariableOp")
    assert len(reads) == 3
    assert made["after_call"] is made["still"]
    first, again, after_write, after_call, still = tf.function(lambda: _run_interned(fn))()
    assert (float(first), float(again), float(after_write), float(after_call), float(still)) \
        == (1.0, 1.0, 2.0, 12.0, 12.0)


def _run_interned(fn):
    with interned_trace():
        return fn()


def test_adams_step_count_chain_is_made_once_for_all_weights_and_updates_alike():
    def model_and_optimizer():
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                                  keras.layers.Dense(2)])
        optimizer = keras.optimizers.Adam(0.1)
        optimizer.build(model.trainable_variables)
        return model, optimizer

    def updated(interned):
        model, optimizer = model_and_optimizer()

        def step():
            grads = [tf.cos(v) for v in model.trainable_variables]
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return tf.constant(0)
        graph = traced(step, interned)
        run = tf.function(lambda: _run_interned(step) if interned else step(),
                          autograph=False)
        for _ in range(3):
            run()
        return len(ops_of(graph, "Pow")), [v.numpy() for v in model.trainable_variables]
    (pows, interned), (pows_plain, plain) = updated(True), updated(False)
    assert (pows, pows_plain) == (2, 8)     # beta_1 and beta_2 to the step's power
    for a, b in zip(interned, plain):
        np.testing.assert_array_equal(a, b)
