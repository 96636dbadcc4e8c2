"""A compiled step's recipe: its Program rebuilt from the compile cache, untraced.

A warm start of a step whose code is known to be unchanged (a Keras model's
step identity, step_identity.py) needs nothing of TensorFlow's trace but what
the trace told the planner: each cluster's boundary, graph digest and
donations, the shapes it compiled for, which variables are the step's state,
the constants among its outputs and the structure of its outputs. The recipe
keeps those, as JSON; the code comes from the cache as for any warm start. A
step of several clusters keeps each cluster's GraphDef too: TensorFlow runs
its TensorFlow clusters, and its compiled ones where they race TensorFlow's
kernels or meet new shapes. A step of one compiled cluster needs none (its
race is the step's verdict, its shapes fixed by the signature).
"""
import ast
import base64
import io
import json

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from ..errors import NotCached
from ..runtime.program import Program
from . import bridge
from .nodes import called_functions
from .plan import cluster_run


def recipe_text(program, positions, out_structure, digest):
    """The recipe of `program` (positions: each state variable's index in
    the step identity's variables, None where not there), or None where it
    cannot have one."""
    graphs = len(program.clusters) > 1
    if None in positions or not all(_kept(c, graphs) for c in program.clusters):
        return None
    outputs = _outline(out_structure)
    try:
        if ast.literal_eval(outputs) != tf.nest.map_structure(_leaf, out_structure):
            return None
    except (ValueError, SyntaxError):
        return None         # (a structure of other classes than tuple, list and dict)
    return json.dumps({
        "clusters": [_cluster_record(c, graphs) for c in program.clusters],
        "inputs": program.inputs, "state_inputs": program.state_inputs,
        "outputs": program.outputs, "state_outputs": sorted(program.state_outputs.items()),
        "constants": {t: _array_text(a) for t, a in program.constants.items()},
        "checked": program.checked, "asserts": program.asserts,
        "variables": positions, "out_structure": outputs, "step_digest": digest})


def _kept(cluster, graph):
    """Whether a recipe can keep `cluster` (with its graph, if `graph`): a
    compiled one's code came from the cache or was stored there (it has a
    key); a graph it keeps calls no function (a cond's branches, a loop's
    body: TensorFlow finds those registered by the step's trace, which a
    rebuilt step has not made)."""
    if graph and (cluster.graph_def is None
                  or any(called_functions(n) for n in cluster.graph_def().node)):
        return False
    if cluster.specializer is None:
        return cluster.kind != "compiled"
    return not cluster.specializer.gave_up and all(
        e.cache_key is not None for e in cluster.specializer.cache.values())


def _cluster_record(cluster, graph):
    record = {"kind": cluster.kind, "ops": cluster.ops, "inputs": cluster.inputs,
              "outputs": cluster.outputs, "reason": cluster.reason,
              "graph": base64.b64encode(cluster.graph_def().SerializeToString()).decode()
              if graph else None}
    if cluster.specializer is not None:     # (compiled, or TensorFlow's by a race it won)
        specializer = cluster.specializer
        record.update(digest=specializer.digest, donations=sorted(specializer.donate.items()),
                      shapes=[[(list(shape), np.dtype(dtype).str) for shape, dtype in key]
                              for key in specializer.cache])
    return record


def _array_text(array):
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(array), allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode()


def _array(text):
    return np.load(io.BytesIO(base64.b64decode(text)), allow_pickle=False)


def _leaf(t):
    return None if t is None else 0


def _outline(structure):
    """The step's output structure as a Python literal, its tensors 0."""
    return repr(tf.nest.map_structure(_leaf, structure))


def _no_graph(*args):
    raise NotCached("a step rebuilt from its recipe holds no graph of this cluster")


def _graph_function(record):
    """The cluster as TensorFlow runs it, from the GraphDef its record keeps."""
    if record["graph"] is None:
        return _no_graph

    def graph_def():
        parsed = graph_pb2.GraphDef()
        parsed.ParseFromString(base64.b64decode(record["graph"]))
        return parsed
    return bridge.graph_function(graph_def, record["inputs"], record["outputs"])


def rebuilt(text, backend, cap, events, race):
    """(Program, variable positions, output structure, the step's digest) of
    a recipe, every compiled cluster's code for the shapes it met from the
    compile cache; NotCached where any of it is not there. `race`: its
    compiled clusters race TensorFlow's kernels as a planned step's would."""
    r = json.loads(text)
    rebuilding = [True]
    clusters = []
    for c in r["clusters"]:
        compiled = "digest" in c
        run = cluster_run("compiled" if compiled else c["kind"], [tuple(op) for op in c["ops"]],
                          c["inputs"], c["outputs"], c["reason"], _graph_function(c),
                          c.get("digest"), {int(i): o for i, o in c.get("donations", ())},
                          backend, cap, events, race and backend.races_tensorflow,
                          lambda: rebuilding[0])
        for shapes in c.get("shapes", ()):
            run.specializer.compile(tuple((tuple(shape), np.dtype(dtype))
                                          for shape, dtype in shapes))
        if compiled and c["kind"] != "compiled":
            # TensorFlow won its race: it stays TensorFlow's, its code kept as it
            # was (the step verdict kept in the cache is known by all the code).
            run.kind, run.race = c["kind"], None
        clusters.append(run)
    rebuilding[0] = False        # (shapes met at run time compile as usual)
    program = Program(clusters, r["inputs"], r["state_inputs"], r["outputs"],
                      {int(i): t for i, t in r["state_outputs"]},
                      {t: _array(a) for t, a in r["constants"].items()}, r["checked"],
                      r["asserts"])
    return program, r["variables"], ast.literal_eval(r["out_structure"]), r["step_digest"]
