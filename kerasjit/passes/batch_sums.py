"""Sums of batched dots over batch dims, as dots that contract those dims too.

The gradient of a Dense layer's kernel on a sequence ([batch, time, in] x
[in, out]) comes from TensorFlow as a dot batched over the examples and a
sum over them: a [batch, in, out] temporary and one small GEMM per example.
reduce-add(dot) over some of the dot's batch dims is the dot contracting
them as well: one GEMM as deep as all the examples' rows together. Folded
only where that dot reads its operands as matrices in place (hlo/gemm.py):
else it would be one long loop-kernel reduction.

Unlike simplify's rewrites this one reassociates the sum (float rounding).
Mutates and returns the module.
"""
from ..hlo.gemm import gemm_layout
from ..hlo.ir import Instruction, NameUniquer
from .util import rewrite, uniform_value, use_counts


def fold_batch_sums(module):
    names = NameUniquer(module)
    for comp in module.computations:
        users = use_counts(comp)
        rewrite(comp, lambda inst, emit: _folded(inst, users, names, emit))
    return module


def _folded(inst, users, names, emit):
    """The dot replacing reduce `inst`, or None."""
    if inst.opcode != "reduce" or len(inst.operands) != 2:
        return None
    dot, init = inst.operands
    if dot.opcode != "dot" or users.get(dot) != 1 or dot.shape.dtype != inst.shape.dtype \
            or not _adds(inst.attrs["to_apply"]) or uniform_value(init) != 0:
        return None
    a = dot.attrs
    lhs_batch, rhs_batch = a.get("lhs_batch_dims", []), a.get("rhs_batch_dims", [])
    summed = sorted(inst.attrs["dimensions"])
    if not summed or summed[-1] >= len(lhs_batch):     # (the dot's batch dims lead its output)
        return None
    kept = [i for i in range(len(lhs_batch)) if i not in summed]
    attrs = {**a,
             "lhs_contracting_dims": tuple(lhs_batch[i] for i in summed)
             + tuple(a["lhs_contracting_dims"]),
             "rhs_contracting_dims": tuple(rhs_batch[i] for i in summed)
             + tuple(a["rhs_contracting_dims"]),
             "lhs_batch_dims": tuple(lhs_batch[i] for i in kept),
             "rhs_batch_dims": tuple(rhs_batch[i] for i in kept)}
    if not kept:
        del attrs["lhs_batch_dims"], attrs["rhs_batch_dims"]
    if gemm_layout(*(x.shape.dims for x in dot.operands), attrs) is None:
        return None       # (the folded dot would be one long loop-kernel reduction)
    new = Instruction(names("dot"), "dot", inst.shape, list(dot.operands), attrs)
    emit(new)
    return new


def _adds(computation):
    root = computation.root
    return root.opcode == "add" and sorted(
        op.parameter_number for op in root.operands if op.opcode == "parameter") == [0, 1]
