"""Convolution as an implicit GEMM: read straight from the operand, no patch matrix.

A convolution is a GEMM with rows over output positions (b, o) and a
contraction over (window offset, input feature), each at a fixed stride in the
operand: an ImplicitGemm lists the strides and a backend reads the operand
where it lies, writing nothing but the output (conv_gemm.py copies each input
element once per covering window position). The filter gradient takes input
features as rows and contracts over batch and image. Padding and input
dilation are made explicit in a copy of the operand first.
"""
import math

from ..hlo.shape import row_major_strides
from . import indexing as ix
from .ir import S64, Const, ImplicitGemm, Index, LoopKernel, Op


def reads_strided(lw, rows, depth, contiguous):
    """Whether an ImplicitGemm of `rows` output rows over a contraction of `depth`,
    `contiguous` of it innermost in both operands, reads B's features at a stride
    rather than from a copy: where the backend can, and where the rows are few
    against the contraction. Each dot product's lanes are summed at its end (a cost
    per output element) where the copy costs one per weight: on the CPU the dot
    products were 2-4x as fast with rows <= depth / 4 (ResNet's late stages),
    level at rows ~ depth, 2-3x as slow past it (reports/tuning-measurements.md)."""
    return lw.target.strided_features and contiguous >= 16 and 2 * rows <= depth


def merged_levels(levels):
    """Levels (extent, stride, stride), outermost first, with extent-1 levels
    dropped and each level that steps exactly over the next one's whole range
    (in both memories) merged into it: fewer, longer loops."""
    out = []
    for level in (lv for lv in levels if lv[0] != 1):
        if out and out[-1][1] == level[0] * level[1] and out[-1][2] == level[0] * level[2]:
            outer = out.pop()
            level = (outer[0] * level[0], level[1], level[2])
        out.append(level)
    return out


def _read(lw, inst, index, at):
    """`inst` at `at` in a copying kernel over `index`: a load, or its producers
    computed in place (a reshape or reverse becomes index arithmetic)."""
    return lw.in_kernel(tuple(index), {}, lambda: lw.value_at(inst, tuple(at)))


def _padded(lw, inst, lhs, lhs_l, window):
    """lhs with the window's padding and input dilation (zeros between elements:
    a strided convolution's input gradient) made explicit in a buffer of its
    own, and its dims."""
    if not any(w.pad_lo or w.pad_hi or w.lhs_dilate > 1 for w in window):
        return lw.in_place(lhs), lhs.shape.dims
    # A convolution's filter gradient pads its input as the forward did: one copy
    # serves both (small_resnet made each of its padded copies twice).
    role = "padded" + repr(sorted((lhs_l[d], w.pad_lo, w.pad_hi, w.lhs_dilate)
                                  for d, w in enumerate(window)))
    if (lhs, role) not in lw.own_kernels:
        lw.own_kernels[lhs, role] = _pad(lw, inst, lhs, lhs_l, window)
    padded_id = lw.own_kernels[lhs, role]
    return padded_id, lw.buffers[padded_id].dims


def _pad(lw, inst, lhs, lhs_l, window):
    """A new buffer, and the kernel filling it, of lhs padded and dilated."""
    dims = list(lhs.shape.dims)
    for d, w in enumerate(window):
        dims[lhs_l[d]] = (dims[lhs_l[d]] - 1) * w.lhs_dilate + 1 + w.pad_lo + w.pad_hi
    index = [Index(S64, i) for i in range(len(dims))]
    source, valid = list(index), None
    for d, w in enumerate(window):
        axis, size = lhs_l[d], lhs.shape.dims[lhs_l[d]]
        at = ix.sub(index[axis], ix.c64(w.pad_lo))
        span = (size - 1) * w.lhs_dilate
        valid = ix.both(valid, ix.both(ix.compare(at, ix.c64(0), "GE"),
                                       ix.compare(at, ix.c64(span), "LE")))
        if w.lhs_dilate > 1:
            valid = ix.both(valid, ix.compare(ix.mod(ix.clamp(at, 0, span), w.lhs_dilate),
                                              ix.c64(0), "EQ"))
        source[axis] = ix.div(ix.clamp(at, 0, span), w.lhs_dilate)
    padded_id = lw.temp("f32", dims, f"{inst.name}.padded")
    value = Op("f32", "select", (valid, _read(lw, lhs, index, source), Const("f32", 0.0)))
    lw.steps.append(LoopKernel(f"pad_{inst.name}", tuple(dims), [(padded_id, value)],
                               [f"{inst.name}.padded"]))
    return padded_id


def _unreversed(rhs, rhs_l, spatial):
    """The weights before a reverse of window dims (an input gradient's, as
    TensorFlow writes it), read backwards by the GEMM instead of copied, and
    the window dims it reversed; else `rhs` and none."""
    if rhs.opcode != "reverse":
        return rhs, set()
    reversed_dims = set(rhs.attrs["dimensions"])
    window = {rhs_l[d]: d for d in range(spatial)}
    if not reversed_dims <= set(window):
        return rhs, set()
    return rhs.operands[0], {window[d] for d in reversed_dims}


def _weights(lw, inst, rhs, rhs_l, lhs_l):
    """The weights' buffer with output features innermost (a copy laid out
    [window..., i, o] where they are not: the input gradient's), its dims and
    labels, and the stride of its output features: not 1 where they are read
    at a stride (reads_strided), the input features innermost in both
    operands (the contraction's innermost level)."""
    spatial = len(rhs_l) - 2
    if rhs_l["o"] == spatial + 1:
        return lw.in_place(rhs), rhs.shape.dims, rhs_l, 1
    features = rhs.shape.dims[rhs_l["o"]]
    if rhs_l["i"] == lhs_l["f"] == spatial + 1 and reads_strided(
            lw, math.prod(inst.shape.dims) // features, math.prod(rhs.shape.dims) // features,
            rhs.shape.dims[rhs_l["i"]]):
        return (lw.in_place(rhs), rhs.shape.dims, rhs_l,
                row_major_strides(rhs.shape.dims)[rhs_l["o"]])
    order = [*range(spatial), "i", "o"]
    dims = tuple(rhs.shape.dims[rhs_l[x]] for x in order)
    index = [Index(S64, d) for d in range(spatial + 2)]
    source = [None] * (spatial + 2)
    for i, label in zip(index, order):
        source[rhs_l[label]] = i
    weights_id = lw.temp("f32", dims, f"{inst.name}.weights")
    lw.steps.append(LoopKernel(f"weights_{inst.name}", dims, [(
        weights_id, _read(lw, rhs, index, source))], [f"{inst.name}.weights"],
        transposes=rhs_l["i"] == spatial + 1))
    return weights_id, dims, {label: d for d, label in enumerate(order)}, 1


def conv_as_implicit_gemm(lw, inst, role):
    """Lower f32 convolution `inst` to an ImplicitGemm (after a padded copy of its
    operand where it pads); False where not applicable: feature or batch
    groups, input dilation, or output features not innermost."""
    a = inst.attrs
    lhs, rhs = inst.operands
    window = a["window"]
    if any(x.shape.dtype != "f32" for x in (inst, lhs, rhs)) \
            or a.get("feature_group_count", 1) != 1 or a.get("batch_group_count", 1) != 1 \
            or 0 in inst.shape.dims \
            or 0 in lhs.shape.dims or 0 in rhs.shape.dims:
        return False
    lhs_l, rhs_l, out_l = a["dim_labels"].positions()
    spatial = len(window)
    if out_l["f"] != spatial + 1:
        return False
    rhs, flipped = _unreversed(rhs, rhs_l, spatial)
    rhs_id, rhs_dims, rhs_l, feature_stride = _weights(lw, inst, rhs, rhs_l, lhs_l)
    lhs_id, lhs_dims = _padded(lw, inst, lhs, lhs_l, window)
    s_a, s_b, s_c = (row_major_strides(d) for d in (lhs_dims, rhs_dims, inst.shape.dims))
    out_dims = inst.shape.dims
    # Output rows: (extent, A stride, C stride) per output position label, in the
    # output's memory order; the innermost becomes the blocked `rows` level.
    positions = [(out_dims[out_l["b"]], s_a[lhs_l["b"]], s_c[out_l["b"]])] + [
        (out_dims[out_l[d]], window[d].stride * s_a[lhs_l[d]], s_c[out_l[d]])
        for d in range(spatial)]
    positions = merged_levels(sorted(positions, key=lambda lv: -lv[2])) or [(1, 0, 0)]
    # The contraction: window offsets (walking the weights backwards where the
    # window is reversed) and input features, outermost = largest weight stride.
    depth, b_offset = [], 0
    for d, w in enumerate(window):
        step = s_b[rhs_l[d]]
        if w.rhs_reversal != (d in flipped):
            b_offset += (w.size - 1) * step
            step = -step
        depth.append((w.size, w.rhs_dilate * s_a[lhs_l[d]], step))
    depth.append((rhs_dims[rhs_l["i"]], s_a[lhs_l["f"]], s_b[rhs_l["i"]]))
    depth = merged_levels(sorted(depth, key=lambda lv: -abs(lv[2]))) or [(1, 0, 0)]
    lw.steps.append(ImplicitGemm(
        f"igemm_{inst.name}", lw.buffer_for(inst, role), lhs_id, rhs_id, out_dims[-1],
        tuple(positions[:-1]), positions[-1], tuple(depth), b_offset,
        b_feature_stride=feature_stride))
    return True
