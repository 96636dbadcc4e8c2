"""Clustering of a TensorFlow graph into compiled (XLA) and TensorFlow parts.

Pure-Python graph algorithm (no TensorFlow import), in the spirit of TF's
mark_for_compilation_pass: nodes are merged along edges with union-find, and
a merge is accepted only if the graph of clusters stays acyclic.  The cluster
DAG keeps a topological rank per cluster (Pearce-Kelly dynamic topological
order, as TF's GraphCycles does), so the "is there another path?" search only
visits clusters ranked between the two endpoints.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from ..errors import UnsupportedGraph


@dataclass(frozen=True)
class Node:
    name: str
    inputs: tuple  # names of nodes whose outputs this node consumes (data edges)
    control_inputs: tuple = ()  # names of control predecessors (ordering edges)
    compilable: bool = True
    reason: str = ""  # why not compilable (kept for explain())
    together: object = None  # nodes with one such key run in one cluster (a collective's members)


@dataclass
class Cluster:
    kind: str  # "compiled" or "tensorflow"
    nodes: list  # node names, in a topological order of the original graph
    reason: str = ""  # for "tensorflow" clusters: the reasons of its nodes, joined


def _toposort(nodes):
    """Return (order, preds): a topological order of node indices and, per
    node index, its distinct predecessor indices (data first, then control).
    Ties are broken by position in `nodes`, so the result is deterministic."""
    index = {}
    for i, n in enumerate(nodes):
        if n.name in index:
            raise ValueError(f"duplicate node name {n.name!r}")
        index[n.name] = i
    preds = []
    for n in nodes:
        ps = []
        for src in (*n.inputs, *n.control_inputs):
            if src not in index:
                raise ValueError(f"node {n.name!r} references unknown node {src!r}")
            ps.append(index[src])
        preds.append(list(dict.fromkeys(ps)))  # dedupe, keep order
    succs = [[] for _ in nodes]
    for v, ps in enumerate(preds):
        for u in ps:
            succs[u].append(v)
    indeg = [len(ps) for ps in preds]
    heap = [i for i, d in enumerate(indeg) if d == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        u = heapq.heappop(heap)
        order.append(u)
        for v in succs[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(heap, v)
    if len(order) < len(nodes):
        # Every unsorted node has an unsorted predecessor; walking those
        # backwards must revisit a node, which yields a concrete cycle to report.
        left = {i for i, d in enumerate(indeg) if d > 0}
        path, seen, v = [], {}, min(left)
        while v not in seen:
            seen[v] = len(path)
            path.append(v)
            v = next(u for u in preds[v] if u in left)
        cycle = [nodes[i].name for i in reversed(path[seen[v]:])]
        raise ValueError("graph has a cycle: " + " -> ".join(cycle + cycle[:1]))
    return order, preds


class _ClusterDAG:
    """Union-find over nodes 0..n-1 (numbered in topological order) plus the
    contracted cluster graph, with a rank that is always a topological order."""

    def __init__(self, preds):
        n = len(preds)
        self.parent = list(range(n))
        self.rank = list(range(n))  # valid because ids are topologically sorted
        self.pred = [set(ps) for ps in preds]
        self.succ = [set() for _ in range(n)]
        for v, ps in enumerate(preds):
            for u in ps:
                self.succ[u].add(v)

    def find(self, x):
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]  # path halving
            x = self.parent[x]
        return x

    def _forward(self, starts, bound, target=None):
        """Clusters reachable from `starts` with rank < bound (starts included);
        returns None as soon as `target` is found."""
        seen, stack = set(starts), list(starts)
        while stack:
            for y in self.succ[stack.pop()]:
                if y not in seen and self.rank[y] < bound:
                    if y == target:
                        return None
                    seen.add(y)
                    stack.append(y)
        return seen

    def _backward(self, starts, bound, target=None):
        """Clusters that reach `starts` with rank > bound (starts included);
        returns None as soon as `target` is found."""
        seen, stack = set(starts), list(starts)
        while stack:
            for y in self.pred[stack.pop()]:
                if y not in seen and self.rank[y] > bound:
                    if y == target:
                        return None
                    seen.add(y)
                    stack.append(y)
        return seen

    def _other_path(self, a, b):
        """Whether a path leads from cluster a to b (ranked after a) through a
        third cluster. Such a path only visits clusters ranked between the
        two; it is searched from the end with fewer edges (a large cluster's
        successors are many, a node's predecessors few)."""
        rank = self.rank
        if len(self.succ[a]) <= len(self.pred[b]):
            starts = [s for s in self.succ[a] if s != b and rank[s] < rank[b]]
            return bool(starts) and self._forward(starts, rank[b] + 1, target=b) is None
        starts = [p for p in self.pred[b] if p != a and rank[p] > rank[a]]
        return bool(starts) and self._backward(starts, rank[a] - 1, target=a) is None

    def try_merge(self, u, v):
        """Merge the clusters of u and v (an edge u -> v, or none, and u ranked
        first) unless that would create a cycle, i.e. unless another path
        leads from one to the other through a third cluster.  Returns True if
        merged."""
        a, b = self.find(u), self.find(v)
        if a == b:
            return False
        if self._other_path(a, b):
            return False
        # Contract b into a: b's successors rank above b > a, so they stay
        # valid; b's predecessors may rank above a and need re-ordering.
        self.parent[b] = a
        for s in self.succ[b]:
            self.pred[s].discard(b)
            self.pred[s].add(a)
            self.succ[a].add(s)
        for p in self.pred[b]:
            self.succ[p].discard(b)
        moved = sorted(self.pred[b] - {a})
        self.succ[b], self.pred[b] = set(), set()
        for p in moved:
            self._insert_edge(p, a)
        return True

    def _insert_edge(self, x, y):
        """Add x -> y (known not to close a cycle), restoring the rank order
        Pearce-Kelly style: the affected window is re-ranked so that the
        ancestors of x come before the descendants of y."""
        self.succ[x].add(y)
        self.pred[y].add(x)
        rank = self.rank
        if rank[x] < rank[y]:
            return
        fwd = sorted(self._forward([y], rank[x]), key=rank.__getitem__)
        bwd = sorted(self._backward([x], rank[y]), key=rank.__getitem__)
        slots = sorted(rank[c] for c in fwd + bwd)
        for c, r in zip(bwd + fwd, slots):
            rank[c] = r


def _merge_unconnected_compiled(dag, tnodes):
    """Merge compiled clusters that no path connects, so a step makes one
    compiled call where TF's edge-only contraction would leave several
    (e.g. the optimizer's iteration counter, fed only by its variable).
    Two clusters without a path between them can never close a cycle."""
    roots = sorted({dag.find(v) for v, n in enumerate(tnodes) if n.compilable},
                   key=dag.rank.__getitem__)
    # Into the first cluster, else into the one before (two clusters after a
    # TensorFlow one, such as the updates of two replicas after their all-reduce):
    # two tries per cluster, not one per pair.
    for before, r in zip(roots, roots[1:]):
        for other in (roots[0], before):
            a, b = sorted((dag.find(other), dag.find(r)), key=dag.rank.__getitem__)
            if a != b and dag.try_merge(a, b):
                break


def _merge_together(dag, tnodes):
    """One cluster for the nodes of each `together` key: the members of one
    collective wait for each other, so none may run before the others start."""
    groups = {}
    for v, n in enumerate(tnodes):
        if n.together is not None:
            groups.setdefault(n.together, []).append(v)
    for members in groups.values():
        for v in members[1:]:
            a, b = sorted((dag.find(members[0]), dag.find(v)), key=dag.rank.__getitem__)
            if a != b and not dag.try_merge(a, b):
                raise UnsupportedGraph(
                    f"{tnodes[members[0]].name} and {tnodes[v].name} must run in one "
                    "cluster, but one depends on the other's cluster")


def partition(nodes: list[Node]) -> list[Cluster]:
    """Partition a DAG into clusters, returned in an order in which they can run."""
    nodes = list(nodes)
    order, preds = _toposort(nodes)
    if all(n.compilable and n.together is None for n in nodes):
        # What the merges below come to, without them (a large step's usual
        # case, and their costliest: every merge scans the growing cluster's
        # successors): one compiled cluster, in topological order.
        return [Cluster("compiled", [nodes[i].name for i in order])] if nodes else []
    # Renumber nodes by topological position so initial ranks are just ids.
    pos = {old: new for new, old in enumerate(order)}
    tnodes = [nodes[i] for i in order]
    tpreds = [[pos[u] for u in preds[i]] for i in order]
    dag = _ClusterDAG(tpreds)

    # Compiled clusters first: merging TF nodes can add paths that would then
    # forbid compiled merges, and large compiled clusters matter most.  Repeat
    # until stable, since a merge can turn a refused edge into a direct one.
    for kind in (True, False):
        changed = True
        while changed:
            changed = False
            for v, node in enumerate(tnodes):
                if node.compilable != kind:
                    continue
                for u in tpreds[v]:
                    if tnodes[u].compilable == kind and dag.try_merge(u, v):
                        changed = True

    _merge_unconnected_compiled(dag, tnodes)
    _merge_together(dag, tnodes)

    members = {}
    for v in range(len(tnodes)):  # ascending v keeps each cluster topo-ordered
        members.setdefault(dag.find(v), []).append(v)

    # Order clusters by Kahn's algorithm, preferring the cluster whose first
    # node comes earliest, which gives a deterministic, readable order.
    indeg = {r: len(dag.pred[r]) for r in members}
    heap = [(members[r][0], r) for r, d in indeg.items() if d == 0]
    heapq.heapify(heap)
    result = []
    while heap:
        _, r = heapq.heappop(heap)
        ns = [tnodes[v] for v in members[r]]
        if ns[0].compilable:
            result.append(Cluster("compiled", [n.name for n in ns]))
        else:
            reason = "; ".join(f"{n.name}: {n.reason or 'not compilable'}" for n in ns)
            result.append(Cluster("tensorflow", [n.name for n in ns], reason))
        for s in dag.succ[r]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (members[s][0], s))
    assert len(result) == len(members), "cluster graph became cyclic"
    return result
