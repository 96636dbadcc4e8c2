"""Large reductions into few results, in two stages that threads can share.

A bias gradient sums 128x26x26 rows of 32 into one row: a loop kernel whose
only loop outside the reduction is the row itself, which no thread can take
a part of (threads split a kernel's outer loops; a reduction's own loop is
serial), so one core streams the whole operand at one core's memory
bandwidth; a sum of a whole tensor, likewise. Split into PARTS along a
reduction dim, each part's partial row is an outer loop of its own that
threads share; a second kernel folds the parts in order by the same combiner. The init is then applied once per part, as
HLO allows (it is an identity of the combiner).

Only combiners whose results do not depend on the grouping are split:
maximum, minimum, and, or, and integer sums and products, exactly; float
sums this large, whose terms are added in any order already (vectors of
partial sums), round differently only.

An ImplicitGemm of few sums over a long contraction (a filter gradient: 75
sums of 682112 products) splits alike: threads share its row blocks, but
each block runs over all of the contraction, so every thread streamed all of
both operands (the elephant CNN's 174 MB output gradient, once per core). In
runs (ImplicitGemm.parts), each thread streams its runs only, into copies of
C that a second kernel adds up in order.
"""
import math
from dataclasses import replace

from . import indexing as ix
from .collapse import rows_can_accumulate
from .ir import (S64, Buffer, Const, ImplicitGemm, Index, Load, LoopKernel, Op, Reduce, ReduceVar,
                 Var, map_nodes)

# A row's parts: fixed, not the thread count, so that results do not depend on it.
PARTS = 8

# Terms (results x terms each) from which a second core's memory bandwidth
# pays for the second stage (a bias gradient of 128x11x11 rows of 64: ~2^20).
MIN_TERMS = 1 << 19

# A contraction's operands streamed along it (bytes of B) from which reading
# them once, not once per thread, pays; and its copies of C: written and read
# again, at most half of B.
MIN_STREAMED_BYTES = 1 << 20
COPIES_OF_B = 0.5

# Combiners split: any order of terms gives the same result (float sums: but for rounding).
_GROUPING_FREE = ("maximum", "minimum", "and", "or", "add")


def _splittable(red):
    """Whether Reduce `red` may fold its terms in parts: one accumulator, a
    combiner of it and the term alone whose result ignores the grouping."""
    if not (len(red.accs) == len(red.curs) == len(red.combined) == len(red.bodies) == 1):
        return False
    (combined,) = red.combined
    if not isinstance(combined, Op) or len(combined.args) != 2 or \
            {a.name for a in combined.args if isinstance(a, Var)} \
            != {red.accs[0].name, red.curs[0].name}:
        return False
    integer = combined.dtype[0] in "su"         # (a float product rounds by grouping)
    return combined.opcode in _GROUPING_FREE or combined.opcode == "multiply" and integer


def _parts(extent):
    """How many parts a reduction dim of `extent` splits into: its largest
    divisor up to PARTS (parts of equal length); 1 where none is."""
    return max(p for p in range(1, PARTS + 1) if extent % p == 0)


def split_kernel(kernel, buffers):
    """(partial kernel, partial buffer, folding kernel) for a loop kernel that
    is one large splittable reduction into a scalar or a row (accumulated in
    place: rows_can_accumulate) with no other loop for threads to share; else
    None."""
    if type(kernel) is not LoopKernel or len(kernel.stores) != 1:
        return None
    ((bid, red),) = kernel.stores
    row = rows_can_accumulate(kernel, buffers) and math.prod(kernel.dims[:-1]) == 1
    if not (row or kernel.dims == () and isinstance(red, Reduce)) or not _splittable(red) \
            or math.prod(kernel.dims) * math.prod(red.extents) < MIN_TERMS:
        return None
    split = next((d for d, n in enumerate(red.extents) if _parts(n) > 1), None)
    if split is None:
        return None
    parts, length = _parts(red.extents[split]), red.extents[split] // _parts(red.extents[split])
    rank = len(kernel.dims)

    # Partials[p, ...]: the reduction over part p of dim `split`, the result's
    # index one dim further out.
    def shifted(node):
        if isinstance(node, Index):
            return Index(S64, node.dim + 1)
        if node.owner == red.key and node.dim == split:
            return ix.add(ix.mul(Index(S64, 0), ix.c64(length)), node)
        return node
    partial = map_nodes(red, (Index, ReduceVar), shifted, {})
    partial = replace(partial, extents=red.extents[:split] + (length,) + red.extents[split + 1:])
    # (A scalar's parts as a column: one reduction each, on the threads.)
    dims = (parts, *kernel.dims) if rank else (parts, 1)
    partial_bid = len(buffers)
    partial_buffer = Buffer(partial_bid, red.dtype, dims, "temp",
                            name=f"{buffers[bid].name}.parts")
    partials = LoopKernel(f"{kernel.name}_parts", dims, [(partial_bid, partial)], kernel.fused,
                          reduction=True)
    # The result: the parts folded in order.
    part = ReduceVar(S64, red.key, 0)
    fold = replace(red, extents=(parts,), bodies=(Load(red.dtype, partial_bid, (
        part, *((Index(S64, d) for d in range(rank)) if rank else (ix.c64(0),)))),))
    return partials, partial_buffer, replace(kernel, stores=[(bid, fold)])


def split_contraction(step, buffers):
    """(ImplicitGemm in runs, its copies' buffer, the kernel adding them into
    C) for an ImplicitGemm whose operands along the contraction are large
    against C, with no epilogue (it would see partial sums); else None."""
    if not isinstance(step, ImplicitGemm) or step.epilogue is not None or step.parts != 1:
        return None
    parts = _parts(step.depth[0][0])
    if parts == 1 or step.k * step.n * 4 < MIN_STREAMED_BYTES \
            or 2 * parts * step.m > COPIES_OF_B * step.k:
        return None
    dims = buffers[step.out].dims
    copies = Buffer(len(buffers), "f32", (parts, *dims), "temp",
                    name=f"{buffers[step.out].name}.parts")
    runs = replace(step, out=copies.id, parts=parts, part_stride=math.prod(dims))
    acc, cur = Var("f32", f"{step.name}.acc"), Var("f32", f"{step.name}.cur")
    index = (ReduceVar(S64, 0, 0), *(Index(S64, d) for d in range(len(dims))))
    copy = Load("f32", copies.id, index)
    total = Reduce("f32", 0, (parts,), (acc,), (cur,), (Op("f32", "add", (acc, cur)),),
                   (Const("f32", 0.0),), (copy,))
    return runs, copies, LoopKernel(f"{step.name}_parts", dims, [(step.out, total)],
                                    reduction=True)


def split_reductions(program):
    """The kernel-IR pass: each top-level loop kernel split_kernel splits, and
    each ImplicitGemm split_contraction does, replaced by its two stages."""
    steps = []
    for step in program.steps:
        split = split_kernel(step, program.buffers) or split_contraction(step, program.buffers)
        if split is None:
            steps.append(step)
            continue
        partials, buffer, fold = split
        program.buffers.append(buffer)
        steps += [partials, fold]
    program.steps = steps
    return program
