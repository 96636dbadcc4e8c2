"""Whether a step traced for any batch size is row-wise: each output row made
from the same row of its batch inputs alone, by the same program at every
batch size (a predict step, as most are), so that the program compiled for
one batch size serves every other (step.py pads or splits the batch).

Proved on the bridge's HLO of the step traced with its leading dims open, at
the compiled batch size and at the new one (hlo/rows.py): the step must be
one compiled cluster that updates no variable.
"""
import tensorflow as tf

from ..hlo.rows import rows_independent
from .functional import UnsupportedGraph, functionalize
from .plan import build_program


def row_wise(open_concrete, backend, row_leaves, compiled_shapes, new_shapes):
    """Whether the step (`open_concrete`: traced with leading dims open) is
    row-wise in its flat inputs numbered `row_leaves`, between the flat input
    shapes it was compiled for and new ones."""
    try:
        fg = functionalize(open_concrete)
        program = build_program(fg, backend, race=False)
    except UnsupportedGraph:
        return False
    if len(program.clusters) != 1 or fg.state_outputs:
        return False
    (cluster,) = program.clusters
    if cluster.kind != "compiled" or cluster.specializer.hlo_fn is None \
            or any(t not in cluster.outputs for t in fg.outputs):
        return False
    leaf = {t: j for j, t in enumerate(fg.inputs)}
    rows = {p for p, t in enumerate(cluster.inputs) if leaf.get(t) in row_leaves}
    # A checked step's last output, its input checks' verdict, is all of the rows' checks:
    # the padding's rows repeat real ones, and the splits' verdicts are combined.
    exempt = {cluster.outputs.index(fg.outputs[-1])} if fg.checked else set()

    def hlo(shapes):
        specs = [tf.TensorSpec(shapes[leaf[t]], fg.specs[t].dtype) if t in leaf
                 else fg.specs[t] for t in cluster.inputs]
        return cluster.specializer.hlo_fn(specs)
    try:
        compiled, new = hlo(compiled_shapes), hlo(new_shapes)
    except Exception:       # (the bridge refused a shape: not this way, then)
        return False
    return rows_independent(compiled, new, rows, exempt)
