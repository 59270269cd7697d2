"""Sparse graphs: a batch of edge lists held as one block-diagonal CSR matrix."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor

from heatformer import checks as V
from heatformer._optional import require
from heatformer.graph_ops._arrays import fold, numel, safe_reciprocal
from heatformer.graph_ops._csr import CSRStructure, TransposeCache, csr_matmul, index_dtype
from heatformer.graph_ops._precision import accumulation_dtype
from heatformer.graph_ops._walk_stats import entropy_terms
from heatformer.graph_ops.protocol import Graph

if TYPE_CHECKING:
    import networkx as nx
    import scipy.sparse

__all__ = ["SparseGraph"]


def _check_weights(name: str, weight: Tensor) -> None:
    if not bool(torch.isfinite(weight).all()) or bool((weight < 0).any()):
        raise V.bad_value(name, "expected finite, non-negative edge weights")


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
            raise V.bad_type(
                name, f"expected an integer tensor, got {getattr(idx, 'dtype', type(idx).__name__)}"
            )
    row, col = cast(Tensor, row), cast(Tensor, col)
    if not (row.dim() == col.dim() == weight.dim() == 1) or not (
        row.numel() == col.numel() == weight.numel()
    ):
        raise V.bad_value(
            f"{index_name}, {weight_name}",
            f"expected E source indices, E target indices and E weights, got shapes "
            f"{tuple(row.shape)}, {tuple(col.shape)} and {tuple(weight.shape)}",
        )
    size = numel(batch_shape) * num_nodes
    if row.numel() == 0:
        return
    with torch.no_grad():
        lo, hi = int(torch.minimum(row.min(), col.min())), int(torch.maximum(row.max(), col.max()))
        if lo < 0 or hi >= size:
            where = f"batch shape {tuple(batch_shape)} and " if len(batch_shape) else ""
            raise V.bad_value(
                index_name,
                f"expected indices in [0, {size}) for {where}num_nodes "
                f"{num_nodes}, got [{lo}, {hi}]",
            )
        if bool(((row // num_nodes) != (col // num_nodes)).any()):
            raise V.bad_value(index_name, "an edge joins two different graphs of the batch")
        _check_weights(weight_name, weight)


class SparseGraph(Graph):
    """A batch of sparse graphs (e.g. top-k attention) stored as one block-diagonal CSR matrix.

    Graph ``g`` of the flattened batch owns global rows/columns ``g * N ... g * N + N - 1``.
    Entries are kept in row-major order; duplicates (repeated ``(row, col)`` pairs) are summed
    by every operation. ``propagate`` is a ``torch.sparse`` CSR product whose backward is
    sparse too (see :mod:`heatformer.graph_ops._csr`), so memory grows with the number of
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
        size = numel(batch_shape) * num_nodes
        if sort:
            key = row.long() * size + col
            if key.numel() > 1 and not bool((key[1:] >= key[:-1]).all()):  # sort to row-major
                order = torch.argsort(key, stable=True)
                row, col, weight = row[order], col[order], weight[order]
        self._set(CSRStructure.from_rows(row, col, size), weight, batch_shape, num_nodes)

    def _set(
        self, struct: CSRStructure, weight: Tensor, batch_shape: torch.Size, num_nodes: int
    ) -> None:
        self._batch_shape, self._n = batch_shape, num_nodes
        self._struct = struct
        self._transposed = TransposeCache()
        self.weight = self._tensor = weight

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
            raise V.bad_type(
                "indices",
                f"expected an integer tensor of shape (..., N, k), got "
                f"{getattr(indices, 'dtype', type(indices).__name__)}",
            )
        weight = V.check_float_tensor("weight", weight, min_dim=2)
        if indices.shape != weight.shape or indices.dim() < 2:
            raise V.bad_value(
                "weight",
                f"expected the shape of indices {tuple(indices.shape)} (..., N, k), "
                f"got {tuple(weight.shape)}",
            )
        n = int(indices.shape[-2])
        with torch.no_grad():
            if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= n):
                raise V.bad_value(
                    "indices",
                    f"expected column indices in [0, {n}), got "
                    f"[{int(indices.min())}, {int(indices.max())}]",
                )
            _check_weights("weight", weight)
        return trusted_sparse_graph_from_ell(indices, weight)

    @classmethod
    def from_edge_index(
        cls,
        edge_index: Tensor,
        edge_weight: Tensor | None = None,
        num_nodes: int | None = None,
        *,
        flow: str = "target_to_source",
    ) -> SparseGraph:
        """Build one graph from a PyG ``edge_index`` of shape ``(2, E)``.

        Args:
            edge_index: ``(2, E)`` integer tensor. With ``flow="target_to_source"`` (the
                default, PyG's adjacency convention of ``to_dense_adj``) edge ``e`` becomes the
                entry ``W[edge_index[0, e], edge_index[1, e]]``; with ``"source_to_target"``
                it is a message from ``edge_index[0, e]`` to ``edge_index[1, e]`` and becomes
                ``W[edge_index[1, e], edge_index[0, e]]`` (see :meth:`to_edge_index`).
            edge_weight: ``(E,)`` finite, non-negative weights (default 1).
            num_nodes: ``N`` (default ``edge_index.max() + 1``).
            flow: the flow of the PyG message-passing layer the edges were made for.

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
            raise V.bad_type("edge_index", f"expected an integer tensor of shape (2, E), got {got}")
        if edge_index.dim() != 2 or edge_index.shape[0] != 2:
            raise V.bad_value(
                "edge_index",
                f"expected an integer tensor of shape (2, E), got shape {tuple(edge_index.shape)}",
            )
        if edge_weight is None:
            edge_weight = torch.ones(edge_index.shape[1], device=edge_index.device)
        if num_nodes is None:
            num_nodes = int(edge_index.max()) + 1 if edge_index.numel() else 1
        num_nodes = V.check_positive_int("num_nodes", num_nodes)
        row, col = edge_index[0], edge_index[1]
        if _check_flow(flow) == "source_to_target":
            row, col = col, row
        _check_edges(
            row, col, edge_weight, num_nodes, torch.Size(),
            index_name="edge_index", weight_name="edge_weight",
        )  # fmt: skip
        return trusted_sparse_graph(
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
        nx = require("networkx", feature="SparseGraph.from_networkx")
        require("scipy", feature="SparseGraph.from_networkx")  # networkx's sparse arrays
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
            raise V.bad_value("matrix", f"expected a square matrix, got shape {coo.shape}")
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
        """``(E,)`` global row index of each stored entry (int64; made on each call)."""
        return self._struct.rows().long()

    @property
    def col(self) -> Tensor:
        """``(E,)`` global column index of each stored entry (int64)."""
        return self._struct.col.long()

    def _transpose(self) -> tuple[CSRStructure, Tensor]:
        return self._transposed.get(self._struct)

    # ---- protocol --------------------------------------------------------------------------

    def propagate(self, x: Tensor) -> Tensor:
        xf, unfold = fold(self._check_x(x), self.batch_shape)
        bf, n, c = xf.shape
        y = csr_matmul(self.weight, xf.reshape(bf * n, c), self._struct, self._transposed)
        return unfold(y.reshape(bf, n, c))

    def propagate_transpose(self, x: Tensor) -> Tensor:
        xf, unfold = fold(self._check_x(x), self.batch_shape)
        bf, n, c = xf.shape
        struct_t, perm = self._transpose()
        # its backward transposes A^T again (a sort, made only then): a cache holding A's
        # structure now would keep it alive beside the saved tensors
        y = csr_matmul(self.weight[perm], xf.reshape(bf * n, c), struct_t, TransposeCache())
        return unfold(y.reshape(bf, n, c))

    def _degree(self, index: Tensor) -> Tensor:
        w = self.weight.to(accumulation_dtype(self.dtype))  # half precision sums in float32
        d = w.new_zeros(self._struct.size).index_add(0, index, w).to(self.dtype)
        return d.reshape(*self.batch_shape, self.num_nodes)

    def out_degree(self) -> Tensor:
        return self._degree(self._struct.rows())

    def in_degree(self) -> Tensor:
        return self._degree(self._struct.col)

    def walk_statistics(self, row_block: int | None = None) -> tuple[Tensor, Tensor, None]:
        """:meth:`Graph.walk_statistics <heatformer.graph_ops.Graph.walk_statistics>` from the
        stored entries: ``P``'s entries ``w_e / d_out(row_e)``, repeated ``(row, col)`` pairs
        summed first (as every operation sums them): ``O(E)`` memory, ``O(E log E)`` work (one
        sort of the entries' keys). A sparse graph holds weights, not logits: ``max_logit``
        is None (a top-k graph keeps its kept weights, renormalized). ``row_block`` is not
        used."""
        acc = accumulation_dtype(self.dtype)
        size = self._struct.size
        row, col = self._struct.rows().long(), self._struct.col.long()  # (E,) each
        w = self.weight.to(acc)
        degree = w.new_zeros(size).index_add(0, row, w)  # (Bf N,)
        p = w * safe_reciprocal(degree)[row]  # (E,): the walk's entries
        column = p.new_zeros(size).index_add(0, col, p)
        key, where = torch.unique(row * size + col, return_inverse=True)  # one key per entry
        merged = p.new_zeros(key.numel()).index_add(0, where, p)  # repeated pairs summed
        entropy = p.new_zeros(size).index_add(0, key // size, entropy_terms(merged))
        shape = (*self.batch_shape, self.num_nodes)
        return column.reshape(shape), entropy.reshape(shape), None

    def weight_rows(self, start: int, stop: int) -> Tensor:
        n, bf = self.num_nodes, numel(self.batch_shape)
        row, col = self.row, self.col
        local_row = row % n
        sel = ((local_row >= start) & (local_row < stop)).nonzero(as_tuple=True)[0]
        b = row[sel] // n
        out = self.weight.new_zeros(bf, stop - start, n)
        return out.index_put(
            (b, local_row[sel] - start, col[sel] % n),
            self.weight[sel],
            accumulate=True,
        )

    def to_dense(self) -> Tensor:
        n, bf = self.num_nodes, numel(self.batch_shape)
        out = self.weight.new_zeros(bf, n, n)
        row, col = self.row, self.col
        out = out.index_put(
            (row // n, row % n, col % n),
            self.weight,
            accumulate=True,
        )
        return out.reshape(*self.batch_shape, n, n)

    def symmetrize(self) -> SparseGraph:
        row, col = self.row, self.col
        return trusted_sparse_graph(
            torch.cat([row, col]), torch.cat([col, row]),
            0.5 * torch.cat([self.weight, self.weight]), num_nodes=self.num_nodes,
            batch_shape=self.batch_shape,
        )  # fmt: skip

    def row_normalize(self) -> SparseGraph:
        """The random-walk graph ``D_out^+ W`` (rows with edges sum to 1)."""
        inv = safe_reciprocal(self.out_degree()).reshape(-1)
        row = self._struct.rows()
        return trusted_sparse_graph(
            row, self._struct.col, self.weight * inv[row],
            num_nodes=self.num_nodes, batch_shape=self.batch_shape, sort=False,
        )  # fmt: skip

    def _kept_entries(self, keep: Callable[[Tensor], Tensor]) -> SparseGraph:
        """The stored entries ``w`` with ``keep(w)``, in their order (what
        :func:`~heatformer.graph_ops.sparsify.select_edges` keeps of a sparse graph: no dense
        rows are formed)."""
        kept = keep(self.weight.detach()).nonzero(as_tuple=True)[0]
        return trusted_sparse_graph(
            self._struct.rows()[kept], self._struct.col[kept], self.weight[kept],
            num_nodes=self.num_nodes, batch_shape=self.batch_shape, sort=False,
        )  # fmt: skip

    def to_sparse(self) -> SparseGraph:
        return self

    def sparse_entries(self) -> int:
        return self.num_edges

    def to_scipy(self, index: tuple[int, ...] | int | None = None) -> scipy.sparse.csr_array:
        """One graph of the batch as a :class:`scipy.sparse.csr_array` (row ``i`` = out-edges),
        copied from the stored entries (``O(E)``, never ``N x N``): duplicates summed, entries
        of weight 0 left out, as :meth:`Graph.to_scipy <heatformer.graph_ops.Graph.to_scipy>`."""
        from heatformer.graph_ops.interop import check_index

        sparse = require("scipy.sparse", feature="to_scipy")
        n, b = self.num_nodes, check_index(self, index)
        crow, col = self._struct.crow, self._struct.col
        lo, hi = int(crow[b * n]), int(crow[(b + 1) * n])
        indptr = (crow[b * n : (b + 1) * n + 1] - lo).cpu().numpy()
        indices = (col[lo:hi] - b * n).cpu().numpy()  # a copy: the graph's own stay as they are
        data = self.weight.detach()[lo:hi].cpu().numpy().copy()
        out = sparse.csr_array((data, indices, indptr), shape=(n, n))
        out.sum_duplicates()
        out.eliminate_zeros()
        return out

    def to(self, dtype: torch.dtype) -> SparseGraph:
        if dtype == self.dtype:
            return self
        return self._with_weight(self.weight.to(dtype))

    def _with_weight(self, weight: Tensor) -> SparseGraph:
        """The same structure (and its cached transpose) with other weights ``(E,)``."""
        graph = object.__new__(SparseGraph)
        graph._batch_shape, graph._n = self._batch_shape, self._n
        graph._struct, graph._transposed = self._struct, self._transposed
        graph.weight = graph._tensor = weight
        return graph

    def uniform(self, x: Tensor) -> Tensor:
        """``U x`` (see :meth:`Graph.uniform <heatformer.graph_ops.Graph.uniform>`) by the
        same CSR product: the stored entries of positive weight are the edges (the
        zero-weight padding of a top-k row with fewer allowed keys is none), each weighted
        ``1 / |N(i)|``."""
        edge = (self.weight.detach() > 0).to(self.dtype)  # (E,)
        row = self._struct.rows()  # (E,)
        count = edge.new_zeros(self._struct.size).index_add_(0, row, edge)  # (Bf * N,)
        return self._with_weight(edge * safe_reciprocal(count)[row]).propagate(x)

    def to_edge_index(self, flow: str = "target_to_source") -> tuple[Tensor, Tensor]:
        """``(edge_index (2, E), edge_weight (E,))``; batched graphs as a disjoint union.

        ``flow`` names the flow of the PyG message-passing layer that will read the edges, so
        that the layer computes :meth:`propagate` (``W x``): with ``"target_to_source"`` (the
        default) ``edge_index = [row; col]`` (``W[i, j]`` is edge ``(i, j)``, PyG's adjacency
        convention, as ``to_dense_adj`` reads it; a layer with ``flow="target_to_source"``
        aggregates at ``edge_index[0]``); with ``"source_to_target"`` (PyG layers' default)
        ``edge_index = [col; row]``: the message from key ``j`` goes to query ``i``.

        A default PyG layer on the default edges computes ``W^T x``
        (:meth:`propagate_transpose`), not ``W x``.
        """
        row, col = self.row, self.col
        if _check_flow(flow) == "source_to_target":
            return torch.stack([col, row]), self.weight
        return torch.stack([row, col]), self.weight


def trusted_sparse_graph(
    row: Tensor,
    col: Tensor,
    weight: Tensor,
    *,
    num_nodes: int,
    batch_shape: torch.Size,
    sort: bool = True,
) -> SparseGraph:
    """A :class:`SparseGraph` of edges the library made itself (the entries
    :func:`~heatformer.graph_ops.sparsify.select_edges` keeps, a sparse graph's symmetrized or
    row-normalized copy): no validation, no host sync for it.

    Not part of the API (the public constructor checks the edges, reading them on the host):
    ``row``/``col`` are integer global indices in range; non-finite weights pass through (NaN
    in, NaN out). With ``sort=False`` the entries must already be row-major.
    """
    graph = object.__new__(SparseGraph)
    graph._init(row, col, weight, num_nodes, torch.Size(batch_shape), sort=sort)
    return graph


def trusted_sparse_graph_from_ell(
    indices: Tensor, weight: Tensor, *, row_stochastic: bool = False
) -> SparseGraph:
    """:meth:`SparseGraph.from_ell` without its checks, for indices the library made: a top-k
    selection (:func:`~heatformer.graph_ops.sparsify.topk`, the window kind's, the ``topk``
    kind's graph of no nodes), whose renormalized rows are ``row_stochastic`` (the Laplacian's
    ``c = 1`` is then known).

    Not part of the API: ``indices`` ``(..., N, k)`` integers in ``[0, N)``, ``weight`` of
    their shape.
    """
    *batch_list, n, k = indices.shape
    batch = torch.Size(batch_list)
    bf = numel(batch)
    dtype = index_dtype(bf * n, bf * n * k)
    # every row holds k entries: the row pointers are multiples of k, and no row index is
    # stored; columns within a row in any order suit the kernel
    crow = torch.arange(bf * n + 1, dtype=dtype, device=indices.device) * k
    base = (torch.arange(bf, dtype=dtype, device=indices.device) * n).view(bf, 1, 1)
    col = (indices.reshape(bf, n, k).to(dtype) + base).reshape(-1)  # (Bf * N * k,)
    graph = object.__new__(SparseGraph)
    graph._set(CSRStructure(crow, col, bf * n), weight.reshape(-1), batch, n)
    graph.row_stochastic = row_stochastic
    return graph


def trusted_sparse_graph_from_csr(
    crow: Tensor, col: Tensor, weight: Tensor, *, num_nodes: int, batch_shape: torch.Size
) -> SparseGraph:
    """A :class:`SparseGraph` of a CSR matrix the library made itself (a window graph's
    :meth:`~heatformer.graph_ops.WindowGraph.to_sparse`): no validation, no sort, no row index.

    Not part of the API: ``crow`` ``(Bf N + 1,)`` and ``col`` ``(E,)`` global indices of one
    integer dtype, entries row-major, ``weight`` ``(E,)``.
    """
    graph = object.__new__(SparseGraph)
    size = numel(batch_shape) * num_nodes
    graph._set(CSRStructure(crow, col, size), weight, torch.Size(batch_shape), num_nodes)
    return graph


FLOWS = ("target_to_source", "source_to_target")


def _check_flow(flow: object) -> str:
    """One of :data:`FLOWS` (the ``flow`` of PyG's ``MessagePassing``)."""
    return V.check_choice("flow", flow, FLOWS, context=" (PyG's flows)")
