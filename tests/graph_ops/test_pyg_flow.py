"""The direction of edges handed to PyTorch Geometric: a PyG message-passing layer on
heatformer's edges reproduces ``propagate`` when the edges are laid out for its ``flow``."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch_geometric.nn import MessagePassing, SimpleConv

import graph_helpers as gh
from heatformer.graph_ops import SparseGraph


class WeightedSum(MessagePassing):
    """``out[i] = sum over edges (j -> i) of w * x[j]``, PyG's way, for a given ``flow``."""

    def __init__(self, flow: str) -> None:
        super().__init__(aggr="add", flow=flow)

    def forward(self, x: Tensor, edge_index: Tensor, edge_weight: Tensor) -> Tensor:
        return self.propagate(edge_index, x=x, edge_weight=edge_weight)

    def message(self, x_j: Tensor, edge_weight: Tensor) -> Tensor:
        return edge_weight.unsqueeze(-1) * x_j


def _pyg(graph, x: Tensor, *, edges_for: str, layer_flow: str) -> Tensor:
    """Run a PyG layer of ``layer_flow`` on ``graph.to_edge_index(edges_for)`` (the batch as a
    disjoint union), back in the graph's ``(..., N, C)`` layout."""
    edge_index, edge_weight = graph.to_edge_index(flow=edges_for)
    out = WeightedSum(layer_flow)(x.reshape(-1, x.shape[-1]), edge_index, edge_weight)
    return out.reshape(x.shape)


@pytest.mark.parametrize("flow", ["source_to_target", "target_to_source"])
def test_a_pyg_layer_on_edges_for_its_flow_reproduces_propagate(graph_kind, flow: str) -> None:
    case = gh.make_attention(3, n=6, batch=(2, 3), masked=True, causal=True, empty_rows=(1,))
    graph = case.graph(graph_kind)
    x = torch.randn(2, 3, 6, 4, dtype=graph.dtype, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_pyg(graph, x, edges_for=flow, layer_flow=flow), graph.propagate(x))
    other = "target_to_source" if flow == "source_to_target" else "source_to_target"
    transposed = _pyg(graph, x, edges_for=flow, layer_flow=other)  # the mismatch: W^T x
    torch.testing.assert_close(transposed, graph.propagate_transpose(x))
    assert not torch.allclose(transposed, graph.propagate(x))


def test_pygs_own_simple_conv_agrees(graph_kind) -> None:
    case = gh.make_attention(6, n=7, batch=(3,), masked=True, empty_rows=(2,))
    graph = case.graph(graph_kind)
    x = torch.randn(3, 7, 2, dtype=graph.dtype, generator=torch.Generator().manual_seed(1))
    edge_index, edge_weight = graph.to_edge_index(flow="source_to_target")
    out = SimpleConv(aggr="sum")(x.reshape(-1, 2), edge_index, edge_weight).reshape(x.shape)
    torch.testing.assert_close(out, graph.propagate(x))


def test_the_default_pyg_layer_on_default_edges_computes_the_transpose() -> None:
    """The trap the ``flow`` argument exists for: PyG layers default to ``source_to_target``,
    ``to_edge_index()`` to PyG's adjacency layout (``[row; col]``, as ``to_dense_adj``)."""
    graph = gh.make_attention(4, n=5, causal=True).graph("softmax")
    x = torch.randn(5, 3, dtype=graph.dtype)
    edge_index, edge_weight = graph.to_edge_index()
    out = WeightedSum("source_to_target")(x, edge_index, edge_weight)
    torch.testing.assert_close(out, graph.propagate_transpose(x))
    fixed = graph.to_pyg(flow="source_to_target")
    out = WeightedSum("source_to_target")(x, fixed.edge_index, fixed.edge_weight)
    torch.testing.assert_close(out, graph.propagate(x))


def test_from_edge_index_reads_either_flow_back() -> None:
    graph = gh.make_attention(5, n=6, masked=True).graph("softmax").topk(3)
    for flow in ("source_to_target", "target_to_source"):
        edge_index, edge_weight = graph.to_edge_index(flow=flow)
        back = SparseGraph.from_edge_index(edge_index, edge_weight, num_nodes=6, flow=flow)
        torch.testing.assert_close(back.to_dense(), graph.to_dense(), atol=0, rtol=0)
    for call in (lambda: graph.to_edge_index(flow="both"),
                 lambda: SparseGraph.from_edge_index(edge_index, flow="rows")):  # fmt: skip
        with pytest.raises(ValueError, match="PyG's flows") as err:
            call()
        assert err.value.argument == "flow"  # type: ignore[attr-defined]
