"""Laplacians against NetworkX (the golden Laplacians) and against ``I - P`` on attention.

NetworkX conventions, checked in ``networkx/linalg/laplacianmatrix.py`` (networkx 3.x):

- ``nx.laplacian_matrix(G) = D - A`` with ``A = nx.to_scipy_sparse_array(G)`` and
  ``D = diag(A.sum(axis=1))``; for a ``DiGraph`` that is the out-degree.
- An undirected self-loop of weight ``w`` appears *once* on the diagonal of ``A`` and is
  therefore counted once in ``D`` (unlike ``G.degree(weight=...)``, which counts it twice). So
  a self-loop cancels in the combinatorial Laplacian (``L_ii = sum_{j != i} w_ij``), and in
  the normalized one it lowers the diagonal to ``1 - w_ii / d_i``.
- ``nx.normalized_laplacian_matrix(G) = D^{-1/2} (D - A) D^{-1/2}`` with ``1/sqrt(0)``
  replaced by 0, so an isolated node has a zero row and column (also a zero diagonal).

heatformer keeps self-loops in ``W`` and takes degrees as row sums of ``W`` (``W_s`` for
``"sym"``), which is exactly this convention; the tests below therefore compare equal on
graphs that have both isolated nodes and self-loops.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import torch

import graph_helpers as gh
from heatformer.graph_ops import (
    DenseGraph,
    GraphLaplacian,
    SparseGraph,
    laplacian,
    laplacian_matrix,
    spectrum,
)

NX_LAPLACIANS = {
    "combinatorial": nx.laplacian_matrix,
    "sym": nx.normalized_laplacian_matrix,
}


def nx_undirected(w: np.ndarray) -> nx.Graph:
    """An undirected NetworkX graph from a symmetric numpy matrix, built edge by edge."""
    n = w.shape[0]
    g = nx.Graph()
    g.add_nodes_from(range(n))
    for i in range(n):
        for j in range(i, n):
            if w[i, j] != 0:
                g.add_edge(i, j, weight=float(w[i, j]))
    return g


def nx_directed(w: np.ndarray) -> nx.DiGraph:
    n = w.shape[0]
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    for i, j in zip(*np.nonzero(w)):
        g.add_edge(int(i), int(j), weight=float(w[i, j]))
    return g


def nx_laplacian(g: nx.Graph, normalization: str) -> np.ndarray:
    return NX_LAPLACIANS[normalization](g, nodelist=range(g.number_of_nodes())).toarray()


@pytest.mark.parametrize("normalization", sorted(NX_LAPLACIANS))
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_undirected_laplacian_equals_networkx(kind, seed, normalization) -> None:
    n = 7
    w = gh.random_weights(seed, n, isolated=(seed % n, 2 if seed % n != 2 else 3))
    assert np.diag(w).any(), "the case must have self-loops"
    assert (w.sum(1) == 0).sum() == 2, "and isolated nodes"
    expected = nx_laplacian(nx_undirected(w), normalization)
    g = gh.graph_from_weights(w, kind, torch.float64)
    x = torch.randn(n, 3, dtype=torch.float64)
    gh.assert_close_np(laplacian_matrix(g, normalization), expected, atol=1e-12)
    gh.assert_close_np(laplacian(g, x, normalization), expected @ x.numpy(), atol=1e-12)


@pytest.mark.parametrize("normalization", sorted(NX_LAPLACIANS))
def test_networkx_graph_without_self_loops_round_trips_to_its_laplacian(normalization) -> None:
    """``SparseGraph.from_networkx`` (self-loop case: see test_interop.py)."""
    w = gh.random_weights(9, 7, isolated=(4,), self_loops=False)
    g_nx = nx_undirected(w)
    g = SparseGraph.from_networkx(g_nx)
    expected = nx_laplacian(g_nx, normalization)
    gh.assert_close_np(laplacian_matrix(g, normalization), expected, atol=1e-6)


def test_isolated_node_and_self_loop_rows() -> None:
    """The two conventions the comparison above relies on, stated on a 3-node graph."""
    w = np.array([[0.0, 0.0, 0.0], [0.0, 2.0, 1.0], [0.0, 1.0, 0.0]])  # 0 isolated, loop at 1
    g = DenseGraph(torch.as_tensor(w))
    comb = laplacian_matrix(g, "combinatorial").numpy()
    sym = laplacian_matrix(g, "sym").numpy()
    np.testing.assert_allclose(comb, [[0, 0, 0], [0, 1, -1], [0, -1, 1]], atol=1e-15)
    d = np.array([0.0, 3.0, 1.0])  # self-loop counted once
    np.testing.assert_allclose(sym[1, 1], 1 - 2 / 3, atol=1e-15)
    np.testing.assert_allclose(sym[1, 2], -1 / np.sqrt(d[1] * d[2]), atol=1e-15)
    assert not sym[0].any() and not sym[:, 0].any()
    np.testing.assert_allclose(comb, nx_laplacian(nx_undirected(w), "combinatorial"))
    np.testing.assert_allclose(sym, nx_laplacian(nx_undirected(w), "sym"))


def test_attention_graph_laplacians_equal_networkx(graph_kind) -> None:
    """Directed attention: combinatorial = nx (out-degree); sym = nx on the undirected W_s."""
    case = gh.make_attention(5, n=6, masked=True, causal=True, empty_rows=(2,))
    p = case.probs()
    g = case.graph(graph_kind)
    ws = 0.5 * (p + p.T)
    gh.assert_close_np(
        laplacian_matrix(g, "combinatorial"), nx_laplacian(nx_directed(p), "combinatorial"),
        atol=1e-12,
    )  # fmt: skip
    gh.assert_close_np(
        laplacian_matrix(g, "sym"), nx_laplacian(nx_undirected(ws), "sym"), atol=1e-12
    )


@pytest.mark.parametrize(
    "variant",
    [{}, {"masked": True}, {"causal": True}, {"masked": True, "causal": True}],
    ids=["plain", "masked", "causal", "masked-causal"],
)
def test_rw_is_identity_minus_attention(graph_kind, variant) -> None:
    """On attention (every row has an allowed key): ``L_rw = I - P``, ``L_rw x = x - P x``."""
    case = gh.make_attention(1, n=6, batch=(2, 2), **variant)
    q, k, x = gh.to_numpy(case.q), gh.to_numpy(case.k), gh.to_numpy(case.x)
    mask = None if case.mask is None else case.mask.numpy()
    # explicit softmax with numpy's exp, independent of the reference helper
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    allowed = np.ones(s.shape, bool) if mask is None else mask.copy()
    if case.causal:
        allowed &= np.tril(np.ones((6, 6), bool))
    e = np.exp(s - s.max(-1, keepdims=True)) * allowed
    p = e / e.sum(-1, keepdims=True)
    g = case.graph(graph_kind)
    gh.assert_close_np(laplacian_matrix(g, "rw"), np.eye(6) - p, atol=1e-12)
    gh.assert_close_np(laplacian(g, case.x, "rw"), x - p @ x, atol=1e-12)
    gh.assert_close_np(laplacian(g, case.x), x - p @ x, atol=1e-12)  # rw is the default


def test_fully_masked_rows_have_zero_laplacian_rows(graph_kind, normalization) -> None:
    case = gh.make_attention(2, n=6, batch=(2,), masked=True, empty_rows=(0, 4))
    g = case.graph(graph_kind)
    lap = laplacian_matrix(g, normalization)
    # rw and combinatorial: the row of a node without out-edges is 0
    if normalization != "sym":
        assert not lap[:, [0, 4]].any()
        assert not laplacian(g, case.x, normalization)[:, [0, 4]].any()
    gh.assert_close_np(
        laplacian(g, case.x, normalization),
        gh.laplacian_batch_reference(case.probs(), normalization) @ gh.to_numpy(case.x),
        atol=1e-12,
    )


@pytest.mark.parametrize("seed", range(2))
def test_all_normalizations_match_reference_directed(graph_kind, normalization, dtype, seed):
    atol = 1e-5 if dtype == torch.float32 else 1e-12
    if graph_kind == "softmax":
        case = gh.make_attention(seed, n=6, batch=(2, 3), masked=True, empty_rows=(1,), dtype=dtype)
        w, g, x = case.probs(), case.graph("softmax"), case.x
    else:
        w = gh.random_weights(seed, 6, batch=(2, 3), symmetric=False, isolated=(1,))
        g = gh.graph_from_weights(w, graph_kind, dtype)
        x = torch.randn(2, 3, 6, 4, dtype=dtype)
    expected = gh.laplacian_batch_reference(w, normalization)
    gh.assert_close_np(laplacian_matrix(g, normalization), expected, atol=atol)
    gh.assert_close_np(laplacian(g, x, normalization), expected @ gh.to_numpy(x), atol=atol)


def test_generator_adjacency_markov_and_scale(graph_kind, normalization) -> None:
    if graph_kind == "softmax":
        case = gh.make_attention(3, n=6, batch=(2,), masked=True, empty_rows=(5,))
        w, g = case.probs(), case.graph("softmax")
    else:
        w = gh.random_weights(3, 6, batch=(2,), symmetric=False, isolated=(5,))
        g = gh.graph_from_weights(w, graph_kind, torch.float64)
    x = torch.randn(2, 6, 3, dtype=torch.float64)
    gen = GraphLaplacian(g, normalization)
    dmax = w.sum(-1).max(-1)
    scale = dmax if normalization == "combinatorial" else np.ones(2)
    gh.assert_close_np(gen.scale, scale, atol=1e-12)
    lap = gh.laplacian_batch_reference(w, normalization)
    markov = np.eye(6) - lap / scale[:, None, None]
    assert (markov >= -1e-12).all(), "M is non-negative (what the positive series needs)"
    gh.assert_close_np(gen.markov(x), markov @ x.numpy(), atol=1e-12)
    adj = np.stack([gh.adjacency_reference(wg, normalization) for wg in w])
    gh.assert_close_np(gen.adjacency(x), adj @ x.numpy(), atol=1e-12)


def test_combinatorial_annihilates_constants(graph_kind) -> None:
    """``L_comb 1 = 0`` (and ``L_rw 1 = 0`` on nodes that have edges)."""
    case = gh.make_attention(4, n=6, batch=(3,), masked=True, causal=True)
    g = case.graph(graph_kind)
    ones = torch.ones(3, 6, 1, dtype=torch.float64)
    assert laplacian(g, ones, "combinatorial").abs().max() < 1e-12
    assert laplacian(g, ones, "rw").abs().max() < 1e-12


def test_spectrum_symmetric_cases() -> None:
    w = gh.random_weights(6, 7, batch=(2,), isolated=(3,))
    g = gh.graph_from_weights(w, "dense", torch.float64)
    for normalization in ("sym", "combinatorial"):
        ev = spectrum(g, normalization)
        assert not ev.is_complex()
        expected = np.stack(
            [np.linalg.eigvalsh(gh.laplacian_reference(wg, normalization)) for wg in w]
        )
        gh.assert_close_np(ev, expected, atol=1e-10)
    # L_rw = D^{-1/2} L_sym D^{1/2} on symmetric W: same (real) spectrum
    expected_rw = np.stack(
        [np.sort(np.linalg.eigvals(gh.laplacian_reference(wg, "rw")).real) for wg in w]
    )
    ev_rw = spectrum(g, "rw")
    assert not ev_rw.is_complex()  # a complex result would lose its imaginary part below
    gh.assert_close_np(ev_rw, expected_rw, atol=1e-10)


def test_spectrum_directed_is_complex() -> None:
    case = gh.make_attention(7, n=6, batch=(2,))
    g = case.graph("softmax")
    ev = spectrum(g, "rw")
    assert ev.is_complex()
    for b in range(2):
        expected = np.linalg.eigvals(np.eye(6) - case.probs()[b])
        np.testing.assert_allclose(
            np.sort_complex(ev[b].numpy()), np.sort_complex(expected), atol=1e-9
        )
    assert bool((ev.real[..., 1:] >= ev.real[..., :-1]).all()), "ascending real part"
