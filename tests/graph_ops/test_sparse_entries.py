"""The explicit edges of a graph without N x N work: ``Graph.sparse_entries``, the window kind's
``to_sparse`` read from its slabs, and ``SparseGraph.to_scipy`` from its stored entries (what
heatformer.analysis.markov's banded solve reads)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse
import torch

from heatformer.graph_ops import DenseGraph, SoftmaxGraph, SparseGraph, WindowGraph

CASES = list(
    itertools.product(
        [1, 7, 40],  # N (below, near and past the window)
        [1, 3, 16],  # w
        [0, 1, 2],  # global tokens
        [False, True],  # causal
        ["none", "keys", "drop"],  # key mask: none, padding keys, padding rows dropped too
    )
)


def _window(n: int, w: int, g: int, causal: bool, mask: str, seed: int = 0) -> WindowGraph:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, n, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 3, n, 8, generator=gen, dtype=torch.float64)
    key_mask = None
    if mask != "none":
        key_mask = torch.rand(2, n, generator=gen) < 0.7
        key_mask[:, 0] = True
    return WindowGraph(
        q, k, window=w, causal=causal, num_global=min(g, n), key_mask=key_mask,
        drop_masked_queries=mask == "drop", row_block=5,
    )  # fmt: skip


@pytest.mark.parametrize(("n", "w", "g", "causal", "mask"), CASES)
def test_window_to_sparse_is_its_dense_weights(
    n: int, w: int, g: int, causal: bool, mask: str
) -> None:
    graph = _window(n, w, g, causal, mask)
    edges = graph.to_sparse()
    dense = graph.to_dense()
    # the slabs' softmax and the dense rows' sum in other orders: equal to round-off
    torch.testing.assert_close(edges.to_dense(), dense, rtol=1e-14, atol=1e-16)
    assert edges.num_edges == int((dense != 0).sum())  # the non-zero entries, nothing else
    assert edges.num_edges <= graph.sparse_entries()
    row, col = edges.row, edges.col
    key = row * (6 * n) + col  # global indices: row-major, ascending keys within a row
    assert bool((key[1:] > key[:-1]).all())


def test_window_sparse_entries_is_the_kinds_bound() -> None:
    """No mask: every row but the dense global ones holds min(N, band + g) keys at most."""
    graph = _window(64, 4, 1, causal=False, mask="none")
    assert graph.sparse_entries() == 6 * (64 + 63 * (9 + 1))
    assert _window(64, 4, 1, causal=True, mask="none").sparse_entries() == 6 * 64 * 5


def test_window_to_sparse_is_differentiable() -> None:
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 50, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 50, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 50, 3, generator=gen, dtype=torch.float64)
    graph = WindowGraph(q, k, window=4, num_global=1)
    expected = torch.autograd.grad((graph.propagate(x) ** 2).sum(), (q, k))
    got = torch.autograd.grad((graph.to_sparse().propagate(x) ** 2).sum(), (q, k))
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_sparse_entries_of_the_other_kinds() -> None:
    """An edge list counts its stored entries; the implicit dense kinds list none."""
    w = torch.rand(2, 6, 6)
    sparse = DenseGraph(w * (w > 0.5)).to_sparse()
    assert sparse.sparse_entries() == sparse.num_edges == int((w > 0.5).sum())
    assert DenseGraph(w).sparse_entries() is None
    assert SoftmaxGraph(w, w).sparse_entries() is None


def test_sparse_to_scipy_reads_the_stored_entries() -> None:
    """One graph of a batch, from the CSR: duplicates summed, zero weights left out, a copy."""
    row = torch.tensor([0, 0, 1, 7, 7, 8])  # graphs of 4 nodes: 0 (rows 0, 1), 1 (rows 3, 4)
    col = torch.tensor([1, 1, 0, 5, 6, 8])
    weight = torch.tensor([1.0, 2.0, 0.0, 4.0, 5.0, 6.0])
    graph = SparseGraph(row, col, weight, num_nodes=4, batch_shape=(3,))
    for index in range(3):
        mat = graph.to_scipy(index)
        assert isinstance(mat, scipy.sparse.csr_array) and mat.dtype == np.float32
        np.testing.assert_array_equal(mat.toarray(), graph.to_dense()[index].numpy())
    first = graph.to_scipy(0)
    assert first.nnz == 1 and first[0, 1] == 3.0  # summed; the zero weight is no entry
    first.data[:] = -1.0
    assert float(graph.weight.min()) == 0.0  # the graph's own weights are untouched
    assert graph.to_scipy(-1).nnz == 1
    with pytest.raises(ValueError, match=r"^index: .* ints in range"):
        graph.to_scipy(3)
