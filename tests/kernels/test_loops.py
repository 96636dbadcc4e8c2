"""While loops in the kernel IR (kernels/loops.py): one WhileLoop step whose
state lives in buffers for the whole loop, values passed on unchanged read
where they are, a list's per-step write in place, the verifier satisfied."""
from kerasjit.hlo import parse_module
from kerasjit.kernels.ir import LoopKernel, ScatterKernel, WhileLoop, leaf_steps
from kerasjit.compiler import lower
from kerasjit.passes import optimize
import pytest

from tests.support.loop_text import LIST_LOOP, NESTED, accumulating_loop
from tests.support.targets import PATCHES


def _program(text):
    return lower(optimize(parse_module(text)), PATCHES, verify=True)


def test_list_loop_is_one_while_step_writing_its_list_in_place():
    program = _program(LIST_LOOP)
    loops = [s for s in program.steps if isinstance(s, WhileLoop)]
    assert len(loops) == 1
    loop = loops[0]
    seq, w = program.params
    assert w in loop.state                       # passed on unchanged: read where it is
    # The list is copied in once (the parameter is the caller's), then only the
    # row of each step is written: no kernel of the body runs over the whole list.
    assert seq not in loop.state
    assert not [k for k in leaf_steps(loop.body) if isinstance(k, LoopKernel)
                and tuple(k.dims) == (5, 3)]
    (row,) = [k for k in leaf_steps(loop.body) if isinstance(k, ScatterKernel)]
    assert row.stores[0][0] in loop.state and not row.ordered


@pytest.mark.parametrize("read_row, in_place", [("add(s32[] %a.i, s32[] %a.zero)", True),
                                               ("subtract(s32[] %a.four, s32[] %a.i)", False)])
def test_a_list_item_read_updated_and_stored_back_is_written_in_place(read_row, in_place):
    """seq[i] = seq[i] + x: the window's kernel reads the list only at the
    element it writes, so the list is not copied each step (as it must be
    where the item read is another one: seq[i] = seq[4 - i] + x)."""
    program = _program(accumulating_loop(read_row))
    (loop,) = [s for s in program.steps if isinstance(s, WhileLoop)]
    whole = [k for k in leaf_steps(loop.body) if isinstance(k, LoopKernel)
             and not isinstance(k, ScatterKernel) and tuple(k.dims) in ((5, 3), (15,))]
    assert (not whole) == in_place
    (row,) = [k for k in leaf_steps(loop.body) if isinstance(k, ScatterKernel)]
    assert (row.stores[0][0] in loop.state) == in_place


def test_a_state_permuted_by_the_body_is_copied_aside_first():
    program = _program(NESTED)
    (outer,) = [s for s in program.steps if isinstance(s, WhileLoop)]
    (inner,) = [s for s in outer.body if isinstance(s, WhileLoop)]
    # The inner body's swap reads b into a's place and a + b into b's: both
    # next values are computed before either state buffer changes.
    copies = [k for k in inner.body if isinstance(k, LoopKernel) and k.name.startswith("copy_")]
    assert {bid for k in copies for bid, _ in k.stores} >= set(inner.state[1:])
