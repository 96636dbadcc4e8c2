"""Convolutions over a dilated input, as one convolution per output phase.

The input gradient of a strided convolution comes from TensorFlow as a
convolution over the output gradient dilated by the stride (s - 1 zeros
between elements): with stride 2 in two dims, three of every four products
are with a zero, and the dilated copy is four times the gradient's size.
Along a dim dilated by s, the outputs o = s*q + r of one phase r meet input
elements only through the taps j = j0, j0 + s, ... (j0 = (pad_lo - r) mod s),
the input element q + e + t at tap j0 + s*t: a convolution of the undilated
input with those taps, its outputs every s-th of the result. So each phase
(one per combination of residues in the dilated dims) is such a convolution
(of a strided slice of the weights), padded out to its positions with zeros
between (pad's interior padding), and the phases are added. Each product
with an input element is computed once, as before, and none with a zero.

Only convolutions of stride 1 without weight dilation or batch groups (what
TensorFlow's input gradients are, depthwise ones too: feature groups split
alike) are split. Mutates and returns the module.
"""
import itertools
from dataclasses import replace

import numpy as np

from ..hlo.ir import NameUniquer, WindowDim
from ..hlo.shape import Shape
from .util import maker, rewrite


def split_dilated_convolutions(module):
    names = NameUniquer(module)
    for comp in module.computations:
        rewrite(comp, lambda inst, emit: _split(inst, maker(names, emit)))
    return module


def _splittable(inst):
    a = inst.attrs
    window = a.get("window") or ()
    return inst.opcode == "convolution" and any(w.lhs_dilate > 1 for w in window) \
        and all(w.stride == 1 and w.rhs_dilate == 1 for w in window) \
        and a.get("batch_group_count", 1) == 1 \
        and inst.shape.size > 0 and all(op.shape.size > 0 for op in inst.operands)


def _split(inst, make):
    """The sum of `inst`'s phases replacing it, or None."""
    if not _splittable(inst):
        return None
    lhs, rhs = inst.operands
    window = inst.attrs["window"]
    labels = inst.attrs["dim_labels"].positions()
    rhs_l, out_l = labels[1:]
    reversed_dims = tuple(rhs_l[d] for d, w in enumerate(window) if w.rhs_reversal)
    if reversed_dims:       # (the phases slice the weights in the order the window reads them)
        rhs = make("reverse", rhs.shape, [rhs], {"dimensions": reversed_dims})
    zero = make("constant", Shape.array(inst.shape.dtype, ()), [],
                literal=np.zeros((), inst.shape.numpy_dtype))
    total = None
    for phase in itertools.product(*(range(min(w.lhs_dilate, inst.shape.dims[out_l[d]]))
                                     for d, w in enumerate(window))):
        placed = _phase(inst, labels, lhs, rhs, phase, zero, make)
        if placed is not None:
            total = placed if total is None else make("add", inst.shape, [total, placed])
    if total is None:       # (no output meets an input element)
        return make("broadcast", inst.shape, [zero], {"dimensions": ()})
    return total


def _phase(inst, labels, lhs, rhs, phase, zero, make):
    """Phase `phase` (a residue per window dim) of convolution `inst` (its
    operands' and result's dim positions `labels`) at its outputs'
    positions, zeros elsewhere; None where it meets no input element."""
    window = inst.attrs["window"]
    lhs_l, rhs_l, out_l = labels
    crop = [(0, n, 1) for n in lhs.shape.dims]
    taps = [(0, n, 1) for n in rhs.shape.dims]
    out_dims = list(inst.shape.dims)
    padding = [(0, 0, 0)] * len(out_dims)
    phase_window = []
    for d, (w, r) in enumerate(zip(window, phase)):
        s, n, m = w.lhs_dilate, lhs.shape.dims[lhs_l[d]], inst.shape.dims[out_l[d]]
        first = (w.pad_lo - r) % s             # the phase's first tap meeting an input element
        if first >= w.size:
            return None
        count = (w.size - first + s - 1) // s  # its taps: first, first + s, ...
        outputs = (m - r + s - 1) // s          # its outputs: r, r + s, ...
        lo = -((r + first - w.pad_lo) // s)     # input element q - lo meets output q's first tap
        hi = outputs - 1 + count - n - lo
        start, limit = max(-lo, 0), n - max(-hi, 0)
        if start >= limit:
            return None
        crop[lhs_l[d]] = (start, limit, 1)
        taps[rhs_l[d]] = (first, first + s * (count - 1) + 1, s)
        phase_window.append(WindowDim(size=count, pad_lo=max(lo, 0), pad_hi=max(hi, 0)))
        out_dims[out_l[d]] = outputs
        padding[out_l[d]] = (r, m - 1 - r - s * (outputs - 1), s - 1)
    # (named after `inst`: the kernel profile tells an input gradient by its name)
    conv = make("convolution", replace(inst.shape, dims=tuple(out_dims)),
                [_sliced(lhs, crop, make), _sliced(rhs, taps, make)],
                {**inst.attrs, "window": tuple(phase_window)}, name=f"{inst.name}_phase")
    return make("pad", inst.shape, [conv, zero], {"padding": tuple(padding)})


def _sliced(inst, ranges, make):
    """`inst` sliced to (start, limit, stride) per dim, itself where that is all of it."""
    if all(r == (0, n, 1) for r, n in zip(ranges, inst.shape.dims)):
        return inst
    dims = tuple((limit - start + stride - 1) // stride for start, limit, stride in ranges)
    return make("slice", replace(inst.shape, dims=dims), [inst], {"slice": tuple(ranges)})
