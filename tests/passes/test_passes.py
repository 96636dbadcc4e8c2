"""HLO passes, in XLA's FileCheck style: HLO text in, pass, printed text out.

Every case also checks semantics: the reference evaluator gives bit-identical
results before and after (our passes never reassociate floats, and the inputs
include -0.0, inf and NaN, which is where a wrong identity shows); the one
exception, fold_batch_sums, is checked to float tolerance.
"""
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from kerasjit import workloads
from kerasjit.frontend.bridge import hlo_module, literals_from_proto
from kerasjit.hlo import Instruction, parse_module, print_module, verify
from kerasjit.hlo.evaluator import evaluate
from kerasjit.passes import (DEFAULT_PASSES, PassError, Pipeline, conditional_to_select,
                             configured_passes, constant_folding, cse, dce, fold_batch_sums,
                             inline_calls, optimize, optimize_as_configured, replace_all_uses,
                             simplify)

from tests.support.hlo_args import random_args
from tests.support.hlo_text import hlo
from tests.support.loop_text import CALLS, INDEX_CONDITIONAL, PRED_CONDITIONAL


def assert_same(a, b):
    if isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
        return
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes(), f"{a} != {b}"


def instruction_count(module):
    return sum(len(c.instructions) for c in module.computations)


def opcodes(module):
    return [i.opcode for c in module.computations for i in c.instructions]


def run(text, passes, check=(), check_not=(), constants=None):
    """Apply `passes` (verified after each) and FileCheck the printed result:
    `check` regexes must match in order, `check_not` ones nowhere. Returns it."""
    before = parse_module(text, constants)
    after = Pipeline(passes, debug=True)(parse_module(text, constants))
    printed = print_module(after)
    position = 0
    for pattern in check:
        match = re.compile(pattern).search(printed, position)
        assert match, f"CHECK '{pattern}' not found after position {position} in:\n{printed}"
        position = match.end()
    for pattern in check_not:
        assert not re.search(pattern, printed), f"CHECK-NOT '{pattern}' in:\n{printed}"
    args = random_args(before)
    assert_same(evaluate(before, args), evaluate(after, args))
    return after


# ------------------------------------------------------------------ simplify

SIMPLIFY_CASES = {
    "reshape_same_shape": (r"""
  %p = f32[2,3] parameter(0)
  %r = f32[2,3] reshape(%p)
  ROOT %n = f32[2,3] negate(%r)""", [r"negate\(f32\[2,3\]\{1,0\} %p\)"], ["reshape"]),
    "reshape_of_reshape": (r"""
  %p = f32[2,3] parameter(0)
  %r1 = f32[6] reshape(%p)
  %r2 = f32[3,2] reshape(%r1)
  ROOT %n = f32[3,2] negate(%r2)""",
        [r"%(\S+) = f32\[3,2\]\{1,0\} reshape\(f32\[2,3\]\{1,0\} %p\)", r"negate"], ["%r1"]),
    "convert_same_type": (r"""
  %p = f32[4] parameter(0)
  %c = f32[4] convert(%p)
  ROOT %d = s32[4] convert(%c)""", [r"s32\[4\]\{0\} convert\(f32\[4\]\{0\} %p\)"], ["%c "]),
    "copy": (r"""
  %p = f32[4] parameter(0)
  %c = f32[4] copy(%p)
  ROOT %n = f32[4] negate(%c)""", [r"negate\(f32\[4\]\{0\} %p\)"], ["copy"]),
    "transpose_identity": (r"""
  %p = f32[2,3] parameter(0)
  %t = f32[2,3] transpose(%p), dimensions={0,1}
  ROOT %n = f32[2,3] negate(%t)""", [r"negate\(f32\[2,3\]\{1,0\} %p\)"], ["transpose"]),
    "transpose_of_transpose": (r"""
  %p = f32[2,3,4] parameter(0)
  %t1 = f32[3,2,4] transpose(%p), dimensions={1,0,2}
  %t2 = f32[3,4,2] transpose(%t1), dimensions={0,2,1}
  ROOT %n = f32[3,4,2] negate(%t2)""",
        [r"f32\[3,4,2\]\{2,1,0\} transpose\(f32\[2,3,4\]\{2,1,0\} %p\), dimensions=\{1,2,0\}"],
        ["%t1", "%t2"]),
    "transpose_of_transpose_cancels": (r"""
  %p = f32[2,3,4] parameter(0)
  %t1 = f32[3,4,2] transpose(%p), dimensions={1,2,0}
  %t2 = f32[2,3,4] transpose(%t1), dimensions={2,0,1}
  ROOT %n = f32[2,3,4] negate(%t2)""", [r"negate\(f32\[2,3,4\]\{2,1,0\} %p\)"], ["transpose"]),
    "broadcast_of_scalar_broadcast": (r"""
  %s = f32[] parameter(0)
  %b1 = f32[3] broadcast(%s), dimensions={}
  %b2 = f32[2,3] broadcast(%b1), dimensions={1}
  ROOT %t = (f32[2,3]) tuple(%b2)""",
        [r"f32\[2,3\]\{1,0\} broadcast\(f32\[\] %s\), dimensions=\{\}"], ["%b1", "%b2"]),
    "broadcast_of_broadcast": (r"""
  %p = f32[3] parameter(0)
  %b1 = f32[3,4] broadcast(%p), dimensions={0}
  %b2 = f32[2,3,4] broadcast(%b1), dimensions={1,2}
  ROOT %n = f32[2,3,4] negate(%b2)""",
        [r"f32\[2,3,4\]\{2,1,0\} broadcast\(f32\[3\]\{0\} %p\), dimensions=\{1\}"], ["%b1"]),
    "broadcast_identity": (r"""
  %p = f32[8,1] parameter(0)
  %b = f32[8,1] broadcast(%p), dimensions={0,1}
  ROOT %n = f32[8,1] negate(%b)""", [r"negate\(f32\[8,1\]\{1,0\} %p\)"], ["broadcast"]),
    "slice_whole": (r"""
  %p = f32[2,3] parameter(0)
  %all = f32[2,3] slice(%p), slice={[0:2], [0:3]}
  %part = f32[2,2] slice(%all), slice={[0:2], [1:3]}
  ROOT %t = (f32[2,3], f32[2,2]) tuple(%all, %part)""",
        [r"%part = f32\[2,2\]\{1,0\} slice\(f32\[2,3\]\{1,0\} %p\)",
         r"tuple\(f32\[2,3\]\{1,0\} %p"],
        ["%all"]),
    "get_tuple_element_of_tuple": (r"""
  %a = f32[2] parameter(0)
  %b = s32[] parameter(1)
  %t = (f32[2], s32[]) tuple(%a, %b)
  %g = s32[] get-tuple-element(%t), index=1
  ROOT %n = s32[] negate(%g)""", [r"negate\(s32\[\] %b\)"], ["get-tuple-element", "tuple"]),
    "concatenate_one": (r"""
  %p = f32[2,3] parameter(0)
  %c = f32[2,3] concatenate(%p), dimensions={0}
  ROOT %n = f32[2,3] negate(%c)""", [r"negate\(f32\[2,3\]\{1,0\} %p\)"], ["concatenate"]),
    "multiply_by_one": (r"""
  %p = f32[4] parameter(0)
  %q = s32[4] parameter(1)
  %one = f32[] constant(1)
  %ones = f32[4] broadcast(%one), dimensions={}
  %m = f32[4] multiply(%ones, %p)
  %i1 = s32[4] constant({1, 1, 1, 1})
  %mi = s32[4] multiply(%q, %i1)
  ROOT %t = (f32[4], s32[4]) tuple(%m, %mi)""",
        [r"tuple\(f32\[4\]\{0\} %p, s32\[4\]\{0\} %q\)"], ["multiply"]),
    # x + 0.0 maps -0.0 to +0.0 and x - (-0.0) is x + 0.0: both must stay.
    "additive_zeros": (r"""
  %x = f32[4] parameter(0)
  %i = s32[4] parameter(1)
  %pz = f32[] constant(0)
  %nz = f32[] constant(-0)
  %pzs = f32[4] broadcast(%pz), dimensions={}
  %nzs = f32[4] broadcast(%nz), dimensions={}
  %iz = s32[4] constant({0, 0, 0, 0})
  %keep_add = f32[4] add(%x, %pzs)
  %drop_add = f32[4] add(%nzs, %x)
  %drop_sub = f32[4] subtract(%x, %pzs)
  %keep_sub = f32[4] subtract(%x, %nzs)
  %drop_iadd = s32[4] add(%i, %iz)
  %drop_isub = s32[4] subtract(%i, %iz)
  %keep_izsub = s32[4] subtract(%iz, %i)
  ROOT %t = (f32[4], f32[4], f32[4], f32[4], s32[4], s32[4], s32[4])
      tuple(%keep_add, %drop_add, %drop_sub, %keep_sub, %drop_iadd, %drop_isub, %keep_izsub)""",
        [r"%keep_add = .* add", r"%keep_sub = .* subtract", r"%keep_izsub = .* subtract",
         r"tuple\(f32\[4\]\{0\} %keep_add, f32\[4\]\{0\} %x, f32\[4\]\{0\} %x, "
         r"f32\[4\]\{0\} %keep_sub, s32\[4\]\{0\} %i, s32\[4\]\{0\} %i, "],
        ["%drop_"]),
    "select_constant_predicate": (r"""
  %x = f32[4] parameter(0)
  %y = f32[4] parameter(1)
  %t = pred[] constant(true)
  %ts = pred[4] broadcast(%t), dimensions={}
  %f = pred[4] constant({false, false, false, false})
  %a = f32[4] select(%ts, %x, %y)
  %b = f32[4] select(%f, %x, %y)
  %mixed = pred[4] constant({true, false, true, false})
  %c = f32[4] select(%mixed, %x, %y)
  ROOT %r = (f32[4], f32[4], f32[4]) tuple(%a, %b, %c)""",
        [r"%c = f32\[4\]\{0\} select",
         r"tuple\(f32\[4\]\{0\} %x, f32\[4\]\{0\} %y, f32\[4\]\{0\} %c\)"],
        ["%a =", "%b ="]),
    "reshape_of_scalar_broadcast": (r"""
  %s = f32[] parameter(0)
  %b = f32[8,1] broadcast(%s), dimensions={}
  %r = f32[8] reshape(%b)
  %t = f32[1,8] transpose(%b), dimensions={1,0}
  ROOT %o = (f32[8], f32[1,8]) tuple(%r, %t)""",
        [r"f32\[8\]\{0\} broadcast\(f32\[\] %s\), dimensions=\{\}",
         r"f32\[1,8\]\{1,0\} broadcast\(f32\[\] %s\), dimensions=\{\}"],
        ["reshape", "transpose"]),
    "elementwise_of_scalar_broadcasts": (r"""
  %s = f32[] parameter(0)
  %c = f32[] constant(2)
  %bs = f32[4,5] broadcast(%s), dimensions={}
  %bc = f32[4,5] broadcast(%c), dimensions={}
  %m = f32[4,5] multiply(%bs, %bc)
  ROOT %e = pred[4,5] compare(%m, %bc), direction=GT""",
        [r"f32\[\] multiply\(f32\[\] %s, f32\[\] %c\)", r"pred\[\] compare",
         r"pred\[4,5\]\{1,0\} broadcast\(pred\[\] %\S+\), dimensions=\{\}"],
        [r"f32\[4,5\]"]),
    # The static size (EnsureShape, top_k) changes nothing.
    "set_dimension_size_to_its_size": (r"""
  %x = f32[4,16] parameter(0)
  %sixteen = s32[] constant(16)
  %same = f32[4,16] set-dimension-size(%x, %sixteen), dimensions={1}
  ROOT %n = f32[4,16] negate(%same)""", [r"negate\(f32\[4,16\]\{1,0\} %x\)"],
        ["set-dimension-size"]),
    # A gradient added into one step's slot of a list touches that slot only.
    "add_into_window": (r"""
  %x = f32[5,3] parameter(0)
  %u = f32[1,3] parameter(1)
  %i = s32[] parameter(2)
  %zero = f32[] constant(0)
  %zeros = f32[5,3] broadcast(%zero), dimensions={}
  %z = s32[] constant(0)
  %slot = f32[5,3] dynamic-update-slice(%zeros, %u, %i, %z)
  ROOT %sum = f32[5,3] add(%x, %slot)""",
        [r"dynamic-slice\(f32\[5,3\]\{1,0\} %x", r"add\(f32\[1,3\]",
         r"ROOT \S+ = f32\[5,3\]\{1,0\} dynamic-update-slice\(f32\[5,3\]\{1,0\} %x"],
        [r"f32\[5,3\]\{1,0\} add", "broadcast"]),
    # A square is a multiply (as exact as pow); other exponents stay pow.
    "power_two_is_a_square": (r"""
  %x = f32[6] parameter(0)
  %two = f32[] constant(2)
  %half = f32[] constant(2.5)
  %b2 = f32[6] broadcast(%two), dimensions={}
  %b3 = f32[6] broadcast(%half), dimensions={}
  %p = f32[6] power(%x, %b2)
  %q = f32[6] power(%x, %b3)
  ROOT %o = (f32[6], f32[6]) tuple(%p, %q)""",
        [r"multiply\(f32\[6\]\{0\} %x, f32\[6\]\{0\} %x\)", r"power"], []),
    # The root is replaced by the parameter: same shape, same parameter list.
    "root_copy_of_parameter": (r"""
  %p = f32[4] parameter(0)
  %unused = s32[] parameter(1)
  ROOT %c = f32[4] copy(%p)""", [r"ROOT %p = f32\[4\]\{0\} parameter\(0\)", r"%unused"], ["copy"]),
}


@pytest.mark.parametrize("case", list(SIMPLIFY_CASES))
def test_simplify(case):
    body, check, check_not = SIMPLIFY_CASES[case]
    run(hlo(body), [simplify, dce], check, check_not)


@pytest.mark.parametrize("n", [3, 4])
def test_small_integer_powers_become_multiplies_within_two_ulps(n):
    """x^3 (tanh-approximated gelu's) as multiplies: two roundings, where pow's
    own result is within an ulp."""
    text = hlo(f"""
  %x = f32[4096] parameter(0)
  %n = f32[] constant({n})
  %b = f32[4096] broadcast(%n), dimensions={{}}
  ROOT %p = f32[4096] power(%x, %b)""")
    after = Pipeline([simplify, dce], debug=True)(parse_module(text))
    assert opcodes(after).count("multiply") == 2 and "power" not in opcodes(after)
    x = np.random.default_rng(n).standard_normal(4096).astype(np.float32) * 30
    x[:4] = [0.0, -0.0, np.inf, -np.inf]
    got, want = evaluate(after, [x]), evaluate(parse_module(text), [x])
    np.testing.assert_array_equal(got[:4], want[:4])
    assert (np.abs(got[4:] - want[4:]) <= 2 * np.spacing(np.abs(want[4:]))).all()


def test_inline_calls_replaces_every_call_by_its_callee():
    after = run(CALLS, [inline_calls, dce], [r"add\(f32\[3\]\{0\} %x, f32\[3\]\{0\} %x\)",
                                              r"multiply", r"ROOT .* add"], ["call"])
    assert len(after.computations) == 1


@pytest.mark.parametrize("text, args", [
    (PRED_CONDITIONAL, [[np.bool_(True)], [np.bool_(False)]]),
    (INDEX_CONDITIONAL, [[np.int32(k)] for k in (0, 1, 2, 5, -1)])], ids=["pred", "index"])
def test_conditional_to_select_runs_every_branch_and_picks_one(text, args):
    x = np.array([1, -2, 3], np.float32)
    after = Pipeline([conditional_to_select, dce], debug=True)(parse_module(text))
    assert "conditional" not in print_module(after) and len(after.computations) == 1
    for selector in args:
        np.testing.assert_array_equal(evaluate(after, selector + [x]),
                                      evaluate(parse_module(text), selector + [x]))


def test_simplify_keeps_signature_and_alias():
    text = ("HloModule m, input_output_alias={ {0}: (0, {}, may-alias) }\n\nENTRY %main {\n"
            "  %p = f32[4] parameter(0)\n  %q = f32[4] parameter(1)\n"
            "  %r = f32[4] reshape(%p)\n  %c = f32[4] copy(%r)\n"
            "  ROOT %t = (f32[4], f32[4]) tuple(%c, %c)\n}\n")
    after = run(text, [simplify, dce], [r"tuple\(f32\[4\]\{0\} %p, f32\[4\]\{0\} %p\)"])
    assert [p.name for p in after.entry.parameters] == ["p", "q"]
    assert after.input_output_alias == {(0,): (0, ())}


def test_simplify_rewrites_called_computations():
    callees = """%region (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  %c = f32[] copy(%b)
  ROOT %s = f32[] add(%a, %c)
}"""
    body = """  %p = f32[3,4] parameter(0)
  %z = f32[] constant(0)
  ROOT %r = f32[3] reduce(%p, %z), dimensions={1}, to_apply=%region"""
    run(hlo(body, callees), [simplify], [r"ROOT %s = f32\[\] add\(f32\[\] %a, f32\[\] %b\)"],
        ["copy"])


# --------------------------------------------------------- constant folding

def test_fold_scalar_chain():
    body = """  %p = s32[] parameter(0)
  %a = s32[] constant(3)
  %b = s32[] constant(4)
  %m = s32[] multiply(%a, %b)
  %n = s32[] negate(%m)
  ROOT %r = s32[] add(%p, %n)"""
    run(hlo(body), [constant_folding, dce],
        [r"%n = s32\[\] constant\(-12\)", r"add\(s32\[\] %p, s32\[\] %n\)"],
        ["multiply", "negate", "%a ", "%b "])


def test_fold_arrays_and_called_computations():
    callees = """%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}"""
    body = """  %c = f32[2,2] constant({ {1, 2}, {3, 4.5} })
  %r = f32[4] reshape(%c)
  %z = f32[] constant(0)
  %total = f32[] reduce(%c, %z), dimensions={0,1}, to_apply=%sum
  %third = f32[] constant(3)
  %d = f32[] divide(%total, %third)
  ROOT %t = (f32[4], f32[]) tuple(%r, %d)"""
    after = run(hlo(body, callees), [constant_folding, dce],
                [r"%r = f32\[4\]\{0\} constant\(\{1.0, 2.0, 3.0, 4.5\}\)",
                 r"%d = f32\[\] constant\(3.5\)"],
                ["reshape", "reduce", "divide", "%sum"])
    assert len(after.computations) == 1


def test_fold_keeps_broadcast_iota_rng_and_big_results():
    body = """  %c = s32[] constant(7)
  %b = s32[4] broadcast(%c), dimensions={}
  %i = s32[4] iota(), iota_dimension=0
  %sum = s32[4] add(%b, %i)
  %state = u64[2] constant({1, 2})
  %rng = (u64[2], u32[4]) rng-bit-generator(%state), algorithm=rng_three_fry
  %bits = u32[4] get-tuple-element(%rng), index=1
  %big = f32[70000] constant({...})
  %neg = f32[70000] negate(%big)
  %head = f32[2] slice(%big), slice={[0:2]}
  ROOT %t = (s32[4], u32[4], f32[70000], f32[2]) tuple(%sum, %bits, %neg, %head)"""
    big = np.arange(70000, dtype=np.float32)
    run(hlo(body), [constant_folding], [r"broadcast", r"iota", r"%sum = s32\[4\]\{0\} add",
                                         r"rng-bit-generator", r"%neg = f32\[70000\]\{0\} negate",
                                         r"%head = f32\[2\]\{0\} constant\(\{0.0, 1.0\}\)"],
        constants={"big": big})


# ----------------------------------------------------------------------- CSE

def test_cse_merges_identical_instructions_and_constants():
    body = """  %p = f32[4] parameter(0)
  %q = f32[4] parameter(1)
  %a1 = f32[4] add(%p, %q), metadata={op_name="first"}
  %a2 = f32[4] add(%p, %q), metadata={op_name="second"}
  %swapped = f32[4] add(%q, %p)
  %one1 = f32[] constant(1)
  %one2 = f32[] constant(1)
  %ione = s32[] constant(1)
  %pz = f32[] constant(0)
  %nz = f32[] constant(-0)
  %lt = pred[4] compare(%p, %q), direction=LT
  %gt = pred[4] compare(%p, %q), direction=GT
  ROOT %t = (f32[4], f32[4], f32[4], f32[], f32[], s32[], f32[], f32[], pred[4], pred[4])
      tuple(%a1, %a2, %swapped, %one1, %one2, %ione, %pz, %nz, %lt, %gt)"""
    after = run(hlo(body), [cse, dce],
                [r"tuple\(f32\[4\]\{0\} %a1, f32\[4\]\{0\} %a1, f32\[4\]\{0\} %swapped, "
                 r"f32\[\] %one1, f32\[\] %one1, s32\[\] %ione, f32\[\] %pz, f32\[\] %nz, "
                 r"pred\[4\]\{0\} %lt, pred\[4\]\{0\} %gt\)"], ["%a2", "%one2"])
    assert opcodes(after).count("parameter") == 2


def test_cse_merges_identical_called_computations():
    callees = "\n\n".join(f"""%add{n} (a{n}: f32[], b{n}: f32[]) -> f32[] {{
  %a{n} = f32[] parameter(0)
  %b{n} = f32[] parameter(1)
  %x{n} = f32[] add(%a{n}, %b{n})
  %y{n} = f32[] add(%a{n}, %b{n})
  ROOT %s{n} = f32[] multiply(%x{n}, %y{n})
}}""" for n in (1, 2))
    body = """  %p = f32[3,4] parameter(0)
  %z = f32[] constant(0)
  %r1 = f32[3] reduce(%p, %z), dimensions={1}, to_apply=%add1
  %r2 = f32[3] reduce(%p, %z), dimensions={1}, to_apply=%add2
  ROOT %t = (f32[3], f32[3]) tuple(%r1, %r2)"""
    after = run(hlo(body, callees), [cse, dce],
                [r"ROOT %s1 = f32\[\] multiply\(f32\[\] %x1, f32\[\] %x1\)",
                 r"tuple\(f32\[3\]\{0\} %r1, f32\[3\]\{0\} %r1\)"], ["%add2", "%y1"])
    assert [c.name for c in after.computations] == ["add1", "main"]


# ----------------------------------------------------------------------- DCE

def test_dce_removes_dead_code_and_computations_keeps_parameters():
    callees = """%max (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  %dead_in_callee = f32[] add(%a, %b)
  ROOT %m = f32[] maximum(%a, %b)
}"""
    body = """  %p = f32[3,4] parameter(0)
  %unused = f32[2] parameter(1)
  %z = f32[] constant(0)
  %dead_reduce = f32[3] reduce(%p, %z), dimensions={1}, to_apply=%max
  %dead = f32[3,4] exponential(%p)
  ROOT %n = f32[3,4] negate(%p)"""
    after = run(hlo(body, callees), [dce], [r"%unused = f32\[2\]\{0\} parameter\(1\)", r"ROOT %n"],
                ["%dead", "%max", "%z"])
    assert [c.name for c in after.computations] == ["main"]


# ----------------------------------------------------------- replace_all_uses

def test_replace_all_uses_keeps_def_before_use_order():
    module = parse_module(hlo("""  %p = f32[4] parameter(0)
  %a = f32[4] add(%p, %p)
  %b = f32[4] multiply(%a, %a)
  %c = f32[4] negate(%p)
  ROOT %t = (f32[4], f32[4]) tuple(%b, %a)"""))
    comp = module.entry
    a, c = (i for i in comp.instructions if i.name in ("a", "c"))
    replace_all_uses(comp, a, c)
    names = [i.name for i in comp.instructions]
    assert names.index("c") < names.index("b")
    verify(module)
    root = Instruction("root2", "tuple", comp.root.shape, list(comp.root.operands))
    old_root = comp.root
    replace_all_uses(comp, old_root, root)      # a new instruction: inserted before the old
    assert comp.root is root and comp.instructions[-2:] == [root, old_root]
    assert old_root not in dce(verify(module)).entry.instructions
    b = next(i for i in comp.instructions if i.name == "b")
    exp_b = Instruction("exp_b", "exponential", b.shape, [b])
    replace_all_uses(comp, b, exp_b)            # x -> f(x): f keeps x as its operand
    assert exp_b.operands == [b] and root.operands[0] is exp_b
    x = np.array([1, -2, 3, -0.0], np.float32)
    out = evaluate(module, [x])
    assert_same(out, (np.exp(np.negative(x) * np.negative(x)), np.negative(x)))


# ------------------------------------------------------------------ pipeline

PIPELINE_TEXT = hlo("""  %p = f32[2,3] parameter(0)
  %r = f32[2,3] reshape(%p)
  %one = f32[] constant(1)
  %two = f32[] constant(2)
  %three = f32[] add(%one, %two)
  %b = f32[2,3] broadcast(%three), dimensions={}
  %m1 = f32[2,3] multiply(%r, %b)
  %m2 = f32[2,3] multiply(%p, %b)
  ROOT %t = (f32[2,3], f32[2,3]) tuple(%m1, %m2)""")


def test_debug_pipeline_names_the_pass_that_broke_the_module():
    def broken_order(module):
        module.entry.instructions.reverse()
        return module

    def broken_signature(module):
        module.entry.root = module.entry.root.operands[0]
        return module

    with pytest.raises(PassError, match="pass 'broken_order' broke the module"):
        Pipeline([simplify, broken_order], debug=True)(parse_module(PIPELINE_TEXT))
    with pytest.raises(PassError, match="'broken_signature' broke the module: it changed"):
        Pipeline([simplify, broken_signature], debug=True)(parse_module(PIPELINE_TEXT))
    Pipeline([broken_order])(parse_module(PIPELINE_TEXT))     # not checked outside debug


def test_dump_to_directory_and_callback(tmp_path):
    result = Pipeline(DEFAULT_PASSES, dump_dir=str(tmp_path), dump_after={"cse"})(
        parse_module(PIPELINE_TEXT))
    cse_file = f"{[p.__name__ for p in DEFAULT_PASSES].index('cse'):02d}-cse.hlo"
    assert sorted(p.name for p in tmp_path.iterdir()) == [cse_file]
    dumped = parse_module((tmp_path / cse_file).read_text())
    assert opcodes(dumped).count("multiply") == 1         # the two multiplies merged
    seen = []
    optimize(parse_module(PIPELINE_TEXT), dump_dir=lambda name, text: seen.append((name, text)))
    names = [name for name, _ in seen]
    assert names[:len(DEFAULT_PASSES)] == [p.__name__ for p in DEFAULT_PASSES]
    assert len(names) % len(DEFAULT_PASSES) == 0
    assert seen[-1][1] == print_module(result)


def test_skipped_passes_do_not_run_and_a_misspelt_one_is_named(monkeypatch):
    assert opcodes(optimize_as_configured(parse_module(PIPELINE_TEXT))).count("multiply") == 1
    monkeypatch.setenv("KERASJIT_SKIP_PASSES", "cse, dce")
    assert [p.__name__ for p in configured_passes()] == [
        p.__name__ for p in DEFAULT_PASSES if p not in (cse, dce)]
    assert opcodes(optimize_as_configured(parse_module(PIPELINE_TEXT))).count("multiply") == 2
    monkeypatch.setenv("KERASJIT_SKIP_PASSES", "cse,window_dim_last")
    with pytest.raises(ValueError, match="names no pass window_dim_last; the passes: "
                                         "inline_calls, .*window_dims_last"):
        configured_passes()


def test_optimize_reaches_a_fixed_point():
    module = run(PIPELINE_TEXT, [optimize],
                 [r"%three = f32\[\] constant\(3.0\)", r"multiply\(f32\[2,3\]\{1,0\} %p"],
                 ["reshape", "add", "%m2"])
    text = print_module(module)
    assert print_module(optimize(module)) == text


# ---------------------------------------------------------- fold_batch_sums

_ADD = """%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}
%max (u: f32[], v: f32[]) -> f32[] {
  %u = f32[] parameter(0)
  %v = f32[] parameter(1)
  ROOT %m = f32[] maximum(f32[] %u, f32[] %v)
}"""
# A Dense kernel's gradient on a sequence: batched over examples, then summed.
_BATCH_SUM = """
  %x = f32[4,5,3] parameter(0)
  %g = f32[4,5,2] parameter(1)
  %zero = f32[] constant({zero})
  %d = f32[4,3,2] dot(f32[4,5,3] %x, f32[4,5,2] %g), lhs_batch_dims={{0}}, lhs_contracting_dims={{1}}, rhs_batch_dims={{0}}, rhs_contracting_dims={{1}}
  %r = f32[{kept}] reduce(f32[4,3,2] %d, f32[] %zero), dimensions={{{dims}}}, to_apply=%{fn}
  ROOT %t = ({root}) tuple({outs})"""


def _batch_sum(zero="0", fn="add", dims="0", kept="3,2", also_dot=False):
    root, outs = f"f32[{kept}]", f"f32[{kept}] %r"
    if also_dot:
        root, outs = root + ", f32[4,3,2]", outs + ", f32[4,3,2] %d"
    return hlo(_BATCH_SUM.format(zero=zero, fn=fn, dims=dims, kept=kept, root=root,
                                 outs=outs), _ADD)


def test_sum_of_a_batched_dot_becomes_one_dot():
    text = _batch_sum()
    after = Pipeline([fold_batch_sums, dce], debug=True)(parse_module(text))
    root = after.entry.root.operands[0]
    assert "reduce" not in opcodes(after) and root.opcode == "dot"
    assert tuple(root.attrs["lhs_contracting_dims"]) == (0, 1) and "lhs_batch_dims" not in root.attrs
    args = random_args(parse_module(text))
    args = [np.nan_to_num(a) for a in args]
    np.testing.assert_allclose(evaluate(after, args)[0], evaluate(parse_module(text), args)[0],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", [
    {"zero": "1"},                          # not a sum from zero
    {"fn": "max"},                          # not a sum
    {"dims": "1", "kept": "4,2"},           # over a free dim
    {"also_dot": True}])                    # the batched dot is needed anyway
def test_other_reductions_of_dots_stay(variant):
    after = Pipeline([fold_batch_sums, dce], debug=True)(parse_module(_batch_sum(**variant)))
    assert "reduce" in opcodes(after)


def test_sums_left_where_the_folded_dot_is_no_gemm():
    """The examples' dim outermost in x but innermost in g: contracting it with
    the time dim would read neither operand as a matrix."""
    text = hlo("""
  %x = f32[4,5,3] parameter(0)
  %g = f32[5,2,4] parameter(1)
  %zero = f32[] constant(0)
  %d = f32[4,3,2] dot(f32[4,5,3] %x, f32[5,2,4] %g), lhs_batch_dims={0}, lhs_contracting_dims={1}, rhs_batch_dims={2}, rhs_contracting_dims={0}
  ROOT %r = f32[3,2] reduce(f32[4,3,2] %d, f32[] %zero), dimensions={0}, to_apply=%add""",
               _ADD)
    after = Pipeline([fold_batch_sums, dce], debug=True)(parse_module(text))
    assert "reduce" in opcodes(after)


# ------------------------------------------------- random graphs, all passes

_NOISE = {
    "copy": ["copy({x})"],
    "convert": ["convert({x})"],
    "reshape": ["reshape({x})", "reshape({x})"],         # f32[2,3] -> f32[2,3]
    "transpose": ["transpose({x}), dimensions={{1,0}}", "transpose({x}), dimensions={{1,0}}"],
}
_STEP = st.one_of(
    st.tuples(st.just("op"), st.sampled_from(["add", "subtract", "multiply", "maximum"]),
              st.integers(0, 99), st.integers(0, 99)),
    st.tuples(st.just("const"), st.sampled_from(["0", "-0", "1", "2"])),
    st.tuples(st.just("noise"), st.sampled_from(sorted(_NOISE)), st.integers(0, 99)),
    st.tuples(st.just("select"), st.sampled_from(["true", "false"]), st.integers(0, 99),
              st.integers(0, 99)))


@settings(max_examples=60, deadline=None)
@given(st.lists(_STEP, min_size=1, max_size=12))
def test_optimize_random_graphs_is_exact(steps):
    """Identities near signed zeros, folding, CSE: bit-exact on -0.0/inf/NaN inputs."""
    lines = ["  %p0 = f32[2,3] parameter(0)", "  %p1 = f32[2,3] parameter(1)"]
    values = ["%p0", "%p1"]

    def emit(rhs, shape="f32[2,3]"):
        name = f"%v{len(lines)}"
        lines.append(f"  {name} = {shape} {rhs}")
        return name

    def constant(value):
        return emit(f"broadcast({emit(f'constant({value})', 'f32[]')}), dimensions={{}}")
    values += [constant(v) for v in ("0", "-0", "1")]     # so that ops often meet them
    first_step = len(values)
    for kind, *rest in steps:
        pick = lambda i: values[i % len(values)]     # noqa: E731
        if kind == "op":
            values.append(emit(f"{rest[0]}({pick(rest[1])}, {pick(rest[2])})"))
        elif kind == "const":
            values.append(constant(rest[0]))
        elif kind == "noise":
            x = pick(rest[1])
            for i, rhs in enumerate(_NOISE[rest[0]]):
                x = emit(rhs.format(x=x), "f32[3,2]" if rest[0] == "transpose" and i == 0
                         else "f32[6]" if rest[0] == "reshape" and i == 0 else "f32[2,3]")
            values.append(x)
        else:
            pred = emit(f"constant({rest[0]})", "pred[]")
            mask = emit(f"broadcast({pred}), dimensions={{}}", "pred[2,3]")
            values.append(emit(f"select({mask}, {pick(rest[1])}, {pick(rest[2])})"))
    outputs = values[first_step:]
    lines.append(f"  ROOT %out = ({', '.join(['f32[2,3]'] * len(outputs))}) "
                 f"tuple({', '.join(outputs)})")
    text = hlo("\n".join(lines))
    after = run(text, [optimize], check_not=["copy", "transpose", "convert", "select"])
    assert instruction_count(after) <= instruction_count(parse_module(text))


# ----------------------------------------------------- real bridge output

def test_bridge_noise_of_a_small_function():
    module = hlo_module(lambda x: tf.reduce_sum(tf.reshape(x, [6]) * 2.0), tf.ones((2, 3)))
    text = print_module(module)
    after = optimize(module, debug=True)
    assert opcodes(after).count("reshape") == 1
    assert not {"convert", "tuple", "get-tuple-element"} & set(opcodes(after))
    assert after.entry.root.opcode == "reduce"
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert_same(evaluate(parse_module(text), [x]), evaluate(after, [x]))


@pytest.fixture(scope="module")
def mlp_train_step():
    """The bridge's HLO of a Keras MLP train step (Adam, Dropout) and its real inputs."""
    keras.utils.set_random_seed(0)
    model = workloads.mlp()
    x, y = workloads.classification_data(8, (784,), 10)
    step = tf.function(lambda x, y: model.train_step((x, y)), jit_compile=True)
    ir = step.experimental_get_compiler_ir(tf.constant(x), tf.constant(y))
    text, constants = ir(stage="hlo"), literals_from_proto(ir(stage="hlo_serialized"))
    concrete = step.get_concrete_function(tf.constant(x), tf.constant(y))
    by_handle = {id(v.handle): v for v in concrete.graph.variables}
    variables = [by_handle[id(h)].numpy() for h in concrete.captured_inputs]
    return text, constants, [x, y, *variables]


def test_optimize_mlp_train_step(mlp_train_step):
    text, constants, args = mlp_train_step
    before = parse_module(text, constants)
    after = optimize(parse_module(text, constants), debug=True)
    n_before, n_after = instruction_count(before), instruction_count(after)
    print(f"\nMLP train step: {n_before} -> {n_after} instructions "
          f"(entry {len(before.entry.instructions)} -> {len(after.entry.instructions)}, "
          f"{len(before.computations)} -> {len(after.computations)} computations)")
    assert n_after < 0.6 * n_before
    assert len(after.computations) < len(before.computations)
    assert not {"copy", "transpose"} & set(opcodes(after))   # all were identities
    assert all(i.operands[0].shape != i.shape for i in after.entry.instructions
               if i.opcode in ("reshape", "convert"))
    assert after.input_output_alias == before.input_output_alias
    assert [p.shape for p in after.entry.parameters] == [p.shape for p in before.entry.parameters]
    assert_same(evaluate(before, args), evaluate(after, args))
    assert print_module(optimize(after)) == print_module(after)
