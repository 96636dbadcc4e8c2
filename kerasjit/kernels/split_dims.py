"""A kernel's innermost loop split in two where it addresses memory by quotient and remainder.

A reshape that splits a dim reads its operand at [b, t, c // 16, c % 16] (an
attention head's columns: indexing.reshape_index): along the innermost loop
c the addresses jump every 16 elements, which LLVM's loop vectoriser meets
with gathers. Where every use of that loop's index is `c // k` or `c % k` for
one k dividing its extent, the loop becomes two, (extent // k, k), whose
indices are the quotient and the remainder: runs of k contiguous elements
are an innermost loop of their own. Stores follow the loop index, laid out
row-major, so splitting a dim in two keeps every element's address (as
collapse.py's merging does); collapse.py, the pass after, merges the two
loops again where both only address memory side by side.
"""
from dataclasses import replace

from .ir import (S64, Const, Index, LoopKernel, Op, Reduce, children, map_nodes, replace_steps,
                 walk)

# The shortest run worth a loop of its own: a vector of 8 floats.
MIN_RUN = 8


def _divisor(kernel, dim):
    """The one k by which every use of loop index `dim` divides or takes the
    remainder, or None."""
    divisors = set()
    for _, expr in kernel.stores:
        if isinstance(expr, Index):
            return None             # (stored as a value)
        for node in walk(expr):
            if isinstance(node, Reduce):
                return None         # (reductions keep their rows: collapse.py)
            for position, child in enumerate(children(node)):
                if not (isinstance(child, Index) and child.dim == dim):
                    continue
                if not (isinstance(node, Op) and node.opcode in ("divide", "remainder")
                        and position == 0 and isinstance(node.args[1], Const)):
                    return None
                divisors.add(node.args[1].value)
    return divisors.pop() if len(divisors) == 1 else None


def split_innermost(kernel):
    """`kernel` with its innermost loop split by the divisor its index is
    used with, where that gives runs of MIN_RUN or more; else itself."""
    if type(kernel) is not LoopKernel or not kernel.dims:
        return kernel
    dim, extent = len(kernel.dims) - 1, kernel.dims[-1]
    k = _divisor(kernel, dim)
    if k is None or k < MIN_RUN or extent % k or extent == k:
        return kernel

    # The loop's index as it was: map_nodes maps children first, so `(c // 16) % 2`
    # reaches split() as `q % 2`, q the new quotient index, which has the old
    # index's number but is not it (a dilated convolution's BatchToSpaceND).
    unsplit = {id(node) for _, expr in kernel.stores for node in walk(expr)
               if isinstance(node, Index) and node.dim == dim}

    def split(op):
        if op.opcode in ("divide", "remainder") and id(op.args[0]) in unsplit:
            return Index(S64, dim if op.opcode == "divide" else dim + 1)
        return op
    memo = {}
    return replace(kernel, dims=(*kernel.dims[:-1], extent // k, k),
                   stores=[(bid, map_nodes(expr, Op, split, memo)) for bid, expr in kernel.stores])


def split_loops(program):
    """The kernel-IR pass: split_innermost on every loop kernel of `program`
    (inside compound steps too)."""
    replace_steps(program.steps, split_innermost)
    return program
