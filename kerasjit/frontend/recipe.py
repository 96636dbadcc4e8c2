"""A compiled step's recipe: its Program rebuilt from the compile cache, untraced.

A warm start of a step whose code is known to be unchanged (a Keras model's
step identity, step_identity.py) needs nothing of TensorFlow's trace but what
the trace told the planner: the cluster's boundary, its graph's digest and
donations, the shapes it compiled for, which variables are the step's state
and the structure of its outputs. The recipe keeps those, as JSON; the code
comes from the cache as for any warm start. Only a step of one compiled
cluster has a recipe: a TensorFlow cluster needs the traced graph to run.
"""
import ast
import functools
import json

import numpy as np
import tensorflow as tf

from ..errors import NotCached
from ..runtime.program import ClusterRun, Program, Specializer
from . import bridge
from .plan import cluster_name


def recipe_text(program, positions, out_structure, digest):
    """The recipe of `program` (positions: each state variable's index in
    the step identity's variables, None where not there), or None where it
    cannot have one."""
    if len(program.clusters) != 1 or program.constants or None in positions:
        return None
    cluster = program.clusters[0]
    if cluster.kind != "compiled" or len(cluster.specializer.cache) != 1:
        return None
    outputs = _outline(out_structure)
    try:
        if ast.literal_eval(outputs) != tf.nest.map_structure(_leaf, out_structure):
            return None
    except (ValueError, SyntaxError):
        return None         # (a structure of other classes than tuple, list and dict)
    (shapes,) = cluster.specializer.cache
    executable = cluster.specializer.cache[shapes]
    if executable.cache_key is None:
        return None
    return json.dumps({
        "ops": cluster.ops, "cluster_inputs": cluster.inputs, "cluster_outputs": cluster.outputs,
        "digest": cluster.specializer.digest, "donations": sorted(cluster.specializer.donate.items()),
        "shapes": [(list(shape), np.dtype(dtype).str) for shape, dtype in shapes],
        "inputs": program.inputs, "state_inputs": program.state_inputs,
        "outputs": program.outputs, "state_outputs": sorted(program.state_outputs.items()),
        "checked": program.checked, "asserts": program.asserts,
        "variables": positions, "out_structure": outputs, "step_digest": digest})


def _leaf(t):
    return None if t is None else 0


def _outline(structure):
    """The step's output structure as a Python literal, its tensors 0."""
    return repr(tf.nest.map_structure(_leaf, structure))


def _no_graph(*specs):
    raise NotCached("a step rebuilt from its recipe has no graph to compile")


def _no_tensorflow(*args):
    raise RuntimeError("kerasjit: a step rebuilt from its recipe ran into a cluster it "
                       "cannot run in TensorFlow (it holds no graph)")


def rebuilt(text, backend, cap, events):
    """(Program, variable positions, output structure, the step's digest) of
    a recipe, its code from the compile cache; NotCached where any of it is
    not there."""
    r = json.loads(text)
    donate = {int(i): o for i, o in r["donations"]}
    hlo_fn = functools.partial(bridge.cached_hlo_module, _no_graph, r["digest"])

    def compile_for(specs):
        module = hlo_fn(specs, backend.optimizes, True)
        return module, backend.compile(module, donate, backend.optimizes, only_cached=True)
    ops = [tuple(op) for op in r["ops"]]
    cluster = ClusterRun("compiled", ops, r["cluster_inputs"], r["cluster_outputs"],
                         tf_function=_no_tensorflow)
    cluster.specializer = Specializer(compile_for, cluster_name(ops), cap, events,
                                      hlo_fn=hlo_fn, digest=r["digest"], donate=donate)
    cluster.specializer.compile(tuple((tuple(shape), np.dtype(dtype))
                                      for shape, dtype in r["shapes"]))
    program = Program([cluster], r["inputs"], r["state_inputs"], r["outputs"],
                      {int(i): t for i, t in r["state_outputs"]}, {}, r["checked"],
                      r["asserts"])
    return program, r["variables"], ast.literal_eval(r["out_structure"]), r["step_digest"]
