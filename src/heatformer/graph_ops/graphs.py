r"""Attention matrices as weighted, directed graphs.

Conventions (stated once, used everywhere):

- A graph on ``N`` nodes has a non-negative weight matrix ``W`` of shape ``(..., N, N)``; the
  leading dims (usually ``(B, H)``) are the graph's ``batch_shape``. Row ``i`` holds the
  out-edges of node ``i``: for attention, row ``i`` is query ``i`` and ``W[i, j]`` is how much
  it attends to key ``j``.
- ``propagate(x) = W @ x`` and ``propagate_transpose(x) = W^T @ x`` for a signal ``x`` of shape
  ``(..., N, C)`` whose leading dims broadcast to the graph's ``batch_shape`` (extra leading
  dims in front are allowed).
- ``out_degree() = W 1`` (row sums) and ``in_degree() = W^T 1`` (column sums), shape
  ``(..., N)``.
- Self-loops are kept (attention has a diagonal). PyTorch Geometric's ``get_laplacian`` drops
  them; heatformer does not.
- A node with no out-edges (an isolated node, or a fully masked attention row) has a zero row:
  its attention output is 0 and its Laplacian row is 0 (see :mod:`heatformer.graph_ops.laplacian`).

Three kinds of graph implement the same protocol:

- :class:`DenseGraph` holds ``W`` explicitly.
- :class:`SoftmaxGraph` is the implicit attention graph ``P = softmax(q k^T * scale)``; it never
  holds more than a ``(..., block, N)`` slab, and ``propagate`` is one fused
  :func:`~torch.nn.functional.scaled_dot_product_attention` call.
- :class:`SparseGraph` is a batched edge list (e.g. a top-k graph) whose ``propagate`` is a
  sparse CSR product with a backward that stays sparse.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from heatformer.graph_ops import _validation as V
from heatformer.graph_ops._precision import accumulation_dtype
from heatformer.graph_ops._sparse import CSRStructure, csr_matmul

if TYPE_CHECKING:
    import networkx as nx
    import scipy.sparse

__all__ = [
    "DenseGraph",
    "Graph",
    "SoftmaxGraph",
    "SparseGraph",
    "SymmetrizedGraph",
    "topk_graph",
]

#: Most query rows per block in chunked computations (top-k, transpose products, slabs).
DEFAULT_BLOCK_SIZE = 256
#: Fewest query rows per block when the batch is large.
MIN_BLOCK_SIZE = 16
#: Target entries of one ``(Bf, rows, N)`` slab (2^24 floats = 64 MiB in float32): large
#: enough to stay cache- and allocator-friendly, large enough to amortize the loop.
SLAB_ELEMENTS = 1 << 24


def _numel(shape: torch.Size | tuple[int, ...]) -> int:
    return int(math.prod(shape))


def _fold(x: Tensor, batch_shape: torch.Size) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
    """Fold a signal into ``(Bf, N, C')`` with ``Bf = prod(batch_shape)``.

    Leading dims of ``x`` in front of the graph's batch dims are moved into the channel dim,
    so one batched product serves them all. Returns the folded tensor and the inverse map.
    """
    m = len(batch_shape)
    out = torch.broadcast_shapes(x.shape[:-2], batch_shape)
    if tuple(out[len(out) - m :]) != tuple(batch_shape):
        raise ValueError(
            f"x: leading dims {tuple(x.shape[:-2])} would broadcast the graph's batch shape "
            f"{tuple(batch_shape)} to {tuple(out)}; expand the graph instead"
        )
    extra = out[: len(out) - m]
    n, c = x.shape[-2], x.shape[-1]
    e, bf = _numel(extra), _numel(batch_shape)
    xf = x.expand(*out, n, c).reshape(e, bf, n, c)  # (E, Bf, N, C)
    xf = xf.permute(1, 2, 0, 3).reshape(bf, n, e * c)  # (Bf, N, E*C)

    def unfold(y: Tensor) -> Tensor:
        y = y.reshape(bf, n, e, c).permute(2, 0, 1, 3)  # (E, Bf, N, C)
        return y.reshape(*out, n, c)

    return xf, unfold


def _safe_reciprocal(d: Tensor) -> Tensor:
    """``1/d`` where ``d > 0`` and 0 elsewhere (the pseudo-inverse of a diagonal)."""
    pos = d > 0
    return torch.where(pos, 1.0 / torch.where(pos, d, torch.ones_like(d)), torch.zeros_like(d))


def _stable_topk_indices(scores: Tensor, k: int) -> Tensor:
    """Indices of the ``k`` largest entries of each row, ties broken by the lower index.

    Works in ``O(rows * N)`` memory (no sort). Returned column indices are ascending per row.

    Args:
        scores: ``(..., R, N)``; ``-inf`` entries rank last.
        k: number of entries per row, ``1 <= k <= N``.

    Returns:
        ``(..., R, k)`` long tensor.
    """
    n = scores.shape[-1]
    if k == n:
        return torch.arange(n, device=scores.device).expand(*scores.shape[:-1], n)
    values, idx = torch.topk(scores, k + 1, dim=-1, sorted=True)  # (..., R, k + 1)
    kth = values[..., k - 1 : k]  # (..., R, 1)
    # a row is ambiguous only when an entry ties with its k-th largest value across the cut
    ambiguous = values[..., k] == kth[..., 0]  # (..., R)
    idx = idx[..., :k].sort(-1).values
    if bool(ambiguous.any()):
        rows = ambiguous.nonzero(as_tuple=True)
        idx[rows] = _tie_broken_topk(scores[rows], kth[rows], k)
    return idx


def _tie_broken_topk(scores: Tensor, kth: Tensor, k: int) -> Tensor:
    """Rows ``(M, N)`` with ties at their k-th value ``kth`` ``(M, 1)``: keep every entry above
    it and the lowest-index tied ones; ascending column indices ``(M, k)``."""
    n = scores.shape[-1]
    above = scores > kth
    tied = scores == kth
    need = k - above.sum(-1, keepdim=True)  # ties to keep, in index order
    keep = above | (tied & (torch.cumsum(tied.to(torch.int32), -1) <= need))
    # a unique positive key for kept entries (larger for lower index), 0 otherwise
    key = keep.to(torch.int32) * torch.arange(n, 0, -1, device=scores.device, dtype=torch.int32)
    return torch.topk(key, k, dim=-1, sorted=True).indices


def _safe_rsqrt(d: Tensor) -> Tensor:
    """``1/sqrt(d)`` where ``d > 0`` and 0 elsewhere, with finite gradients at ``d = 0``."""
    pos = d > 0
    return torch.where(pos, torch.where(pos, d, torch.ones_like(d)).rsqrt(), torch.zeros_like(d))


def _row_normalize(w: Tensor) -> Tensor:
    """Divide each row (last dim) by its sum; rows summing to 0 stay 0."""
    return w * _safe_reciprocal(w.sum(-1, keepdim=True))


class Graph(ABC):
    """A batch of weighted directed graphs on ``num_nodes`` nodes (the protocol).

    Subclasses implement :meth:`propagate`, :meth:`propagate_transpose`, :meth:`out_degree`,
    :meth:`in_degree` and :meth:`_weight_rows`; everything else (top-k, thresholding,
    symmetrization, interop) is written once here on top of them.
    """

    #: rows sum to 1 except rows with no out-edges, which sum to 0 (e.g. attention).
    row_stochastic: bool = False
    #: ``W == W^T`` by construction.
    symmetric: bool = False
    #: every row has an out-edge, known without reading the weights (e.g. attention without a
    #: key mask); lets the Laplacians skip masking isolated nodes. False means "unknown".
    _rows_nonempty: bool = False

    @property
    @abstractmethod
    def num_nodes(self) -> int:
        """Number of nodes ``N``."""

    @property
    @abstractmethod
    def batch_shape(self) -> torch.Size:
        """Leading dims of the batch of graphs, e.g. ``(B, H)``."""

    #: a tensor of the graph (weights or queries) that fixes its dtype and device
    _tensor: Tensor

    @property
    def dtype(self) -> torch.dtype:
        """Floating dtype of the weights."""
        return self._tensor.dtype

    @property
    def device(self) -> torch.device:
        """Device of the weights."""
        return self._tensor.device

    @abstractmethod
    def propagate(self, x: Tensor) -> Tensor:
        """``W @ x`` for ``x`` of shape ``(..., N, C)``; returns ``(..., N, C)``."""

    @abstractmethod
    def propagate_transpose(self, x: Tensor) -> Tensor:
        """``W^T @ x`` for ``x`` of shape ``(..., N, C)``; returns ``(..., N, C)``."""

    @abstractmethod
    def out_degree(self) -> Tensor:
        """Row sums ``W 1``, shape ``(..., N)``."""

    @abstractmethod
    def in_degree(self) -> Tensor:
        """Column sums ``W^T 1``, shape ``(..., N)``."""

    @abstractmethod
    def _weight_rows(self, start: int, stop: int) -> Tensor:
        """Differentiable dense rows ``W[..., start:stop, :]`` flattened to ``(Bf, rows, N)``."""

    @abstractmethod
    def to(self, dtype: torch.dtype) -> Graph:
        """The same graph computed in ``dtype`` (differentiable; ``self`` if already there).

        An implicit graph recomputes its weights in ``dtype`` (a ``SoftmaxGraph`` casts
        ``q`` and ``k``), so e.g. ``graph.to(torch.float64).to_dense()`` of a bfloat16
        attention graph has rows that sum to 1 in float64.
        """

    # ---- derived, written once -------------------------------------------------------------

    def _score_rows(self, start: int, stop: int) -> Tensor:
        """Ranking scores for top-k, ``(Bf, rows, N)``; missing edges rank last."""
        w = self._weight_rows(start, stop)
        return w

    def _kept_weights(self, start: int, stop: int, idx: Tensor) -> Tensor:
        """Renormalized weights of the kept entries ``idx`` (``(Bf, rows, k)``)."""
        w = self._weight_rows(start, stop).gather(-1, idx)
        return _row_normalize(w)

    def _check_x(self, x: Tensor) -> Tensor:
        return V.check_signal(x, self.num_nodes, self.batch_shape, self.dtype)

    def _blocks(self, block_size: int | None) -> list[tuple[int, int]]:
        if block_size is None:  # keep a (Bf, rows, N) slab near SLAB_ELEMENTS entries
            slab_row = max(1, _numel(self.batch_shape) * self.num_nodes)
            block_size = min(DEFAULT_BLOCK_SIZE, max(MIN_BLOCK_SIZE, SLAB_ELEMENTS // slab_row))
        b = block_size
        V.check_positive_int("block_size", b)
        n = self.num_nodes
        return [(s, min(s + b, n)) for s in range(0, n, b)]

    def to_dense(self) -> Tensor:
        """Materialize ``W`` as a dense ``(..., N, N)`` tensor (differentiable).

        Uses ``N^2`` memory: meant for small graphs, analysis and teaching.
        """
        rows = [self._weight_rows(s, e) for s, e in self._blocks(None)]
        dense = torch.cat(rows, dim=-2)  # (Bf, N, N)
        return dense.reshape(*self.batch_shape, self.num_nodes, self.num_nodes)

    def topk(self, k: int, *, block_size: int | None = None) -> SparseGraph:
        """Keep the ``k`` heaviest out-edges of every node, renormalized to sum 1.

        Exactly ``k`` edges per row; ties are broken by the lower column index, so the result
        is deterministic. Rows are processed in blocks of ``block_size`` queries, so the extra
        memory is ``O(block_size * N)`` per graph, never ``N x N``. Gradients flow into the
        graph's tensors through the kept entries. A row with fewer than ``k`` edges keeps
        zero-weight entries (e.g. early rows of a causal graph); a row with no edges keeps
        ``k`` zero-weight entries, so it stays a node with no out-edges.

        Args:
            k: edges kept per row, ``1 <= k <= N``.
            block_size: query rows per block (default: slabs of about ``SLAB_ELEMENTS`` entries,
                at most 256 rows).

        Returns:
            A :class:`SparseGraph` with the same ``batch_shape``.

        Raises:
            ValueError: if ``k < 1`` or ``k > N``.
        """
        k = V.check_positive_int("k", k, upper=self.num_nodes)
        idx_blocks, w_blocks = [], []
        for s, e in self._blocks(block_size):
            with torch.no_grad():
                idx = _stable_topk_indices(self._score_rows(s, e), k)  # (Bf, rows, k)
            w = self._kept_weights(s, e, idx)  # (Bf, rows, k)
            idx_blocks.append(idx)
            w_blocks.append(w)
        idx = torch.cat(idx_blocks, dim=1)
        w = torch.cat(w_blocks, dim=1)
        shape = (*self.batch_shape, self.num_nodes, k)
        return SparseGraph._from_ell(idx.reshape(shape), w.reshape(shape))

    def threshold(
        self, eps: float, *, renormalize: bool = False, block_size: int | None = None
    ) -> SparseGraph:
        """Keep the edges with weight ``>= eps`` (computed in query blocks).

        Args:
            eps: threshold, ``> 0``.
            renormalize: rescale the kept out-edges of each node to sum 1.
            block_size: query rows per block.

        Returns:
            A :class:`SparseGraph` with the same ``batch_shape``.
        """
        eps = V.check_threshold(eps)
        graph = self._select_edges(lambda w: w >= eps, block_size)
        return graph.row_normalize() if renormalize else graph

    def _select_edges(
        self, keep: Callable[[Tensor], Tensor], block_size: int | None = None
    ) -> SparseGraph:
        """The entries ``w`` with ``keep(w)``, gathered differentiably block by block."""
        n = self.num_nodes
        rows, cols, vals = [], [], []
        for s, e in self._blocks(block_size):
            w = self._weight_rows(s, e)  # (Bf, rows, N)
            b, i, j = keep(w.detach()).nonzero(as_tuple=True)
            rows.append(b * n + i + s)
            cols.append(b * n + j)
            vals.append(w[b, i, j])
        return SparseGraph._trusted(
            torch.cat(rows), torch.cat(cols), torch.cat(vals), num_nodes=n,
            batch_shape=self.batch_shape,
        )  # fmt: skip

    def symmetrize(self) -> Graph:
        """The undirected graph ``W_s = (W + W^T) / 2``."""
        return SymmetrizedGraph(self)

    # ---- interop ---------------------------------------------------------------------------

    def _single(self, index: tuple[int, ...] | int | None) -> Tensor:
        if index is None:
            index = ()
        if isinstance(index, int):
            index = (index,)
        if len(index) != len(self.batch_shape) or any(
            isinstance(i, bool) or not isinstance(i, int) or not -size <= i < size
            for i, size in zip(index, self.batch_shape, strict=False)
        ):
            raise ValueError(
                f"index: this graph has batch shape {tuple(self.batch_shape)}; expected an "
                f"index of {len(self.batch_shape)} ints in range, selecting one graph, got "
                f"{index!r}"
            )
        dense = self.to_dense().detach()
        return dense[index] if index else dense

    def to_networkx(self, index: tuple[int, ...] | int | None = None) -> nx.DiGraph:
        """One graph of the batch as a weighted :class:`networkx.DiGraph` (attr ``"weight"``).

        Args:
            index: which graph of the batch, e.g. ``(b, h)``; omit for an unbatched graph.
        """
        import networkx as nx

        w = self._single(index).cpu().double().numpy()
        g = nx.DiGraph()
        g.add_nodes_from(range(w.shape[0]))
        rows, cols = w.nonzero()
        g.add_weighted_edges_from(
            (int(i), int(j), float(w[i, j])) for i, j in zip(rows, cols, strict=True)
        )
        return g

    def to_scipy(self, index: tuple[int, ...] | int | None = None) -> scipy.sparse.csr_array:
        """One graph of the batch as a :class:`scipy.sparse.csr_array`."""
        import scipy.sparse

        return scipy.sparse.csr_array(self._single(index).cpu().numpy())

    def to_edge_index(self) -> tuple[Tensor, Tensor]:
        """PyG-style ``(edge_index (2, E), edge_weight (E,))``.

        A batched graph is returned as the disjoint union of its graphs (graph ``g`` of the
        flattened batch owns nodes ``g * N ... g * N + N - 1``), as PyG batches graphs.
        """
        return self.to_sparse().to_edge_index()

    def to_sparse(self) -> SparseGraph:
        """This graph as a :class:`SparseGraph` (keeps the non-zero entries)."""
        return self._select_edges(lambda w: w != 0)

    def to_pyg(self, index: tuple[int, ...] | int | None = None) -> Any:
        """One graph as a :class:`torch_geometric.data.Data` with ``edge_index``/``edge_weight``."""
        from torch_geometric.data import Data

        sub = DenseGraph(self._single(index))
        edge_index, edge_weight = sub.to_edge_index()
        return Data(edge_index=edge_index, edge_weight=edge_weight, num_nodes=self.num_nodes)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_nodes={self.num_nodes}, "
            f"batch_shape={tuple(self.batch_shape)}, dtype={self.dtype})"
        )


class DenseGraph(Graph):
    """A batch of graphs given by explicit weights.

    Args:
        weight: ``(..., N, N)`` non-negative floating tensor; row ``i`` holds the out-edges of
            node ``i``.

    Raises:
        TypeError: if ``weight`` is not a floating-point tensor.
        ValueError: if ``weight`` is not square, has fewer than 2 dims, or has negative or
            non-finite entries.

    Example:
        >>> import torch
        >>> g = DenseGraph(torch.tensor([[0., 1., 0.], [1., 0., 1.], [0., 1., 0.]]))
        >>> g.out_degree()
        tensor([1., 2., 1.])
        >>> g.propagate(torch.tensor([[1.], [2.], [3.]])).squeeze(-1)
        tensor([2., 4., 2.])
    """

    def __init__(self, weight: Tensor) -> None:
        weight = V.check_float_tensor("weight", weight, min_dim=2)
        V.check_square("weight", weight)
        with torch.no_grad():
            if not bool(torch.isfinite(weight).all()):
                raise ValueError("weight: expected finite entries, got NaN or inf")
            if bool((weight < 0).any()):
                raise ValueError(
                    f"weight: expected non-negative edge weights, got min {weight.min().item():.3g}"
                )
        self.weight = self._tensor = weight

    @property
    def num_nodes(self) -> int:
        return int(self.weight.shape[-1])

    @property
    def batch_shape(self) -> torch.Size:
        return self.weight.shape[:-2]

    def propagate(self, x: Tensor) -> Tensor:
        return self.weight @ self._check_x(x)

    def propagate_transpose(self, x: Tensor) -> Tensor:
        return self.weight.transpose(-1, -2) @ self._check_x(x)

    def out_degree(self) -> Tensor:
        return self.weight.sum(-1)

    def in_degree(self) -> Tensor:
        return self.weight.sum(-2)

    def _weight_rows(self, start: int, stop: int) -> Tensor:
        n = self.num_nodes
        return self.weight[..., start:stop, :].reshape(-1, stop - start, n)  # (Bf, rows, N)

    def to_dense(self) -> Tensor:
        return self.weight

    def to(self, dtype: torch.dtype) -> DenseGraph:
        if dtype == self.dtype:
            return self
        graph = DenseGraph.__new__(DenseGraph)  # the weights were checked already
        graph.weight = graph._tensor = self.weight.to(dtype)
        return graph

    def symmetrize(self) -> DenseGraph:
        return DenseGraph(0.5 * (self.weight + self.weight.transpose(-1, -2)))

    @classmethod
    def from_networkx(
        cls, graph: nx.Graph, *, weight: str = "weight", dtype: torch.dtype | None = None
    ) -> DenseGraph:
        """Build from a NetworkX graph (nodes in ``graph.nodes`` order; undirected = symmetric).

        Args:
            graph: a :class:`networkx.Graph` or :class:`networkx.DiGraph`.
            weight: edge attribute holding the weight (missing = 1).
            dtype: floating dtype (default: torch's default dtype).
        """
        import networkx as nx

        a = nx.to_numpy_array(graph, weight=weight)
        return cls(torch.as_tensor(a, dtype=dtype or torch.get_default_dtype()))


class SoftmaxGraph(Graph):
    r"""The implicit attention graph ``P = softmax(q k^T * scale)`` (rows are queries).

    Nothing of size ``N x N`` is ever stored: :meth:`propagate` is one
    :func:`~torch.nn.functional.scaled_dot_product_attention` call (fused, flash-backed on
    CUDA), and every other method works on ``(..., block, N)`` slabs of queries.

    A fully masked row is a node with no out-edges: its propagated output is 0 (forward and
    backward stay finite), its out-degree is 0 and its Laplacian row is 0.

    Args:
        q: ``(..., N, E)`` queries.
        k: ``(..., N, E)`` keys; batch dims broadcast with ``q``'s.
        scale: logit scale; default ``1 / sqrt(E)`` as in SDPA.
        mask: bool, broadcastable to ``(..., N, N)``; ``True`` = may attend (SDPA polarity).
        causal: also forbid attending to later positions (``j > i``).
        block_size: query rows per block in chunked methods (default: slabs of about
            ``SLAB_ELEMENTS`` entries, at most 256 rows).

    Shape:
        ``propagate(x)``: ``x`` ``(..., N, C)`` -> ``(..., N, C)``.

    Equivalent to::

        scores = q @ k.transpose(-2, -1) * scale
        scores = scores.masked_fill(~allowed, -inf)       # mask & causal
        P = softmax(scores, -1).nan_to_num(0.0)            # fully masked rows -> 0
        DenseGraph(P)

    Example:
        >>> import torch
        >>> q = k = torch.zeros(1, 3, 2)                  # uniform attention
        >>> g = SoftmaxGraph(q, k, causal=True)
        >>> g.propagate(torch.tensor([[[3.], [6.], [9.]]])).squeeze(-1)
        tensor([[3., 4.5, 6.]])
    """

    row_stochastic = True

    def __init__(
        self,
        q: Tensor,
        k: Tensor,
        *,
        scale: float | None = None,
        mask: Tensor | None = None,
        causal: bool = False,
        block_size: int | None = None,
    ) -> None:
        q = V.check_float_tensor("q", q, min_dim=2)
        k = V.check_float_tensor("k", k, min_dim=2)
        if q.dtype != k.dtype:
            raise TypeError(f"k: expected the dtype of q ({q.dtype}), got {k.dtype}")
        if q.shape[-1] != k.shape[-1]:
            raise ValueError(
                f"k: expected the feature dim of q ({q.shape[-1]}), got shape {tuple(k.shape)}"
            )
        if q.shape[-2] != k.shape[-2]:
            raise ValueError(
                f"k: a SoftmaxGraph is square; expected N = {q.shape[-2]} keys (as many as "
                f"queries), got shape {tuple(k.shape)}"
            )
        try:
            batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        except RuntimeError:
            raise ValueError(
                f"k: batch dims {tuple(k.shape[:-2])} do not broadcast with q's "
                f"{tuple(q.shape[:-2])}"
            ) from None
        if scale is not None:
            if isinstance(scale, bool) or not isinstance(scale, (int, float)):
                raise TypeError(f"scale: expected a finite float or None, got {scale!r}")
            if not math.isfinite(scale):
                raise ValueError(f"scale: expected a finite float or None, got {scale!r}")
        if not isinstance(causal, bool):
            raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
        n = int(q.shape[-2])
        if mask is not None:
            V.check_mask(mask, batch, n)
        self.q = self._tensor = q.expand(*batch, *q.shape[-2:])
        self.k = k.expand(*batch, *k.shape[-2:])
        self.scale = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
        self.mask = mask
        self.causal = causal
        self.block_size = block_size
        self._row_has_edge: Tensor | None = None
        self._rows_nonempty = mask is None  # a causal row keeps its diagonal

    @property
    def num_nodes(self) -> int:
        return int(self.q.shape[-2])

    @property
    def batch_shape(self) -> torch.Size:
        return self.q.shape[:-2]

    def _blocks(self, block_size: int | None) -> list[tuple[int, int]]:
        return super()._blocks(self.block_size if block_size is None else block_size)

    def to(self, dtype: torch.dtype) -> SoftmaxGraph:
        if dtype == self.dtype:
            return self
        return SoftmaxGraph(
            self.q.to(dtype), self.k.to(dtype), scale=self.scale, mask=self.mask,
            causal=self.causal, block_size=self.block_size,
        )  # fmt: skip

    # ---- slabs -----------------------------------------------------------------------------

    def _flat(self) -> tuple[Tensor, Tensor]:
        n, e = self.q.shape[-2:]
        return self.q.reshape(-1, n, e), self.k.reshape(-1, n, e)  # (Bf, N, E) each

    def _allowed_rows(self, start: int, stop: int) -> Tensor | None:
        """Bool ``(Bf or 1, rows, N)`` of allowed edges in rows ``start:stop``; None = all."""
        n = self.num_nodes
        allowed: Tensor | None = None
        if self.mask is not None:
            m = self.mask.expand(*self.batch_shape, n, n)[..., start:stop, :]
            allowed = m.reshape(-1, stop - start, n)  # (Bf, rows, N)
        if self.causal:
            i = torch.arange(start, stop, device=self.device).unsqueeze(-1)
            tri = (torch.arange(n, device=self.device) <= i).unsqueeze(0)  # (1, rows, N)
            allowed = tri if allowed is None else allowed & tri
        return allowed

    def _score_rows(self, start: int, stop: int) -> Tensor:
        q, k = self._flat()
        s = (q[:, start:stop] @ k.transpose(-1, -2)) * self.scale  # (Bf, rows, N)
        allowed = self._allowed_rows(start, stop)
        return s if allowed is None else s.masked_fill(~allowed, float("-inf"))

    def _weight_rows(self, start: int, stop: int) -> Tensor:
        return self._weight_rows_from(*self._flat(), start, stop)

    def _weight_rows_from(self, q: Tensor, k: Tensor, start: int, stop: int) -> Tensor:
        """Rows ``start:stop`` of ``P`` from ``q``, ``k`` ``(Bf, N, E)``: ``(Bf, rows, N)``."""
        s = (q[:, start:stop] @ k.transpose(-1, -2)) * self.scale  # (Bf, rows, N)
        return self._masked_softmax(s, self._allowed_rows(start, stop))

    def _masked_softmax(
        self, s: Tensor, allowed: Tensor | None, *, cut_gradient: bool = False
    ) -> Tensor:
        """The one masked-score softmax of every slab (dense rows, transpose products, top-k).

        Only a key mask can leave a row without an allowed key (a causal row keeps its
        diagonal), so without one the plain softmax of the ``-inf``-filled scores is exact.
        With one (or ``cut_gradient``), disallowed entries are structural zeros: an empty row
        gives 0, not NaN, and no gradient reaches (or, in half precision, overflows at) an
        entry that cannot carry weight. A NaN score of an allowed entry stays NaN.
        """
        if allowed is None:
            return torch.softmax(s, dim=-1)
        s = s.masked_fill(~allowed, float("-inf"))
        if self.mask is None and not cut_gradient:
            return torch.softmax(s, dim=-1)
        has = allowed.any(-1, keepdim=True)
        p = torch.softmax(torch.where(has, s, 0.0), dim=-1)
        return torch.where(allowed, p, 0.0)

    def _kept_weights(self, start: int, stop: int, idx: Tensor) -> Tensor:
        def kept(q: Tensor, k: Tensor) -> Tensor:
            bf = torch.arange(k.shape[0], device=k.device)[:, None, None]
            k_sel = k[bf, idx]  # (Bf, rows, kk, E)
            s = torch.einsum("bre,brke->brk", q[:, start:stop], k_sel) * self.scale
            allowed = self._allowed_rows(start, stop)
            if allowed is not None:
                allowed = allowed.expand(k.shape[0], -1, -1).gather(-1, idx)
            # a kept entry that is not allowed (a row with fewer than k keys) stays a
            # structural zero: no gradient flows through it
            return self._masked_softmax(s, allowed, cut_gradient=True)

        q, k = self._flat()
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
            # recompute in backward: saves O(rows * k * E) per block instead of keeping it
            return checkpoint(kept, q, k, use_reentrant=False)
        return kept(q, k)

    # ---- protocol --------------------------------------------------------------------------

    def propagate(self, x: Tensor) -> Tensor:
        x = self._check_x(x)
        if self.mask is None:
            return F.scaled_dot_product_attention(
                self.q, self.k, x, is_causal=self.causal, scale=self.scale
            )
        if not self.causal:
            # fully masked rows attend everywhere inside SDPA, then are zeroed: no NaN anywhere
            has = self.mask.any(-1, keepdim=True)  # broadcast shape of mask, last dim 1
            y = F.scaled_dot_product_attention(
                self.q, self.k, x, attn_mask=self.mask | ~has, scale=self.scale
            )
            return y * has
        xf, unfold = _fold(x, self.batch_shape)
        q, k = self._flat()
        outs = []
        for s, e in self._blocks(None):
            allowed = self._allowed_mask_rows(s, e)
            has = allowed.any(-1, keepdim=True)  # (Bf, rows, 1)
            y = F.scaled_dot_product_attention(
                q[:, s:e], k, xf, attn_mask=allowed | ~has, scale=self.scale
            )
            outs.append(y * has)
        return unfold(torch.cat(outs, dim=1))

    def _allowed_mask_rows(self, start: int, stop: int) -> Tensor:
        allowed = self._allowed_rows(start, stop)
        if allowed is None:
            return torch.ones(1, stop - start, self.num_nodes, dtype=torch.bool, device=self.device)
        return allowed

    def propagate_transpose(self, x: Tensor) -> Tensor:
        x = self._check_x(x)
        xf, unfold = _fold(x, self.batch_shape)
        q, k = self._flat()

        def block(s: int, e: int) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
            def f(q: Tensor, k: Tensor, xb: Tensor) -> Tensor:
                w = self._weight_rows_from(q, k, s, e)  # (Bf, rows, N)
                return w.transpose(-1, -2) @ xb  # (Bf, N, C')

            return f

        grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or xf.requires_grad)
        out = torch.zeros_like(xf)
        for s, e in self._blocks(None):
            fn = block(s, e)
            xb = xf[:, s:e]
            out = out + (checkpoint(fn, q, k, xb, use_reentrant=False) if grad else fn(q, k, xb))
        return unfold(out)

    def row_has_edge(self) -> Tensor:
        """Bool ``(..., N)``: which rows have at least one allowed key."""
        if self._row_has_edge is None:
            shape = (*self.batch_shape, self.num_nodes)
            if self.mask is None:
                has = torch.ones(shape, dtype=torch.bool, device=self.device)
            elif not self.causal:
                has = self.mask.any(-1).expand(shape)
            else:
                bf = _numel(self.batch_shape)
                blocks = [
                    self._allowed_mask_rows(s, e).any(-1).expand(bf, -1)
                    for s, e in self._blocks(None)
                ]
                has = torch.cat(blocks, dim=-1).reshape(shape)
            self._row_has_edge = has
        return self._row_has_edge

    def out_degree(self) -> Tensor:
        return self.row_has_edge().to(self.dtype)

    def in_degree(self) -> Tensor:
        ones = torch.ones(
            *self.batch_shape, self.num_nodes, 1, dtype=self.dtype, device=self.device
        )
        return self.propagate_transpose(ones).squeeze(-1)


def _check_weights(name: str, weight: Tensor) -> None:
    if not bool(torch.isfinite(weight).all()) or bool((weight < 0).any()):
        raise ValueError(f"{name}: expected finite, non-negative edge weights")


def _check_edges(
    row: object,
    col: object,
    weight: object,
    num_nodes: int,
    batch_shape: torch.Size,
    *,
    index_name: str = "row, col",
    weight_name: str = "weight",
) -> None:
    """The checks of a user-given edge list (global indices of a batch of graphs)."""
    weight = V.check_float_tensor(weight_name, weight)
    names = index_name.split(", ") if "," in index_name else [index_name] * 2
    for name, idx in zip(names, (row, col), strict=True):
        if not isinstance(idx, Tensor) or idx.dtype not in (torch.int32, torch.int64):
            raise TypeError(
                f"{name}: expected an integer tensor, got "
                f"{getattr(idx, 'dtype', type(idx).__name__)}"
            )
    row, col = cast(Tensor, row), cast(Tensor, col)
    if not (row.dim() == col.dim() == weight.dim() == 1) or not (
        row.numel() == col.numel() == weight.numel()
    ):
        raise ValueError(
            f"{index_name}, {weight_name}: expected E source indices, E target indices and E "
            f"weights, got shapes {tuple(row.shape)}, {tuple(col.shape)} and "
            f"{tuple(weight.shape)}"
        )
    size = _numel(batch_shape) * num_nodes
    if row.numel() == 0:
        return
    with torch.no_grad():
        lo, hi = int(torch.minimum(row.min(), col.min())), int(torch.maximum(row.max(), col.max()))
        if lo < 0 or hi >= size:
            where = f"batch shape {tuple(batch_shape)} and " if len(batch_shape) else ""
            raise ValueError(
                f"{index_name}: expected indices in [0, {size}) for {where}num_nodes "
                f"{num_nodes}, got [{lo}, {hi}]"
            )
        if bool(((row // num_nodes) != (col // num_nodes)).any()):
            raise ValueError(f"{index_name}: an edge joins two different graphs of the batch")
        _check_weights(weight_name, weight)


class SparseGraph(Graph):
    """A batch of sparse graphs (e.g. top-k attention) stored as one block-diagonal CSR matrix.

    Graph ``g`` of the flattened batch owns global rows/columns ``g * N ... g * N + N - 1``.
    Entries are kept in row-major order; duplicates (repeated ``(row, col)`` pairs) are summed
    by every operation. ``propagate`` is a ``torch.sparse`` CSR product whose backward is
    sparse too (see :mod:`heatformer.graph_ops._sparse`), so memory grows with the number of
    edges ``E`` (``N * k`` for a top-k graph), never with ``N^2``.

    Prefer the constructors :meth:`from_ell` (``k`` neighbours per row),
    :meth:`from_edge_index` (PyG) and :meth:`Graph.topk`.

    Args:
        row: ``(E,)`` global row index of each edge.
        col: ``(E,)`` global column index (same graph as its row).
        weight: ``(E,)`` non-negative edge weights (differentiable).
        num_nodes: ``N``.
        batch_shape: leading dims of the batch, e.g. ``(B, H)``.

    Example:
        >>> import torch
        >>> edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
        >>> g = SparseGraph.from_edge_index(edge_index, torch.ones(4), num_nodes=3)
        >>> g.out_degree()
        tensor([1., 2., 1.])
        >>> g.propagate(torch.tensor([[1.], [2.], [3.]])).squeeze(-1)
        tensor([2., 4., 2.])
    """

    def __init__(
        self,
        row: Tensor,
        col: Tensor,
        weight: Tensor,
        *,
        num_nodes: int,
        batch_shape: tuple[int, ...] | torch.Size = (),
    ) -> None:
        num_nodes = V.check_positive_int("num_nodes", num_nodes)
        _check_edges(row, col, weight, num_nodes, torch.Size(batch_shape))
        self._init(row.long(), col.long(), weight, num_nodes, torch.Size(batch_shape), sort=True)

    def _init(
        self,
        row: Tensor,
        col: Tensor,
        weight: Tensor,
        num_nodes: int,
        batch_shape: torch.Size,
        *,
        sort: bool,
    ) -> None:
        self._batch_shape = batch_shape
        self._n = num_nodes
        size = _numel(batch_shape) * num_nodes
        if sort:
            key = row * size + col
            if key.numel() > 1 and not bool((key[1:] >= key[:-1]).all()):  # sort to row-major
                order = torch.argsort(key, stable=True)
                row, col, weight = row[order], col[order], weight[order]
        counts = torch.bincount(row, minlength=size)
        crow = torch.zeros(size + 1, dtype=torch.long, device=row.device)
        crow[1:] = torch.cumsum(counts, 0)
        self._struct = CSRStructure(crow, col, row, size)
        self._transposed: tuple[CSRStructure, Tensor] | None = None
        self.weight = self._tensor = weight

    @classmethod
    def _trusted(
        cls,
        row: Tensor,
        col: Tensor,
        weight: Tensor,
        *,
        num_nodes: int,
        batch_shape: torch.Size,
        sort: bool = True,
    ) -> SparseGraph:
        """Build from edges the library made itself: no validation, no host sync for it.

        ``row``/``col`` are int64 global indices in range; non-finite weights pass through
        (NaN in, NaN out). With ``sort=False`` the entries must already be row-major.
        """
        graph = cls.__new__(cls)
        graph._init(row, col, weight, num_nodes, torch.Size(batch_shape), sort=sort)
        return graph

    # ---- constructors ----------------------------------------------------------------------

    @classmethod
    def from_ell(cls, indices: Tensor, weight: Tensor) -> SparseGraph:
        """Build from ``k`` neighbours per node (ELLPACK layout).

        Args:
            indices: ``(..., N, k)`` integer column indices in ``[0, N)`` of each node's
                out-edges.
            weight: ``(..., N, k)`` their finite, non-negative weights.

        Raises:
            TypeError: ``indices`` not an integer tensor, ``weight`` not a floating one.
            ValueError: mismatched shapes, indices out of range, negative or non-finite
                weights.
        """
        if not isinstance(indices, Tensor) or indices.dtype not in (torch.int32, torch.int64):
            raise TypeError(
                f"indices: expected an integer tensor of shape (..., N, k), got "
                f"{getattr(indices, 'dtype', type(indices).__name__)}"
            )
        weight = V.check_float_tensor("weight", weight, min_dim=2)
        if indices.shape != weight.shape or indices.dim() < 2:
            raise ValueError(
                f"weight: expected the shape of indices {tuple(indices.shape)} (..., N, k), "
                f"got {tuple(weight.shape)}"
            )
        n = int(indices.shape[-2])
        with torch.no_grad():
            if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= n):
                raise ValueError(
                    f"indices: expected column indices in [0, {n}), got "
                    f"[{int(indices.min())}, {int(indices.max())}]"
                )
            _check_weights("weight", weight)
        return cls._from_ell(indices, weight)

    @classmethod
    def _from_ell(cls, indices: Tensor, weight: Tensor) -> SparseGraph:
        """:meth:`from_ell` without checks, for indices the library made (e.g. top-k)."""
        *batch_list, n, k = indices.shape
        batch = torch.Size(batch_list)
        bf = _numel(batch)
        base = (torch.arange(bf, device=indices.device) * n).view(bf, 1, 1)
        row = (base + torch.arange(n, device=indices.device).view(1, n, 1)).expand(bf, n, k)
        col = indices.reshape(bf, n, k).long() + base
        return cls._trusted(
            row.reshape(-1), col.reshape(-1), weight.reshape(-1), num_nodes=n, batch_shape=batch,
            sort=False,  # rows in order; columns within a row in any order suit the kernel
        )  # fmt: skip

    @classmethod
    def from_edge_index(
        cls, edge_index: Tensor, edge_weight: Tensor | None = None, num_nodes: int | None = None
    ) -> SparseGraph:
        """Build one graph from a PyG ``edge_index`` of shape ``(2, E)`` (row 0 = sources).

        Args:
            edge_index: ``(2, E)`` integer tensor; edge ``e`` goes ``edge_index[0, e] ->
                edge_index[1, e]`` and becomes the entry ``W[src, dst]``.
            edge_weight: ``(E,)`` finite, non-negative weights (default 1).
            num_nodes: ``N`` (default ``edge_index.max() + 1``).

        Raises:
            TypeError: ``edge_index`` not an integer tensor, ``edge_weight`` not a floating
                one, ``num_nodes`` not an int.
            ValueError: wrong shapes, indices outside ``[0, num_nodes)``, negative or
                non-finite weights.
        """
        if not isinstance(edge_index, Tensor) or edge_index.dtype not in (
            torch.int32,
            torch.int64,
        ):
            got = getattr(edge_index, "dtype", type(edge_index).__name__)
            raise TypeError(f"edge_index: expected an integer tensor of shape (2, E), got {got}")
        if edge_index.dim() != 2 or edge_index.shape[0] != 2:
            raise ValueError(
                f"edge_index: expected an integer tensor of shape (2, E), got shape "
                f"{tuple(edge_index.shape)}"
            )
        if edge_weight is None:
            edge_weight = torch.ones(edge_index.shape[1], device=edge_index.device)
        if num_nodes is None:
            num_nodes = int(edge_index.max()) + 1 if edge_index.numel() else 1
        num_nodes = V.check_positive_int("num_nodes", num_nodes)
        row, col = edge_index[0], edge_index[1]
        _check_edges(
            row, col, edge_weight, num_nodes, torch.Size(),
            index_name="edge_index", weight_name="edge_weight",
        )  # fmt: skip
        return cls._trusted(
            row.long(), col.long(), edge_weight, num_nodes=num_nodes, batch_shape=torch.Size()
        )

    @classmethod
    def from_networkx(
        cls, graph: nx.Graph, *, weight: str = "weight", dtype: torch.dtype | None = None
    ) -> SparseGraph:
        """Build from a NetworkX graph (undirected edges in both directions).

        Args:
            graph: a :class:`networkx.Graph` or :class:`networkx.DiGraph`.
            weight: edge attribute holding the weight (missing = 1).
            dtype: floating dtype (default: torch's default dtype).
        """
        import networkx as nx

        matrix = nx.to_scipy_sparse_array(graph, weight=weight, format="csr")
        return cls.from_scipy(matrix, dtype=dtype or torch.get_default_dtype())

    @classmethod
    def from_scipy(cls, matrix: Any, *, dtype: torch.dtype | None = None) -> SparseGraph:
        """Build one graph from a square ``scipy.sparse`` matrix or array.

        Duplicate entries are summed. ``dtype`` defaults to the matrix's floating dtype
        (torch's default dtype for integer matrices).
        """
        import numpy as np

        csr = matrix.tocsr()
        csr.sum_duplicates()
        coo = csr.tocoo()
        if coo.shape[0] != coo.shape[1]:
            raise ValueError(f"matrix: expected a square matrix, got shape {coo.shape}")
        if dtype is None:
            floating = np.issubdtype(coo.data.dtype, np.floating)
            dtype = torch.from_numpy(coo.data[:0]).dtype if floating else None
        idx = torch.from_numpy(np.stack([coo.row, coo.col]).astype(np.int64)).reshape(2, -1)
        w = torch.as_tensor(coo.data, dtype=dtype or torch.get_default_dtype())
        return cls.from_edge_index(idx, w, coo.shape[0])

    # ---- properties ------------------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        return self._n

    @property
    def batch_shape(self) -> torch.Size:
        return self._batch_shape

    @property
    def num_edges(self) -> int:
        """Stored entries ``E`` over the whole batch."""
        return int(self.weight.numel())

    @property
    def row(self) -> Tensor:
        """``(E,)`` global row index of each stored entry."""
        return self._struct.row

    @property
    def col(self) -> Tensor:
        """``(E,)`` global column index of each stored entry."""
        return self._struct.col

    def _transpose(self) -> tuple[CSRStructure, Tensor]:
        if self._transposed is None:
            self._transposed = self._struct.transpose()
        return self._transposed

    # ---- protocol --------------------------------------------------------------------------

    def propagate(self, x: Tensor) -> Tensor:
        xf, unfold = _fold(self._check_x(x), self.batch_shape)
        bf, n, c = xf.shape
        y = csr_matmul(self.weight, xf.reshape(bf * n, c), self._struct, self._transpose)
        return unfold(y.reshape(bf, n, c))

    def propagate_transpose(self, x: Tensor) -> Tensor:
        xf, unfold = _fold(self._check_x(x), self.batch_shape)
        bf, n, c = xf.shape
        struct_t, perm = self._transpose()

        def back() -> tuple[CSRStructure, Tensor]:  # (A^T)^T = A
            return self._struct, _inverse(perm)

        y = csr_matmul(self.weight[perm], xf.reshape(bf * n, c), struct_t, back)
        return unfold(y.reshape(bf, n, c))

    def _degree(self, index: Tensor) -> Tensor:
        w = self.weight.to(accumulation_dtype(self.dtype))  # half precision sums in float32
        d = w.new_zeros(self._struct.size).index_add(0, index, w).to(self.dtype)
        return d.reshape(*self.batch_shape, self.num_nodes)

    def out_degree(self) -> Tensor:
        return self._degree(self._struct.row)

    def in_degree(self) -> Tensor:
        return self._degree(self._struct.col)

    def _weight_rows(self, start: int, stop: int) -> Tensor:
        n, bf = self.num_nodes, _numel(self.batch_shape)
        local_row = self._struct.row % n
        sel = ((local_row >= start) & (local_row < stop)).nonzero(as_tuple=True)[0]
        b = self._struct.row[sel] // n
        out = self.weight.new_zeros(bf, stop - start, n)
        return out.index_put(
            (b, local_row[sel] - start, self._struct.col[sel] % n),
            self.weight[sel],
            accumulate=True,
        )

    def to_dense(self) -> Tensor:
        n, bf = self.num_nodes, _numel(self.batch_shape)
        out = self.weight.new_zeros(bf, n, n)
        out = out.index_put(
            (self._struct.row // n, self._struct.row % n, self._struct.col % n),
            self.weight,
            accumulate=True,
        )
        return out.reshape(*self.batch_shape, n, n)

    def symmetrize(self) -> SparseGraph:
        s = self._struct
        return SparseGraph._trusted(
            torch.cat([s.row, s.col]), torch.cat([s.col, s.row]),
            0.5 * torch.cat([self.weight, self.weight]), num_nodes=self.num_nodes,
            batch_shape=self.batch_shape,
        )  # fmt: skip

    def row_normalize(self) -> SparseGraph:
        """The random-walk graph ``D_out^+ W`` (rows with edges sum to 1)."""
        inv = _safe_reciprocal(self.out_degree()).reshape(-1)
        return SparseGraph._trusted(
            self._struct.row, self._struct.col, self.weight * inv[self._struct.row],
            num_nodes=self.num_nodes, batch_shape=self.batch_shape, sort=False,
        )  # fmt: skip

    def threshold(
        self, eps: float, *, renormalize: bool = False, block_size: int | None = None
    ) -> SparseGraph:
        eps = V.check_threshold(eps)
        keep = (self.weight.detach() >= eps).nonzero(as_tuple=True)[0]
        graph = SparseGraph._trusted(
            self._struct.row[keep], self._struct.col[keep], self.weight[keep],
            num_nodes=self.num_nodes, batch_shape=self.batch_shape, sort=False,
        )  # fmt: skip
        return graph.row_normalize() if renormalize else graph

    def to_sparse(self) -> SparseGraph:
        return self

    def to(self, dtype: torch.dtype) -> SparseGraph:
        if dtype == self.dtype:
            return self
        graph = SparseGraph.__new__(SparseGraph)  # same structure, cast weights
        graph._batch_shape, graph._n = self._batch_shape, self._n
        graph._struct, graph._transposed = self._struct, self._transposed
        graph.weight = graph._tensor = self.weight.to(dtype)
        return graph

    def to_edge_index(self) -> tuple[Tensor, Tensor]:
        """``(edge_index (2, E), edge_weight (E,))``; batched graphs as a disjoint union."""
        return torch.stack([self._struct.row, self._struct.col]), self.weight


def _inverse(perm: Tensor) -> Tensor:
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device)
    return inv


class SymmetrizedGraph(Graph):
    """The undirected graph ``W_s = (W + W^T) / 2`` of any graph, without materializing it.

    ``propagate(x) = (W x + W^T x) / 2``; degrees are the mean of out- and in-degree.

    Args:
        base: the directed graph.
    """

    symmetric = True

    def __init__(self, base: Graph) -> None:
        if not isinstance(base, Graph):
            raise TypeError(f"base: expected a Graph, got {type(base).__name__}")
        self.base = base
        self._tensor = base._tensor

    @property
    def num_nodes(self) -> int:
        return self.base.num_nodes

    @property
    def batch_shape(self) -> torch.Size:
        return self.base.batch_shape

    def propagate(self, x: Tensor) -> Tensor:
        return 0.5 * (self.base.propagate(x) + self.base.propagate_transpose(x))

    def propagate_transpose(self, x: Tensor) -> Tensor:
        return self.propagate(x)

    def out_degree(self) -> Tensor:
        return 0.5 * (self.base.out_degree() + self.base.in_degree())

    def in_degree(self) -> Tensor:
        return self.out_degree()

    def _weight_rows(self, start: int, stop: int) -> Tensor:
        rows = self.base._weight_rows(start, stop)  # (Bf, rows, N)
        # columns start:stop of W, i.e. rows of W^T, gathered block by block
        cols = torch.cat(
            [self.base._weight_rows(s, e)[..., start:stop] for s, e in self._blocks(None)], dim=1
        )  # (Bf, N, rows)
        return 0.5 * (rows + cols.transpose(-1, -2))

    def to_dense(self) -> Tensor:
        w = self.base.to_dense()
        return 0.5 * (w + w.transpose(-1, -2))

    def symmetrize(self) -> SymmetrizedGraph:
        return self

    def to(self, dtype: torch.dtype) -> SymmetrizedGraph:
        return self if dtype == self.dtype else SymmetrizedGraph(self.base.to(dtype))


def topk_graph(
    q: Tensor,
    k: Tensor,
    *,
    k_top: int,
    scale: float | None = None,
    mask: Tensor | None = None,
    causal: bool = False,
    block_size: int | None = None,
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
        block_size: query rows per block (default: slabs of about ``SLAB_ELEMENTS`` entries,
                at most 256 rows).

    Returns:
        :class:`SparseGraph` with ``N * k_top`` edges per graph.
    """
    graph = SoftmaxGraph(q, k, scale=scale, mask=mask, causal=causal, block_size=block_size)
    k_top = V.check_positive_int("k_top", k_top, upper=graph.num_nodes)  # ``k`` is the keys
    return graph.topk(k_top, block_size=block_size)
