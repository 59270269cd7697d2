"""Sparse graphs made from any graph: top-k, thresholding and the non-zero entries.

Everything works on :meth:`~heatformer.graph_ops.Graph.weight_rows` slabs of at most
``row_block`` query rows, so the extra memory is ``O(row_block * N)`` per graph, never
``N x N``; the kept weights stay differentiable in the graph's tensors.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from heatformer import checks as V
from heatformer.graph_ops._arrays import numel
from heatformer.graph_ops._csr import index_dtype
from heatformer.graph_ops.protocol import SELECTION_SLAB_ELEMENTS, Graph
from heatformer.graph_ops.softmax import SoftmaxGraph
from heatformer.graph_ops.sparse import (
    SparseGraph,
    trusted_sparse_graph,
    trusted_sparse_graph_from_ell,
)

__all__ = ["stable_topk_indices", "threshold", "to_sparse", "topk", "topk_graph"]


def topk(graph: Graph, k_top: int, *, row_block: int | None = None) -> SparseGraph:
    """:meth:`Graph.topk <heatformer.graph_ops.Graph.topk>` (see there)."""
    k = V.check_positive_int("k_top", k_top, upper=graph.num_nodes)
    rows = numel(graph.batch_shape) * graph.num_nodes
    dtype = index_dtype(rows, rows * k)  # int32 unless the batch needs int64: 4 bytes an edge
    blocks = graph._blocks(
        row_block, row_entries=graph._kept_row_entries(k), slab_elements=SELECTION_SLAB_ELEMENTS
    )
    # every block writes into one buffer: a list of per-block pieces joined at the end held
    # the indices twice, and its thousands of small pieces (a 16-row block's is 8 KiB) came
    # from the heap, whose holes stay resident (docs/benchmarks.md, top-k training memory)
    idx = torch.empty(
        numel(graph.batch_shape), graph.num_nodes, k, dtype=dtype, device=graph.device
    )
    with torch.no_grad():
        for s, e in blocks:
            idx[:, s:e] = stable_topk_indices(graph._score_rows(s, e, k), k)  # (Bf, rows, k)
    w = graph._kept_weights(idx, blocks)  # (Bf, N, k)
    shape = (*graph.batch_shape, graph.num_nodes, k)
    return trusted_sparse_graph_from_ell(idx.reshape(shape), w.reshape(shape), row_stochastic=True)


def threshold(
    graph: Graph, eps: float, *, renormalize: bool = False, row_block: int | None = None
) -> SparseGraph:
    """:meth:`Graph.threshold <heatformer.graph_ops.Graph.threshold>` (see there)."""
    eps = V.check_threshold(eps)
    kept = select_edges(graph, lambda w: w >= eps, row_block)
    return kept.row_normalize() if renormalize else kept


def to_sparse(graph: Graph) -> SparseGraph:
    """The non-zero entries of ``graph`` as a :class:`SparseGraph`."""
    return select_edges(graph, lambda w: w != 0)


def select_edges(
    graph: Graph, keep: Callable[[Tensor], Tensor], row_block: int | None = None
) -> SparseGraph:
    """The entries ``w`` with ``keep(w)``, gathered differentiably block by block (a
    :class:`SparseGraph`: its stored entries, without blocks)."""
    if isinstance(graph, SparseGraph):
        return graph._kept_entries(keep)
    n = graph.num_nodes
    rows, cols, vals = [], [], []
    for s, e in graph._blocks(row_block):
        w = graph.weight_rows(s, e)  # (Bf, rows, N)
        b, i, j = keep(w.detach()).nonzero(as_tuple=True)
        rows.append(b * n + i + s)
        cols.append(b * n + j)
        vals.append(w[b, i, j])
    return trusted_sparse_graph(
        torch.cat(rows), torch.cat(cols), torch.cat(vals), num_nodes=n,
        batch_shape=graph.batch_shape,
    )  # fmt: skip


def _reads_free(t: Tensor) -> bool:
    """Whether reading ``t`` on the host costs nothing: a CPU tensor, outside tracing (on an
    accelerator every read is a device sync, and :func:`torch.compile` cannot trace one)."""
    return t.device.type == "cpu" and not torch.compiler.is_compiling()


def stable_topk_indices(scores: Tensor, k: int) -> Tensor:
    """Indices of the ``k`` largest entries of each row, ties broken by the lower index.

    The one selection of every kind's top-k (:func:`topk`, the window kind's top-k inside the
    window, the ``topk`` kind's decoding), so that they all keep the same edges. Works in
    ``O(rows * N)`` memory (no sort). Returned column indices are ascending per row.

    Two ways to the same indices: on the CPU (:func:`_reads_free`), one ``topk`` and a read of
    whether any row has a tie across its ``k``-th value, which only those rows then resolve
    (ties are rare; resolving every row costs 3-5x the selection, measured); elsewhere every
    row is resolved, with no read (no device sync, traceable).

    Args:
        scores: ``(..., R, N)``; ``-inf`` entries rank last.
        k: number of entries per row, ``1 <= k <= N``.

    Returns:
        ``(..., R, k)`` long tensor.
    """
    n = scores.shape[-1]
    if k == n:
        return torch.arange(n, device=scores.device).expand(*scores.shape[:-1], n)
    if not _reads_free(scores):
        kth = torch.topk(scores, k, dim=-1, sorted=True).values[..., k - 1 : k]  # (..., R, 1)
        return _tie_broken_topk(scores, kth, k)
    values, idx = torch.topk(scores, k + 1, dim=-1, sorted=True)  # (..., R, k + 1)
    kth = values[..., k - 1 : k]  # (..., R, 1)
    # a row is ambiguous only when an entry ties with its k-th largest value across the cut
    ambiguous = values[..., k] == kth[..., 0]  # (..., R)
    idx = idx[..., :k].sort(-1).values
    if bool(ambiguous.any()):  # a CPU read, no device sync
        rows = ambiguous.nonzero(as_tuple=True)
        idx[rows] = _tie_broken_topk(scores[rows], kth[rows], k)
    return idx


def _tie_broken_topk(scores: Tensor, kth: Tensor, k: int) -> Tensor:
    """Rows ``(..., M, N)`` with their k-th value ``kth`` ``(..., M, 1)``: keep every entry
    above it and the lowest-index tied ones; ascending column indices ``(..., M, k)``."""
    n = scores.shape[-1]
    above = scores > kth
    tied = scores == kth
    need = k - above.sum(-1, keepdim=True)  # ties to keep, in index order
    keep = above | (tied & (torch.cumsum(tied.to(torch.int32), -1) <= need))
    # a unique positive key for kept entries (larger for lower index), 0 otherwise
    key = keep.to(torch.int32) * torch.arange(n, 0, -1, device=scores.device, dtype=torch.int32)
    return torch.topk(key, k, dim=-1, sorted=True).indices  # descending key: ascending index


def topk_graph(
    q: Tensor,
    k: Tensor,
    *,
    k_top: int,
    scale: float | None = None,
    mask: Tensor | None = None,
    causal: bool = False,
    row_block: int | None = None,
) -> SparseGraph:
    """Top-k sparsified attention graph, built in query blocks (never ``N x N``).

    Shorthand for ``SoftmaxGraph(q, k, scale=..., mask=..., causal=...).topk(k_top)``: each
    query keeps its ``k_top`` highest-scoring allowed keys (ties to the lower index), with
    weights ``softmax`` over the kept scores, so gradients reach ``q`` and ``k``.

    Args:
        q: ``(..., N, E)`` queries.
        k: ``(..., N, E)`` keys.
        k_top: edges per query, ``1 <= k_top <= N``.
        scale, mask, causal: as in :class:`SoftmaxGraph`.
        row_block: query rows per block (default: slabs of about ``SLAB_ELEMENTS`` entries,
            at most 256 rows).

    Returns:
        :class:`SparseGraph` with ``N * k_top`` edges per graph.
    """
    graph = SoftmaxGraph(q, k, scale=scale, mask=mask, causal=causal, row_block=row_block)
    k_top = V.check_positive_int("k_top", k_top, upper=graph.num_nodes)  # ``k`` is the keys
    return graph.topk(k_top, row_block=row_block)
