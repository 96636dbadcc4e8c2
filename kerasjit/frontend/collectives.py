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
from tensorflow.python.framework import op_def_registry

from .nodes import Builder, node, node_name, tensor_name

# A strategy's cross-replica ops: TensorFlow runs them, on the devices they name,
# the members of one collective in one cluster (each waits for the others).
COLLECTIVES = {"CollectiveReduceV2", "CollectiveGatherV2", "CollectiveBcastSendV2",
               "CollectiveBcastRecvV2", "CollectiveAllToAllV2", "CollectiveReduce",
               "CollectiveGather", "CollectiveBcastSend", "CollectiveBcastRecv",
               "NcclAllReduce", "NcclReduce", "NcclBroadcast"}
_MERGES = {b"Add": "AddV2", b"Mul": "Mul", b"Max": "Maximum", b"Min": "Minimum"}


def _constant(by_name, tensor):
    """The value of a Const tensor, else None."""
    made = by_name.get(node_name(tensor))
    return None if made is None or made.op != "Const" else \
        tf.make_ndarray(made.attr["value"].tensor).item()


def collective_instance(n, by_name):
    """What identifies the collective `n` takes part in (its group and instance
    keys, or NCCL's shared name), shared by its members alone; None for other
    ops, or where a key is known only at run time."""
    if n.op not in COLLECTIVES:
        return None
    if "shared_name" in n.attr:
        return n.attr["shared_name"].s
    if "instance_key" in n.attr:
        return n.attr["group_key"].i, n.attr["instance_key"].i
    arguments = [a.name for a in op_def_registry.get(n.op).input_arg]
    keys = tuple(_constant(by_name, n.input[arguments.index(k)])
                 for k in ("group_key", "instance_key"))
    return None if None in keys else keys


def local_all_reduces(fg):
    """`fg` with each all-reduce whose members it holds all of computed in place."""
    by_name = {n.name: n for n in fg.nodes}
    groups = {}
    for n in fg.nodes:
        if n.op == "CollectiveReduceV2" and n.attr["merge_op"].s in _MERGES \
                and n.attr["final_op"].s in (b"Id", b"Div"):
            instance, size = collective_instance(n, by_name), _constant(by_name, n.input[1])
            if instance is not None and size is not None:
                groups.setdefault((n.attr["merge_op"].s, n.attr["final_op"].s, size, instance),
                                  []).append(n)
    replacements = {}
    for (merge, final, size, _), members in groups.items():
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
