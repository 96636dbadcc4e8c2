"""Multi-output fusion beyond adjacent kernels (kernels/lower.py).

A materialised value joins a recent loop of its shape, not only the last
step, when everything it reads is written before that loop: Adam's m, v and
weight updates of one weight share one pass over memory even though other
variables' updates come between them in post-order. Where a value reads
something written after a candidate loop, it keeps a loop of its own.
"""
import numpy as np
import pytest

import kerasjit
from kerasjit import workloads
from kerasjit.hlo import parse_module
from kerasjit.kernels.ir import LoopKernel
from kerasjit.compiler import lower
from kerasjit.kernels.verifier import verify_kernels

from tests.support.cpu_check import check
from tests.support.dtype_values import values
from tests.support.hlo_text import SUM, hlo
from tests.support.targets import PATCHES


def kernel_of(program, name):
    """(position, LoopKernel) of the loop that stores HLO instruction `name`."""
    for pos, step in enumerate(program.steps):
        if isinstance(step, LoopKernel) and \
                any(program.buffers[bid].name == name for bid, _ in step.stores):
            return pos, step
    raise AssertionError(f"no loop stores {name}")


def compiled_and_lowered(module, args, **tolerance):
    """Check the CPU backend against the evaluator, then lower the module as it
    was compiled (the backend optimises it in place; executables keep no steps)."""
    check(module, args, **tolerance)
    program = lower(module, PATCHES)
    verify_kernels(program)
    return program


# ------------------------------------------------------------ the MLP's Adam step

@pytest.fixture(scope="module")
def mlp_module():
    x, y = workloads.classification_data(640, (784,), 10)
    model = kerasjit.wrap(workloads.mlp(0), race=False)
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    program = model._kerasjit.train.program_for((x[:64], y[:64]))
    [cluster] = [c for c in program.clusters if c.kind == "compiled"]
    [executable] = cluster.specializer.cache.values()
    return cluster.specializer.module, executable


def test_adam_updates_of_each_weight_matrix_are_one_loop(mlp_module):
    module, executable = mlp_module
    program = lower(module, PATCHES)
    assert len(program.buffers) == len(executable.program.buffers)   # the program it runs
    verify_kernels(program)
    for dims in [(784, 256), (256, 10)]:
        updates = {bid for bid in program.outputs if program.buffers[bid].dims == dims}
        assert len(updates) == 3                       # m, v and the new weight
        loops = [s for s in program.steps if isinstance(s, LoopKernel)
                 and {bid for bid, _ in s.stores} & updates]
        assert len(loops) == 1, [loop.fused for loop in loops]
        assert {bid for bid, _ in loops[0].stores} == updates
        assert len(loops[0].fused) == 3


def test_mlp_step_matches_evaluator(mlp_module):
    module, _ = mlp_module
    rng = np.random.default_rng(0)
    args = []
    for p in module.entry.parameters:      # positive: Adam takes sqrt of v
        dims = p.shape.dims
        args.append(np.full(dims, 3, np.int64) if p.shape.dtype == "s64" else
                    (rng.random(dims) * 0.1).astype(np.float32))
    compiled_and_lowered(module, args, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------- hand-written HLO

ADAM = hlo("""  %g = f32[8,16] parameter(0)
  %m = f32[8,16] parameter(1)
  %v = f32[8,16] parameter(2)
  %w = f32[8,16] parameter(3)
  %bg = f32[16] parameter(4)
  %bm = f32[16] parameter(5)
  %t = s64[] parameter(6)
  %one = s64[] constant(1)
  %c9 = f32[] constant(0.9)
  %c1 = f32[] constant(0.1)
  %c99 = f32[] constant(0.999)
  %c01 = f32[] constant(0.001)
  %eps = f32[] constant(1e-07)
  %k9 = f32[8,16] broadcast(%c9), dimensions={}
  %k1 = f32[8,16] broadcast(%c1), dimensions={}
  %k99 = f32[8,16] broadcast(%c99), dimensions={}
  %k01 = f32[8,16] broadcast(%c01), dimensions={}
  %ke = f32[8,16] broadcast(%eps), dimensions={}
  %mm = f32[8,16] multiply(%k9, %m)
  %gg = f32[8,16] multiply(%k1, %g)
  %m1 = f32[8,16] add(%mm, %gg)
  %vv = f32[8,16] multiply(%k99, %v)
  %g2 = f32[8,16] multiply(%g, %g)
  %g2s = f32[8,16] multiply(%k01, %g2)
  %v1 = f32[8,16] add(%vv, %g2s)
  %b1 = f32[16] multiply(%bm, %bg)
  %t1 = s64[] add(%t, %one)
  %tf = f32[] convert(%t1)
  %lr = f32[] divide(%c01, %tf)
  %lrb = f32[8,16] broadcast(%lr), dimensions={}
  %sq = f32[8,16] sqrt(%v1)
  %den = f32[8,16] add(%sq, %ke)
  %upd = f32[8,16] divide(%m1, %den)
  %step = f32[8,16] multiply(%lrb, %upd)
  %w1 = f32[8,16] subtract(%w, %step)
  ROOT %out = (f32[8,16], f32[8,16], f32[16], s64[], f32[8,16]) tuple(%m1, %v1, %b1, %t1, %w1)""")


def test_weight_update_joins_its_moments_past_other_steps():
    """w1 comes after a bias update and the step count's own kernel, yet joins m1
    and v1: the count is a cheap scalar, recomputed rather than read too early."""
    module = parse_module(ADAM)
    rng = np.random.default_rng(1)
    args = [values("f32", (8, 16), rng), values("f32", (8, 16), rng),
            values("f32", (8, 16), rng, positive=True), values("f32", (8, 16), rng),
            values("f32", (16,), rng), values("f32", (16,), rng), np.int64(4)]
    program = compiled_and_lowered(module, args)
    pos, loop = kernel_of(program, "m1")
    assert kernel_of(program, "v1") == kernel_of(program, "w1") == (pos, loop)
    assert kernel_of(program, "t1")[0] > pos      # written after the loop w1 joined
    assert loop.fused == ["m1", "v1", "w1"]


def _conditional_adam():
    """Keras's update under a condition (a step skipped where gradients are not finite):
    m1 both updates w and, selected, m itself; the select comes after five loops of
    the same shape that each read a reduction, past the LOOKBACK of recent loops."""
    fillers = "\n".join(f"""  %c{k} = f32[] constant({k + 2})
  %kk{k} = f32[8,16] broadcast(%c{k}), dimensions={{}}
  %a{k} = f32[8,16] multiply(%x, %kk{k})
  %r{k} = f32[8] reduce(%a{k}, %zero), dimensions={{1}}, to_apply=%sum
  %rb{k} = f32[8,16] broadcast(%r{k}), dimensions={{0}}
  %f{k} = f32[8,16] subtract(%x, %rb{k})""" for k in range(5))
    outputs = ", ".join(f"%f{k}" for k in range(5))
    return hlo(f"""  %g = f32[8,16] parameter(0)
  %m = f32[8,16] parameter(1)
  %w = f32[8,16] parameter(2)
  %apply = pred[] parameter(3)
  %x = f32[8,16] parameter(4)
  %zero = f32[] constant(0)
  %c1 = f32[] constant(0.1)
  %k1 = f32[8,16] broadcast(%c1), dimensions={{}}
  %d = f32[8,16] subtract(%g, %m)
  %dd = f32[8,16] multiply(%d, %k1)
  %m1 = f32[8,16] add(%m, %dd)
  %step = f32[8,16] multiply(%m1, %k1)
  %w1 = f32[8,16] subtract(%w, %step)
  %ap = pred[8,16] broadcast(%apply), dimensions={{}}
  %wo = f32[8,16] select(%ap, %w1, %w)
{fillers}
  %mo = f32[8,16] select(%ap, %m1, %m)
  ROOT %out = (f32[8,16], {", ".join(["f32[8,16]"] * 5)}, f32[8,16]) tuple(%wo, {outputs}, %mo)""",
               SUM)


@pytest.mark.parametrize("apply", [True, False])
def test_a_selected_moment_joins_the_loop_that_computes_it(apply):
    """mo = select(apply, m1, m) joins the loop where m1 updates w, however far back,
    and m1 is stored nowhere (its readers all compute it there): one pass over m."""
    module = parse_module(_conditional_adam())
    rng = np.random.default_rng(3)
    args = [values("f32", (8, 16), rng) for _ in range(3)] + [np.bool_(apply),
                                                              values("f32", (8, 16), rng)]
    program = compiled_and_lowered(module, args, rtol=1e-5, atol=1e-5)
    assert kernel_of(program, "mo") == kernel_of(program, "wo")
    assert not any(program.buffers[bid].name == "m1" for step in program.steps
                   if isinstance(step, LoopKernel) for bid, _ in step.stores)


INVALID = hlo("""  %x = f32[8,16] parameter(0)
  %y = f32[8,16] parameter(1)
  %zero = f32[] constant(0)
  %a = f32[8,16] multiply(%x, %y)
  %r = f32[8] reduce(%a, %zero), dimensions={1}, to_apply=%sum
  %rb = f32[8,16] broadcast(%r), dimensions={0}
  %b = f32[8,16] subtract(%a, %rb)
  %s = f32[] reduce(%a, %zero), dimensions={0,1}, to_apply=%sum
  %sb = f32[8,16] broadcast(%s), dimensions={}
  %c = f32[8,16] multiply(%y, %sb)
  %d = f32[8,16] add(%x, %y)
  ROOT %out = (f32[8,16], f32[8,16], f32[8,16], f32[8,16]) tuple(%a, %b, %c, %d)""", SUM)


def test_value_reading_a_later_step_keeps_its_own_loop():
    """b reads a row sum and c a total of a, both computed after a's loop: neither
    may join it (nor c b's loop); a scalar reduction is not recomputed in place.
    d reads only parameters and joins the latest loop of its shape."""
    module = parse_module(INVALID)
    rng = np.random.default_rng(2)
    args = [values("f32", (8, 16), rng) for _ in range(2)]
    program = compiled_and_lowered(module, args, rtol=1e-4, atol=1e-5)   # sums round
    pos_a, _ = kernel_of(program, "a")
    pos_b, _ = kernel_of(program, "b")
    pos_c, _ = kernel_of(program, "c")
    assert pos_a < pos_b < pos_c
    assert kernel_of(program, "d")[0] == pos_c
    reductions = [i for i, s in enumerate(program.steps) if isinstance(s, LoopKernel)
                  and s.reduction]
    assert len(reductions) == 2 and pos_a < reductions[0] < pos_b < reductions[1] < pos_c


def test_repeated_output_of_a_fused_loop():
    """An output listed twice is copied; the copy must not mistake the value for
    one of a kernel still being built."""
    module = parse_module(hlo("""  %p0 = f32[4] parameter(0)
  %p1 = f32[4] parameter(1)
  %a = f32[4] multiply(%p0, %p1)
  ROOT %t = (f32[4], f32[4]) tuple(%a, %a)"""))
    rng = np.random.default_rng(3)
    compiled_and_lowered(module, [values("f32", (4,), rng) for _ in range(2)])


# ------------------------------------------------------------- pooling gradients

GE = """%ge (a: f32[], b: f32[]) -> pred[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %c = pred[] compare(%a, %b), direction=GE
}"""


def pooling_gradient(size, stride, source_dims):
    """A max-pool gradient feeding the relu gradient, as Keras's Conv2D(relu) +
    MaxPooling2D backward pass has it."""
    return parse_module(hlo(f"""  %x = f32[2,7,7,3] parameter(0)
  %src = f32[{source_dims}] parameter(1)
  %zero = f32[] constant(0)
  %zeros = f32[2,7,7,3] broadcast(%zero), dimensions={{}}
  %pool_grad = f32[2,7,7,3] select-and-scatter(%x, %src, %zero), window={{size=1x{size}x{size}x1 stride=1x{stride}x{stride}x1}}, select=%ge, scatter=%sum
  %active = pred[2,7,7,3] compare(%x, %zeros), direction=GT
  ROOT %relu_grad = f32[2,7,7,3] select(%active, %pool_grad, %zeros)""", GE + "\n\n" + SUM))


@pytest.mark.parametrize("size, stride, source, kernels", [
    (2, 2, "2,3,3,3", 1),         # disjoint windows: the gradient is computed in place
    (3, 2, "2,3,3,3", 2),         # overlapping ones: after a kernel that finds each
    (3, 1, "2,5,5,3", 2)])        # window's selected element
def test_a_pooling_gradient_fuses_into_the_activation_gradient(size, stride, source, kernels):
    module = pooling_gradient(size, stride, source)
    rng = np.random.default_rng(0)
    x = np.round(rng.standard_normal((2, 7, 7, 3)) * 2).astype(np.float32)   # ties, zeros
    program = compiled_and_lowered(module, [x, rng.standard_normal(
        [int(d) for d in source.split(",")]).astype(np.float32)])
    loops = [s for s in program.steps if isinstance(s, LoopKernel)]
    assert len(loops) == kernels, [loop.name for loop in loops]
    assert not any(b.name == "pool_grad" for b in program.buffers)


def test_each_edge_has_a_fusion_decision_with_its_reason():
    module = parse_module("""HloModule d
ENTRY %e (x: f32[64], b: f32[]) -> (f32[64], f32[64]) {
  %x = f32[64] parameter(0)
  %b = f32[] parameter(1)
  %e = f32[64] exponential(f32[64] %x)
  %n = f32[64] negate(f32[64] %x)
  %s = f32[64] add(f32[64] %e, f32[64] %n)
  %m = f32[64] multiply(f32[64] %e, f32[64] %n)
  ROOT %t = (f32[64], f32[64]) tuple(f32[64] %s, f32[64] %m)
}
""")
    decisions = {(d.producer, d.consumer): d.reason for d in lower(module, PATCHES).decisions}
    assert decisions[("e", "s")] == decisions[("e", "m")] == "2 users would each recompute it"
    assert decisions[("n", "s")] == decisions[("n", "m")] == "fused"     # (negate: free)


def centred(users, operand="%mean_row"):
    """x - `operand` (x less its column means, as BatchNormalization's
    moments take it) read by `users` elementwise consumers and a variance."""
    consumers = "\n".join(f"  %u{i} = f32[64,16] multiply(%d, %g{i})" for i in range(users))
    outputs = ", ".join(f"%u{i}" for i in range(users))
    types = ", ".join(["f32[64,16]"] * users)
    params = "\n".join(f"  %g{i} = f32[64,16] parameter({i + 2})" for i in range(users))
    return parse_module(hlo(f"""  %x = f32[64,16] parameter(0)
  %y = f32[64,16] parameter(1)
{params}
  %zero = f32[] constant(0)
  %total = f32[16] reduce(%x, %zero), dimensions={{0}}, to_apply=%sum
  %n = f32[16] constant({{64,64,64,64,64,64,64,64,64,64,64,64,64,64,64,64}})
  %mean = f32[16] divide(%total, %n)
  %mean_row = f32[64,16] broadcast(%mean), dimensions={{1}}
  %d = f32[64,16] subtract(%x, {operand})
  %square = f32[64,16] multiply(%d, %d)
  %variance = f32[16] reduce(%square, %zero), dimensions={{0}}, to_apply=%sum
{consumers}
  ROOT %out = (f32[16], {types}) tuple(%variance, {outputs})""", SUM))


@pytest.mark.parametrize("users, operand, stored", [
    (1, "%mean_row", False),   # x and a row: each user computes x - mean for itself
    (4, "%mean_row", False),
    (1, "%y", False),          # two tensors: read by the variance and one user, not stored...
    (3, "%y", True)])          # ... but by four, stored once and read
def test_a_value_of_stored_operands_is_recomputed_by_its_users_where_that_moves_less_memory(
        users, operand, stored):
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((64, 16)).astype(np.float32) for _ in range(2 + users)]
    program = compiled_and_lowered(centred(users, operand), args, rtol=1e-5, atol=1e-4)
    assert any(b.name == "d" for b in program.buffers) == stored
    reasons = {d.reason for d in program.decisions if d.producer == "d"}
    assert reasons == ({f"{users + 1} users would each recompute it"} if stored else {"fused"})


def test_a_value_computed_from_an_inlined_one_is_stored_for_its_users():
    """Recomputing it would recompute its operand's work too, once per user."""
    module = parse_module(hlo("""  %x = f32[64] parameter(0)
  %e = f32[64] exponential(%x)
  %half = f32[64] multiply(%x, %x)
  %s = f32[64] add(%half, %x)
  %a = f32[64] multiply(%s, %e)
  %b = f32[64] subtract(%s, %e)
  ROOT %out = (f32[64], f32[64]) tuple(%a, %b)"""))
    decisions = {(d.producer, d.consumer): d.reason
                 for d in compiled_and_lowered(module, [np.ones(64, np.float32)]).decisions}
    assert decisions[("half", "s")] == "fused"
    assert decisions[("s", "a")] == "2 users would each recompute it"
