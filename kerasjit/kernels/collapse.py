"""Adjacent loop dims merged into one where the kernel only uses them to address memory.

A [784, 10] loop runs mostly in the vector loop's scalar remainder. Where the
two indices are used only as consecutive positions of loads from buffers laid
out like the loop, one flat loop over 7840 elements reads the same elements:
the loads keep their rank, zeros at the merged positions but the last, which
takes the flat index. It is the last kernel-IR pass, since those loads index
past their nominal bounds.
"""
import math
from dataclasses import replace

from ..hlo.shape import DTYPES
from .ir import (S64, Const, Index, Load, LoopKernel, Reduce, ReduceVar, children, map_nodes,
                 replace_steps, walk)


def _positions(kernel):
    """Per loop dim, the (load, position) pairs of its index; None for a dim
    whose index is used in any other way (arithmetic, a store's value)."""
    uses = {d: [] for d in range(len(kernel.dims))}
    for _, expr in kernel.stores:
        if isinstance(expr, Index):
            uses[expr.dim] = None
        for node in walk(expr):
            for position, child in enumerate(children(node)):
                if isinstance(child, Index) and uses[child.dim] is not None:
                    if isinstance(node, Load):
                        uses[child.dim].append((node, position))
                    else:
                        uses[child.dim] = None
    return uses


def _mergeable(kernel, buffers, uses, d):
    """Whether loop dims d and d + 1 may merge: each always follows the other
    in a load, over a buffer dim as long as the inner loop."""
    # (Not a loop dim of 1: renderers skip the index of a buffer's unit dim, and
    # merging one saves nothing.)
    inner = kernel.dims[d + 1]
    if uses[d] is None or uses[d + 1] is None or kernel.dims[d] == 1 or inner == 1:
        return False
    for load, p in uses[d]:
        nxt = load.index[p + 1] if p + 1 < len(load.index) else None
        dims = buffers[load.buffer].dims
        # (Both buffer dims as long as the loop's: a unit one indexed by a longer
        # loop dim is a broadcast the renderer makes by skipping its index.)
        if not (isinstance(nxt, Index) and nxt.dim == d + 1
                and dims[p] == kernel.dims[d] and dims[p + 1] == inner):
            return False
    return all(q > 0 and isinstance(load.index[q - 1], Index) and load.index[q - 1].dim == d
               for load, q in uses[d + 1])


def collapse_dims(kernel, buffers):
    """`kernel` (a LoopKernel) with every run of mergeable adjacent dims merged,
    then its unit dims dropped; the kernel itself where there is neither."""
    if type(kernel) is not LoopKernel or len(kernel.dims) < 2:
        return kernel
    merged = _merged(kernel, buffers)
    fewer = _without_unit_dims(merged)
    # (A reduction left with a last dim over 1 would accumulate its rows in place,
    # addressed by its output's own dims: it keeps them.)
    return merged if rows_can_accumulate(fewer, buffers) else fewer


def _without_unit_dims(kernel):
    """`kernel` without its loop dims of 1 (their index is 0): threads split a
    kernel's first dim, and a 1x1 convolution's weights, (1, 1, 1024, 2048),
    merged to (1, 1, 2097152), had left its optimizer update on one thread.
    Its stores keep their places (row-major over the loop dims either way).
    Not a tiled transposing copy, whose two innermost dims are its tiles'."""
    if kernel.transposes or 1 not in kernel.dims or set(kernel.dims) == {1}:
        return kernel
    new_dim, kept = {}, []
    for d, extent in enumerate(kernel.dims):
        if extent != 1:
            new_dim[d] = len(kept)
            kept.append(extent)
    zero, memo = Const(S64, 0), {}
    stores = [(bid, map_nodes(expr, Index, lambda i: Index(S64, new_dim[i.dim])
                              if i.dim in new_dim else zero, memo))
              for bid, expr in kernel.stores]
    return replace(kernel, dims=tuple(kept), stores=stores)


def _merged(kernel, buffers):
    """`kernel` with every run of mergeable adjacent dims merged."""
    uses = _positions(kernel)
    merge = [_mergeable(kernel, buffers, uses, d) for d in range(len(kernel.dims) - 1)]
    if not any(merge):
        return kernel
    groups = [[0]]                      # original dims per new dim
    for d in range(1, len(kernel.dims)):
        if merge[d - 1]:
            groups[-1].append(d)
        else:
            groups.append([d])
    new_dim = {d: g for g, group in enumerate(groups) for d in group}
    # Only loads use a merged dim's index (_mergeable), and each merged run's
    # indices sit at consecutive load positions: the last takes the run's flat
    # index, the others zero. Dims kept alone are renumbered wherever they occur.
    last = {group[-1] for group in groups}
    zero = Const(S64, 0)
    memo = {}
    stores = [(bid, map_nodes(expr, Index, lambda i: Index(S64, new_dim[i.dim])
                              if i.dim in last else zero, memo))
              for bid, expr in kernel.stores]
    return replace(kernel, dims=tuple(math.prod(kernel.dims[d] for d in group)
                                      for group in groups), stores=stores)


# A reduction's accumulators other than its result keep a row each (on the stack).
ROW_BYTES = 16 << 10


def rows_can_accumulate(kernel, buffers):
    """A lone reduction (dot, convolution, sum, an argmax, a pooling gradient's
    gather) over a last dim longer than 1, whose other accumulators' rows are
    small and that reads no operand along its reduction: renderers may
    accumulate its rows in place, so it keeps its dims."""
    stores = kernel.stores
    if len(stores) != 1 or not kernel.dims or kernel.dims[-1] == 1:
        return False
    red = stores[0][1]
    if not isinstance(red, Reduce) or _reads_along(red, buffers, len(kernel.dims) - 1):
        return False
    return kernel.dims[-1] * sum(DTYPES[a.dtype].itemsize for i, a in enumerate(red.accs)
                                 if i != red.result) <= ROW_BYTES


def _reads_along(red, buffers, row_dim):
    """Whether reduction `red` loads an operand whose memory runs along its
    innermost reduction dim but which varies along the row (loop dim
    `row_dim`; a softmax's row max or sum): accumulating a row of results at
    a time would read it a column at a time (reports/tuning-measurements.md)."""
    inner = len(red.extents) - 1
    if inner < 0 or red.extents[inner] == 1:
        return False

    def along(load):
        last = load.index[-1] if load.index else None
        return (isinstance(last, ReduceVar) and last.owner == red.key and last.dim == inner
                and buffers[load.buffer].dims[-1] > 1
                and any(isinstance(n, Index) and n.dim == row_dim
                        for i in load.index[:-1] for n in walk(i)))
    return any(isinstance(node, Load) and along(node) for body in red.bodies for node in walk(body))


def collapse_loops(program):
    """The kernel-IR pass: every loop kernel of `program` (inside compound
    steps too) with its mergeable dims merged, but for lone reductions."""
    replace_steps(program.steps, lambda step: collapse_dims(step, program.buffers)
                  if type(step) is LoopKernel and not rows_can_accumulate(step, program.buffers)
                  else step)
    return program
