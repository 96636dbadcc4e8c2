"""Convolution as GEMM: patch matrix (im2col) times weight matrix, by batch slices.

For the convolutions conv_implicit.py does not take (features not innermost),
on both backends (sgemm or cuBLAS). Builds P[(b, o...), (w..., c)] (zeros in
padding and between dilated inputs) and multiplies it by the weights as
[(w..., c), f]; Conv2D and both its gradients are such convolutions, so one
lowering serves all. P is built a slice at a time (a ChunkLoop) within a
memory budget.
"""
import numpy as np

from . import indexing as ix
from .ir import S64, ChunkIndex, ChunkLoop, Const, GemmCall, Index, Load, LoopKernel, Op

def window_positions(index, window, in_dims, window_index, reverse=True):
    """Operand positions for output `index` and window offsets `window_index`,
    with a validity predicate (None when always valid)."""
    valid, inner = None, []
    for d, (i, w, k) in enumerate(zip(index, window, window_index)):
        if reverse and w.rhs_reversal:
            k = ix.sub(ix.c64(w.size - 1), k)
        pos = ix.sub(ix.add(ix.mul(i, ix.c64(w.stride)), ix.mul(k, ix.c64(w.rhs_dilate))),
                     ix.c64(w.pad_lo))
        span = (in_dims[d] - 1) * w.lhs_dilate
        in_range = ix.both(ix.compare(pos, ix.c64(0), "GE"), ix.compare(pos, ix.c64(span), "LE"))
        valid = ix.both(valid, in_range)
        if w.lhs_dilate > 1:
            valid = ix.both(valid, ix.compare(ix.mod(ix.clamp(pos, 0, span), w.lhs_dilate),
                                              ix.c64(0), "EQ"))
        inner.append(ix.div(ix.clamp(pos, 0, span), w.lhs_dilate))
    return valid, inner


def _kernel(name, dims, bid, value):
    return LoopKernel(name, tuple(dims), [(bid, value)], [name])


def _slice_rows(total, row_bytes, budget):
    """Rows per slice: the largest divisor of `total` (slices tile it exactly)
    whose patch block fits the budget."""
    target = max(1, min(total, budget // max(row_bytes, 1)))
    return next(rows for rows in range(target, 0, -1) if total % rows == 0)


def _order(labels, last):
    """Labels in their memory order, without `last` (if it is the innermost), else None."""
    ordered = sorted(labels, key=labels.get)
    return ordered[:-1] if ordered[-1] == last else None


def conv_as_gemm(lw, inst, role):
    """Lower `inst` (an f32 convolution) to patches + sgemm steps; False if not applicable.

    The GEMM's row (M) and column (K) orders follow the output's and the
    weights' memory order where they allow, so neither needs a transpose,
    and the patch matrix is stored transposed when that makes its innermost
    dimension the operand's contiguous one (the filter gradient's case).
    """
    a = inst.attrs
    lhs, rhs = inst.operands
    if inst.shape.dtype != "f32" or lhs.shape.dtype != "f32" or rhs.shape.dtype != "f32" \
            or a.get("feature_group_count", 1) != 1 or a.get("batch_group_count", 1) != 1:
        return False
    lhs_l, rhs_l, out_l = a["dim_labels"].positions()
    window = a["window"]
    spatial = len(window)
    out_dims, lhs_dims, rhs_dims = inst.shape.dims, lhs.shape.dims, rhs.shape.dims
    m_labels = _order(out_l, "f") or ["b", *range(spatial)]
    k_labels = _order(rhs_l, "o") or [*range(spatial), "i"]
    m_sizes = [out_dims[out_l[x]] for x in m_labels]
    k_sizes = [rhs_dims[rhs_l[x]] for x in k_labels]
    features = out_dims[out_l["f"]]
    m_total, k_total = int(np.prod(m_sizes)), int(np.prod(k_sizes))
    # Slice the patch matrix along the longer GEMM side: rows (each slice writes
    # its own rows of the product) or columns (slices add into the product, as
    # the filter gradient's long contraction over batch and image wants).
    along_k = k_total > m_total
    sliced_total, other_total = (k_total, m_total) if along_k else (m_total, k_total)
    per_chunk = _slice_rows(sliced_total, other_total * 4, lw.target.patch_budget_bytes)

    lhs_id, rhs_id = lw.materialized(lhs), lw.materialized(rhs)
    # Weights as [K, f]; window reversal is applied here.
    reversed_dims = [d for d, w in enumerate(window) if w.rhs_reversal]
    if [rhs_l[x] for x in k_labels + ["o"]] == list(range(spatial + 2)) and not reversed_dims:
        w_id = rhs_id
    else:
        w_dims = k_sizes + [features]
        w_id = lw.temp("f32", w_dims, f"{inst.name}.weights")
        index = [Index(S64, d) for d in range(spatial + 2)]
        source = [None] * (spatial + 2)
        for i, label in zip(index, k_labels + ["o"]):
            if label in reversed_dims:
                i = ix.sub(ix.c64(window[label].size - 1), i)
            source[rhs_l[label]] = i
        lw.steps.append(_kernel(f"weights_{inst.name}", w_dims, w_id,
                                Load("f32", rhs_id, tuple(source))))
    # Patches for one slice: `per_chunk` consecutive rows of the sliced side
    # (flattened, so a slice can be smaller than one image) by the whole other
    # side, stored [M, K] or [K, M].
    transposed = sorted(lhs_l, key=lhs_l.get)[-1] == "b"
    chunk_m = m_sizes if along_k else [per_chunk]
    chunk_k = [per_chunk] if along_k else k_sizes
    p_dims = chunk_k + chunk_m if transposed else chunk_m + chunk_k
    p_id = lw.temp("f32", p_dims, f"{inst.name}.patches")
    index = [Index(S64, d) for d in range(len(p_dims))]
    k_index, m_index = (index[:len(chunk_k)], index[len(chunk_k):]) if transposed else \
        (index[len(chunk_m):], index[:len(chunk_m)])
    row = ix.add(ix.mul(ChunkIndex(S64), ix.c64(per_chunk)), (k_index if along_k else m_index)[0])
    if along_k:
        k_index = list(ix.delinearize(row, k_sizes))
    else:
        m_index = list(ix.delinearize(row, m_sizes))
    at = {**dict(zip(m_labels, m_index)), **{("k", x): i for x, i in zip(k_labels, k_index)}}
    in_spatial = [lhs_dims[lhs_l[d]] for d in range(spatial)]
    valid, positions = window_positions([at[d] for d in range(spatial)], window, in_spatial,
                                        [at[("k", d)] for d in range(spatial)], reverse=False)
    source = [None] * lhs.shape.rank
    source[lhs_l["b"]], source[lhs_l["f"]] = at["b"], at[("k", "i")]
    for d in range(spatial):
        source[lhs_l[d]] = positions[d]
    value = Load("f32", lhs_id, tuple(source))
    if valid is not None:
        value = Op("f32", "select", (valid, value, Const("f32", 0.0)))
    patches = _kernel(f"patches_{inst.name}", p_dims, p_id, value)
    # The product lands in [M, f] order; any other output layout gets a transpose.
    direct = [out_l[x] for x in m_labels + ["f"]] == list(range(spatial + 2))
    product_dims = m_sizes + [features]
    product_id = lw.buffer_for(inst, role) if direct else lw.temp("f32", product_dims,
                                                                 f"{inst.name}.product")
    rows, depth = int(np.prod(chunk_m)), int(np.prod(chunk_k))
    gemm = GemmCall(f"gemm_{inst.name}", product_id, p_id, w_id, rows, features, depth,
                    lhs_transposed=transposed, rhs_transposed=False,
                    out_rows_per_chunk=0 if along_k else rows,
                    rhs_rows_per_chunk=depth if along_k else 0, accumulate=along_k)
    lw.steps.append(ChunkLoop(sliced_total // per_chunk, [patches, gemm]))
    if not direct:
        out_id = lw.buffer_for(inst, role)
        index = [Index(S64, d) for d in range(spatial + 2)]
        source = [index[out_l[x]] for x in m_labels + ["f"]]
        lw.steps.append(_kernel(f"layout_{inst.name}", out_dims, out_id,
                                Load("f32", product_id, tuple(source))))
    return True
