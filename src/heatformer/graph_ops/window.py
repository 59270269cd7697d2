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

How: queries are cut into blocks of ``b`` rows; block ``[s, s + b)`` needs only the keys of a
slab of ``b + w - 1`` positions (``b + 2w`` bidirectional) plus the ``g`` global keys, so
:meth:`WindowGraph.propagate` is a batched, masked softmax product over runs of blocks whose
backward recomputes the weights instead of storing them or the slabs
(:mod:`heatformer.graph_ops._window_attention`: ``O(N (w + g + b) d)`` work, ``O(N d)``
memory beyond its inputs, one log-sum-exp per row). The ``g``
global rows are dense rows over all ``N`` keys, ``O(g N)``. Transpose products and top-k work
on the same slabs, block by block, in ``O(N (w + g))`` memory.

References:
    Beltagy, I., Peters, M. & Cohan, A. (2020). Longformer: the long-document transformer.
    Zaheer, M. et al. (2020). Big Bird: transformers for longer sequences. NeurIPS.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from heatformer import checks as V
from heatformer.graph_ops import _flex
from heatformer.graph_ops._precision import accumulation_dtype, attention_scores
from heatformer.graph_ops._window_attention import GradSink, shared, window_attention
from heatformer.graph_ops.protocol import (
    SLAB_ELEMENTS,
    UNIFORM_DIM,
    Graph,
    _check_key_mask,
    _fold,
    _numel,
    _row_normalize,
)
from heatformer.graph_ops.sparse import SparseGraph

__all__ = ["BACKEND", "WindowGraph"]

#: The engine of :meth:`WindowGraph.propagate`, read at every call: ``"kernels"`` (the window
#: kernels of :mod:`~heatformer.graph_ops._window_attention`, every device), ``"flex"``
#: (FlexAttention on a block mask built from the window's arithmetic,
#: :mod:`~heatformer.graph_ops._flex`; forward only on the CPU in torch 2.13) or ``"auto"``:
#: FlexAttention on CUDA where it applies (:func:`~heatformer.graph_ops._flex.use_flex`), the
#: kernels elsewhere. Transpose products, degrees and top-k always use the window kernels.
BACKEND = "auto"


def _tracing() -> bool:
    """Whether :func:`torch.compile` is tracing the call (the graph then takes the traceable
    path of plain products, see :meth:`WindowGraph._traced_products`)."""
    return torch.compiler.is_compiling()


def _stable_topk(scores: Tensor, k: int) -> Tensor:
    from heatformer.graph_ops.sparsify import _stable_topk_indices

    return _stable_topk_indices(scores, k)


def _masked_softmax(s: Tensor, allowed: Tensor) -> Tensor:
    """The softmax of scores ``s`` over the ``allowed`` entries of each row (broadcast with
    ``s``); the others, and every entry of a row with none, are structural zeros (0, no
    gradient, no NaN)."""
    s = s.masked_fill(~allowed, float("-inf"))
    has = allowed.any(-1, keepdim=True)
    return torch.where(allowed, torch.softmax(torch.where(has, s, 0.0), dim=-1), 0.0)


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
        q = V.check_float_tensor("q", q, min_dim=2)
        k = V.check_float_tensor("k", k, min_dim=2)
        if q.dtype != k.dtype:
            raise V.bad_type("k", f"expected the dtype of q ({q.dtype}), got {k.dtype}")
        if q.shape[-2:] != k.shape[-2:]:
            raise V.bad_value(
                "k", f"expected shape (..., {q.shape[-2]}, {q.shape[-1]}), got {tuple(k.shape)}"
            )
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        n = int(q.shape[-2])
        # a window of N or more keys already holds every key: the same graph as w = N, whose
        # slabs stay O(N) (the given w would size them: 3-4 GB for w = 10^6 on 16 tokens)
        self.window = min(V.check_positive_int("window", window), max(n, 1))
        if isinstance(num_global, bool) or not isinstance(num_global, int):
            raise V.bad_type("num_global", f"expected an int >= 0, got {type(num_global).__name__}")
        if num_global < 0:
            raise V.bad_value("num_global", f"expected an int >= 0, got {num_global}")
        self.num_global = num_global
        self.causal = V.check_bool("causal", causal)
        self.drop_masked_queries = V.check_bool("drop_masked_queries", drop_masked_queries)
        if self.num_global > n:
            raise V.bad_value("num_global", f"expected at most N = {n}, got {num_global}")
        self.q = self._tensor = q.expand(*batch, n, q.shape[-1])
        self.k = k.expand(*batch, n, k.shape[-1])
        self.scale = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
        bf = _numel(batch)
        self._key_mask: Tensor | None = None
        if key_mask is not None:
            lead = _check_key_mask(key_mask, batch, n).shape[:-1]
            view = key_mask.reshape(*lead, *([1] * (len(batch) - len(lead))), n)
            self._key_mask = view.expand(*batch, n).reshape(bf, n)  # (Bf, N)
        b = row_block if row_block is not None else min(256, max(self.window, 32))
        self.row_block = V.check_positive_int("row_block", b)
        self.rows_nonempty = key_mask is None  # a row always keeps its own key
        self._row_has_edge: Tensor | None = None
        self._pattern: tuple[Tensor, Tensor] | None = None  # see _run_masks
        self._all_masks: tuple[Tensor, Tensor, Tensor | None] | None = None  # see _run_masks
        self._end_masks: dict[tuple[int, int], tuple[Tensor, Tensor, Tensor | None]] = {}
        self._additive: Tensor | None = None  # see _sdpa_mask
        self._flat_qk: tuple[bool, Tensor, Tensor, GradSink | None] | None = None  # _flat

    # ---- geometry ----------------------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        return int(self.q.shape[-2])

    @property
    def batch_shape(self) -> torch.Size:
        return self.q.shape[:-2]

    def to(self, dtype: torch.dtype) -> WindowGraph:
        if dtype == self.dtype:
            return self
        return self._with_qk(self.q.to(dtype), self.k.to(dtype))

    def _with_qk(self, q: Tensor, k: Tensor) -> WindowGraph:
        """The same structure (window, global tokens, key mask and the masks made of them) on
        other queries and keys ``(..., N, E')`` of the graph's batch shape, unchecked."""
        graph = WindowGraph.__new__(WindowGraph)
        graph.__dict__.update(self.__dict__)
        graph.q = graph._tensor = q
        graph.k = k
        graph._flat_qk = None
        return graph

    def uniform(self, x: Tensor) -> Tensor:
        """``U x`` (see :meth:`Graph.uniform <heatformer.graph_ops.Graph.uniform>`): the
        window attention of constant queries and keys, every allowed score 0 and every row
        uniform over its window, global tokens and real keys; the same products as
        :meth:`propagate`."""
        z = self.q.new_zeros(*self.batch_shape, self.num_nodes, UNIFORM_DIM)  # (..., N, 8)
        return self._with_qk(z, z).propagate(x)

    def _before(self) -> int:
        """Keys of a block's slab before its first query (``w - 1``, or ``w`` bidirectional)."""
        return self.window - 1 if self.causal else self.window

    def _slab(self) -> int:
        """Keys in one block's slab: ``b + w - 1`` (causal) or ``b + 2 w``."""
        return self.row_block + (self.window - 1 if self.causal else 2 * self.window)

    def _num_blocks(self) -> int:
        """``ceil(N / b)``, at least 1: with no nodes, one block of padding gives every product
        its empty ``(Bf, 0, ...)`` result without a case of its own."""
        return max(1, -(-self.num_nodes // self.row_block))

    def _unfold(self, t: Tensor, fill: float | bool = 0.0) -> Tensor:
        """Slabs of ``t`` ``(Bf, N, ...)`` -> ``(Bf, nb, L, ...)``: block ``m`` holds positions
        ``m b - before ... m b - before + L - 1`` (out-of-range ones ``fill``)."""
        return self._slabs_of_padded(self._pad_for_slabs(t, fill))

    def _pad_for_slabs(self, t: Tensor, fill: float | bool = 0.0) -> Tensor:
        """``t`` ``(Bf, N, ...)`` padded to ``(Bf, (nb - 1) b + L, ...)``: row ``m b + l`` is
        slab position ``l`` of block ``m`` (for small per-key tensors such as the key mask;
        signals are padded per run, by :meth:`_keys`)."""
        padded_len = (self._num_blocks() - 1) * self.row_block + self._slab()
        pad_front = self._before()
        pad_back = padded_len - pad_front - t.shape[1]
        trailing = [0, 0] * (t.dim() - 2)
        return F.pad(t, [*trailing, pad_front, pad_back], value=fill)  # (Bf, P, ...)

    def _slabs_of_padded(self, padded: Tensor) -> Tensor:
        """The slabs ``(Bf, nb, L, ...)`` of :meth:`_pad_for_slabs`' output (or of a run's
        padded rows: ``nb`` of its blocks), as a view."""
        slabs = padded.unfold(1, self._slab(), self.row_block)  # (Bf, nb, ..., L)
        return slabs.movedim(-1, 2)  # (Bf, nb, L, ...)

    def _blocks_of(self, t: Tensor) -> Tensor:
        """Query blocks of ``t`` ``(Bf, N, ...)`` -> ``(Bf, nb, b, ...)`` (zero-padded)."""
        nb, b = self._num_blocks(), self.row_block
        trailing = [0, 0] * (t.dim() - 2)
        padded = t if nb * b == t.shape[1] else F.pad(t, [*trailing, 0, nb * b - t.shape[1]])
        return padded.reshape(t.shape[0], nb, b, *t.shape[2:])  # a view when N = nb b

    def _allowed(self, blocks: slice) -> Tensor:
        """Bool ``(Bf or 1, nb', b, g + L)``: the allowed (global key, slab key) pairs."""
        n, g, b, before = self.num_nodes, self.num_global, self.row_block, self._before()
        dev = self.device
        m = torch.arange(self._num_blocks(), device=dev)[blocks]  # (nb',)
        rows = m[:, None] * b + torch.arange(b, device=dev)  # (nb', b) absolute query
        cols = m[:, None] * b - before + torch.arange(self._slab(), device=dev)  # (nb', L)
        gap = rows[:, :, None] - cols[:, None, :]  # (nb', b, L)  i - j
        band = (gap >= 0) & (gap < self.window) if self.causal else gap.abs() <= self.window
        band &= (cols[:, None, :] >= g) & (cols[:, None, :] < n)  # real keys, not global ones
        gcols = torch.arange(g, device=dev)
        glob = torch.ones(len(m), b, g, dtype=torch.bool, device=dev)
        if self.causal:
            glob = gcols <= rows[:, :, None]  # (nb', b, g)
        allowed = torch.cat([glob, band], dim=-1).unsqueeze(0)  # (1, nb', b, g + L)
        if self._key_mask is not None:
            km = self._key_mask
            slab_mask = self._unfold(km, fill=False)[:, blocks]  # (Bf, nb', L)
            keys = torch.cat([km[:, :g].unsqueeze(1).expand(-1, len(m), -1), slab_mask], -1)
            allowed = allowed & keys.unsqueeze(2)  # (Bf, nb', b, g + L)
            if self.drop_masked_queries:
                allowed = allowed & self._blocks_of(km)[:, blocks].unsqueeze(-1)
        return allowed

    def _block_rows(self, t: Tensor, blocks: slice) -> Tensor:
        """Query rows of the blocks ``blocks`` of ``t`` ``(Bf, N, ...)``: ``(Bf, nb', b, ...)``,
        zero-padded past ``N`` (a view unless the run reaches past ``N``)."""
        start, stop, _ = blocks.indices(self._num_blocks())
        b = self.row_block
        rows = t[:, start * b : stop * b]
        short = (stop - start) * b - rows.shape[1]
        if short:
            rows = F.pad(rows, [0, 0] * (t.dim() - 2) + [0, short])
        return rows.reshape(t.shape[0], stop - start, b, *t.shape[2:])

    def _keys(self, t: Tensor, blocks: slice) -> Tensor:
        """``(Bf, N, D)`` -> the keys (or values) of each block of the run ``blocks``:
        ``(Bf, nb', g + L, D)``, overlapping views of one padded copy of the run's own rows
        (``O(run)`` memory, never a padded copy of all of ``t``)."""
        start, stop, _ = blocks.indices(self._num_blocks())
        b, n, slab = self.row_block, self.num_nodes, self._slab()
        lo = start * b - self._before()  # first slab position of the run (may be < 0)
        hi = (stop - 1) * b - self._before() + slab  # one past its last
        piece = t[:, max(lo, 0) : min(hi, n)]
        if lo < 0 or hi > n:
            piece = F.pad(piece, [0, 0] * (t.dim() - 2) + [max(-lo, 0), max(hi - n, 0)])
        slabs = self._slabs_of_padded(piece)  # (Bf, nb', L, D)
        if not self.num_global:
            return slabs
        glob = t[:, : self.num_global].unsqueeze(1).expand(-1, slabs.shape[1], -1, -1)
        return torch.cat([glob, slabs], dim=2)

    def _flat(self) -> tuple[Tensor, Tensor]:
        """``q``, ``k`` as ``(Bf, N, E)``: made once per grad mode (a copy when ``q`` is a
        strided view, e.g. of a fused projection) and shared by every product, so that a heat
        series keeps one copy for its backward, not one per term. With gradients they pass
        through :func:`~heatformer.graph_ops._window_attention.shared`, so that every
        propagation adds its gradient in ``q``, ``k`` into one buffer each (:attr:`_sink`)."""
        grad = torch.is_grad_enabled()
        if self._flat_qk is None or self._flat_qk[0] != grad:
            n, e = self.q.shape[-2:]
            bf = _numel(self.batch_shape)  # not -1: N may be 0
            q, k = self.q.reshape(bf, n, e), self.k.reshape(bf, n, e)
            sink = None
            if grad and (q.requires_grad or k.requires_grad) and not _tracing():
                q, k, sink = shared(self, q, k)
            self._flat_qk = (grad, q, k, sink)
        return self._flat_qk[1], self._flat_qk[2]

    @property
    def _sink(self) -> GradSink | None:
        """Where :class:`WindowAttention` sums the gradients of the current :meth:`_flat`."""
        self._flat()
        assert self._flat_qk is not None
        return self._flat_qk[3]

    def _chunks(self, per_block: int) -> list[slice]:
        """Runs of blocks whose ``(Bf, blocks, b, per_block)`` slab stays near SLAB_ELEMENTS,
        cut where the interior (one shared mask pattern, :meth:`_interior`) begins and ends."""
        rows = _numel(self.batch_shape) * self.row_block * max(1, per_block)
        step = max(1, SLAB_ELEMENTS // rows)
        nb = self._num_blocks()
        lo, hi = self._interior()
        cuts = sorted({0, nb} | ({lo, hi} & set(range(1, nb)) if lo < hi else set()))
        return [
            slice(s, min(s + step, stop))
            for start, stop in itertools.pairwise(cuts)
            for s in range(start, stop, step)
        ]

    def _global_allowed(self) -> Tensor:
        """Bool ``(Bf or 1, g, N)``: what the global rows may attend (every key, causal order)."""
        g, n = self.num_global, self.num_nodes
        allowed = torch.ones(1, g, n, dtype=torch.bool, device=self.device)
        if self.causal:
            allowed = torch.arange(n, device=self.device) <= torch.arange(
                g, device=self.device
            ).unsqueeze(-1)
            allowed = allowed.unsqueeze(0)
        if self._key_mask is not None:
            allowed = allowed & self._key_mask.unsqueeze(1)
            if self.drop_masked_queries:
                allowed = allowed & self._key_mask[:, :g].unsqueeze(-1)
        return allowed

    # ---- weights -------------------------------------------------------------------------

    def _block_weights(self, q: Tensor, k: Tensor, blocks: slice) -> Tensor:
        """Softmax weights ``(Bf, nb', b, g + L)`` of the blocks (rows of global tokens 0),
        scores and softmax in float32 for half inputs (:func:`attention_scores`; the caller
        rounds them to the graph's dtype)."""
        qb = self._block_rows(q, blocks)  # (Bf, nb', b, E)
        s = attention_scores(qb, self._keys(k, blocks), self.scale)
        p = _masked_softmax(s, self._allowed(blocks))
        if self.num_global:  # global rows are dense rows, computed apart
            rows = torch.arange(self._num_blocks(), device=q.device)[blocks, None] * self.row_block
            rows = rows + torch.arange(self.row_block, device=q.device)  # (nb', b)
            p = p.masked_fill((rows < self.num_global)[None, :, :, None], 0.0)
        return p

    def _global_weights(self, q: Tensor, k: Tensor) -> Tensor:
        """Dense rows ``(Bf, g, N)`` of the global tokens (in float32 for half inputs, as
        :meth:`_block_weights`)."""
        s = attention_scores(q[:, : self.num_global], k, self.scale)
        return _masked_softmax(s, self._global_allowed())

    # ---- protocol ------------------------------------------------------------------------

    def _interior(self) -> tuple[int, int]:
        """Blocks ``[lo, hi)`` that all share one allowed pattern: no key mask, every row a
        real query past the global ones, the whole slab inside ``[g, N)``; ``lo >= hi`` when
        there are none."""
        if self._key_mask is not None:
            return 0, 0
        b, n, before = self.row_block, self.num_nodes, self._before()
        lo = -(-(self.num_global + before) // b)  # m b - before >= g, so also m b >= g
        last = n - self._slab() + before  # m b <= last: the slab ends inside N
        hi = min(last // b + 1 if last >= 0 else 0, n // b)  # and every row is real
        return lo, hi

    def _in_interior(self, blocks: slice) -> bool:
        """Whether the run ``blocks`` lies inside :meth:`_interior`."""
        start, stop, _ = blocks.indices(self._num_blocks())
        lo, hi = self._interior()
        return lo <= start and stop <= hi

    def _run_masks(self, blocks: slice) -> tuple[Tensor, Tensor, Tensor | None]:
        """``(allowed, disallowed, empty)`` of a run of blocks: bool ``(Bf or 1, nb', b,
        g + L)`` each, and the rows without any allowed key ``(Bf or 1, nb', b, 1)`` or None.

        An interior run (:meth:`_interior`) gets one shared ``(b, g + L)`` pattern, expanded
        (no memory per block); the runs at the ends (a few blocks) are made once each; with a
        key mask every block differs, and the masks of all blocks are made once. All are kept
        by the graph: a heat series propagates one graph many times."""
        start, stop, _ = blocks.indices(self._num_blocks())
        if self._in_interior(blocks):
            if self._pattern is None:  # any interior block's: they are all the same
                allowed = self._allowed(slice(start, start + 1))  # (1, 1, b, g + L)
                self._pattern = (allowed, ~allowed)
            shape = (1, stop - start, *self._pattern[0].shape[2:])
            return self._pattern[0].expand(shape), self._pattern[1].expand(shape), None
        if self._key_mask is None:  # the ends: a few blocks, kept per run
            if (start, stop) not in self._end_masks:
                self._end_masks[start, stop] = self._masks_of(self._allowed(blocks))
            return self._end_masks[start, stop]
        if self._all_masks is None:
            self._all_masks = self._masks_of(self._allowed(slice(None)))
        allowed, disallowed, empty = self._all_masks
        rows = None if empty is None else empty[:, blocks]
        return allowed[:, blocks], disallowed[:, blocks], rows

    @staticmethod
    def _masks_of(allowed: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        # the rows without keys, as a mask whether or not there are any: deciding that would
        # read the mask on the host (a device sync per graph); the interior runs, which are
        # known to have none, never come here
        return allowed, ~allowed, ~allowed.any(-1, keepdim=True)

    def _sdpa_mask(self, blocks: slice, dtype: torch.dtype | None = None) -> Tensor:
        """The mask of a run for the fused kernels: rows without keys attend everywhere (their
        output is then set to 0), so that no row of the kernel is all ``-inf``; bool, or with
        ``dtype`` the additive float mask (0 or ``-inf``; shared across an interior run)."""
        allowed, disallowed, empty = self._run_masks(blocks)
        if dtype is None:
            return allowed if empty is None else allowed | empty
        if self._in_interior(blocks):  # one pattern
            if self._additive is None or self._additive.dtype != dtype:
                self._additive = torch.zeros(
                    allowed.shape[2:], dtype=dtype, device=allowed.device
                ).masked_fill_(disallowed[0, 0], float("-inf"))  # (b, g + L)
            return self._additive.expand(allowed.shape)
        if empty is not None:
            disallowed = disallowed & ~empty
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
            disallowed, float("-inf")
        )

    def propagate(self, x: Tensor) -> Tensor:
        if _flex.use_flex(self, BACKEND):  # FlexAttention (see BACKEND)
            return _flex.window_propagate(self, x)
        xf, unfold = _fold(self._check_x(x), self.batch_shape)
        q, k = self._flat()
        n = self.num_nodes
        if _tracing():  # the same products, differentiated by autograd (see _traced_products)
            y = self._traced_products(q, k, xf)
        else:
            y = window_attention(self, q, k, xf, self._sink)  # (Bf, nb, b, C); rows w/o edges: 0
        y = y.reshape(q.shape[0], -1, xf.shape[-1])  # (Bf, nb b, C)
        if y.shape[1] != n:  # a slice's backward writes into a zero-filled copy: only if needed
            y = y[:, :n]  # (Bf, N, C)
        if self.num_global:
            ga = self._global_allowed()
            g_has = ga.any(-1, keepdim=True)
            yg = F.scaled_dot_product_attention(
                q[:, : self.num_global], k, xf, attn_mask=ga | ~g_has, scale=self.scale
            )  # (Bf, g, C)
            y = torch.cat([yg * g_has, y[:, self.num_global :]], dim=1)
        return unfold(y)

    def _traced_products(self, q: Tensor, k: Tensor, x: Tensor) -> Tensor:
        """``P x`` block by block, ``(Bf, nb, b, C)``, as :class:`~heatformer.graph_ops.
        _window_attention.WindowAttention`'s forward computes it on its generic path, for
        :func:`torch.compile`: one SDPA call per run of blocks, differentiated by autograd
        (which a tracer derives and fuses) instead of the recomputing backward and the shared
        gradient buffers, whose Python state (the graph, the backward pass's id) a tracer cannot
        follow. Memory: autograd keeps each run's inputs, ``O(N (w + g) / b)`` slabs."""
        outs = []
        for blocks in self._chunks(self.num_global + self._slab()):
            qb, kb = self._block_rows(q, blocks), self._keys(k, blocks)
            xb = self._keys(x, blocks)
            empty = self._run_masks(blocks)[2]
            y = F.scaled_dot_product_attention(
                qb, kb, xb, attn_mask=self._sdpa_mask(blocks), scale=self.scale
            )  # (Bf, nb', b, C)
            outs.append(y if empty is None else y.masked_fill(empty, 0.0))
        return torch.cat(outs, dim=1) if len(outs) != 1 else outs[0]

    def propagate_transpose(self, x: Tensor) -> Tensor:
        xf, unfold = _fold(self._check_x(x), self.batch_shape)
        q, k = self._flat()
        n, g, b = self.num_nodes, self.num_global, self.row_block
        nb, slab, before = self._num_blocks(), self._slab(), self._before()
        grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or xf.requires_grad)

        acc = accumulation_dtype(xf.dtype)  # half precision: sums over blocks in float32

        def chunk(q: Tensor, k: Tensor, xb: Tensor, blocks: slice) -> tuple[Tensor, Tensor]:
            p = self._block_weights(q, k, blocks).to(xb.dtype)  # (Bf, nb', b, g + L)
            out = p.transpose(-1, -2) @ xb  # (Bf, nb', g + L, C)
            return out[:, :, :g].sum(1, dtype=acc), out[:, :, g:]  # (Bf, g, C), (Bf, nb', L, C)

        to_global = xf.new_zeros(xf.shape[0], g, xf.shape[-1], dtype=acc)
        slabs: list[Tensor] = []
        for blocks in self._chunks(g + slab):
            args = (q, k, self._block_rows(xf, blocks))
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
            out = out + self._global_weights(q, k).to(xf.dtype).transpose(-1, -2) @ xf[:, :g]
        return unfold(out.to(xf.dtype))

    def row_has_edge(self) -> Tensor:
        """Bool ``(..., N)``: which rows have at least one allowed key."""
        if self._row_has_edge is None:
            shape = (*self.batch_shape, self.num_nodes)
            if self._key_mask is None:
                has = torch.ones(shape, dtype=torch.bool, device=self.device)
            else:
                bf, n, g = _numel(self.batch_shape), self.num_nodes, self.num_global
                blocks = self._allowed(slice(None)).any(-1).expand(bf, -1, -1)  # (Bf, nb, b)
                has = blocks.reshape(bf, -1)[:, :n]
                if g:
                    has = torch.cat([self._global_allowed().any(-1).expand(bf, g), has[:, g:]], 1)
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

    def weight_rows(self, start: int, stop: int) -> Tensor:
        """Dense rows ``(Bf, rows, N)`` (for to_dense and generic conversions: ``O(rows N)``),
        scores and softmax in float32 for half inputs, rounded to the graph's dtype once."""
        q, k = self._flat()
        n, g = self.num_nodes, self.num_global
        rows = torch.arange(start, stop, device=self.device).unsqueeze(-1)  # (rows, 1)
        cols = torch.arange(n, device=self.device)
        gap = rows - cols
        band = (gap >= 0) & (gap < self.window) if self.causal else gap.abs() <= self.window
        glob = (rows < g) | (cols < g)
        allowed = (band | (glob & (gap >= 0) if self.causal else band | glob)).unsqueeze(0)
        if self._key_mask is not None:
            allowed = allowed & self._key_mask.unsqueeze(1)
            if self.drop_masked_queries:
                allowed = allowed & self._key_mask[:, start:stop].unsqueeze(-1)
        s = attention_scores(q[:, start:stop], k, self.scale)  # float32 for half inputs
        return _masked_softmax(s, allowed).to(q.dtype)

    # ---- top-k inside the window: O(N (w + g)) -------------------------------------------

    def topk(self, k_top: int, *, row_block: int | None = None) -> SparseGraph:
        """The ``k_top`` heaviest allowed keys of every query, renormalized (see
        :meth:`Graph.topk <heatformer.graph_ops.Graph.topk>`), ranked inside each block's slab:
        ``O(N (w + g))`` work and memory. Equals the top-k of the dense banded matrix (ties to
        the lower key index); a row with fewer allowed keys keeps zero-weight entries.

        Raises:
            ValueError: ``k_top`` outside ``[1, min(N, g + L)]`` (``L`` the slab length).
        """
        n, g = self.num_nodes, self.num_global
        limit = min(n, g + self._slab())
        k_top = V.check_positive_int("k_top", k_top, upper=limit)
        q, k = self._flat()
        idx_parts, w_parts = [], []
        for blocks in self._chunks(g + self._slab()):
            with torch.no_grad():  # ranked on the scores the weights are made of (float32)
                s = attention_scores(self._block_rows(q, blocks), self._keys(k, blocks), self.scale)
                s = s.masked_fill(~self._allowed(blocks), float("-inf"))
                slot = _stable_topk(s, k_top)  # (Bf, nb', b, K) slots, ascending
            idx_parts.append(self._slot_columns(slot, blocks))
            w_parts.append(self._kept(q, k, blocks, slot))
        idx = torch.cat(idx_parts, dim=1).reshape(q.shape[0], -1, k_top)[:, :n]
        w = torch.cat(w_parts, dim=1).reshape(q.shape[0], -1, k_top)[:, :n]
        if g:  # the global rows rank all N keys
            dense = self._global_weights(*self._flat())
            with torch.no_grad():
                ranks = attention_scores(q[:, :g], k, self.scale).masked_fill(
                    ~self._global_allowed(), float("-inf")
                )
                gidx = _stable_topk(ranks, k_top)  # (Bf, g, K)
            gw = _row_normalize(dense.gather(-1, gidx)).to(q.dtype)
            idx = torch.cat([gidx, idx[:, g:]], dim=1)
            w = torch.cat([gw, w[:, g:]], dim=1)
        shape = (*self.batch_shape, n, k_top)
        return SparseGraph._from_ell(idx.reshape(shape), w.reshape(shape), row_stochastic=True)

    def _slot_columns(self, slot: Tensor, blocks: slice) -> Tensor:
        """Absolute key index of each kept slot; an empty slot points at the row itself."""
        g, b, before = self.num_global, self.row_block, self._before()
        m = torch.arange(self._num_blocks(), device=slot.device)[blocks]
        first = (m * b - before).view(1, -1, 1, 1)
        col = torch.where(slot < g, slot, slot - g + first)
        rows = (m[:, None] * b + torch.arange(b, device=slot.device)).view(1, -1, b, 1)
        valid = (col >= 0) & (col < self.num_nodes)
        return torch.where(valid, col, rows.clamp_max(self.num_nodes - 1))

    def _kept(self, q: Tensor, k: Tensor, blocks: slice, slot: Tensor) -> Tensor:
        def kept(q: Tensor, k: Tensor) -> Tensor:
            p = self._block_weights(q, k, blocks).gather(-1, slot)  # (Bf, nb', b, K)
            return _row_normalize(p).to(q.dtype)  # in float32 for half inputs, rounded once

        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
            return checkpoint(kept, q, k, use_reentrant=False)
        return kept(q, k)
