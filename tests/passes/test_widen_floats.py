"""widen_floats: every instruction that computes on f16 or bf16 computes on
f32 between converts, so each op's result is rounded as TensorFlow rounds it."""
import ml_dtypes
import numpy as np
import pytest

from kerasjit.hlo import parse_module
from kerasjit.hlo.evaluator import evaluate
from kerasjit.passes import Pipeline, dce, widen_floats
from tests.support.hlo_text import hlo

NARROW_SUM = """%nsum (nsum.a: {t}[], nsum.b: {t}[]) -> {t}[] {{
  %nsum.a = {t}[] parameter(0)
  %nsum.b = {t}[] parameter(1)
  ROOT %nsum.s = {t}[] add(%nsum.a, %nsum.b)
}}"""

BODY = """  %x = {t}[4,3] parameter(0)
  %y = {t}[3,2] parameter(1)
  %e = {t}[4,3] exponential(%x)
  %m = {t}[4,3] multiply(%e, %x)
  %d = {t}[4,2] dot(%m, %y), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  %zero = {t}[] constant(0)
  %r = {t}[4] reduce(%m, %zero), dimensions={{1}}, to_apply=%nsum
  %t = {t}[3,4] transpose(%m), dimensions={{1,0}}
  %p = pred[4,3] compare(%x, %e), direction=LT
  ROOT %o = ({t}[4,2], {t}[4], {t}[3,4], pred[4,3]) tuple(%d, %r, %t, %p)"""

NUMPY = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}


@pytest.mark.parametrize("t", ["f16", "bf16"])
def test_only_data_movement_and_converts_stay_16_bit(t):
    text = hlo(BODY.format(t=t), NARROW_SUM.format(t=t))
    module = Pipeline([widen_floats, dce], debug=True)(parse_module(text))
    for comp in module.computations:
        for inst in comp.instructions:
            narrow = inst.shape.is_tuple or inst.shape.dtype == t or any(
                not op.shape.is_tuple and op.shape.dtype == t for op in inst.operands)
            if narrow:
                assert inst.opcode in ("parameter", "constant", "convert", "transpose",
                                       "tuple"), inst
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(NUMPY[t]) for s in [(4, 3), (3, 2)]]
    before, after = evaluate(parse_module(text), args), evaluate(module, args)
    # Elementwise results are rounded per op as before; the dot and the sum
    # now accumulate in f32 (as XLA's do): within a 16-bit rounding of each.
    for b, a in zip(before, after):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32),
                                   rtol=1e-2 if t == "bf16" else 2e-3, atol=1e-2)
    np.testing.assert_array_equal(after[2], before[2])
    np.testing.assert_array_equal(after[3], before[3])
