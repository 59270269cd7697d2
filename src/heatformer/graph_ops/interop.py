"""One graph of a batch to NetworkX, SciPy and PyTorch Geometric.

The one way to pick a single graph out of a batch is :func:`single_graph`; every conversion
that returns one graph goes through it. (The other direction is a constructor:
:meth:`DenseGraph.from_networkx <heatformer.graph_ops.DenseGraph.from_networkx>`,
:meth:`SparseGraph.from_networkx <heatformer.graph_ops.SparseGraph.from_networkx>`,
:meth:`SparseGraph.from_scipy <heatformer.graph_ops.SparseGraph.from_scipy>`,
:meth:`SparseGraph.from_edge_index <heatformer.graph_ops.SparseGraph.from_edge_index>`.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from heatformer import checks as V
from heatformer._optional import require
from heatformer.graph_ops._arrays import numel
from heatformer.graph_ops.dense import DenseGraph
from heatformer.graph_ops.protocol import Graph

if TYPE_CHECKING:
    import networkx as nx
    import scipy.sparse

__all__ = ["check_index", "single_graph", "to_networkx", "to_pyg", "to_scipy"]

Index = tuple[int, ...] | int | None


def check_index(graph: Graph, index: Index) -> int:
    """The position in the flattened batch (``0 .. Bf - 1``) of graph ``index`` of the batch.

    Args:
        graph: a batch of graphs.
        index: ``len(batch_shape)`` ints (one int for a 1-D batch; None or ``()`` for an
            unbatched graph); negative indices count from the end.

    Raises:
        ValueError: an index that does not select exactly one graph.
    """
    if index is None:
        index = ()
    if isinstance(index, int):
        index = (index,)
    batch = graph.batch_shape
    if len(index) != len(batch) or any(
        isinstance(i, bool) or not isinstance(i, int) or not -size <= i < size
        for i, size in zip(index, batch, strict=False)
    ):
        raise V.bad_value(
            "index",
            f"this graph has batch shape {tuple(batch)}; expected an index of {len(batch)} "
            f"ints in range, selecting one graph, got {index!r}",
        )
    flat = 0
    for i, size in zip(index, batch, strict=True):
        flat = flat * size + i % size
    return flat


def single_graph(graph: Graph, index: Index) -> Tensor:
    """The detached dense weights ``(N, N)`` of graph ``index`` of the batch (see
    :func:`check_index`).

    Raises:
        ValueError: an index that does not select exactly one graph.
    """
    b = check_index(graph, index)
    dense = graph.to_dense().detach()
    if not graph.batch_shape:
        return dense
    return dense.reshape(numel(graph.batch_shape), graph.num_nodes, graph.num_nodes)[b]


def to_networkx(graph: Graph, index: Index = None) -> nx.DiGraph:
    """One graph of the batch as a weighted :class:`networkx.DiGraph` (attribute ``"weight"``).

    Edge ``i -> j`` carries ``W[i, j]`` (for attention: query ``i`` attends to key ``j``).
    """
    nx = require("networkx", feature="to_networkx")
    w = single_graph(graph, index).cpu().double().numpy()
    g = nx.DiGraph()
    g.add_nodes_from(range(w.shape[0]))
    rows, cols = w.nonzero()
    g.add_weighted_edges_from(
        (int(i), int(j), float(w[i, j])) for i, j in zip(rows, cols, strict=True)
    )
    return g


def to_scipy(graph: Graph, index: Index = None) -> scipy.sparse.csr_array:
    """One graph of the batch as a :class:`scipy.sparse.csr_array` (row ``i`` = out-edges)."""
    sparse = require("scipy.sparse", feature="to_scipy")
    return sparse.csr_array(single_graph(graph, index).cpu().numpy())


def to_pyg(graph: Graph, index: Index = None, *, flow: str = "target_to_source") -> Any:
    """One graph as a :class:`torch_geometric.data.Data` with ``edge_index``/``edge_weight``.

    The edges are laid out for a PyG message-passing layer of ``flow``, which then computes
    ``W x`` (:meth:`~heatformer.graph_ops.Graph.propagate`): ``"target_to_source"`` (default,
    PyG's adjacency convention, ``edge_index = [row; col]``) or ``"source_to_target"`` (PyG
    layers' default flow, ``[col; row]``). A default PyG layer on the default edges computes
    ``W^T x``.
    """
    Data = require("torch_geometric.data", feature="to_pyg").Data

    sub = DenseGraph(single_graph(graph, index))
    edge_index, edge_weight = sub.to_edge_index(flow)
    return Data(edge_index=edge_index, edge_weight=edge_weight, num_nodes=graph.num_nodes)
