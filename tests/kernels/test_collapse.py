"""Adjacent loop dims merge where the kernel uses their indices only to
address memory laid out like the loop: a [784, 10] update runs as one loop
of 7840 (the inner 10 is too short for vectors), with the same results; dims
of 1 are dropped.
And the innermost one splits where a reshape addresses memory by its
quotient and remainder: an attention head's 16 columns a loop of their own."""
import pytest

from kerasjit.hlo import parse_module
from kerasjit.kernels.ir import LoopKernel
from kerasjit.compiler import lower

from tests.support.cpu_check import check
from tests.support.hlo_args import random_args
from tests.support.hlo_text import hlo
from tests.support.targets import PATCHES


def collapsed_dims(text):
    """The dims of the module's one loop kernel after the kernel passes, after
    checking the compiled module against the evaluator."""
    module = parse_module(text)
    check(module, random_args(module))
    kernel, = [s for s in lower(module, PATCHES).steps if isinstance(s, LoopKernel)]
    return kernel.dims


def test_an_update_over_a_narrow_inner_dim_runs_as_one_flat_loop():
    assert collapsed_dims(hlo("""
  %w = f32[784,10] parameter(0)
  %g = f32[784,10] parameter(1)
  %lr = f32[] constant(0.5)
  %b = f32[784,10] broadcast(%lr), dimensions={}
  %step = f32[784,10] multiply(%g, %b)
  ROOT %new = f32[784,10] subtract(%w, %step)""")) == (7840,)


def test_a_broadcast_along_the_inner_dim_keeps_the_dims():
    assert collapsed_dims(hlo("""
  %x = f32[7,10] parameter(0)
  %bias = f32[10] parameter(1)
  %b = f32[7,10] broadcast(%bias), dimensions={1}
  ROOT %y = f32[7,10] add(%x, %b)""")) == (7, 10)


def test_a_transposed_read_keeps_the_dims():
    assert collapsed_dims(hlo("""
  %x = f32[9,10] parameter(0)
  %t = f32[10,9] transpose(%x), dimensions={1,0}
  %y = f32[10,9] parameter(1)
  ROOT %z = f32[10,9] multiply(%t, %y)""")) == (10, 9)


@pytest.mark.parametrize("axis, dims", [(0, (3, 35)), (2, (15, 7)), (1, (3, 5, 7))])
def test_an_index_used_in_arithmetic_keeps_its_dim_and_the_others_merge(axis, dims):
    # (axis 2: the merged dims come first, so the kept one is renumbered)
    assert collapsed_dims(hlo(f"""
  %x = f32[3,5,7] parameter(0)
  %i = s32[3,5,7] iota(), iota_dimension={axis}
  %f = f32[3,5,7] convert(%i)
  ROOT %y = f32[3,5,7] add(%x, %f)""")) == dims


def test_a_partly_broadcast_operand_merges_the_dims_it_reads_in_full():
    assert collapsed_dims(hlo("""
  %x = f32[4,6,8] parameter(0)
  %m = f32[6,8] parameter(1)
  %b = f32[4,6,8] broadcast(%m), dimensions={1,2}
  ROOT %y = f32[4,6,8] multiply(%x, %b)""")) == (4, 48)


def test_unit_dims_are_dropped():
    # (Threads split a kernel's first dim: a 1x1 convolution's weight update,
    # (1, 1, 64, 96), must not leave them a dim of 1.)
    assert collapsed_dims(hlo("""
  %x = f32[2,1,3] parameter(0)
  ROOT %y = f32[2,1,3] abs(%x)""")) == (2, 3)
    assert collapsed_dims(hlo("""
  %w = f32[1,1,64,96] parameter(0)
  %g = f32[1,1,64,96] parameter(1)
  ROOT %y = f32[1,1,64,96] subtract(%w, %g)""")) == (6144,)


def test_a_unit_dim_broadcast_by_skipping_its_index_keeps_the_dims():
    # (XLA allows a broadcast that keeps a unit dim; the renderer reads it by
    # skipping that index, so merging it would read past the buffer.)
    module = parse_module(hlo("""
  %x = f32[7,10] parameter(0)
  %row = f32[1,10] parameter(1)
  %b = f32[7,10] broadcast(%row), dimensions={0,1}
  ROOT %y = f32[7,10] add(%x, %b)"""))
    kernel, = [s for s in lower(module, PATCHES).steps if isinstance(s, LoopKernel)]
    assert kernel.dims == (7, 10)


REDUCE_SUM = """
%sum {
  %a = s32[] parameter(0)
  %b = s32[] parameter(1)
  ROOT %s = s32[] add(%a, %b)
}
"""


def test_a_reduction_along_the_rows_in_memory_runs_element_by_element():
    # A softmax's row sum reads each row contiguously: accumulating a row of
    # 40 results at a time would read the input a column at a time, so the
    # kernel is no row accumulation and its dims merge.
    assert collapsed_dims(hlo("""
  %x = s32[16,40,100] parameter(0)
  %zero = s32[] constant(0)
  ROOT %r = s32[16,40] reduce(%x, %zero), dimensions={2}, to_apply=%sum""", REDUCE_SUM)) == (640,)


def test_a_reduction_over_the_batch_accumulates_rows():
    # A bias gradient sums over the batch: each step adds a contiguous row.
    assert collapsed_dims(hlo("""
  %x = s32[64,7,10] parameter(0)
  %zero = s32[] constant(0)
  ROOT %r = s32[7,10] reduce(%x, %zero), dimensions={0}, to_apply=%sum""", REDUCE_SUM)) == (7, 10)


def heads_merged(heads, width):
    """Attention heads' outputs [8, heads, 10, width] as [8, 10, heads * width]."""
    return hlo(f"""
  %x = f32[8,{heads},10,{width}] parameter(0)
  %t = f32[8,10,{heads},{width}] transpose(%x), dimensions={{0,2,1,3}}
  %r = f32[8,10,{heads * width}] reshape(%t)
  %two = f32[] constant(2)
  %b = f32[8,10,{heads * width}] broadcast(%two), dimensions={{}}
  ROOT %y = f32[8,10,{heads * width}] multiply(%r, %b)""")


def test_merged_attention_heads_loop_over_each_head_s_columns():
    assert collapsed_dims(heads_merged(4, 16)) == (8, 10, 4, 16)


def test_runs_shorter_than_a_vector_keep_the_loop_whole():
    assert collapsed_dims(heads_merged(16, 4)) == (8, 10, 64)


def test_an_index_used_whole_too_keeps_its_loop():
    text = heads_merged(4, 16).replace("ROOT %y", "%y").replace("\n}", """
  %i = s32[8,10,64] iota(), iota_dimension=2
  %f = f32[8,10,64] convert(%i)
  ROOT %z = f32[8,10,64] add(%y, %f)
}""")
    assert collapsed_dims(text) == (8, 10, 64)
