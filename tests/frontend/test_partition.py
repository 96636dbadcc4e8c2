"""Tests for kerasjit.frontend.partition (pure Python, no TensorFlow)."""
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kerasjit.frontend import partition as partition_module
from kerasjit.frontend.partition import Cluster, Node, partition


def C(name, *inputs, ctrl=()):
    return Node(name, tuple(inputs), tuple(ctrl))


def U(name, *inputs, ctrl=(), reason="unsupported op"):
    return Node(name, tuple(inputs), tuple(ctrl), compilable=False, reason=reason)


def groups(clusters):
    """Grouping as a set of (kind, frozenset of names): comparable regardless of ids."""
    return {(c.kind, frozenset(c.nodes)) for c in clusters}


def cluster_of(clusters):
    return {n: i for i, c in enumerate(clusters) for n in c.nodes}


def check_invariants(nodes, clusters):
    """Everything the contract promises, checked from the original edges."""
    by_name = {n.name: n for n in nodes}
    where = cluster_of(clusters)
    # Each node in exactly one cluster.
    assert sorted(where) == sorted(by_name)
    assert sum(len(c.nodes) for c in clusters) == len(nodes)
    for i, c in enumerate(clusters):
        assert c.nodes, "empty cluster"
        assert c.kind in ("compiled", "tensorflow")
        # Kind-homogeneous.
        assert all(by_name[n].compilable == (c.kind == "compiled") for n in c.nodes)
        # Nodes inside a cluster in topological order.
        pos = {n: k for k, n in enumerate(c.nodes)}
        for n in c.nodes:
            for src in by_name[n].inputs + by_name[n].control_inputs:
                if where[src] == i:
                    assert pos[src] < pos[n]
    # Every inter-cluster edge goes forward in the returned order: this proves
    # both that the order is topological and that the cluster graph is acyclic.
    for n in nodes:
        for src in n.inputs + n.control_inputs:
            assert where[src] <= where[n.name]


def cluster_edges(nodes, clusters):
    where = cluster_of(clusters)
    succ = {i: set() for i in range(len(clusters))}
    for n in nodes:
        for src in n.inputs + n.control_inputs:
            if where[src] != where[n.name]:
                succ[where[src]].add(where[n.name])
    return succ


def check_maximal(nodes, clusters):
    """Two same-kind nodes joined by an edge but left in different clusters
    must be kept apart by a path through a third cluster (else merge was safe)."""
    by_name = {n.name: n for n in nodes}
    where = cluster_of(clusters)
    succ = cluster_edges(nodes, clusters)
    for n in nodes:
        for src in n.inputs + n.control_inputs:
            a, b = where[src], where[n.name]
            if a == b or by_name[src].compilable != n.compilable:
                continue
            stack = [s for s in succ[a] if s != b]
            seen = set(stack)
            while stack and b not in seen:
                for y in succ[stack.pop()]:
                    if y not in seen:
                        seen.add(y)
                        stack.append(y)
            assert b in seen, f"{src} -> {n.name} could have been merged"


# --- Ported from tensorflow/compiler/jit/mark_for_compilation_pass_test.cc ---


def test_tf_chains():
    # TF "Chains": A(UncompilableNullary) -> B(Relu) -> C(Relu)
    #   -> D(UncompilableUnary) -> E(Relu) -> F(Relu).
    # TF expects clusters {B, C} and {E, F}, distinct, and A, D unclustered.
    nodes = [U("A"), C("B", "A"), C("C", "B"), U("D", "C"), C("E", "D"), C("F", "E")]
    out = partition(nodes)
    # Ours additionally returns A and D as separate "tensorflow" clusters: they
    # are not adjacent (B, C sit between), so they cannot merge.
    assert [(c.kind, c.nodes) for c in out] == [
        ("tensorflow", ["A"]),
        ("compiled", ["B", "C"]),
        ("tensorflow", ["D"]),
        ("compiled", ["E", "F"]),
    ]
    check_invariants(nodes, out)


def test_tf_uncompilable_cycles():
    # TF "UncompilableCycles": A(Const) -> B(UncompilableUnary), C = MatMul(A, B).
    # TF expects no clusters at all: A and C cannot merge (A -> B -> C would
    # become a cycle) and TF drops the resulting size-1 clusters (min cluster
    # size).  We keep singleton compiled clusters, so we expect A and C as two
    # separate compiled clusters, with B in TF between them.
    nodes = [C("A"), U("B", "A"), C("C", "A", "B")]
    out = partition(nodes)
    assert [(c.kind, c.nodes) for c in out] == [
        ("compiled", ["A"]),
        ("tensorflow", ["B"]),
        ("compiled", ["C"]),
    ]
    check_invariants(nodes, out)


def test_tf_compilable_cycles():
    # TF "CompilableCycles": same shape with B = Relu: all three in one cluster.
    nodes = [C("A"), C("B", "A"), C("C", "A", "B")]
    assert groups(partition(nodes)) == {("compiled", frozenset("ABC"))}


# --- Other shapes -----------------------------------------------------------


def test_classic_cycle_case_not_merged():
    # A -> B(uncompilable) -> C and A -> C: merging A, C would give a cycle.
    nodes = [C("A"), U("B", "A"), C("C", "B", "A")]
    out = partition(nodes)
    where = cluster_of(out)
    assert where["A"] != where["C"]
    check_invariants(nodes, out)
    check_maximal(nodes, out)


def test_diamond_all_compilable():
    nodes = [C("A"), C("B", "A"), C("C", "A"), C("D", "B", "C")]
    assert groups(partition(nodes)) == {("compiled", frozenset("ABCD"))}


def test_diamond_with_uncompilable_branch():
    # A -> B(unc) -> D and A -> C -> D.  A+C merge first (topological order),
    # then {A,C} -> D is refused because of the path through B.
    nodes = [C("A"), U("B", "A"), C("C", "A"), C("D", "B", "C")]
    out = partition(nodes)
    assert [(c.kind, c.nodes) for c in out] == [
        ("compiled", ["A", "C"]),
        ("tensorflow", ["B"]),
        ("compiled", ["D"]),
    ]
    check_invariants(nodes, out)
    check_maximal(nodes, out)


def test_diamond_uncompilable_ends():
    # A(unc) -> B, C -> D(unc): the ends cannot merge (that would cycle
    # through B).  B and C share no edge; TF (which only contracts edges)
    # would leave them apart, but no path joins them, so we merge them into
    # one compiled call.
    nodes = [U("A"), C("B", "A"), C("C", "A"), U("D", "B", "C")]
    out = partition(nodes)
    assert [(c.kind, c.nodes) for c in out] == [
        ("tensorflow", ["A"]),
        ("compiled", ["B", "C"]),
        ("tensorflow", ["D"]),
    ]
    # With an edge B -> C the compiled middle becomes one cluster.
    nodes = [U("A"), C("B", "A"), C("C", "A", "B"), U("D", "B", "C")]
    assert groups(partition(nodes)) == {
        ("tensorflow", frozenset("A")), ("compiled", frozenset("BC")),
        ("tensorflow", frozenset("D"))}


def test_refused_merge_retried_after_other_merges():
    # Edge order makes A-C be tried before B-C; the path A -> B -> C blocks it
    # at first, but once B joins C the edge A -> {B, C} is direct again.
    nodes = [C("A"), C("C", "A", "B"), C("B", "A")]
    assert groups(partition(nodes)) == {("compiled", frozenset("ABC"))}


def test_control_edges_merge_and_order():
    # Control edges count for merging...
    nodes = [C("A"), C("B", ctrl=["A"])]
    assert groups(partition(nodes)) == {("compiled", frozenset("AB"))}
    # ...and for cycle detection: A -ctrl-> B(unc) -> C, A -> C.
    nodes = [C("A"), U("B", ctrl=["A"]), C("C", "A", "B")]
    out = partition(nodes)
    assert [c.nodes for c in out] == [["A"], ["B"], ["C"]]
    # ...and for cluster order: X must run after the cluster holding Y.
    nodes = [U("X", ctrl=["Y"]), C("Y")]
    out = partition(nodes)
    assert [c.nodes for c in out] == [["Y"], ["X"]]
    check_invariants(nodes, out)


def test_tensorflow_runs_merge_with_reasons():
    nodes = [U("U1", reason="r1"), U("U2", "U1", reason="r2"), U("U3", "U2"), C("X", "U3")]
    out = partition(nodes)
    assert out[0] == Cluster("tensorflow", ["U1", "U2", "U3"], "U1: r1; U2: r2; U3: unsupported op")
    assert out[1] == Cluster("compiled", ["X"], "")


def test_tensorflow_merge_refused_across_compiled():
    # U1 -> X(compiled) -> U2 and U1 -> U2: the TF nodes must stay apart.
    nodes = [U("U1"), C("X", "U1"), U("U2", "X", "U1")]
    out = partition(nodes)
    assert [c.nodes for c in out] == [["U1"], ["X"], ["U2"]]


def test_compiled_merges_take_priority_over_tensorflow_merges():
    # U1 -> U2 and C1 -> C2 with cross edges U1 -> C2, C1 -> U2.  Only one of
    # the two pairs can merge; compiled clusters are formed first.
    nodes = [U("U1"), C("C1"), U("U2", "U1", "C1"), C("C2", "C1", "U1")]
    assert groups(partition(nodes)) >= {("compiled", frozenset(["C1", "C2"]))}


def test_input_order_need_not_be_topological():
    nodes = [C("C", "B"), C("B", "A"), C("A")]
    out = partition(nodes)
    assert out == [Cluster("compiled", ["A", "B", "C"])]


def test_duplicate_inputs_and_empty_graph():
    assert partition([]) == []
    out = partition([C("A"), C("B", "A", "A", ctrl=["A"])])
    assert out == [Cluster("compiled", ["A", "B"])]


def test_errors():
    with pytest.raises(ValueError, match="cycle: .*A"):
        partition([C("A", "B"), C("B", "A")])
    with pytest.raises(ValueError, match="cycle"):
        partition([C("A", "A")])
    with pytest.raises(ValueError, match="cycle: C -> B -> C"):
        partition([C("A"), C("B", "A", "C"), C("C", "B"), C("D", "C")])
    with pytest.raises(ValueError, match="cycle"):
        partition([C("A"), U("B", ctrl=["C"]), C("C", "B")])
    with pytest.raises(ValueError, match="unknown node 'Z'"):
        partition([C("A", "Z")])
    with pytest.raises(ValueError, match="unknown node 'Z'"):
        partition([C("A", ctrl=["Z"])])
    with pytest.raises(ValueError, match="duplicate"):
        partition([C("A"), C("A")])


def test_deterministic():
    nodes = random_dag(random.Random(0), 300)
    first = partition(nodes)
    assert partition(list(nodes)) == first
    assert partition([Node(n.name, n.inputs, n.control_inputs, n.compilable, n.reason)
                      for n in nodes]) == first


# --- Random graphs ----------------------------------------------------------


def random_dag(rng, n, p_unc=0.3, max_in=3, p_ctrl=0.1, shuffle=True):
    names = [f"n{i}" for i in range(n)]
    nodes = []
    for i in range(n):
        k = rng.randint(0, min(i, max_in))
        ins = tuple(names[j] for j in rng.sample(range(i), k))
        ctrl = tuple(names[j] for j in range(max(0, i - 5), i) if rng.random() < p_ctrl)
        unc = rng.random() < p_unc
        nodes.append(Node(names[i], ins, ctrl, not unc, "why" if unc else ""))
    if shuffle:
        rng.shuffle(nodes)
    return nodes


@st.composite
def dags(draw):
    n = draw(st.integers(0, 25))
    names = [f"n{i}" for i in range(n)]
    nodes = []
    for i in range(n):
        ins = draw(st.lists(st.integers(0, i - 1), max_size=3)) if i else []
        ctrl = draw(st.lists(st.integers(0, i - 1), max_size=1)) if i else []
        comp = draw(st.booleans())
        nodes.append(Node(names[i], tuple(names[j] for j in ins),
                          tuple(names[j] for j in ctrl), comp))
    return draw(st.permutations(nodes))


@settings(max_examples=400, deadline=None)
@given(dags())
def test_property_random_dags(nodes):
    out = partition(nodes)
    check_invariants(nodes, out)
    check_maximal(nodes, out)
    assert partition(nodes) == out


@pytest.mark.parametrize("seed", range(5))
def test_larger_random_dags(seed):
    nodes = random_dag(random.Random(seed), 400, max_in=4)
    out = partition(nodes)
    check_invariants(nodes, out)
    check_maximal(nodes, out)


@pytest.mark.parametrize("seed", range(5))
def test_an_all_compilable_graph_is_the_one_cluster_the_merges_make(seed):
    """A graph of compilable nodes only is one compiled cluster, in the order
    the merges would give it (the same graph with an unconnected TensorFlow
    node beside it takes the merging path)."""
    nodes = random_dag(random.Random(seed), 400, p_unc=0.0, max_in=4)
    [cluster] = partition(nodes)
    check_invariants(nodes, [cluster])
    merged = [c for c in partition(nodes + [U("beside")]) if c.kind == "compiled"]
    assert merged == [cluster]


# --- Performance ------------------------------------------------------------
#
# Counted, not timed: the work of partition() is the adjacency sets of the
# cluster graph it looks up (each merge's cycle check searches them) and the
# merges it tries (a pass over the edges per round of merging). Both stay
# proportional to the graph's size. Cycle checks that searched past the window
# of ranks between the two clusters would look up 160 and 320 sets per node
# and edge on the transformer and random graphs below (square growth), rounds
# that did not settle would try merges over the edges again and again.
LOOKUPS_PER_NODE_AND_EDGE = 100     # 4 to 40 for the graphs below
MERGES_PER_EDGE = 3                 # 2 passes over a chain's edges, fewer elsewhere


@pytest.fixture
def work(monkeypatch):
    """partition()'s work, counted: adjacency sets of the cluster graph looked
    up ("lookups") and merges tried ("merges")."""
    counts = {"lookups": 0, "merges": 0}

    class Counted(list):
        def __getitem__(self, index):
            counts["lookups"] += 1
            return super().__getitem__(index)

    class CountedDAG(partition_module._ClusterDAG):
        def __init__(self, preds):
            super().__init__(preds)
            self.succ, self.pred = Counted(self.succ), Counted(self.pred)

        def try_merge(self, u, v):
            counts["merges"] += 1
            return super().try_merge(u, v)
    monkeypatch.setattr(partition_module, "_ClusterDAG", CountedDAG)
    return counts


def transformer_like(layers, per_layer=30, unc_every=7):
    """Residual blocks: a chain with skip connections, some uncompilable ops
    sprinkled in, plus per-layer constants feeding the chain."""
    nodes, prev, k = [], None, 0
    for _ in range(layers):
        block_in = prev
        for j in range(per_layer):
            k += 1
            const = f"w{k}"
            nodes.append(C(const))
            ins = [x for x in (prev, const) if x]
            if j == per_layer - 1 and block_in:
                ins.append(block_in)  # residual add
            name = f"op{k}"
            nodes.append(U(name, *ins) if k % unc_every == 0 else C(name, *ins))
            prev = name
    return nodes


@pytest.mark.parametrize("make", [
    lambda: [C("n0")] + [C(f"n{i}", f"n{i-1}") for i in range(1, 3000)],
    lambda: [C("n0")] + [U(f"n{i}", f"n{i-1}") if i % 10 == 0 else C(f"n{i}", f"n{i-1}")
                         for i in range(1, 3000)],
    lambda: transformer_like(50),  # 3000 nodes
    lambda: random_dag(random.Random(1), 3000, max_in=3),
], ids=["chain", "chain-with-tf", "transformer", "random"])
def test_performance_3000_nodes(make, work):
    nodes = make()
    assert len(nodes) == 3000
    out = partition(nodes)
    check_invariants(nodes, out)
    edges = sum(len(set(n.inputs + n.control_inputs)) for n in nodes)
    assert work["lookups"] <= LOOKUPS_PER_NODE_AND_EDGE * (len(nodes) + edges), \
        f"partition looked up {work['lookups']} adjacency sets for {len(nodes)} nodes, " \
        f"{edges} edges"
    assert work["merges"] <= MERGES_PER_EDGE * edges, \
        f"partition tried {work['merges']} merges over {edges} edges"
