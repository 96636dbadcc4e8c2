"""A row reduction computing the elementwise value it sums, and storing it too.

A convolution's bias gradient sums its output gradient over the batch and
the image: the elephant CNN's first one reads 349 MB that the kernel before
it (the activation's and the pooling's gradient) has just written, a pass
of its own at the memory's bandwidth (10 ms of a 650 ms step). Where a
reduction kernel reads that value once per element, the producer's
expression moves into the reduction's loop (XLA's multi-output fusion): each
term is computed there, added to the row and stored for the value's other
readers (the filter gradient), so it is read from memory by them alone. The
fused kernel runs where the producer ran.

Fused only where the reduction accumulates rows along the value's innermost
dimension (its loop stores the value contiguously, vectorised) and has outer
rows for threads to share (the parts of split_reductions.py), reads the
value at an index that visits each element exactly once, and still
accumulates rows with the producer's loads inside (not a transpose's).
"""
import math

from .collapse import rows_can_accumulate
from .ir import (Const, Index, Load, LoopKernel, MultiOutputReduction, Op, ReduceVar,
                 kernel_exprs, map_nodes, walk)
from .storage import loaded, touched, writes


def _affine(expr, red):
    """{loop variable: coefficient} and the constant of an s64 index
    expression built of the kernel's Index, `red`'s ReduceVars, constants,
    sums and products by constants; None where it is anything else."""
    if isinstance(expr, Const):
        return {}, expr.value
    if isinstance(expr, Index):
        return {("index", expr.dim): 1}, 0
    if isinstance(expr, ReduceVar) and expr.owner == red.key:
        return {("reduce", expr.dim): 1}, 0
    if not isinstance(expr, Op) or expr.opcode not in ("add", "multiply") or len(expr.args) != 2:
        return None
    a, b = (_affine(arg, red) for arg in expr.args)
    if a is None or b is None:
        return None
    if expr.opcode == "add":
        terms = dict(a[0])
        for var, coefficient in b[0].items():
            terms[var] = terms.get(var, 0) + coefficient
        return terms, a[1] + b[1]
    if a[0] and b[0]:
        return None           # (a product of two variables)
    (terms, scale), factor = (a, b[1]) if a[0] else (b, a[1])
    return {var: c * factor for var, c in terms.items()}, scale * factor


def _visits_each_once(index, dims, kernel, red):
    """Whether the reduction's loops (the kernel's dims, `red`'s extents)
    reach each element of a buffer of `dims` exactly once at `index`, its
    row (the kernel's last dim) running along the buffer's innermost dim:
    each component a mixed-radix number of its own loop variables."""
    extent = {("index", d): n for d, n in enumerate(kernel.dims)}
    extent.update({("reduce", d): n for d, n in enumerate(red.extents)})
    if len(index) != len(dims):
        return False
    used = set()
    for component, size in zip(index, dims):
        affine = _affine(component, red)
        if affine is None or affine[1] != 0:
            return False
        variables = sorted((c, v) for v, c in affine[0].items() if extent[v] > 1 and c)
        place = 1
        for coefficient, var in variables:
            if coefficient != place or var in used:
                return False
            used.add(var)
            place *= extent[var]
        if place != size:
            return False
    row = ("index", len(kernel.dims) - 1)
    return used == {v for v, n in extent.items() if n > 1} and \
        _affine(index[-1], red)[0].get(row) == 1 and dims[-1] == kernel.dims[-1]


def _value_index(reduction, value):
    """The index at which the reduction loads buffer `value`, if it loads it at
    one index only (the same Exprs), else None."""
    indices = [n.index for e in kernel_exprs(reduction) for n in walk(e)
               if isinstance(n, Load) and n.buffer == value]
    first = indices[0] if indices else None
    return first if first is not None and all(
        len(i) == len(first) and all(a is b for a, b in zip(i, first)) for i in indices) else None


def fused(producer, reduction, buffers):
    """The MultiOutputReduction computing `producer`'s value inside
    `reduction`, or None where it may not."""
    if type(producer) is not LoopKernel or producer.reduction or producer.transposes \
            or len(producer.stores) != 1:
        return None
    ((value, expr),) = producer.stores
    if buffers[value].dims != producer.dims:     # (stored at its loop index, as laid out)
        return None
    if type(reduction) is not LoopKernel or not rows_can_accumulate(reduction, buffers) \
            or math.prod(reduction.dims[:-1]) < 2:
        return None
    ((result, red),) = reduction.stores
    if result in loaded(expr):         # (a row written over what the producer reads)
        return None
    at = _value_index(reduction, value)
    if at is None or not _visits_each_once(at, producer.dims, reduction, red):
        return None
    computed = map_nodes(expr, Index, lambda i: at[i.dim], {})
    term = map_nodes(red, Load, lambda n: computed if n.buffer == value else n, {})
    candidate = MultiOutputReduction(
        f"{producer.name}_{reduction.name}", reduction.dims, [(result, term)],
        producer.fused + reduction.fused, reduction=True,
        term_stores=((value, at, computed),))
    # (Not where the producer reads its operands along the reduction but across
    # the row, as a transpose does: the row's loop would read them a column at a time.)
    return candidate if rows_can_accumulate(candidate, buffers) else None


def fuse_reduction_producers(program):
    """The kernel-IR pass: each top-level reduction and the latest loop kernel
    before it that writes what it reads become one MultiOutputReduction
    (where fused() allows), at that kernel's place; the steps between must
    not touch the reduction's result."""
    steps = program.steps
    for r in range(len(steps)):
        reduction = steps[r]
        if type(reduction) is not LoopKernel or not reduction.reduction:
            continue
        reads = set().union(*map(loaded, kernel_exprs(reduction)))
        for p in range(r - 1, -1, -1):
            producer = steps[p]
            if producer is None:            # (a reduction fused before)
                continue
            if writes(producer) & reads:
                candidate = fused(producer, reduction, program.buffers)
                if candidate is not None:
                    steps[p], steps[r] = candidate, None
                break
            if touched(producer) & writes(reduction):
                break
    program.steps = [s for s in steps if s is not None]
    return program
