"""Gathers and scatters with their slice (window) dims after their index dims.

TensorFlow's bilinear resize comes from its bridge as a gather of a 3x3
window of the whole image (batch and channels included) per output pixel,
the window's dims first and the pixels last: [batch, 3, 3, channels, out_h,
out_w]; its gradient scatters such windows back. A kernel runs over its
dims in order, so the gather wrote, and the dot reading it read, one
element every out_h * out_w, and the scatter's loop added its updates
likewise: all of a mini U-Net's step but its convolutions. With the index
dims first ([out_h, out_w, batch, 3, 3, channels]) each window is written,
read and added where it lies, channels innermost. A transpose back to the
order the users read (free: each user indexes through it) keeps every
value the same.

Mutates and returns the module.
"""
from dataclasses import replace

from ..hlo.ir import NameUniquer
from .util import maker, rewrite


def window_dims_last(module):
    names = NameUniquer(module)
    for comp in module.computations:
        rewrite(comp, lambda inst, emit: _reordered(inst, maker(names, emit)))
    return module


def _reordered(inst, make):
    if inst.opcode == "gather" and not inst.attrs.get("operand_batching_dims"):
        return _gather(inst, make)
    if inst.opcode == "scatter" and not inst.attrs.get("input_batching_dims") \
            and len(inst.operands) == 3:
        return _scatter(inst, make)
    return None


def _index_first(rank, window):
    """The dims of a rank-`rank` value with `window` dims, index dims first
    (each group in order), or None where they are so already."""
    order = [d for d in range(rank) if d not in window] + sorted(window)
    return None if order == list(range(rank)) else order


def _window_last(rank, window):
    """A rank-`rank` value's `window` dims' positions once they come last."""
    return tuple(range(rank - len(window), rank))


def _gather(inst, make):
    """The gather writing index dims first, transposed back."""
    rank, window = inst.shape.rank, inst.attrs["offset_dims"]
    order = _index_first(rank, window)
    if order is None:
        return None
    gathered = make("gather", replace(inst.shape, dims=tuple(inst.shape.dims[d] for d in order)),
                    inst.operands, {**inst.attrs, "offset_dims": _window_last(rank, window)},
                    name=inst.name)
    return make("transpose", inst.shape, [gathered],
                {"dimensions": tuple(order.index(d) for d in range(rank))})


def _scatter(inst, make):
    """The scatter reading its updates index dims first."""
    operand, indices, updates = inst.operands
    rank, window = updates.shape.rank, inst.attrs["update_window_dims"]
    order = _index_first(rank, window)
    if order is None:
        return None
    reordered = make("transpose", replace(updates.shape, dims=tuple(updates.shape.dims[d]
                                                                   for d in order)),
                     [updates], {"dimensions": tuple(order)})
    return make("scatter", inst.shape, [operand, indices, reordered],
                {**inst.attrs, "update_window_dims": _window_last(rank, window)}, name=inst.name)
