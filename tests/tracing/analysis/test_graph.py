"""The trace graph: data flow by tensor identity, collapsed block views, GraphML."""

from __future__ import annotations

import networkx as nx
import pytest
import torch
from helpers.tiny_models import tiny_model

import tracing
from tracing.analysis.graph import collapse, to_graphml


@pytest.fixture(scope="module")
def trace():

    torch.manual_seed(0)
    model = tiny_model(seed=None)
    return tracing.trace(model, torch.randint(0, 40, (1, 6)), capture="shapes")


def test_a_node_per_step_and_edges_by_tensor_identity(trace):
    g = trace.graph
    assert set(g.nodes) == {s.index for s in trace.steps}
    assert nx.is_directed_acyclic_graph(g)
    for u, v, data in g.edges(data=True):
        record = trace.tensor(data["tensor"])
        assert record.producer == u
        assert data["tensor"] in trace.steps[v].inputs
        assert data["shape"] == record.shape_str()
    # every consumed tensor with a producer has its edge
    for step in trace.steps:
        for i in step.inputs:
            p = trace.tensor(i).producer
            if p is not None and p != step.index:
                assert g.has_edge(p, step.index)
    attrs = g.nodes[trace.module_steps("blocks.0.self_attn")[0].index]
    assert attrs["kind"] == "module" and attrs["module"] == "blocks.0.self_attn"
    assert attrs["label"] == "self_attn (MultiHeadAttention)" and attrs["depth"] == 2
    assert attrs["shape"] == "(B=1, T=6, C=32)"


def test_residual_add_has_an_edge_from_the_block_input(trace):
    g = trace.graph
    block = trace.module_steps("blocks.1")[0]
    x = trace.tensor(block.inputs[0])
    first_add = next(s for s in trace.children_of(block.index) if s.op == "add")
    assert g.has_edge(x.producer, first_add.index)
    # the producer is the previous block's second residual add
    assert trace.steps[x.producer].module == "blocks.0" and trace.steps[x.producer].op == "add"


def test_collapse_to_blocks(trace):
    # step depth is call nesting: the ModuleList "blocks" never runs, so blocks.N is at 1
    g = collapse(trace, 1)
    blocks = [trace.module_steps(f"blocks.{i}")[0].index for i in range(2)]
    for b in blocks:
        members = g.nodes[b]["members"]
        assert members[0] == b and set(members) == set(range(b, trace.steps[b].end + 1))
        assert g.nodes[b]["path"] == trace.steps[b].module
    assert g.has_edge(blocks[0], blocks[1])
    assert not any(u == v for u, v in g.edges)
    assert nx.is_directed_acyclic_graph(g)
    # every step is in exactly one node, containers left out
    covered = [m for n in g.nodes for m in g.nodes[n]["members"]]
    assert len(covered) == len(set(covered))
    assert 0 not in g.nodes  # the root call is a container at this depth
    with_root = collapse(trace, 1, containers=True)
    assert with_root.nodes[0]["container"] is True
    assert collapse(trace, 0).number_of_nodes() == 1
    assert trace.collapsed_graph(1).number_of_edges() == g.number_of_edges()


def test_repeated_calls_stay_separate_nodes():
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(torch.relu(self.lin(x)))

    t = tracing.trace(Twice(), torch.randn(2, 3))
    g = collapse(t, 1)
    first, second = (s.index for s in t.module_steps("lin"))
    relu = next(s.index for s in t.steps if s.op == "relu")
    assert list(nx.topological_sort(g)) == [first, relu, second]
    assert g.nodes[second]["label"] == "lin (Linear) #1"


def test_graphml_round_trip(trace, tmp_path):
    path = tmp_path / "trace.graphml"
    to_graphml(trace, path)
    back = nx.read_graphml(path)
    assert back.number_of_nodes() == trace.graph.number_of_nodes()
    assert back.number_of_edges() == trace.graph.number_of_edges()
    to_graphml(trace, tmp_path / "blocks.graphml", depth=2)
    blocks = nx.read_graphml(tmp_path / "blocks.graphml")
    assert blocks.number_of_nodes() == collapse(trace, 2).number_of_nodes()
