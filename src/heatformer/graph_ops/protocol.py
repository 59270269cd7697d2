r"""The graph protocol: attention matrices as weighted, directed graphs.

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

The protocol, :class:`Graph`, knows no implementation. The graph kinds live in their own
modules: :mod:`~heatformer.graph_ops.dense` (explicit weights),
:mod:`~heatformer.graph_ops.softmax` (the implicit attention graph, one fused SDPA call per
``propagate``), :mod:`~heatformer.graph_ops.sparse` (edge lists and top-k graphs, a CSR
product) and :mod:`~heatformer.graph_ops.symmetrized`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from heatformer import checks as V
from heatformer.graph_ops._arrays import fold, numel, row_normalize, safe_reciprocal
from heatformer.graph_ops._precision import accumulation_dtype
from heatformer.graph_ops._walk_stats import weight_rows as weight_row_entropy

if TYPE_CHECKING:
    import networkx as nx
    import scipy.sparse

    from heatformer.graph_ops.sparse import SparseGraph

__all__ = ["DEFAULT_BLOCK_SIZE", "MIN_BLOCK_SIZE", "SLAB_ELEMENTS", "Graph", "check_graph"]

#: Most query rows per block in chunked computations (top-k, transpose products, slabs).
DEFAULT_BLOCK_SIZE = 256
#: Fewest query rows per block when the batch is large.
MIN_BLOCK_SIZE = 16
#: Target entries of one ``(Bf, rows, N)`` slab (2^24 floats = 64 MiB in float32): large
#: enough to stay cache- and allocator-friendly, large enough to amortize the loop.
SLAB_ELEMENTS = 1 << 24
#: The same for the score slabs of a top-k selection (2^21 floats = 8 MiB): they live beside a
#: model's activations (and activation checkpointing makes them again during backward), and
#: smaller slabs cost the selection no measurable time (bench_topk_train.py).
SELECTION_SLAB_ELEMENTS = 1 << 21
#: Feature width of the constant queries and keys with which an attention kind computes
#: :meth:`Graph.uniform` (every allowed score 0): a multiple of 8, as fused kernels want.
UNIFORM_DIM = 8


class Graph(ABC):
    """A batch of weighted directed graphs on ``num_nodes`` nodes (the protocol).

    A graph kind implements :meth:`propagate`, :meth:`propagate_transpose`,
    :meth:`out_degree`, :meth:`weight_rows` and :meth:`to`, and sets ``_tensor`` (a tensor of
    the graph: it fixes :attr:`dtype` and :attr:`device`, and, when it is ``(..., N, ·)``, the
    default :attr:`num_nodes` and :attr:`batch_shape`; :meth:`in_degree` defaults to
    :meth:`propagate_transpose` of ones). Everything else (dense form, top-k, thresholding,
    symmetrization, interop, the uniform walk of :meth:`uniform`) is written once, here and in
    :mod:`~heatformer.graph_ops.sparsify`, :mod:`~heatformer.graph_ops.symmetrized` and
    :mod:`~heatformer.graph_ops.interop`, on top of them.

    What a kind may add, each a documented extension point: :attr:`row_stochastic`,
    :attr:`symmetric` and :attr:`rows_nonempty` (facts known without reading the weights,
    which spare the Laplacians work), a faster :meth:`uniform` where the kind knows its
    structure (the softmax, window and sparse kinds override it), and :meth:`sparse_entries`
    with a :meth:`to_sparse` that lists the edges without ``N x N`` work (the sparse and window
    kinds).
    """

    #: rows sum to 1 except rows with no out-edges, which sum to 0 (e.g. attention).
    row_stochastic: bool = False
    #: ``W == W^T`` by construction.
    symmetric: bool = False
    #: every row has an out-edge, known without reading the weights (e.g. attention without a
    #: key mask); lets the Laplacians skip masking isolated nodes. False means "unknown".
    rows_nonempty: bool = False

    #: a tensor of the graph (weights or queries) that fixes its dtype and device, and by
    #: default its :attr:`num_nodes` and :attr:`batch_shape`: ``(..., N, ·)``
    _tensor: Tensor

    @property
    def num_nodes(self) -> int:
        """Number of nodes ``N`` (by default ``_tensor``'s dim -2: a kind whose tensor is
        not ``(..., N, ·)`` overrides it)."""
        return int(self._tensor.shape[-2])

    @property
    def batch_shape(self) -> torch.Size:
        """Leading dims of the batch of graphs, e.g. ``(B, H)`` (by default ``_tensor``'s
        dims before the last two)."""
        return self._tensor.shape[:-2]

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

    def in_degree(self) -> Tensor:
        """Column sums ``W^T 1``, shape ``(..., N)``: by default :meth:`propagate_transpose`
        of ones (the implicit kinds keep it; an explicit kind sums its weights)."""
        ones = torch.ones(
            *self.batch_shape, self.num_nodes, 1, dtype=self.dtype, device=self.device
        )  # (..., N, 1)
        return self.propagate_transpose(ones).squeeze(-1)

    def walk_statistics(self, row_block: int | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        r"""``(in_degree, entropy, max_logit)`` of the walk ``P = D_out^+ W``, each ``(..., N)``.

        ``in_degree`` is ``P^T 1`` (column sums: how much each node is read), ``entropy`` the
        Shannon entropy of each row of ``P`` in nats (0 for a row without edges), ``max_logit``
        the largest allowed logit of each row for a kind made of logits (attention:
        ``softmax(q k^T * scale)``; ``-inf`` on a row without edges), None for a kind that
        holds weights only. For attention ``P = W``. Computed a block of rows at a time, never
        ``N x N``; in :func:`~heatformer.graph_ops._precision.accumulation_dtype` (float32 for
        half weights). What :func:`heatformer.analysis.attention_stats` returns.

        An extension point: by default the dense rows of :meth:`weight_rows`, ``(Bf, rows, N)``
        per block (``O(N^2)`` work, ``O(rows N)`` memory); the attention kinds reduce their
        logits (the softmax kind's rows, the window kind's band), the sparse kind its edges.

        Args:
            row_block: query rows per block (default: slabs of about ``SLAB_ELEMENTS``).
        """
        acc = accumulation_dtype(self.dtype)
        n, bf = self.num_nodes, numel(self.batch_shape)
        inv = safe_reciprocal(self.out_degree().to(acc)).reshape(bf, n, 1)  # (Bf, N, 1)
        column = torch.zeros(bf, n, dtype=acc, device=self.device)  # (Bf, N)
        entropy = []
        for start, stop in self._blocks(row_block):
            p = self.weight_rows(start, stop).to(acc) * inv[:, start:stop]  # (Bf, rows, N)
            column = column + p.sum(1)
            entropy.append(weight_row_entropy(p))  # (Bf, rows)
        shape = (*self.batch_shape, n)
        return column.reshape(shape), torch.cat(entropy, dim=1).reshape(shape), None

    @abstractmethod
    def weight_rows(self, start: int, stop: int) -> Tensor:
        """Differentiable dense rows ``W[..., start:stop, :]`` flattened to ``(Bf, rows, N)``
        (``Bf = prod(batch_shape)``): the slabs that :meth:`to_dense`, :meth:`uniform`, top-k
        and thresholding read, a block of rows at a time, never all ``N x N`` at once."""

    @abstractmethod
    def to(self, dtype: torch.dtype) -> Graph:
        """The same graph computed in ``dtype`` (differentiable; ``self`` if already there).

        An implicit graph recomputes its weights in ``dtype`` (a ``SoftmaxGraph`` casts
        ``q`` and ``k``), so e.g. ``graph.to(torch.float64).to_dense()`` of a bfloat16
        attention graph has rows that sum to 1 in float64.
        """

    # ---- derived, written once -------------------------------------------------------------

    def _score_rows(self, start: int, stop: int, k_top: int) -> Tensor:
        """Ranking scores of rows ``start:stop`` for a top-``k_top`` selection, ``(Bf, rows,
        W)``: missing edges rank last. ``W <= N`` columns: a kind may leave out keys that no
        row of the block can choose (here ``W = N``: the weights themselves)."""
        w = self.weight_rows(start, stop)
        return w

    def _kept_weights(self, idx: Tensor, blocks: list[tuple[int, int]]) -> Tensor:
        """Renormalized weights ``(Bf, N, k)`` of the kept entries ``idx`` ``(Bf, N, k)``,
        row block by row block of ``blocks`` (those of the selection)."""
        w = [self.weight_rows(s, e).gather(-1, idx[:, s:e].long()) for s, e in blocks]
        return row_normalize(torch.cat(w, dim=1))

    def uniform(self, x: Tensor) -> Tensor:
        r"""``U x``: the mean of ``x`` over each node's out-neighbours, whatever the weights.

        ``U`` is the uniform random walk on the structure of ``W``,
        ``U_ij = [j in N(i)] / |N(i)|``; a node without out-edges gives 0. Here the
        out-neighbours are the non-zero entries of :meth:`weight_rows`, read one
        ``(Bf, rows, N)`` slab at a time; an implicit attention kind overrides it with its own
        structure (mask, causal order, window, kept keys), so that an entry whose weight
        underflows to 0 still counts. Differentiable in ``x``; no gradient reaches the
        graph's tensors.

        Shape:
            ``x``: ``(..., N, C)`` -> ``(..., N, C)``.

        Equivalent to::

            edges = (self.to_dense() != 0).to(x.dtype)
            edges / edges.sum(-1, keepdim=True).clamp_min(1) @ x
        """
        xf, unfold = fold(self._check_x(x), self.batch_shape)  # (Bf, N, C')
        outs = []
        for start, stop in self._blocks(None):
            with torch.no_grad():
                edges = (self.weight_rows(start, stop) != 0).to(x.dtype)  # (Bf, rows, N)
            count = edges.sum(-1, keepdim=True)  # (Bf, rows, 1)
            outs.append((edges @ xf) * safe_reciprocal(count))  # (Bf, rows, C')
        return unfold(torch.cat(outs, dim=1))

    def signal_elements(self, x: Tensor) -> int:
        """Elements of the signal ``x`` over the whole graph, what size-based choices read (a
        series' recomputed segments, :data:`~heatformer.graph_ops.heat.CHECKPOINT_ELEMENTS`):
        ``x.numel()``. A graph over a sequence split over processes counts every rank's rows,
        so that every rank makes the same choice (and sends the same messages)."""
        return x.numel()

    def materialized_bytes(self) -> int | None:
        """Bytes an explicit copy of the weights would take when it makes repeated
        :meth:`propagate` calls cheaper (an implicit graph that recomputes its weights each
        time), else None. Heat series ask this before materializing under a budget."""
        return None

    def materialized(self) -> Graph:
        """The same graph with explicit weights (when :meth:`materialized_bytes` is not None):
        differentiable, equal to ``self`` up to round-off."""
        raise NotImplementedError(f"{type(self).__name__} has no cheaper explicit form")

    def _check_x(self, x: Tensor) -> Tensor:
        return V.check_signal(x, self.num_nodes, self.batch_shape, self.dtype)

    def _kept_row_entries(self, k_top: int) -> int:
        """Entries per query row that :meth:`_kept_weights` holds at once for ``k_top`` kept
        keys (here a row of :meth:`weight_rows`: ``N``); top-k sizes its blocks by it."""
        return self.num_nodes

    def _default_row_block(self) -> int | None:
        """Query rows per block of the blockwise methods when a call names none (None: slabs
        of about ``slab_elements`` entries); a kind built with a ``row_block`` returns it."""
        return None

    def _blocks(
        self,
        row_block: int | None,
        *,
        row_entries: int | None = None,
        slab_elements: int = SLAB_ELEMENTS,
    ) -> list[tuple[int, int]]:
        if row_block is None:
            row_block = self._default_row_block()
        if row_block is None:  # a (Bf, rows, row_entries) slab near slab_elements entries
            per_row = self.num_nodes if row_entries is None else row_entries
            slab_row = max(1, numel(self.batch_shape) * per_row)
            row_block = min(DEFAULT_BLOCK_SIZE, max(MIN_BLOCK_SIZE, slab_elements // slab_row))
        b = row_block
        V.check_positive_int("row_block", b)
        n = self.num_nodes
        # no nodes: one empty block, so that every blockwise method returns its empty result
        return [(s, min(s + b, n)) for s in range(0, n, b)] or [(0, 0)]

    def to_dense(self) -> Tensor:
        """Materialize ``W`` as a dense ``(..., N, N)`` tensor (differentiable).

        Uses ``N^2`` memory: meant for small graphs, analysis and teaching.
        """
        rows = [self.weight_rows(s, e) for s, e in self._blocks(None)]
        dense = torch.cat(rows, dim=-2)  # (Bf, N, N)
        return dense.reshape(*self.batch_shape, self.num_nodes, self.num_nodes)

    # ---- derived graphs and interop: written once, in their own modules --------------------
    # (imported when called, so this module knows no subclass)

    def topk(self, k_top: int, *, row_block: int | None = None) -> SparseGraph:
        """Keep the ``k`` heaviest out-edges of every node, renormalized to sum 1.

        Exactly ``k`` edges per row; ties are broken by the lower column index, so the result
        is deterministic. Rows are processed in blocks of ``row_block`` queries, so the extra
        memory is ``O(row_block * N)`` per graph, never ``N x N``. Gradients flow into the
        graph's tensors through the kept entries. A row with fewer than ``k`` edges keeps
        zero-weight entries (e.g. early rows of a causal graph); a row with no edges keeps
        ``k`` zero-weight entries, so it stays a node with no out-edges.

        Args:
            k_top: edges kept per row, ``1 <= k_top <= N``.
            row_block: query rows per block (default: slabs of about ``SLAB_ELEMENTS`` entries,
                at most 256 rows).

        Returns:
            A :class:`~heatformer.graph_ops.SparseGraph` with the same ``batch_shape``.

        Raises:
            ValueError: if ``k_top < 1`` or ``k_top > N``.
        """
        from heatformer.graph_ops.sparsify import topk

        return topk(self, k_top, row_block=row_block)

    def threshold(
        self,
        eps: float,
        *,
        renormalize: bool = False,
        row_block: int | None = None,
    ) -> SparseGraph:
        """Keep the edges with weight ``>= eps`` (computed in query blocks).

        Args:
            eps: threshold, ``> 0``.
            renormalize: rescale the kept out-edges of each node to sum 1.
            row_block: query rows per block.

        Returns:
            A :class:`~heatformer.graph_ops.SparseGraph` with the same ``batch_shape``.
        """
        from heatformer.graph_ops.sparsify import threshold

        return threshold(self, eps, renormalize=renormalize, row_block=row_block)

    def to_sparse(self) -> SparseGraph:
        """This graph as a :class:`~heatformer.graph_ops.SparseGraph` (its non-zero entries)."""
        from heatformer.graph_ops.sparsify import to_sparse

        return to_sparse(self)

    def sparse_entries(self) -> int | None:
        """The most entries :meth:`to_sparse` holds, when this kind lists them in work and
        memory that grow with that count (an edge list; a window's band and global rows); None
        when it cannot (an implicit dense kind's :meth:`to_sparse` reads all ``N x N`` weights).
        Analyses that need the explicit edges ask this first (the banded solve of
        :func:`~heatformer.analysis.stationary_distribution`)."""
        return None

    def symmetrize(self) -> Graph:
        """The undirected graph ``W_s = (W + W^T) / 2``."""
        from heatformer.graph_ops.symmetrized import SymmetrizedGraph

        return SymmetrizedGraph(self)

    def to_networkx(self, index: tuple[int, ...] | int | None = None) -> nx.DiGraph:
        """One graph of the batch as a weighted :class:`networkx.DiGraph` (attr ``"weight"``).

        Args:
            index: which graph of the batch, e.g. ``(b, h)``; omit for an unbatched graph.
        """
        from heatformer.graph_ops.interop import to_networkx

        return to_networkx(self, index)

    def to_scipy(self, index: tuple[int, ...] | int | None = None) -> scipy.sparse.csr_array:
        """One graph of the batch as a :class:`scipy.sparse.csr_array`."""
        from heatformer.graph_ops.interop import to_scipy

        return to_scipy(self, index)

    def to_edge_index(self, flow: str = "target_to_source") -> tuple[Tensor, Tensor]:
        """PyG-style ``(edge_index (2, E), edge_weight (E,))``.

        A batched graph is returned as the disjoint union of its graphs (graph ``g`` of the
        flattened batch owns nodes ``g * N ... g * N + N - 1``), as PyG batches graphs.

        ``flow`` is the flow of the PyG message-passing layer that will read the edges: that
        layer then computes :meth:`propagate` (``W x``). ``"target_to_source"`` (default):
        ``edge_index = [row; col]``, PyG's adjacency convention; ``"source_to_target"`` (PyG
        layers' default): ``[col; row]``. A default PyG layer on the default edges computes
        ``W^T x``. See :meth:`SparseGraph.to_edge_index
        <heatformer.graph_ops.SparseGraph.to_edge_index>`.
        """
        return self.to_sparse().to_edge_index(flow)

    def to_pyg(
        self, index: tuple[int, ...] | int | None = None, *, flow: str = "target_to_source"
    ) -> Any:
        """One graph as a :class:`torch_geometric.data.Data` with ``edge_index``/``edge_weight``
        laid out for a PyG layer of ``flow`` (see :meth:`to_edge_index`)."""
        from heatformer.graph_ops.interop import to_pyg

        return to_pyg(self, index, flow=flow)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_nodes={self.num_nodes}, "
            f"batch_shape={tuple(self.batch_shape)}, dtype={self.dtype})"
        )


def check_graph(graph: object) -> Graph:
    """``graph``, checked to be a :class:`Graph`: the one check of every function and operator
    that takes a graph (the Laplacians, the heat kernel, every
    :class:`~heatformer.graph_ops.DiffusionOperator`).

    Raises:
        TypeError: naming ``graph``, anything else.
    """
    if not isinstance(graph, Graph):
        raise V.bad_type(
            "graph",
            f"expected a heatformer Graph (DenseGraph, SoftmaxGraph, SparseGraph), "
            f"got {type(graph).__name__}",
        )
    return graph
