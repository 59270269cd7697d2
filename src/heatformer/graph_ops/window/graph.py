r"""Local attention graphs: a sliding window, with optional global tokens, in ``O(N w)``.

(``w`` stands for ``min(w, N)`` throughout: a window of ``N`` or more keys holds every key, and
the graph is built as the one of ``w = N``, so a long window on a short sequence costs what the
full graph costs, never more.)

Query ``i`` may attend key ``j`` when

- **causal**: ``0 <= i - j < w`` (the ``w`` most recent keys, itself included), or
- **bidirectional**: ``|i - j| <= w`` (a band of half-width ``w``),

or when one of them is a **global token** (``i < g`` or ``j < g``: the first ``g`` positions
attend to and are attended by every position, Longformer/BigBird style; causal order still
applies), and the key is not padding (``key_mask``). The weights are the softmax of
``q k^T * scale`` over the allowed keys, exactly as :class:`~heatformer.graph_ops.SoftmaxGraph`
with the corresponding ``N x N`` mask -- but nothing of size ``N x N`` is ever formed.

How (:mod:`~heatformer.graph_ops.window.layout`: the one predicate of the edges, and the
blocks and slabs derived from it): queries are cut into blocks of ``b`` rows; block ``[s, s + b)``
needs only the keys of a slab of ``b + w - 1`` positions (``b + 2w`` bidirectional) plus the
``g`` global keys, so :meth:`WindowGraph.propagate` is a batched, masked softmax product over
runs of blocks whose backward recomputes the weights instead of storing them or the slabs
(:mod:`heatformer.graph_ops.window.kernels`: ``O(N (w + g + b) d)`` work, ``O(N d)`` memory
beyond its inputs, one log-sum-exp per row). A causal global row's keys are global keys, in its
block; bidirectional global rows are dense rows over all ``N`` keys, ``O(g N)``. Transpose
products and top-k work on the same slabs, block by block, in ``O(N (w + g))`` memory.

References:
    Beltagy, I., Peters, M. & Cohan, A. (2020). Longformer: the long-document transformer.
    Zaheer, M. et al. (2020). Big Bird: transformers for longer sequences. NeurIPS.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

import heatformer.graph_ops.window as package  # its BACKEND, the switch, read at every call
from heatformer import checks as V
from heatformer._torch_compat import func_transforming, sdpa
from heatformer.graph_ops._arrays import check_key_mask, fold, masked_softmax, numel, row_normalize
from heatformer.graph_ops._csr import index_dtype
from heatformer.graph_ops._precision import accumulation_dtype, attention_scores
from heatformer.graph_ops._walk_stats import logit_rows
from heatformer.graph_ops.protocol import UNIFORM_DIM, Graph
from heatformer.graph_ops.sparse import (
    SparseGraph,
    trusted_sparse_graph_from_csr,
    trusted_sparse_graph_from_ell,
)
from heatformer.graph_ops.sparsify import stable_topk_indices
from heatformer.graph_ops.window import flex
from heatformer.graph_ops.window.kernels import GradSink, shared, window_attention
from heatformer.graph_ops.window.layout import WindowLayout, check_window, flat_key_mask

__all__ = ["WindowGraph", "check_qk"]


def _tracing() -> bool:
    """Whether :func:`torch.compile` is tracing the call or a :mod:`torch.func` transform
    running it (:func:`~heatformer._torch_compat.func_transforming`): the graph then takes the
    path of plain products that autograd differentiates, see
    :meth:`WindowGraph._traced_products`."""
    return torch.compiler.is_compiling() or func_transforming()


def check_qk(q: object, k: object) -> torch.Size:
    """The queries and keys of a window graph, checked (by :class:`WindowGraph` and by
    :class:`~heatformer.graph_ops.window.builder.WindowBuilder`'s ``build``): float tensors
    ``(..., N, E)`` of one dtype, ``N`` and ``E``, whose batch dims broadcast; returns the
    broadcast batch shape.

    Raises:
        TypeError: not float tensors, or of two dtypes.
        ValueError: fewer than 2 dims, other ``(N, E)``, batch dims that do not broadcast.
    """
    q = V.check_float_tensor("q", q, min_dim=2)
    k = V.check_float_tensor("k", k, min_dim=2)
    if q.dtype != k.dtype:
        raise V.bad_type("k", f"expected the dtype of q ({q.dtype}), got {k.dtype}")
    if q.shape[-2:] != k.shape[-2:]:
        raise V.bad_value(
            "k", f"expected shape (..., {q.shape[-2]}, {q.shape[-1]}), got {tuple(k.shape)}"
        )
    try:
        return torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    except RuntimeError:
        raise V.bad_value(
            "k",
            f"expected batch dims that broadcast with q's {tuple(q.shape[:-2])}, got "
            f"{tuple(k.shape[:-2])}",
        ) from None


class WindowGraph(Graph):
    r"""The attention graph of a sliding window (and global tokens), never ``N x N``.

    Args:
        q: ``(..., N, E)`` queries.
        k: ``(..., N, E)`` keys (batch dims broadcast with ``q``'s).
        window: ``w >= 1``: keys per query (causal), or the band's half-width; a window past
            ``N`` is the same graph as ``w = N`` and is kept as that (:attr:`window` is
            ``min(w, max(N, 1))``), so memory is ``O(N min(w, N))``.
        causal: each query sees only itself and earlier keys.
        num_global: ``g >= 0`` global tokens (the first ``g`` positions).
        key_mask: bool ``(B, N)`` (``True`` = a real key), broadcast over the dims between
            the first and the node dim (e.g. heads); None = every key is real. A masked key
            gets no weight, but a NaN in it (or in its value) still reaches the rows whose
            slab holds it, as in SDPA (``NaN + (-inf)``, ``0 * NaN``): zero padded keys and
            values first.
        drop_masked_queries: padded queries lose their out-edges too (what a symmetrizing
            operator needs, so that ``W^T`` cannot carry padding to real tokens).
        scale: logit scale; default ``1 / sqrt(E)``.
        row_block: query rows per block (default ``max(window, 32)``, at most 256).

    Shape:
        ``propagate(x)``: ``x`` ``(..., N, C)`` -> ``(..., N, C)``.

    Equivalent to::

        allowed = band(i, j) | (i < g) | (j < g)           # and j <= i if causal
        allowed &= key_mask[j] (& key_mask[i] if drop_masked_queries)
        SoftmaxGraph(q, k, mask=allowed)

    Example:
        >>> import torch
        >>> q = k = torch.zeros(1, 5, 2)                  # uniform attention over the window
        >>> g = WindowGraph(q, k, window=2, causal=True)
        >>> g.propagate(torch.tensor([[[1.], [3.], [5.], [7.], [9.]]])).squeeze(-1)
        tensor([[1., 2., 4., 6., 8.]])
    """

    row_stochastic = True

    def __init__(
        self,
        q: Tensor,
        k: Tensor,
        *,
        window: int,
        causal: bool = False,
        num_global: int = 0,
        key_mask: Tensor | None = None,
        drop_masked_queries: bool = False,
        scale: float | None = None,
        row_block: int | None = None,
    ) -> None:
        batch = check_qk(q, k)
        n = int(q.shape[-2])
        check_window(n, window, num_global, causal, drop_masked_queries, row_block)
        if key_mask is not None:
            check_key_mask(key_mask, batch, n)
        checked = trusted_window_graph(
            q, k, window=window, causal=causal, num_global=num_global, key_mask=key_mask,
            drop_masked_queries=drop_masked_queries, row_block=row_block, scale=scale,
        )  # fmt: skip
        self._init(checked.q, checked.k, checked.layout)

    def _init(self, q: Tensor, k: Tensor, layout: WindowLayout) -> None:
        """The graph of ``layout`` on ``q`` ``(..., R, E)`` (``R = N`` unless the layout's
        ``q_offset`` says otherwise), ``k`` ``(..., N, E)`` of one batch shape."""
        self.q = self._tensor = q
        self.k = k
        #: The edges and blocks (:class:`~heatformer.graph_ops.window.layout.WindowLayout`),
        #: shared with the autograd function of :meth:`propagate` and the FlexAttention backend.
        self.layout = layout
        self.window, self.causal, self.num_global = layout.window, layout.causal, layout.num_global
        self.drop_masked_queries, self.scale = layout.drop_masked_queries, layout.scale
        self.row_block = layout.row_block
        self.rows_nonempty = layout.key_mask is None  # a row always keeps its own key
        self._row_has_edge: Tensor | None = None
        self._flat_qk: tuple[bool, Tensor, Tensor, GradSink | None] | None = None  # _flat

    @property
    def num_nodes(self) -> int:
        return self.layout.n

    @property
    def batch_shape(self) -> torch.Size:
        return self.q.shape[:-2]

    def to(self, dtype: torch.dtype) -> WindowGraph:
        if dtype == self.dtype:
            return self
        return self._with_qk(self.q.to(dtype), self.k.to(dtype))

    def _with_qk(self, q: Tensor, k: Tensor) -> WindowGraph:
        """The same layout (and the masks it keeps) on other queries and keys ``(..., N, E')``
        of the graph's batch shape, unchecked."""
        graph = object.__new__(WindowGraph)
        graph._init(q, k, self.layout)
        return graph

    def uniform(self, x: Tensor) -> Tensor:
        """``U x`` (see :meth:`Graph.uniform <heatformer.graph_ops.Graph.uniform>`): the
        window attention of constant queries and keys, every allowed score 0 and every row
        uniform over its window, global tokens and real keys; the same products as
        :meth:`propagate`."""
        z = self.q.new_zeros(*self.batch_shape, self.num_nodes, UNIFORM_DIM)  # (..., N, 8)
        return self._with_qk(z[..., : self.q.shape[-2], :], z).propagate(x)

    def _flat(self) -> tuple[Tensor, Tensor]:
        """``q`` ``(Bf, R, E)`` and ``k`` ``(Bf, N, E)`` (``R = N`` unless the layout's
        ``q_offset`` says otherwise): made once per grad mode (a copy when ``q`` is a
        strided view, e.g. of a fused projection) and shared by every product, so that a heat
        series keeps one copy for its backward, not one per term. With gradients they pass
        through :func:`~heatformer.graph_ops.window.kernels.shared`, so that every
        propagation adds its gradient in ``q``, ``k`` into one buffer each (:attr:`_sink`)."""
        grad = torch.is_grad_enabled()
        if self._flat_qk is None or self._flat_qk[0] != grad:
            bf = numel(self.batch_shape)  # not -1: N may be 0
            q = self.q.reshape(bf, *self.q.shape[-2:])  # (Bf, R, E)
            k = self.k.reshape(bf, *self.k.shape[-2:])  # (Bf, N, E)
            sink = None
            if grad and (q.requires_grad or k.requires_grad) and not _tracing():
                q, k, sink = shared(self.layout, q, k)
            self._flat_qk = (grad, q, k, sink)
        return self._flat_qk[1], self._flat_qk[2]

    @property
    def _sink(self) -> GradSink | None:
        """Where :class:`WindowAttention` sums the gradients of the current :meth:`_flat`."""
        self._flat()
        assert self._flat_qk is not None
        return self._flat_qk[3]

    # ---- weights -------------------------------------------------------------------------

    def _block_weights(self, q: Tensor, k: Tensor, blocks: slice) -> Tensor:
        """Softmax weights ``(Bf, nb', b, g + L)`` of the blocks (dense global rows 0), scores
        and softmax in float32 for half inputs (:func:`attention_scores`; the caller rounds
        them to the graph's dtype)."""
        lay = self.layout
        s = attention_scores(lay.block_queries(q, blocks), lay.keys(k, blocks), lay.scale)
        p = masked_softmax(s, lay.block_allowed(blocks))
        if lay.dense_rows:  # computed apart
            p = p.masked_fill((lay.block_query_rows(blocks) < lay.dense_rows)[..., None], 0.0)
        return p

    def _global_weights(self, q: Tensor, k: Tensor) -> Tensor:
        """Dense rows ``(Bf, g, N)`` of the global tokens (in float32 for half inputs, as
        :meth:`_block_weights`)."""
        g = self.layout.dense_rows
        s = attention_scores(self.layout.query_rows(q, 0, g), k, self.scale)
        return masked_softmax(s, self.layout.dense_allowed(0, g))

    # ---- protocol ------------------------------------------------------------------------

    def propagate(self, x: Tensor) -> Tensor:
        if flex.use_flex(self, package.BACKEND):  # FlexAttention (see BACKEND)
            return flex.window_propagate(self, x)
        xf, unfold = fold(self._check_x(x), self.batch_shape)
        q, k = self._flat()
        n, g = self.num_nodes, self.layout.dense_rows
        if _tracing():  # the same products, differentiated by autograd (see _traced_products)
            y = self._traced_products(q, k, xf)
            y = y.reshape(q.shape[0], -1, xf.shape[-1])[:, :n]  # (Bf, N, C)
        else:  # (Bf, N, C); rows without edges: 0
            y = window_attention(self.layout, q, k, xf, self._sink)
        if g:  # bidirectional global rows: dense rows over all N keys
            ga = self.layout.dense_allowed(0, g)
            g_has = ga.any(-1, keepdim=True)
            qg = self.layout.query_rows(q, 0, g)  # (Bf, g, E)
            yg = sdpa(qg, k, xf, ga | ~g_has, scale=self.scale)
            y = torch.cat([yg * g_has, y[:, g:]], dim=1)
        return unfold(y)

    def _propagate_rows(self, x: Tensor) -> Tensor:
        """The rows of :meth:`propagate` that ``q`` holds (``q_offset ... q_offset + R - 1``),
        ``(Bf, R, C)`` for ``x`` ``(Bf, N, C)``: without the slice of the whole output (whose
        backward fills a zero copy of it), where no dense global row or other engine is
        involved (:class:`~heatformer.graph_ops.window.sharding.ShardedWindowGraph`'s products)."""
        off, r = self.layout.q_offset, int(self.q.shape[-2])
        if flex.use_flex(self, package.BACKEND) or _tracing() or self.layout.dense_rows:
            return self.propagate(x)[:, off : off + r]
        q, k = self._flat()
        return window_attention(self.layout, q, k, x, self._sink, rows=(off, off + r))

    def _traced_products(self, q: Tensor, k: Tensor, x: Tensor) -> Tensor:
        """``P x`` block by block, ``(Bf, nb, b, C)``, as :class:`~heatformer.graph_ops.window.
        kernels.WindowAttention`'s forward computes it on its generic path, for
        :func:`torch.compile` and the :mod:`torch.func` transforms (:func:`_tracing`): one
        SDPA call per run of blocks, differentiated by autograd (which a tracer derives and
        fuses, and a transform composes) instead of the recomputing backward and the shared
        gradient buffers, whose Python state (the backward pass's id, storage addresses) a
        tracer cannot follow nor a transform's wrapped tensor carry. Memory: autograd keeps
        each run's inputs, ``O(N (w + g) / b)`` slabs."""
        lay, outs = self.layout, []
        for blocks in lay.chunks(q.shape[0]):
            qb, kb, xb = lay.block_queries(q, blocks), lay.keys(k, blocks), lay.keys(x, blocks)
            empty = lay.run_masks(blocks)[2]
            mask = lay.sdpa_mask(blocks)
            y = sdpa(qb, kb, xb, mask, scale=self.scale)  # (Bf, nb', b, C)
            outs.append(y if empty is None else y.masked_fill(empty, 0.0))
        return torch.cat(outs, dim=1) if len(outs) != 1 else outs[0]

    def propagate_transpose(self, x: Tensor) -> Tensor:
        xf, unfold = fold(self._check_x(x), self.batch_shape)
        q, k = self._flat()
        lay = self.layout
        n, g, b, nb, slab, before = (
            lay.n,
            lay.num_global,
            lay.row_block,
            lay.num_blocks,
            lay.slab,
            lay.before,
        )
        grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or xf.requires_grad)
        acc = accumulation_dtype(xf.dtype)  # half precision: sums over blocks in float32

        def chunk(q: Tensor, k: Tensor, xb: Tensor, blocks: slice) -> tuple[Tensor, Tensor]:
            p = self._block_weights(q, k, blocks).to(xb.dtype)  # (Bf, nb', b, g + L)
            out = p.transpose(-1, -2) @ xb  # (Bf, nb', g + L, C)
            return out[:, :, :g].sum(1, dtype=acc), out[:, :, g:]  # (Bf, g, C), (Bf, nb', L, C)

        to_global = xf.new_zeros(xf.shape[0], g, xf.shape[-1], dtype=acc)
        slabs: list[Tensor] = []
        for blocks in lay.chunks(q.shape[0]):
            args = (q, k, lay.block_rows(xf, blocks))
            fn = lambda q, k, xb, blocks=blocks: chunk(q, k, xb, blocks)  # noqa: E731
            tg, ts = checkpoint(fn, *args, use_reentrant=False) if grad else fn(*args)
            to_global = to_global + tg
            slabs.append(ts)
        parts = torch.cat(slabs, dim=1)  # (Bf, nb, L, C): contributions to slab positions
        c = parts.shape[-1]
        cols = parts.permute(0, 3, 2, 1).reshape(parts.shape[0], c * slab, nb).to(acc)
        length = (nb - 1) * b + slab
        added = F.fold(cols, output_size=(length, 1), kernel_size=(slab, 1), stride=(b, 1))
        out = added.reshape(parts.shape[0], c, length).transpose(1, 2)[:, before : before + n]
        if g:
            out = torch.cat([out[:, :g] + to_global, out[:, g:]], dim=1)
        if lay.dense_rows:
            dense = self._global_weights(q, k).to(xf.dtype)  # (Bf, g, N)
            out = out + dense.transpose(-1, -2) @ xf[:, : lay.dense_rows]
        return unfold(out.to(xf.dtype))

    def row_has_edge(self) -> Tensor:
        """Bool ``(..., N)``: which rows have at least one allowed key."""
        if self._row_has_edge is None:
            lay, shape = self.layout, (*self.batch_shape, self.num_nodes)
            if lay.key_mask is None:
                has = torch.ones(shape, dtype=torch.bool, device=self.device)
            else:
                bf, n, g = numel(self.batch_shape), lay.n, lay.dense_rows
                blocks = lay.block_allowed(slice(None)).any(-1).expand(bf, -1, -1)  # (Bf, nb, b)
                has = blocks.reshape(bf, -1)[:, :n]
                if g:
                    has = torch.cat([lay.dense_allowed(0, g).any(-1).expand(bf, g), has[:, g:]], 1)
                has = has.reshape(shape)
            self._row_has_edge = has
        return self._row_has_edge

    def out_degree(self) -> Tensor:
        return self.row_has_edge().to(self.dtype)

    def in_degree(self) -> Tensor:
        ones = torch.ones(
            *self.batch_shape, self.num_nodes, 1, dtype=self.dtype, device=self.device
        )
        return self.propagate_transpose(ones).squeeze(-1)

    def walk_statistics(self, row_block: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`Graph.walk_statistics <heatformer.graph_ops.Graph.walk_statistics>` on the
        band: each block's logits over its ``g + L`` keys (global rows: over all ``N``), the
        in-degree by :meth:`in_degree`; ``O(N (w + g))``, never ``N x N``. The blocks are the
        layout's (``row_block`` is not used)."""
        lay, bf = self.layout, numel(self.batch_shape)
        n, g = lay.n, lay.dense_rows
        q, k = self.q.reshape(bf, *self.q.shape[-2:]), self.k.reshape(bf, *self.k.shape[-2:])
        grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)

        def chunk(q: Tensor, k: Tensor, blocks: slice) -> tuple[Tensor, Tensor]:
            s = attention_scores(lay.block_queries(q, blocks), lay.keys(k, blocks), lay.scale)
            h, m, _ = logit_rows(s.flatten(1, 2), lay.block_allowed(blocks).flatten(1, 2))
            return h, m  # (Bf, nb' b) each

        parts = [checkpoint(chunk, q, k, blocks, use_reentrant=False) if grad
                 else chunk(q, k, blocks) for blocks in lay.chunks(bf)]  # fmt: skip
        h, m = (torch.cat([p[i] for p in parts], dim=1)[:, :n] for i in (0, 1))  # (Bf, N)
        if g:  # bidirectional global rows: dense rows over all N keys
            s = attention_scores(lay.query_rows(q, 0, g), k, self.scale)  # (Bf, g, N)
            hg, mg, _ = logit_rows(s, lay.dense_allowed(0, g))
            h, m = torch.cat([hg, h[:, g:]], dim=1), torch.cat([mg, m[:, g:]], dim=1)
        in_degree = self.to(accumulation_dtype(self.dtype)).in_degree()
        return in_degree, h.reshape(*self.batch_shape, n), m.reshape(*self.batch_shape, n)

    def weight_rows(self, start: int, stop: int) -> Tensor:
        """Dense rows ``(Bf, rows, N)`` (for to_dense and generic conversions: ``O(rows N)``),
        scores and softmax in float32 for half inputs, rounded to the graph's dtype once."""
        q, k = self._flat()
        qs = self.layout.query_rows(q, start, stop)  # (Bf, rows, E)
        s = attention_scores(qs, k, self.scale)  # float32 for half inputs
        return masked_softmax(s, self.layout.dense_allowed(start, stop)).to(q.dtype)

    # ---- the explicit edges: O(N (w + g)) -------------------------------------------------

    def sparse_entries(self) -> int:
        """``Bf (g N + (N - g) min(N, band + g'))``: the dense global rows (``g``, none causal)
        and at most ``band + g'`` keys in every other row (``band`` = ``w`` causal, ``2 w + 1``
        bidirectional; ``g'`` the global tokens), which :meth:`to_sparse` lists."""
        lay = self.layout
        n, g = lay.n, lay.dense_rows
        band = lay.window if lay.causal else 2 * lay.window + 1
        return numel(self.batch_shape) * (g * n + (n - g) * min(n, band + lay.num_global))

    def to_sparse(self) -> SparseGraph:
        """The non-zero entries (see :meth:`Graph.to_sparse
        <heatformer.graph_ops.Graph.to_sparse>`), read from the blocks' slabs and the dense
        global rows: ``O(N (w + g))`` work and memory, the weights of :meth:`propagate`
        (differentiable), entries row-major with ascending keys."""
        lay = self.layout
        n, g = lay.n, lay.dense_rows
        q, k = self._flat()
        bf = q.shape[0]
        dtype = index_dtype(bf * n, self.sparse_entries())
        # pieces of entries in (graph, row, key) order: the dense global rows, then runs of blocks
        counts = torch.zeros(bf, n, dtype=torch.long, device=q.device)  # entries per row
        pieces: list[tuple[Tensor, Tensor, Tensor]] = []  # (per-graph sizes, keys, weights)
        if g:
            w = self._global_weights(q, k).to(q.dtype)  # (Bf, g, N)
            keep = w.detach() != 0
            counts[:, :g] += keep.sum(-1)
            keys = torch.arange(n, device=q.device).expand(w.shape)  # (Bf, g, N)
            pieces.append((keep.sum((1, 2)), keys[keep].to(dtype), w[keep]))
        for blocks in lay.chunks(bf):
            p = self._block_weights(q, k, blocks).to(q.dtype)  # (Bf, nb', b, g + L)
            rows = lay.block_query_rows(blocks)  # (nb', b)
            keep = (p.detach() != 0) & (rows < n)[None, :, :, None]
            start = lay.span(blocks)[0] * lay.row_block  # the run's first row
            per_row = keep.sum(-1).reshape(bf, -1)[:, : max(0, min(n - start, rows.numel()))]
            counts[:, start : start + per_row.shape[1]] += per_row
            keys = lay.block_cols(blocks)[None, :, None, :].expand(p.shape)  # (Bf, nb', b, g + L)
            pieces.append((keep.sum((1, 2, 3)), keys[keep].to(dtype), p[keep]))
        crow = torch.zeros(bf * n + 1, dtype=dtype, device=q.device)
        crow[1:] = counts.reshape(-1).cumsum(0)
        cols, weights = [], []
        for b in range(bf):  # graph b's entries of every piece, its keys moved to rows b N ...
            for sizes, keys, w in pieces:
                lo = int(sizes[:b].sum())
                hi = lo + int(sizes[b])
                cols.append(keys[lo:hi] + b * n if b else keys[lo:hi])
                weights.append(w[lo:hi])
        return trusted_sparse_graph_from_csr(
            crow, torch.cat(cols), torch.cat(weights), num_nodes=n, batch_shape=self.batch_shape
        )

    # ---- top-k inside the window: O(N (w + g)) -------------------------------------------

    def topk(self, k_top: int, *, row_block: int | None = None) -> SparseGraph:
        """The ``k_top`` heaviest allowed keys of every query, renormalized (see
        :meth:`Graph.topk <heatformer.graph_ops.Graph.topk>`), ranked inside each block's slab:
        ``O(N (w + g))`` work and memory. Equals the top-k of the dense banded matrix (ties to
        the lower key index); a row with fewer allowed keys keeps zero-weight entries.

        Raises:
            ValueError: ``k_top`` outside ``[1, min(N, g + L)]`` (``L`` the slab length).
        """
        lay = self.layout
        n, g = lay.n, lay.dense_rows
        k_top = V.check_positive_int("k_top", k_top, upper=min(n, lay.num_global + lay.slab))
        q, k = self._flat()
        idx_parts, w_parts = [], []
        for blocks in lay.chunks(q.shape[0]):
            with torch.no_grad():  # ranked on the scores the weights are made of (float32)
                s = attention_scores(lay.block_queries(q, blocks), lay.keys(k, blocks), self.scale)
                s = s.masked_fill(~lay.block_allowed(blocks), float("-inf"))
                slot = stable_topk_indices(s, k_top)  # (Bf, nb', b, K) slots, ascending
            idx_parts.append(self._slot_columns(slot, blocks))
            w_parts.append(self._kept(q, k, blocks, slot))
        idx = torch.cat(idx_parts, dim=1).reshape(q.shape[0], -1, k_top)[:, :n]
        w = torch.cat(w_parts, dim=1).reshape(q.shape[0], -1, k_top)[:, :n]
        if g:  # the dense global rows rank all N keys
            dense = self._global_weights(q, k)
            with torch.no_grad():
                ranks = attention_scores(lay.query_rows(q, 0, g), k, self.scale).masked_fill(
                    ~lay.dense_allowed(0, g), float("-inf")
                )
                gidx = stable_topk_indices(ranks, k_top)  # (Bf, g, K)
            gw = row_normalize(dense.gather(-1, gidx)).to(q.dtype)
            idx = torch.cat([gidx, idx[:, g:]], dim=1)
            w = torch.cat([gw, w[:, g:]], dim=1)
        shape = (*self.batch_shape, n, k_top)
        return trusted_sparse_graph_from_ell(
            idx.reshape(shape), w.reshape(shape), row_stochastic=True
        )

    def _slot_columns(self, slot: Tensor, blocks: slice) -> Tensor:
        """Absolute key index of each kept slot; an empty slot points at the row itself."""
        g, first = self.layout.num_global, self.layout.block_query_rows(blocks)  # (nb', b)
        start = (first[:, :1] - self.layout.before)[None, :, :, None]  # (1, nb', 1, 1)
        col = torch.where(slot < g, slot, slot - g + start)
        valid = (col >= 0) & (col < self.num_nodes)
        return torch.where(valid, col, first[None, :, :, None].clamp_max(self.num_nodes - 1))

    def _kept(self, q: Tensor, k: Tensor, blocks: slice, slot: Tensor) -> Tensor:
        def kept(q: Tensor, k: Tensor) -> Tensor:
            p = self._block_weights(q, k, blocks).gather(-1, slot)  # (Bf, nb', b, K)
            return row_normalize(p).to(q.dtype)  # in float32 for half inputs, rounded once

        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
            return checkpoint(kept, q, k, use_reentrant=False)
        return kept(q, k)


def trusted_window_graph(
    q: Tensor,
    k: Tensor,
    *,
    window: int,
    causal: bool,
    num_global: int,
    key_mask: Tensor | None,
    drop_masked_queries: bool,
    row_block: int | None,
    scale: float | None = None,
    q_offset: int = 0,
) -> WindowGraph:
    """The :class:`WindowGraph` of arguments its caller checked: the window kind's builder
    (:class:`~heatformer.graph_ops.window.builder.WindowBuilder`: the window and ``num_global <= N``
    when it was made, ``q``, ``k``, the key mask and the flags by :func:`check_qk` and its own
    checks in ``build``), so that the public constructor's checks are not made again on every
    forward; the public constructor is its checks, then this.

    ``q_offset`` (a :class:`~heatformer.graph_ops.window.sharding.ShardedWindowGraph`'s
    extended block): ``q`` ``(..., R, E)`` holds the queries of graph rows ``q_offset ...
    q_offset + R - 1`` of the ``N = k.shape[-2]`` rows, the others' are zeros (never read; see
    :class:`~heatformer.graph_ops.window.layout.WindowLayout`).

    Not part of the API: nothing is checked here.
    """
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    n = int(k.shape[-2])
    # a window of N or more keys already holds every key: the same graph as w = N, whose
    # slabs stay O(N) (the given w would size them: 3-4 GB for w = 10^6 on 16 tokens)
    w = min(window, max(n, 1))
    flat_mask = flat_key_mask(key_mask, batch, n)  # (Bf, N)
    b = row_block if row_block is not None else min(256, max(w, 32))
    s = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    drop = drop_masked_queries
    layout = WindowLayout(n, w, causal, num_global, b, drop, s, q_offset, q.device, flat_mask)
    q = q.expand(*batch, *q.shape[-2:])  # (..., R, E): R = N unless q_offset says otherwise
    graph = object.__new__(WindowGraph)
    graph._init(q, k.expand(*batch, n, k.shape[-1]), layout)
    return graph
