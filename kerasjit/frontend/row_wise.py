"""Whether a step traced for any batch size is row-wise: each output row made
from the same row of its batch inputs alone, by the same program at every
batch size (a predict step, as most are), so that the program compiled for
one batch size serves every other (step.py pads or splits the batch).

Proved on the bridge's HLO of the step traced with its leading dims open, at
the compiled batch size and at the new one (hlo/rows.py): the step must be
one compiled cluster that updates no variable, and the program compiled for
its batch size (traced for that size) must be the open trace's at that size
once kerasjit's passes have folded the latter's shape arithmetic.
"""
import tensorflow as tf

from ..hlo.rows import rows_independent, same_program
from .functional import UnsupportedGraph, functionalize
from .plan import build_program


class RowWiseProof:
    """Whether the step (`open_concrete`: traced with leading dims open) is
    row-wise in its flat inputs numbered `row_leaves`, between the flat input
    shapes `compiled_shapes` that `running` (the step's Program of one
    compiled cluster, traced for them) was compiled for and new ones. What
    depends on the pair alone is made once; `serves(new_shapes)` bridges and
    reads one new size."""

    def __init__(self, open_concrete, backend, row_leaves, running, compiled_shapes):
        self.at_compiled = None         # (None: the step is not row-wise at any size)
        try:
            fg = functionalize(open_concrete)
            program = build_program(fg, backend, race=False)
        except UnsupportedGraph:
            return
        compiled = running.clusters[0]
        # (a step's own assertions may check the batch as a whole: its verdict, which
        # decides whether a split's outputs stand, is proved only for index checks)
        if len(program.clusters) != 1 or fg.state_outputs \
                or len(compiled.specializer.cache) != 1 or fg.asserts or running.asserts \
                or _wiring(program, program.clusters[0]) != _wiring(running, compiled):
            return
        (cluster,) = program.clusters
        if cluster.kind != "compiled" or cluster.specializer.hlo_fn is None \
                or any(t not in cluster.outputs for t in fg.outputs):
            return
        self.fg, self.cluster = fg, cluster
        self.leaf = {t: j for j, t in enumerate(fg.inputs)}
        self.rows = {p for p, t in enumerate(cluster.inputs) if self.leaf.get(t) in row_leaves}
        # A checked step's last output is its input checks' verdict.
        self.verdict = cluster.outputs.index(fg.outputs[-1]) if fg.checked else None
        (compiled_key,) = compiled.specializer.cache
        try:
            # The program that runs was traced for its batch size: the proof holds for
            # it where the two are the same program once kerasjit's passes have folded
            # the shape arithmetic of the trace for any size (no Python branch on it).
            running_hlo = compiled.specializer.hlo_fn(
                [tf.TensorSpec(s, d) for s, d in compiled_key], True)
            if same_program(running_hlo, self._hlo(compiled_shapes, True), self.verdict):
                self.at_compiled = self._hlo(compiled_shapes)
        except Exception:       # (the bridge refused a shape: not this way, then)
            pass

    def serves(self, new_shapes):
        if self.at_compiled is None:
            return False
        try:
            new = self._hlo(new_shapes)
        except Exception:       # (as above)
            return False
        return rows_independent(self.at_compiled, new, self.rows, self.verdict)

    def _hlo(self, shapes, optimized=False):
        specs = [tf.TensorSpec(shapes[self.leaf[t]], self.fg.specs[t].dtype) if t in self.leaf
                 else self.fg.specs[t] for t in self.cluster.inputs]
        return self.cluster.specializer.hlo_fn(specs, optimized)


def _wiring(program, cluster):
    """What a program's one cluster reads and makes, by role: each input a
    step argument or a variable (by number), each output the step outputs
    it is (by position)."""
    def source(t):
        if t in program.inputs:
            return "argument", program.inputs.index(t)
        if t in program.state_inputs:
            return "variable", program.state_inputs.index(t)
        return "other", None
    return ([source(t) for t in cluster.inputs],
            [tuple(i for i, o in enumerate(program.outputs) if o == t) for t in cluster.outputs])
