"""In-place variable updates (kernels/aliasing.py): a donated parameter's
buffer holds its update when that is safe, and only then."""
import numpy as np
import pytest

import kerasjit
from kerasjit import workloads
from kerasjit.backends.cpu import BACKEND
from kerasjit.hlo import parse_module
from kerasjit.hlo.evaluator import evaluate

from tests.support.hlo_text import SUM, hlo

pytestmark = pytest.mark.tensorflow_reference

# w' = w - 0.1 g, stored with a second output that also reads w at each element,
# and a later reduction that reads w' (which then lives in w's buffer).
UPDATE = """  %w = f32[5,3] parameter(0)
  %g = f32[5,3] parameter(1)
  %c = f32[] constant(0.1)
  %b = f32[5,3] broadcast(f32[] %c), dimensions={}
  %m = f32[5,3] multiply(f32[5,3] %b, f32[5,3] %g)
  %new = f32[5,3] subtract(f32[5,3] %w, f32[5,3] %m)
  %other = f32[5,3] add(f32[5,3] %w, f32[5,3] %g)
  %zero = f32[] constant(0)
  %total = f32[] reduce(f32[5,3] %new, f32[] %zero), dimensions={0,1}, to_apply=%sum
  ROOT %t = (f32[5,3], f32[5,3], f32[]) tuple(f32[5,3] %new, f32[5,3] %other, f32[] %total)"""

# The update reads w transposed: an element's write would clobber another's input.
TRANSPOSED = """  %w = f32[4,4] parameter(0)
  %wt = f32[4,4] transpose(f32[4,4] %w), dimensions={1,0}
  %new = f32[4,4] subtract(f32[4,4] %w, f32[4,4] %wt)
  ROOT %t = (f32[4,4]) tuple(f32[4,4] %new)"""

# A reduction reading the old w (and the update) runs after the update's loop.
READ_LATER = """  %w = f32[4,3] parameter(0)
  %g = f32[4,3] parameter(1)
  %new = f32[4,3] subtract(f32[4,3] %w, f32[4,3] %g)
  %both = f32[4,3] multiply(f32[4,3] %w, f32[4,3] %new)
  %zero = f32[] constant(0)
  %total = f32[] reduce(f32[4,3] %both, f32[] %zero), dimensions={0,1}, to_apply=%sum
  ROOT %t = (f32[4,3], f32[]) tuple(f32[4,3] %new, f32[] %total)"""

# Two updates in one loop, the second reading the first variable as it was
# (an optimizer's linear term reading the old accumulator): once the first is
# written in place, the second may not be moved after it.
READS_ANOTHER_OLD = """  %a = f32[4] parameter(0)
  %b = f32[4] parameter(1)
  %g = f32[4] parameter(2)
  %a2 = f32[4] add(f32[4] %a, f32[4] %g)
  %old = f32[4] multiply(f32[4] %a, f32[4] %g)
  %b2 = f32[4] add(f32[4] %b, f32[4] %old)
  ROOT %t = (f32[4], f32[4]) tuple(f32[4] %a2, f32[4] %b2)"""


def run(text, donate, seed=0):
    module = parse_module(hlo(text, SUM))
    rng = np.random.default_rng(seed)
    args = [rng.standard_normal(p.shape.dims).astype(np.float32)
            for p in module.entry.parameters]
    want = evaluate(parse_module(hlo(text, SUM)), [a.copy() for a in args])
    executable = BACKEND.compile(module, donate)
    got = executable(list(args))
    for g, w in zip(got, want if isinstance(want, tuple) else [want]):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    return executable, args, got


def test_a_donated_update_is_written_over_its_parameter():
    executable, (w, g), (new, other, total) = run(UPDATE, {0: 0})
    assert executable.program.aliases == {0: 0}
    assert new is w                       # the update lives in the donated array
    assert not np.shares_memory(other, w)


@pytest.mark.parametrize("text", [TRANSPOSED, READ_LATER], ids=["transposed", "read-later"])
def test_unsafe_donations_are_refused(text):
    executable, args, outputs = run(text, {0: 0})
    assert executable.program.aliases == {}
    assert not np.shares_memory(outputs[0], args[0])


def test_an_update_reading_another_variables_old_value_keeps_it():
    executable, (a, b, g), (a2, b2) = run(READS_ANOTHER_OLD, {0: 0, 1: 1})
    assert len(executable.program.aliases) == 1       # one of the two, not both


def test_without_donation_parameters_are_never_written():
    executable, (w, g), _ = run(UPDATE, None)
    assert executable.program.aliases == {}


def test_a_read_only_donated_array_is_copied_not_written():
    module = parse_module(hlo(UPDATE, SUM))
    w = np.ones((5, 3), np.float32)
    w.flags.writeable = False
    new, _, _ = BACKEND.compile(module, {0: 0})([w, np.ones((5, 3), np.float32)])
    assert (w == 1).all() and np.allclose(new, 0.9)


# Indices updated in place, then read by a scatter (whose target and update
# Exprs must follow the indices to their new buffer).
SCATTER_AFTER_UPDATE = """  %t = f32[6,3] parameter(0)
  %iv = s32[4,1] parameter(1)
  %u = f32[4,3] parameter(2)
  %one = s32[] constant(1)
  %ones = s32[4,1] broadcast(s32[] %one), dimensions={}
  %inew = s32[4,1] add(s32[4,1] %iv, s32[4,1] %ones)
  %s = f32[6,3] scatter(f32[6,3] %t, s32[4,1] %inew, f32[4,3] %u), update_window_dims={1},
      inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1,
      to_apply=%sum
  ROOT %r = (s32[4,1], f32[6,3]) tuple(s32[4,1] %inew, f32[6,3] %s)"""


def test_a_scatter_reads_indices_updated_in_place():
    args = [np.zeros((6, 3), np.float32), np.array([[0], [2], [2], [5]], np.int32),
            np.arange(12, dtype=np.float32).reshape(4, 3)]
    want = evaluate(parse_module(hlo(SCATTER_AFTER_UPDATE, SUM)), [a.copy() for a in args])
    executable = BACKEND.compile(parse_module(hlo(SCATTER_AFTER_UPDATE, SUM)), {1: 0})
    indices, scattered = executable([a.copy() for a in args])
    assert executable.program.aliases == {0: 1}
    np.testing.assert_array_equal(indices, want[0])
    np.testing.assert_array_equal(scattered, want[1])     # (index 6 is skipped)


def test_training_updates_variables_in_place_and_matches_keras():
    x, y = workloads.classification_data(256, (784,), 10)
    plain = workloads.mlp(0)
    wrapped = kerasjit.wrap(workloads.mlp(0), race=False)
    wrapped.set_weights(plain.get_weights())
    for model in (plain, wrapped):
        model.fit(x, y, batch_size=64, epochs=2, shuffle=False, verbose=0)
    (executable,) = wrapped._kerasjit.train.executables()
    # Every kernel and bias with its two Adam moments, and the step counter.
    assert len(executable.program.aliases) >= 3 * 4 + 1
    for a, b in zip(plain.get_weights(), wrapped.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
