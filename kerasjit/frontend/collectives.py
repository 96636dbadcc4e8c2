"""All-reduces whose members are all in the step become plain arithmetic.

Under a strategy of one process (MirroredStrategy over a host's devices) the
replicas' steps are traced together, so every member of an all-reduce is a
node of the step: the result is the members' inputs merged (and divided by
their number for a mean), which compiles with the rest of the step, as XLA
compiles an all-reduce within one program. Across workers, or with a member
missing, the collective stays TensorFlow's.
"""
import heapq

import numpy as np
import tensorflow as tf

from .nodes import Builder, node, node_name, tensor_name

_MERGES = {b"Add": "AddV2", b"Mul": "Mul", b"Max": "Maximum", b"Min": "Minimum"}


def local_all_reduces(fg):
    """`fg` with each all-reduce whose members it holds all of computed in place."""
    by_name = {n.name: n for n in fg.nodes}

    def constant(tensor):
        made = by_name.get(node_name(tensor))
        return None if made is None or made.op != "Const" else \
            tf.make_ndarray(made.attr["value"].tensor).item()

    groups = {}
    for n in fg.nodes:
        if n.op == "CollectiveReduceV2" and n.attr["merge_op"].s in _MERGES \
                and n.attr["final_op"].s in (b"Id", b"Div"):
            size, group, instance = (constant(t) for t in n.input[1:4])
            if None not in (size, group, instance):
                groups.setdefault((n.attr["merge_op"].s, n.attr["final_op"].s, size, group,
                                   instance), []).append(n)
    replacements = {}
    for (merge, final, size, _, _), members in groups.items():
        if len(members) == size:
            replacements.update(_merged(members, merge, final, fg.specs))
    if not replacements:
        return fg
    nodes = []
    for n in fg.nodes:
        nodes.extend(replacements.get(n.name, [n]))
    fg.nodes = _topological(nodes)
    return fg


def _merged(members, merge, final, specs):
    """{member name: nodes}: the first member's entry computes the reduction,
    and each member becomes an Identity of it (its readers unchanged)."""
    dtype = tf.as_dtype(members[0].attr["T"].type)
    shape = specs[tensor_name(members[0].name)].shape
    b = Builder(members[0].name + "/kerasjit_all_reduce", specs)
    value = members[0].input[0]
    for k, member in enumerate(members[1:]):
        value = b.op(f"merge_{k}", _MERGES[merge], [value, member.input[0]], shape, dtype,
                     T=dtype).name
    if final == b"Div":
        count = b.const("members", np.asarray(len(members), dtype.as_numpy_dtype))
        value = b.op("mean", "RealDiv", [value, count], shape, dtype, T=dtype).name
    copies = {m.name: [node(m.name, "Identity", [value], T=dtype)] for m in members}
    copies[members[0].name] = b.nodes + copies[members[0].name]
    return copies


def _topological(nodes):
    """`nodes` reordered so each comes after its inputs, otherwise as given."""
    position = {n.name: i for i, n in enumerate(nodes)}
    waiting = [{node_name(i) for i in n.input} & position.keys() for n in nodes]
    readers = {}
    for i, needs in enumerate(waiting):
        for name in needs:
            readers.setdefault(name, []).append(i)
    ready = [i for i, needs in enumerate(waiting) if not needs]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for r in readers.get(nodes[i].name, ()):
            waiting[r].discard(nodes[i].name)
            if not waiting[r]:
                heapq.heappush(ready, r)
    return order
