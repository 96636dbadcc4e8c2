"""Transposes around dots folded into the dots' dimension numbers.

TensorFlow spells attention's einsums as batched matmuls between transposes:
the scores come out of the dot as [batch, heads, keys, queries] and are
transposed to [..., queries, keys] for the softmax; a gradient is transposed
before the dot that reads it. Left as they are, every elementwise kernel and
reduction around them reads across rows (or the transpose is a kernel of
its own). Folded (XLA's transpose folding):

  dot(transpose(x), y) -> dot(x, y), the dimension numbers mapped through the
      permutation (where it keeps x's free dims in their order);
  transpose(dot(a, b)) swapping the lhs and rhs free dims -> dot(b, a)
      (batch dims in place; the dot has no other user).

Only where the new dot still reads its operands in place as matrices
(hlo/gemm.py). Each output element is the same sum of the same products;
BLAS may add them in another order (float rounding). Mutates and returns
the module.
"""
from ..hlo.gemm import gemm_layout
from ..hlo.ir import Instruction, NameUniquer
from .util import rewrite, use_counts


def fold_dot_transposes(module):
    names = NameUniquer(module)
    for comp in module.computations:
        users = use_counts(comp)

        def visit(inst, emit):
            folded = _operands_folded(inst) if inst.opcode == "dot" else \
                _swapped(inst, users) if inst.opcode == "transpose" else None
            if folded is None:
                return None
            operands, attrs = folded
            new = Instruction(names("dot"), "dot", inst.shape, operands, attrs)
            emit(new)
            return new
        rewrite(comp, visit)
    return module


def _in_place(operands, attrs):
    return gemm_layout(*(x.shape.dims for x in operands), attrs) is not None


def _free(rank, batch, contracting):
    return [d for d in range(rank) if d not in batch and d not in contracting]


def _operands_folded(dot):
    """(operands, attrs) of `dot` reading its transposed operands' own
    operands, or None where no transpose folds."""
    operands, attrs, changed = list(dot.operands), dict(dot.attrs), False
    for i, side in enumerate(("lhs", "rhs")):
        x = operands[i]
        if x.opcode != "transpose":
            continue
        perm = x.attrs["dimensions"]        # output dim d is operand dim perm[d]
        batch, contracting = (tuple(attrs.get(f"{side}_{k}_dims", ())) for k in
                              ("batch", "contracting"))
        if [perm[d] for d in _free(len(perm), batch, contracting)] != \
                _free(len(perm), [perm[d] for d in batch], [perm[d] for d in contracting]):
            continue        # (its free dims would come out in another order)
        trial = dict(attrs, **{f"{side}_contracting_dims": tuple(perm[d] for d in contracting)})
        if batch:
            trial[f"{side}_batch_dims"] = tuple(perm[d] for d in batch)
        if _in_place(operands[:i] + [x.operands[0]] + operands[i + 1:], trial):
            operands[i], attrs, changed = x.operands[0], trial, True
    return (operands, attrs) if changed else None


def _swapped(transpose, users):
    """(operands, attrs) of the dot that computes `transpose` of a dot with
    its operands swapped, or None."""
    dot = transpose.operands[0]
    if dot.opcode != "dot" or users.get(dot) != 1:
        return None
    a = dot.attrs
    lhs, rhs = dot.operands
    lhs_batch, rhs_batch = tuple(a.get("lhs_batch_dims", ())), tuple(a.get("rhs_batch_dims", ()))
    nb = len(lhs_batch)
    nl = len(_free(lhs.shape.rank, lhs_batch, a["lhs_contracting_dims"]))
    nr = len(_free(rhs.shape.rank, rhs_batch, a["rhs_contracting_dims"]))
    swap = tuple(range(nb)) + tuple(range(nb + nl, nb + nl + nr)) + tuple(range(nb, nb + nl))
    if transpose.attrs["dimensions"] != swap or not (nl and nr):
        return None
    attrs = {**a, "lhs_contracting_dims": tuple(a["rhs_contracting_dims"]),
             "rhs_contracting_dims": tuple(a["lhs_contracting_dims"])}
    if nb:
        attrs["lhs_batch_dims"], attrs["rhs_batch_dims"] = rhs_batch, lhs_batch
    return ([rhs, lhs], attrs) if _in_place([rhs, lhs], attrs) else None
