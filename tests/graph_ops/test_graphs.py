"""The graph protocol (propagate, transpose, degrees, dense view) against numpy references.

Every graph kind is built from the same weights (see ``conftest.py``), so one numpy matrix is
the reference for ``DenseGraph``, ``SoftmaxGraph`` and ``SparseGraph``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import graph_helpers as gh
from heatformer.graph_ops import DenseGraph, SoftmaxGraph, SparseGraph, SymmetrizedGraph

ATOL = {torch.float32: 1e-5, torch.float64: 1e-12}

ATTENTION_VARIANTS = {
    "plain": {},
    "masked": {"masked": True},
    "causal": {"causal": True},
    "masked-causal": {"masked": True, "causal": True},
    "empty-rows": {"masked": True, "empty_rows": (1, 3)},
    "causal-empty-rows": {"masked": True, "causal": True, "empty_rows": (0, 2)},
}


@pytest.fixture(params=list(ATTENTION_VARIANTS))
def variant(request: pytest.FixtureRequest) -> dict:
    return ATTENTION_VARIANTS[request.param]


def test_protocol_matches_reference(graph_kind, variant, dtype, device) -> None:
    case = gh.make_attention(3, n=6, batch=(2, 3), dtype=dtype, device=device, **variant)
    p = case.probs()
    x = gh.to_numpy(case.x)
    g = case.graph(graph_kind)
    atol = ATOL[dtype]
    assert g.num_nodes == 6
    assert tuple(g.batch_shape) == (2, 3)
    assert g.dtype == dtype
    assert g.device.type == device.type
    gh.assert_close_np(g.to_dense(), p, atol=atol)
    gh.assert_close_np(g.propagate(case.x), p @ x, atol=atol)
    gh.assert_close_np(g.propagate_transpose(case.x), np.swapaxes(p, -1, -2) @ x, atol=atol)
    gh.assert_close_np(g.out_degree(), p.sum(-1), atol=atol)
    gh.assert_close_np(g.in_degree(), p.sum(-2), atol=atol)


def test_softmax_rows_are_distributions(variant) -> None:
    case = gh.make_attention(5, n=6, batch=(2,), **variant)
    p = SoftmaxGraph(case.q, case.k, mask=case.mask, causal=case.causal).to_dense()
    rows = p.sum(-1)
    empty = np.zeros(6, dtype=bool)
    empty[list(variant.get("empty_rows", ()))] = True
    gh.assert_close_np(rows, np.broadcast_to(np.where(empty, 0.0, 1.0), (2, 6)), atol=1e-12)
    assert bool((p >= 0).all())


def test_softmax_scale_and_default_scale() -> None:
    case = gh.make_attention(1, n=5, features=4)
    q, k = gh.to_numpy(case.q), gh.to_numpy(case.k)
    default = SoftmaxGraph(case.q, case.k).to_dense()
    gh.assert_close_np(default, gh.softmax_reference(q, k, scale=0.5), atol=1e-12)  # 1/sqrt(4)
    scaled = SoftmaxGraph(case.q, case.k, scale=2.5).to_dense()
    gh.assert_close_np(scaled, gh.softmax_reference(q, k, scale=2.5), atol=1e-12)


@pytest.mark.parametrize("x_shape", [(5, 2), (3, 5, 2), (4, 2, 3, 5, 2)], ids=str)
def test_signal_broadcasts_against_batch(graph_kind, x_shape) -> None:
    """``x`` may lack the graph's batch dims (broadcast) or carry extra dims in front."""
    case = gh.make_attention(7, n=5, batch=(2, 3), masked=True, empty_rows=(4,))
    p = case.probs()
    x = torch.randn(*x_shape, dtype=torch.float64)
    g = case.graph(graph_kind)
    out = g.propagate(x)
    assert out.shape == torch.broadcast_shapes(x.shape, (2, 3, 5, 2))
    gh.assert_close_np(out, p @ x.numpy(), atol=1e-12)
    gh.assert_close_np(g.propagate_transpose(x), np.swapaxes(p, -1, -2) @ x.numpy(), atol=1e-12)


@pytest.mark.parametrize("row_block", [1, 2, 4, 256])
def test_softmax_row_block_does_not_change_results(row_block) -> None:
    case = gh.make_attention(8, n=7, batch=(2,), masked=True, causal=True, empty_rows=(3,))
    g = SoftmaxGraph(case.q, case.k, mask=case.mask, causal=True, row_block=row_block)
    p = case.probs()
    x = gh.to_numpy(case.x)
    gh.assert_close_np(g.to_dense(), p, atol=1e-12)
    gh.assert_close_np(g.propagate(case.x), p @ x, atol=1e-12)
    gh.assert_close_np(g.propagate_transpose(case.x), np.swapaxes(p, -1, -2) @ x, atol=1e-12)
    gh.assert_close_np(g.in_degree(), p.sum(-2), atol=1e-12)


def test_mask_broadcasts_over_batch() -> None:
    """A ``(N, N)`` mask applies to every graph of a ``(B, H)`` batch."""
    case = gh.make_attention(9, n=5, batch=(2, 3))
    mask = torch.rand(5, 5, generator=torch.Generator().manual_seed(0)) < 0.6
    mask[2] = False  # a fully masked row in every graph
    g = SoftmaxGraph(case.q, case.k, mask=mask)
    p = gh.softmax_reference(gh.to_numpy(case.q), gh.to_numpy(case.k), mask=mask.numpy())
    gh.assert_close_np(g.propagate(case.x), p @ gh.to_numpy(case.x), atol=1e-12)
    gh.assert_close_np(g.out_degree(), p.sum(-1), atol=1e-12)


def test_softmax_batch_dims_broadcast_between_q_and_k() -> None:
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, 3, 4, 3, generator=gen, dtype=torch.float64)
    k = torch.randn(3, 4, 3, generator=gen, dtype=torch.float64)  # shared across the batch
    g = SoftmaxGraph(q, k)
    assert tuple(g.batch_shape) == (2, 3)
    ref = gh.softmax_reference(q.numpy(), np.broadcast_to(k.numpy(), (2, 3, 4, 3)))
    gh.assert_close_np(g.to_dense(), ref, atol=1e-12)


def test_dense_graph_general_weights(dtype) -> None:
    w = gh.random_weights(4, 6, batch=(2,), symmetric=False, isolated=(2,))
    x = np.random.default_rng(0).normal(size=(2, 6, 3))
    for kind in ("dense", "sparse"):
        g = gh.graph_from_weights(w, kind, dtype)
        xt = torch.as_tensor(x, dtype=dtype)
        gh.assert_close_np(g.to_dense(), w, atol=ATOL[dtype])
        gh.assert_close_np(g.propagate(xt), w @ x, atol=ATOL[dtype])
        gh.assert_close_np(g.propagate_transpose(xt), np.swapaxes(w, -1, -2) @ x, atol=ATOL[dtype])
        gh.assert_close_np(g.out_degree(), w.sum(-1), atol=ATOL[dtype])
        gh.assert_close_np(g.in_degree(), w.sum(-2), atol=ATOL[dtype])


def test_sparse_graph_sums_duplicate_entries_and_sorts_edges() -> None:
    """Unsorted edges with a repeated (row, col) pair: entries are summed everywhere."""
    row = torch.tensor([2, 0, 1, 0, 2, 0])
    col = torch.tensor([0, 1, 2, 1, 2, 0])
    val = torch.tensor([1.0, 2.0, 3.0, 0.5, 4.0, 1.5], dtype=torch.float64)
    g = SparseGraph(row, col, val, num_nodes=3)
    w = np.zeros((3, 3))
    np.add.at(w, (row.numpy(), col.numpy()), val.numpy())
    x = torch.randn(3, 2, dtype=torch.float64)
    gh.assert_close_np(g.to_dense(), w, atol=0)
    gh.assert_close_np(g.propagate(x), w @ x.numpy(), atol=1e-12)
    gh.assert_close_np(g.propagate_transpose(x), w.T @ x.numpy(), atol=1e-12)
    gh.assert_close_np(g.out_degree(), w.sum(1), atol=1e-12)
    gh.assert_close_np(g.in_degree(), w.sum(0), atol=1e-12)
    assert g.num_edges == 6


def test_sparse_from_ell_batched() -> None:
    gen = torch.Generator().manual_seed(3)
    idx = torch.randint(0, 4, (2, 4, 2), generator=gen)
    wt = torch.rand(2, 4, 2, generator=gen, dtype=torch.float64)
    g = SparseGraph.from_ell(idx, wt)
    w = np.zeros((2, 4, 4))
    b, i, _ = np.indices(idx.shape)
    np.add.at(w, (b, i, idx.numpy()), wt.numpy())
    assert tuple(g.batch_shape) == (2,)
    gh.assert_close_np(g.to_dense(), w, atol=0)
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    gh.assert_close_np(g.propagate(x), w @ x.numpy(), atol=1e-12)


def test_sparse_row_normalize() -> None:
    w = gh.random_weights(6, 5, batch=(2,), symmetric=False, isolated=(1,))
    g = gh.graph_from_weights(w, "sparse", torch.float64).row_normalize()
    d = w.sum(-1, keepdims=True)
    expected = np.divide(w, d, out=np.zeros_like(w), where=d > 0)
    gh.assert_close_np(g.to_dense(), expected, atol=1e-12)


@pytest.mark.parametrize("kind", ["dense", "softmax", "sparse", "dense-weights"])
def test_symmetrize_is_mean_with_transpose(kind) -> None:
    if kind == "dense-weights":
        w = gh.random_weights(1, 6, batch=(2,), symmetric=False)
        g = gh.graph_from_weights(w, "dense", torch.float64)
    else:
        case = gh.make_attention(2, n=6, batch=(2,), masked=True, causal=True, empty_rows=(2,))
        w, g = case.probs(), case.graph(kind)
    ws = 0.5 * (w + np.swapaxes(w, -1, -2))
    s = g.symmetrize()
    x = torch.randn(2, 6, 3, dtype=torch.float64)
    gh.assert_close_np(s.to_dense(), ws, atol=1e-12)
    gh.assert_close_np(s.propagate(x), ws @ x.numpy(), atol=1e-12)
    gh.assert_close_np(s.propagate_transpose(x), ws @ x.numpy(), atol=1e-12)
    gh.assert_close_np(s.out_degree(), ws.sum(-1), atol=1e-12)
    gh.assert_close_np(s.in_degree(), ws.sum(-2), atol=1e-12)


def test_symmetrized_graph_rows_blockwise() -> None:
    """``SymmetrizedGraph`` of a softmax graph: dense rows assembled block by block."""
    case = gh.make_attention(4, n=7, batch=(2,), masked=True)
    g = SymmetrizedGraph(SoftmaxGraph(case.q, case.k, mask=case.mask, row_block=3))
    p = case.probs()
    ws = 0.5 * (p + np.swapaxes(p, -1, -2))
    rows = g.weight_rows(2, 5).reshape(2, 3, 7)
    gh.assert_close_np(rows, ws[:, 2:5], atol=1e-12)
    assert g.symmetrize() is g
    # every block size, through the public methods built on the row blocks
    for row_block in (1, 2, 7):
        kept = g.threshold(1e-300, row_block=row_block)
        assert kept.num_edges == int((ws > 0).sum())
        gh.assert_close_np(kept.to_dense(), ws, atol=1e-12)


@pytest.mark.parametrize("renormalize", [False, True])
def test_threshold_keeps_heavy_edges(graph_kind, renormalize) -> None:
    case = gh.make_attention(11, n=6, batch=(2,), masked=True, empty_rows=(0,))
    p = case.probs()
    eps = float(np.quantile(p[p > 0], 0.5))
    kept = np.where(p >= eps, p, 0.0)
    if renormalize:
        d = kept.sum(-1, keepdims=True)
        kept = np.divide(kept, d, out=np.zeros_like(kept), where=d > 0)
    g = case.graph(graph_kind).threshold(eps, renormalize=renormalize, row_block=4)
    assert isinstance(g, SparseGraph)
    assert g.num_edges == int((p >= eps).sum())
    gh.assert_close_np(g.to_dense(), kept, atol=1e-12)


@pytest.mark.parametrize("kind", ["dense", "sparse", "softmax"])
def test_threshold_keeps_edges_equal_to_eps(kind) -> None:
    """``weight >= eps`` is kept, on the boundary too (weights exact in binary)."""
    if kind == "softmax":  # uniform causal attention: row i is 1/(i+1) on keys 0..i
        z = torch.zeros(4, 2, dtype=torch.float64)
        g = SoftmaxGraph(z, z, causal=True)
        w = np.tril(np.ones((4, 4))) / np.arange(1, 5)[:, None]
    else:
        w = np.array([[0.5, 0.25, 0.0], [0.25, 0.125, 0.625], [0.0, 0.0, 0.25]])
        g = gh.graph_from_weights(w, kind, torch.float64)
    for eps in (0.25, 0.5):
        kept = g.threshold(eps)
        assert kept.num_edges == int((w >= eps).sum())
        gh.assert_close_np(kept.to_dense(), np.where(w >= eps, w, 0.0), atol=0)


def test_to_sparse_keeps_nonzeros_only() -> None:
    w = gh.random_weights(3, 6, batch=(2,), symmetric=False, isolated=(0, 4))
    g = DenseGraph(torch.as_tensor(w)).to_sparse()
    assert g.num_edges == int((w != 0).sum())
    assert g.to_sparse() is g
    gh.assert_close_np(g.to_dense(), w, atol=0)


def test_repr_names_shape() -> None:
    g = DenseGraph(torch.zeros(2, 3, 3))
    assert repr(g) == "DenseGraph(num_nodes=3, batch_shape=(2,), dtype=torch.float32)"
