"""Round trips to NetworkX, PyTorch Geometric and SciPy, checked against their own tools."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse
import torch
from torch_geometric.data import Data
from torch_geometric.utils import dense_to_sparse, get_laplacian, to_dense_adj

import graph_helpers as gh
from heatformer.graph_ops import DenseGraph, SparseGraph, laplacian_matrix

# ---- NetworkX ----------------------------------------------------------------------------------


def test_to_networkx_edges_and_weights(graph_kind) -> None:
    case = gh.make_attention(1, n=6, batch=(2, 3), masked=True, causal=True, empty_rows=(2,))
    p = case.probs()
    g = case.graph(graph_kind)
    for index in [(0, 0), (1, 2)]:
        g_nx = g.to_networkx(index)
        assert isinstance(g_nx, nx.DiGraph)
        assert list(g_nx.nodes) == list(range(6))
        assert g_nx.number_of_edges() == int((p[index] != 0).sum())
        for i, j, data in g_nx.edges(data=True):
            assert data["weight"] == pytest.approx(p[index][i, j], abs=1e-15)
        np.testing.assert_allclose(nx.to_numpy_array(g_nx, nodelist=range(6)), p[index], atol=1e-15)


def test_to_networkx_needs_a_full_index() -> None:
    g = gh.make_attention(1, n=4, batch=(2, 3)).graph("dense")
    for bad in [None, 0, (0, 0, 0)]:
        with pytest.raises(ValueError, match="index"):
            g.to_networkx(bad)


def test_unbatched_to_networkx_takes_no_index() -> None:
    w = gh.random_weights(0, 5, symmetric=False)
    g_nx = DenseGraph(torch.as_tensor(w)).to_networkx()
    np.testing.assert_array_equal(nx.to_numpy_array(g_nx, nodelist=range(5)), w)


def test_directed_networkx_round_trip() -> None:
    w = gh.random_weights(3, 6, symmetric=False, isolated=(1,))
    g_nx = DenseGraph(torch.as_tensor(w)).to_networkx()
    back = SparseGraph.from_networkx(g_nx)
    np.testing.assert_allclose(back.to_dense().numpy(), w, rtol=1e-7)
    np.testing.assert_array_equal(DenseGraph.from_networkx(g_nx, dtype=torch.float64).weight, w)


def test_dense_from_undirected_networkx_with_self_loops() -> None:
    """An undirected self-loop of weight w becomes W[i, i] = w (NetworkX's adjacency)."""
    w = gh.random_weights(4, 6, isolated=(0,))
    g_nx = nx.Graph()
    g_nx.add_nodes_from(range(6))
    for i, j in zip(*np.nonzero(np.triu(w))):
        g_nx.add_edge(int(i), int(j), weight=float(w[i, j]))
    assert nx.number_of_selfloops(g_nx) > 0
    np.testing.assert_array_equal(DenseGraph.from_networkx(g_nx, dtype=torch.float64).weight, w)


def test_from_networkx_missing_weight_is_one() -> None:
    g_nx = nx.path_graph(3)
    expected = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    np.testing.assert_array_equal(SparseGraph.from_networkx(g_nx).to_dense().numpy(), expected)
    np.testing.assert_array_equal(DenseGraph.from_networkx(g_nx).weight.numpy(), expected)


def test_sparse_from_undirected_networkx_with_self_loops() -> None:
    g_nx = nx.Graph()
    g_nx.add_edge(0, 0, weight=1.0)
    g_nx.add_edge(0, 1, weight=2.0)
    g = SparseGraph.from_networkx(g_nx)  # ValueError: weight: expected ... non-negative
    np.testing.assert_array_equal(g.to_dense().numpy(), [[1.0, 2.0], [2.0, 0.0]])


# ---- PyTorch Geometric -------------------------------------------------------------------------


def test_to_edge_index_matches_pyg(graph_kind) -> None:
    """Batched graphs are a disjoint union, as PyG's ``dense_to_sparse`` makes them."""
    case = gh.make_attention(2, n=5, batch=(2, 3), masked=True, empty_rows=(1,))
    p = torch.as_tensor(case.probs())
    edge_index, edge_weight = case.graph(graph_kind).to_edge_index()
    ref_index, ref_weight = dense_to_sparse(p.reshape(6, 5, 5))
    order = torch.argsort(edge_index[0] * 30 + edge_index[1])
    ref_order = torch.argsort(ref_index[0] * 30 + ref_index[1])
    torch.testing.assert_close(edge_index[:, order], ref_index[:, ref_order])
    torch.testing.assert_close(edge_weight[order], ref_weight[ref_order], atol=1e-15, rtol=0)


def test_edge_index_round_trip() -> None:
    w = gh.random_weights(5, 6, symmetric=False, isolated=(2,))
    g = DenseGraph(torch.as_tensor(w))
    edge_index, edge_weight = g.to_edge_index()
    torch.testing.assert_close(
        to_dense_adj(edge_index, edge_attr=edge_weight, max_num_nodes=6)[0], g.weight
    )
    back = SparseGraph.from_edge_index(edge_index, edge_weight, num_nodes=6)
    torch.testing.assert_close(back.to_dense(), g.weight, atol=0, rtol=0)
    sparse_again = back.to_edge_index()
    torch.testing.assert_close(sparse_again[0], edge_index)
    torch.testing.assert_close(sparse_again[1], edge_weight)


def test_from_edge_index_defaults() -> None:
    edge_index = torch.tensor([[0, 1, 3], [1, 3, 0]])
    g = SparseGraph.from_edge_index(edge_index)
    assert g.num_nodes == 4
    expected = to_dense_adj(edge_index, max_num_nodes=4)[0]
    torch.testing.assert_close(g.to_dense(), expected)


def test_to_pyg_returns_data(graph_kind) -> None:
    case = gh.make_attention(3, n=5, batch=(2,), masked=True, empty_rows=(0,))
    data = case.graph(graph_kind).to_pyg(1)
    assert isinstance(data, Data)
    assert data.num_nodes == 5
    dense = to_dense_adj(data.edge_index, edge_attr=data.edge_weight, max_num_nodes=5)[0]
    gh.assert_close_np(dense, case.probs()[1], atol=1e-15)


def test_to_pyg_keeps_isolated_trailing_nodes() -> None:
    """PyG infers ``num_nodes`` from ``edge_index`` when it is missing, which would drop an
    isolated last node: the count must be stored explicitly."""
    w = gh.random_weights(2, 6, symmetric=False, isolated=(4, 5))
    data = DenseGraph(torch.as_tensor(w)).to_pyg()
    assert int(data.edge_index.max()) < 4
    assert data.num_nodes == 6
    dense = to_dense_adj(data.edge_index, edge_attr=data.edge_weight, max_num_nodes=6)[0]
    np.testing.assert_array_equal(dense.numpy(), w)


@pytest.mark.parametrize("normalization", ["combinatorial", "sym", "rw"])
def test_laplacian_matches_pyg_without_self_loops(normalization) -> None:
    """PyG's ``get_laplacian`` drops self-loops and puts 1 on isolated nodes; on a graph with
    neither, the conventions agree (``"sym"`` on an undirected graph)."""
    w = gh.random_weights(6, 6, symmetric=normalization == "sym", isolated=(), self_loops=False)
    w[np.arange(6), (np.arange(6) + 1) % 6] += 0.5  # a cycle: no isolated node
    if normalization == "sym":
        w = 0.5 * (w + w.T)
    g = DenseGraph(torch.as_tensor(w))
    edge_index, edge_weight = g.to_edge_index()
    pyg_norm = None if normalization == "combinatorial" else normalization
    lap_index, lap_weight = get_laplacian(edge_index, edge_weight, normalization=pyg_norm)
    expected = to_dense_adj(lap_index, edge_attr=lap_weight, max_num_nodes=6)[0]
    torch.testing.assert_close(laplacian_matrix(g, normalization), expected)


def test_self_loops_kept_unlike_pyg() -> None:
    """DESIGN.md: heatformer keeps self-loops; PyG drops them. The combinatorial Laplacian is
    blind to loops (they cancel), the random-walk one is not."""
    w = gh.random_weights(7, 5, symmetric=False, isolated=())
    w[np.arange(5), (np.arange(5) + 1) % 5] += 0.5
    w[np.arange(5), np.arange(5)] = 0.7
    g = DenseGraph(torch.as_tensor(w))
    edge_index, edge_weight = g.to_edge_index()
    for normalization, same in [("combinatorial", True), ("rw", False)]:
        pyg_norm = None if normalization == "combinatorial" else normalization
        li, lw = get_laplacian(edge_index, edge_weight, normalization=pyg_norm)
        pyg = to_dense_adj(li, edge_attr=lw, max_num_nodes=5)[0]
        ours = laplacian_matrix(g, normalization)
        assert torch.allclose(ours, pyg) == same
    ours_rw = laplacian_matrix(g, "rw").numpy()
    np.testing.assert_allclose(np.diag(ours_rw), 1 - 0.7 / w.sum(1))


# ---- SciPy -------------------------------------------------------------------------------------


def test_scipy_round_trip(graph_kind) -> None:
    case = gh.make_attention(8, n=6, batch=(2,), masked=True, empty_rows=(3,), dtype=torch.float32)
    g = case.graph(graph_kind)
    mat = g.to_scipy(1)
    assert isinstance(mat, scipy.sparse.csr_array)
    dense = g.to_dense()[1].detach().numpy()
    np.testing.assert_array_equal(mat.toarray(), dense)
    assert mat.nnz == int((dense != 0).sum())
    back = SparseGraph.from_scipy(mat)
    assert back.dtype == torch.float32  # the matrix's floating dtype
    np.testing.assert_array_equal(back.to_dense().numpy(), dense)
    np.testing.assert_array_equal(SparseGraph.from_scipy(mat.tocoo()).to_dense().numpy(), dense)


def test_from_scipy_with_duplicates_sums_them() -> None:
    coo = scipy.sparse.coo_array(([1.0, 2.0, 3.0], ([0, 0, 1], [1, 1, 0])), shape=(3, 3))
    g = SparseGraph.from_scipy(coo)
    np.testing.assert_array_equal(g.to_dense().numpy(), coo.toarray())
    assert g.num_nodes == 3
    assert g.dtype == torch.float64  # float64 data keeps its precision


def test_from_scipy_dtype_rules() -> None:
    """A floating matrix keeps its dtype, an integer one gets torch's default, ``dtype=``
    overrides both."""
    ints = scipy.sparse.csr_array(np.array([[0, 2], [1, 0]]))
    assert SparseGraph.from_scipy(ints).dtype == torch.get_default_dtype()
    fine = scipy.sparse.csr_array(np.array([[0.0, 1 + 2**-40], [0.5, 0.0]]))
    g = SparseGraph.from_scipy(fine)
    assert g.dtype == torch.float64
    np.testing.assert_array_equal(g.to_dense().numpy(), fine.toarray())  # no float32 rounding
    assert SparseGraph.from_scipy(fine, dtype=torch.float32).dtype == torch.float32


def test_from_scipy_non_square() -> None:
    with pytest.raises(ValueError, match="matrix"):
        SparseGraph.from_scipy(scipy.sparse.csr_array(np.ones((2, 3))))


def test_isolated_node_diagonal_is_zero_here_and_one_in_pyg() -> None:
    """The documented difference: PyG's normalized ``get_laplacian`` puts 1 on the diagonal
    of an isolated node, heatformer (like NetworkX) puts 0; elsewhere they agree."""
    from torch_geometric.utils import get_laplacian, to_dense_adj

    edge_index = torch.tensor([[0, 1], [1, 0]])  # nodes 0 - 1, node 2 isolated
    graph = SparseGraph.from_edge_index(edge_index, torch.ones(2, dtype=torch.float64), 3)
    for normalization in ("sym", "rw"):
        index, weight = get_laplacian(
            edge_index, torch.ones(2, dtype=torch.float64), normalization, num_nodes=3
        )
        pyg = to_dense_adj(index, edge_attr=weight, max_num_nodes=3)[0]
        ours = laplacian_matrix(graph, normalization)
        assert float(pyg[2, 2]) == 1.0 and float(ours[2, 2]) == 0.0
        torch.testing.assert_close(ours[:2, :2], pyg[:2, :2])
