"""Top-k sparsification: exact edge counts, renormalized weights, deterministic ties, grads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import graph_helpers as gh
from heatformer.graph_ops import DenseGraph, SoftmaxGraph, SparseGraph, topk_graph


def reference_topk(scores: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the ``k`` largest entries of every row, ties to the lower index,
    returned as a sorted ``(..., N, k)`` array."""
    n = scores.shape[-1]
    flat = scores.reshape(-1, n)
    out = np.empty((flat.shape[0], k), dtype=np.int64)
    for r, row in enumerate(flat):
        order = np.lexsort((np.arange(n), -row))  # by descending score, then by index
        out[r] = np.sort(order[:k])
    return out.reshape(*scores.shape[:-1], k)


def kept_columns(g: SparseGraph, k: int) -> np.ndarray:
    """The stored columns of every row as a sorted ``(..., N, k)`` array."""
    n = g.num_nodes
    rows, cols = g.row.numpy(), g.col.numpy() % n
    counts = np.bincount(rows, minlength=int(np.prod(g.batch_shape)) * n)
    assert (counts == k).all(), f"expected exactly {k} edges per row, got {counts}"
    order = np.lexsort((cols, rows))
    return cols[order].reshape(*g.batch_shape, n, k)


def masked_scores(case) -> np.ndarray:
    q, k = case.q.numpy(), case.k.numpy()
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    allowed = np.ones(s.shape, bool) if case.mask is None else np.broadcast_to(case.mask, s.shape)
    if case.causal:
        allowed = allowed & np.tril(np.ones(s.shape[-2:], bool))
    return np.where(allowed, s, -np.inf)


VARIANTS = {
    "plain": {},
    "masked": {"masked": True},
    "causal": {"causal": True},
    "empty-rows": {"masked": True, "empty_rows": (1, 4)},
    "causal-empty-rows": {"masked": True, "causal": True, "empty_rows": (2,)},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("k_top", [1, 2, 4, 6])
def test_softmax_topk_keeps_k_largest(k_top, variant) -> None:
    case = gh.make_attention(1, n=6, batch=(2, 2), **VARIANTS[variant])
    g = SoftmaxGraph(case.q, case.k, mask=case.mask, causal=case.causal).topk(k_top)
    assert isinstance(g, SparseGraph)
    assert g.num_edges == 2 * 2 * 6 * k_top
    scores = masked_scores(case)
    np.testing.assert_array_equal(kept_columns(g, k_top), reference_topk(scores, k_top))
    # weights: softmax over the kept allowed scores (= P renormalized over the kept set)
    p = case.probs()
    kept = np.zeros_like(p)
    np.put_along_axis(kept, reference_topk(scores, k_top), 1.0, axis=-1)
    expected = p * kept
    d = expected.sum(-1, keepdims=True)
    expected = np.divide(expected, d, out=np.zeros_like(expected), where=d > 0)
    gh.assert_close_np(g.to_dense(), expected, atol=1e-12)
    empty = np.isneginf(scores).all(-1)
    gh.assert_close_np(g.out_degree(), np.where(empty, 0.0, 1.0), atol=1e-12)


def test_topk_of_general_weights() -> None:
    w = gh.random_weights(2, 7, batch=(3,), symmetric=False, isolated=(5,))
    for kind in ("dense", "sparse"):
        g = gh.graph_from_weights(w, kind, torch.float64).topk(3)
        np.testing.assert_array_equal(kept_columns(g, 3), reference_topk(w, 3))
        kept = np.take_along_axis(w, reference_topk(w, 3), -1)
        d = kept.sum(-1, keepdims=True)
        expected = np.divide(kept, d, out=np.zeros_like(kept), where=d > 0)
        dense = g.to_dense().numpy()
        np.testing.assert_allclose(np.take_along_axis(dense, reference_topk(w, 3), -1), expected)
        np.testing.assert_allclose(g.out_degree().numpy(), (w.sum(-1) > 0).astype(float))


def test_ties_go_to_the_lower_index() -> None:
    w = torch.tensor(
        [
            [1.0, 2.0, 2.0, 2.0, 1.0],
            [3.0, 3.0, 3.0, 3.0, 3.0],
            [0.0, 0.0, 5.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0],
            [1.0, 1.0, 0.5, 1.0, 4.0],
        ],
        dtype=torch.float64,
    )
    expected = {
        1: [[1], [0], [2], [0], [4]],
        2: [[1, 2], [0, 1], [0, 2], [0, 1], [0, 4]],
        4: [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 3, 4]],
    }
    for k, cols in expected.items():
        for row_block in (1, 2, 5):
            g = DenseGraph(w).topk(k, row_block=row_block)
            np.testing.assert_array_equal(kept_columns(g, k), np.array(cols))
    # identical keys: every score of a row ties, so the first k keys win
    q = torch.randn(4, 3, dtype=torch.float64)
    keys = torch.ones(4, 3, dtype=torch.float64)
    g = SoftmaxGraph(q, keys).topk(2)
    np.testing.assert_array_equal(kept_columns(g, 2), np.tile([0, 1], (4, 1)))
    gh_dense = g.to_dense().numpy()
    np.testing.assert_allclose(gh_dense[:, :2], 0.5)


@pytest.mark.parametrize("row_block", [1, 2, 3, 5, 256])
def test_row_block_does_not_change_topk(graph_kind, row_block) -> None:
    case = gh.make_attention(3, n=7, batch=(2,), masked=True, causal=True, empty_rows=(3,))
    g = case.graph(graph_kind)
    ref = g.topk(3)
    got = g.topk(3, row_block=row_block)
    torch.testing.assert_close(got.row, ref.row, atol=0, rtol=0)
    torch.testing.assert_close(got.col, ref.col, atol=0, rtol=0)
    torch.testing.assert_close(got.weight, ref.weight, atol=1e-15, rtol=0)
    via_function = topk_graph(
        case.q, case.k, k_top=3, mask=case.mask, causal=True, row_block=row_block
    )
    torch.testing.assert_close(via_function.to_dense(), ref.to_dense(), atol=1e-15, rtol=0)


def test_topk_n_is_the_dense_graph(graph_kind) -> None:
    case = gh.make_attention(4, n=6, batch=(2,), masked=True, causal=True, empty_rows=(1,))
    g = case.graph(graph_kind).topk(6)
    gh.assert_close_np(g.to_dense(), case.probs(), atol=1e-12)
    x = gh.to_numpy(case.x)
    gh.assert_close_np(g.propagate(case.x), case.probs() @ x, atol=1e-12)


def test_topk_n_of_weights_is_row_normalized() -> None:
    """``topk`` renormalizes: ``topk(N)`` of explicit weights is ``D_out^+ W``."""
    w = gh.random_weights(5, 6, batch=(2,), symmetric=False, isolated=(0,))
    g = gh.graph_from_weights(w, "dense", torch.float64).topk(6)
    d = w.sum(-1, keepdims=True)
    gh.assert_close_np(g.to_dense(), np.divide(w, d, out=np.zeros_like(w), where=d > 0), atol=1e-12)


@pytest.mark.parametrize("k_top", [0, -1, 7])
def test_k_out_of_range(k_top) -> None:
    case = gh.make_attention(0, n=6)
    for kind in gh.GRAPH_KINDS:
        with pytest.raises(ValueError, match=rf"^k_top: expected 1 <= k_top <= 6, got {k_top}$"):
            case.graph(kind).topk(k_top)


@pytest.mark.parametrize(("k_top", "error"), [(0, ValueError), (7, ValueError), (2.0, TypeError)])
def test_topk_graph_errors_name_k_top(k_top, error) -> None:
    """DESIGN: a bad-input error names the argument; ``topk_graph(q, k, k_top=...)`` has a
    ``k`` argument too (the keys), so ``k:`` points at the wrong one."""
    case = gh.make_attention(0, n=6)
    with pytest.raises(error, match=r"^k_top:"):
        topk_graph(case.q, case.k, k_top=k_top)


def test_softmax_topk_rejects_zero_row_block() -> None:
    """``DenseGraph.topk(k, row_block=0)`` raises; the softmax graph must too."""
    case = gh.make_attention(0, n=6)
    with pytest.raises(ValueError, match=r"^row_block:"):
        case.graph("dense").topk(2, row_block=0)
    with pytest.raises(ValueError, match=r"^row_block:"):
        case.graph("softmax").topk(2, row_block=0)


def test_k_must_be_an_int() -> None:
    g = gh.make_attention(0, n=6).graph("softmax")
    with pytest.raises(TypeError, match=r"^k_top:"):
        g.topk(2.0)
    with pytest.raises(TypeError, match=r"^k_top:"):
        g.topk(True)


@pytest.mark.parametrize(
    "variant", [{}, {"masked": True, "empty_rows": (2,)}, {"causal": True}], ids=str
)
def test_topk_gradcheck_q_k_x(variant) -> None:
    """Gradients reach q and k through the kept scores (and x through the sparse product)."""
    case = gh.make_attention(6, n=5, batch=(2,), **variant)

    def f(q, k, x):
        return topk_graph(q, k, k_top=2, mask=case.mask, causal=case.causal).propagate(x)

    inputs = tuple(t.clone().requires_grad_() for t in (case.q, case.k, case.x))
    assert torch.autograd.gradcheck(f, inputs)


def _assert_same_output_and_gradients(y1, y2, leaves1, leaves2) -> None:
    """``y1 == y2``, and the gradients of one weighted sum of each reach equal leaves."""
    torch.testing.assert_close(y1, y2)
    weight = torch.randn_like(y1)
    (y1 * weight).sum().backward()
    (y2 * weight).sum().backward()
    for a, b in zip(leaves1, leaves2, strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_topk_gradient_equals_explicit_reference() -> None:
    """Grad of the top-k output equals that of an explicit masked softmax over the kept set."""
    case = gh.make_attention(7, n=6, batch=(2,), masked=True)
    keep = torch.as_tensor(reference_topk(masked_scores(case), 3))
    q1, k1 = case.q.clone().requires_grad_(), case.k.clone().requires_grad_()
    q2, k2 = case.q.clone().requires_grad_(), case.k.clone().requires_grad_()
    y1 = topk_graph(q1, k1, k_top=3, mask=case.mask).propagate(case.x)
    kept = torch.zeros(2, 6, 6, dtype=torch.bool).scatter_(-1, keep, True) & case.mask
    s = (q2 @ k2.transpose(-1, -2)) / np.sqrt(3)
    p = torch.softmax(s.masked_fill(~kept, float("-inf")), -1)
    y2 = p @ case.x
    _assert_same_output_and_gradients(y1, y2, (q1, k1), (q2, k2))


# ---- the selection's memory: narrow causal slabs, kept scores, int32 structure --------------


@pytest.mark.parametrize("variant", ["causal", "causal-empty-rows"])
@pytest.mark.parametrize("k_top", [3, 20, 40])
def test_causal_selection_in_narrow_slabs_keeps_the_k_largest(variant, k_top) -> None:
    """A causal selection scores a block of rows against its first ``max(stop, k)`` keys only;
    the kept columns are still the ``k`` largest of every whole row (ties to the lower index),
    also in rows with fewer than ``k`` allowed keys, for any block size."""
    case = gh.make_attention(11, n=50, batch=(2,), **VARIANTS[variant])
    expected = reference_topk(masked_scores(case), k_top)
    for row_block in (1, 7, 16, 50):
        g = SoftmaxGraph(case.q, case.k, mask=case.mask, causal=True, row_block=row_block)
        np.testing.assert_array_equal(kept_columns(g.topk(k_top), k_top), expected)


def test_topk_gradient_over_many_blocks_equals_explicit_reference() -> None:
    """Causal, masked, 7-row blocks, rows with fewer than k keys: the output and the gradients
    of q and k equal those of an explicit masked softmax over the kept set."""
    case = gh.make_attention(12, n=40, batch=(2, 3), masked=True, causal=True, empty_rows=(5,))
    keep = torch.as_tensor(reference_topk(masked_scores(case), 12))
    allowed = case.mask & torch.ones(40, 40, dtype=torch.bool).tril()
    kept = torch.zeros(2, 3, 40, 40, dtype=torch.bool).scatter_(-1, keep, True) & allowed
    q1, k1 = case.q.clone().requires_grad_(), case.k.clone().requires_grad_()
    q2, k2 = case.q.clone().requires_grad_(), case.k.clone().requires_grad_()
    g = SoftmaxGraph(q1, k1, mask=case.mask, causal=True, row_block=7).topk(12)
    y1 = g.propagate(case.x)
    s = (q2 @ k2.transpose(-1, -2)) / np.sqrt(3)
    p = torch.softmax(s.masked_fill(~kept, float("-inf")), -1).nan_to_num(0.0)  # row 5: empty
    y2 = p @ case.x
    _assert_same_output_and_gradients(y1, y2, (q1, k1), (q2, k2))


def test_kept_scores_backward_equals_autograd_through_the_gather() -> None:
    """``_KeptScores`` (blockwise gather, one key-gradient buffer) against autograd through an
    explicit gather, with keys chosen by several rows and twice in one row; and gradcheck."""
    from heatformer.graph_ops.softmax import _KeptScores

    gen = torch.Generator().manual_seed(3)
    q = torch.randn(3, 10, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(3, 10, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    idx = torch.randint(0, 10, (3, 10, 5), generator=gen, dtype=torch.int32)
    idx[:, 0, :2] = 4  # one key twice in a row
    blocks = [(0, 3), (3, 7), (7, 10)]

    def kept(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return _KeptScores.apply(q, k, idx, 0.5, blocks)

    bf = torch.arange(3)[:, None, None]
    reference = 0.5 * (q.unsqueeze(-2) * k[bf, idx.long()]).sum(-1)  # (3, 10, 5)
    got = kept(q, k)
    torch.testing.assert_close(got, reference, atol=1e-14, rtol=0)
    weight = torch.randn(3, 10, 5, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad((got * weight).sum(), (q, k))
    expected = torch.autograd.grad((reference * weight).sum(), (q, k))
    for a, b in zip(grads, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-14, rtol=0)
    assert torch.autograd.gradcheck(kept, (q, k))


def test_kept_scores_of_half_inputs_are_float32_and_grads_half() -> None:
    from heatformer.graph_ops.softmax import _KeptScores

    gen = torch.Generator().manual_seed(4)
    q64, k64 = (torch.randn(2, 8, 4, generator=gen, dtype=torch.float64) * 200 for _ in "qk")
    idx = torch.randint(0, 8, (2, 8, 3), generator=gen, dtype=torch.int32)
    q = q64.half().requires_grad_()
    k = k64.half().requires_grad_()
    s = _KeptScores.apply(q, k, idx, 0.5, [(0, 8)])
    assert s.dtype == torch.float32 and s.isfinite().all()  # q.k ~ 1e5: beyond float16
    s.sum().backward()
    assert q.grad is not None and k.grad is not None
    assert q.grad.dtype == k.grad.dtype == torch.float16


def test_a_checkpointed_topk_graph_keeps_none_of_its_tensors() -> None:
    """Every tensor the backward of a top-k graph reads goes through ``save_for_backward``,
    so under activation checkpointing nothing of the graph outlives the forward; the
    recomputed backward gives the gradients of the plain one."""
    import gc
    import weakref

    from torch.utils.checkpoint import checkpoint

    case = gh.make_attention(13, n=30, batch=(2,), causal=True)
    refs: list[weakref.ref[torch.Tensor]] = []

    def layer(q: torch.Tensor, k: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        g = SoftmaxGraph(q, k, causal=True, row_block=8).topk(5)
        refs.extend(weakref.ref(t) for t in (g.weight, g._struct.col, g._struct.crow))
        return g.propagate(x)

    inputs = [t.clone().requires_grad_() for t in (case.q, case.k, case.x)]
    y = checkpoint(layer, *inputs, use_reentrant=False)
    gc.collect()
    assert [r() for r in refs] == [None] * 3
    y.square().sum().backward()
    plain = [t.clone().requires_grad_() for t in (case.q, case.k, case.x)]
    layer(*plain).square().sum().backward()
    for a, b in zip(inputs, plain, strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-14, rtol=0)


def test_topk_structure_is_int32_and_the_public_indices_int64() -> None:
    from heatformer.graph_ops._csr import index_dtype

    case = gh.make_attention(14, n=9, batch=(2,), causal=True)
    g = SoftmaxGraph(case.q, case.k, causal=True).topk(3)
    assert g._struct.col.dtype == g._struct.crow.dtype == torch.int32  # 4 bytes an edge
    assert g.row.dtype == g.col.dtype == torch.int64
    edge_index, _ = g.to_edge_index()
    assert edge_index.dtype == torch.int64  # what PyG takes
    assert index_dtype(2**31 - 2, 2**31 - 1) == torch.int32
    assert index_dtype(2**31 - 1, 0) == index_dtype(10, 2**31) == torch.int64


@pytest.mark.parametrize("counts", [[2, 0, 3, 0, 0, 1], [0, 0, 4], [3], [0, 1, 0], [0, 0]])
def test_csr_rows_expand_the_row_pointers(counts) -> None:
    """``CSRStructure.rows`` (sync-free) equals ``repeat_interleave`` of the row lengths,
    empty rows included."""
    from heatformer.graph_ops._csr import CSRStructure

    c = torch.tensor(counts)
    crow = torch.zeros(len(counts) + 1, dtype=torch.int32)
    crow[1:] = c.cumsum(0)
    struct = CSRStructure(crow, torch.zeros(int(c.sum()), dtype=torch.int32), len(counts))
    expected = torch.repeat_interleave(torch.arange(len(counts)), c)
    assert struct.rows().tolist() == expected.tolist()
    assert struct.rows().dtype == torch.int32
