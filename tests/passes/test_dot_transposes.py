"""fold_dot_transposes: attention's transposes around batched dots become
dimension numbers of the dots, with the same values (to float rounding), and
stay where folding would change the result's order or lose the GEMM."""
import numpy as np
import pytest
import tensorflow as tf

from kerasjit.frontend.bridge import hlo_module
from kerasjit.hlo import parse_module
from kerasjit.hlo.evaluator import evaluate
from kerasjit.passes import Pipeline, dce, fold_dot_transposes, optimize
from tests.support.hlo_args import random_args
from tests.support.hlo_text import hlo


def _opcodes(module):
    return [i.opcode for c in module.computations for i in c.instructions]


def _folded(text):
    """The module after the pass (verified), checked against the original
    on random inputs; its opcodes."""
    before = parse_module(text)
    after = Pipeline([fold_dot_transposes, dce], debug=True)(parse_module(text))
    args = [np.nan_to_num(a) for a in random_args(before)]
    for want, got in zip(evaluate(before, args), evaluate(after, args)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    return after, _opcodes(after)


# Attention's scores: q [b, h, t, d] . k [b, h, s, d] -> [b, h, t, s], which TF
# computes as keys x queries and transposes.
_SCORES = """
  %q = f32[2,3,5,4] parameter(0)
  %k = f32[2,3,6,4] parameter(1)
  %d = f32[2,3,6,5] dot(f32[2,3,6,4] %k, f32[2,3,5,4] %q), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,1}, rhs_contracting_dims={3}
  ROOT %t = f32[2,3,5,6] transpose(f32[2,3,6,5] %d), dimensions={0,1,3,2}"""


def test_a_transposed_batched_dot_becomes_the_dot_of_its_swapped_operands():
    after, ops = _folded(hlo(_SCORES))
    assert ops.count("transpose") == 0 and ops.count("dot") == 1
    dot = after.entry.root
    assert [p.name for p in dot.operands] == ["q", "k"]


def test_a_dot_read_by_others_too_keeps_its_transpose():
    text = hlo(_SCORES.replace("ROOT %t = f32[2,3,5,6]", "%t = f32[2,3,5,6]") + """
  ROOT %out = (f32[2,3,5,6], f32[2,3,6,5]) tuple(%t, %d)""")
    _, ops = _folded(text)
    assert ops.count("transpose") == 1


def test_a_transposed_operand_is_read_in_place():
    """The gradient of the scores, transposed back before the dot with the keys."""
    _, ops = _folded(hlo("""
  %g = f32[2,3,6,5] parameter(0)
  %k = f32[2,3,6,4] parameter(1)
  %t = f32[2,3,5,6] transpose(f32[2,3,6,5] %g), dimensions={0,1,3,2}
  ROOT %d = f32[2,3,5,4] dot(f32[2,3,5,6] %t, f32[2,3,6,4] %k), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,1}, rhs_contracting_dims={2}"""))
    assert ops == ["parameter", "parameter", "dot"]


@pytest.mark.parametrize("body", [
    # the operand's free dims change order: [x, y] read as [y, x]
    """
  %a = f32[4,3,5] parameter(0)
  %b = f32[5,2] parameter(1)
  %t = f32[3,4,5] transpose(f32[4,3,5] %a), dimensions={1,0,2}
  ROOT %d = f32[3,4,2] dot(f32[3,4,5] %t, f32[5,2] %b), lhs_contracting_dims={2}, rhs_contracting_dims={0}""",
    # a transpose that moves a batch dim is no swap of the free dims
    """
  %a = f32[2,3,4] parameter(0)
  %b = f32[2,4,5] parameter(1)
  %d = f32[2,3,5] dot(f32[2,3,4] %a, f32[2,4,5] %b), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
  ROOT %t = f32[3,2,5] transpose(f32[2,3,5] %d), dimensions={1,0,2}"""])
def test_transposes_that_would_reorder_a_result_stay(body):
    _, ops = _folded(hlo(body))
    assert "transpose" in ops


def test_keras_attention_scores_fold_in_the_full_pipeline():
    """MultiHeadAttention's forward and backward pass: once optimised no dot
    reads a transpose and none is transposed between queries and keys (its
    heads' dims still move: [b, t, h, d] <-> [b, h, t, d] is no swap of a
    dot's free dims); the values are unchanged."""
    import keras
    keras.utils.set_random_seed(0)
    layer = keras.layers.MultiHeadAttention(2, 4)
    x = tf.random.normal((2, 5, 8))
    layer(x, x)

    def grads(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(tf.square(layer(x, x)))
        return y, tape.gradient(y, [x] + layer.trainable_variables)
    module = hlo_module(grads, x)
    before = [i for i in _opcodes(module)].count("transpose")
    after = optimize(hlo_module(grads, x))
    dots = [i for c in after.computations for i in c.instructions if i.opcode == "dot"]
    feeds = {op.opcode for d in dots for op in d.operands}
    users = [i for c in after.computations for i in c.instructions
             if i.opcode == "transpose" and i.operands[0].opcode == "dot"
             and i.attrs["dimensions"] == (0, 1, 3, 2)]
    assert before > 0 and "transpose" not in feeds and not users
    args = [np.nan_to_num(a) for a in random_args(module)]
    for want, got in zip(evaluate(module, args), evaluate(after, args)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
