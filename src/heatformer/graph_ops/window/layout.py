r"""The layout of a window graph: one predicate, and the blocks and slabs derived from it.

Query ``i`` may attend key ``j`` (:func:`window_allowed`, the one statement of the window
kind's edges, as FlexAttention's ``mask_mod(b, h, q_idx, kv_idx)``) when

- **causal**: ``0 <= i - j`` and (``i - j < w`` or ``i < g`` or ``j < g``),
- **bidirectional**: ``|i - j| <= w`` or ``i < g`` or ``j < g``,

and, in a graph (:meth:`WindowLayout.allowed`), ``0 <= j < N`` and the key is real
(``key_mask``; with ``drop_masked_queries`` the query too). Everything else is derived from it:
the allowed pairs of a block's keys (:meth:`WindowLayout.block_allowed`), the dense rows of the
global tokens (:meth:`WindowLayout.dense_allowed`), the masks of the fused kernels
(:meth:`WindowLayout.sdpa_mask`) and a decoding step's mask (by
:meth:`~heatformer.graph_ops.window.builder.WindowBuilder.decode`).

Blocks: queries are cut into blocks of ``b`` rows; block ``m`` (rows ``m b ... m b + b - 1``)
reads the ``g`` global keys and a slab of ``L = b + w - 1`` positions (``b + 2 w``
bidirectional) starting at ``m b - before`` (``before = w - 1``, or ``w``), its slab positions
below ``g`` left out (they are global keys already). A causal global row ``i < g`` attends keys
``j <= i < g`` only, all of them global keys, so its block holds its whole row; bidirectional
global rows are dense rows over all ``N`` keys (:attr:`WindowLayout.dense_rows`), ``O(g N)``.

:class:`WindowLayout` is plain data (ints and the key mask), shared by
:class:`~heatformer.graph_ops.WindowGraph` and its autograd function
(:mod:`~heatformer.graph_ops.window.kernels`), which saves the mask with
``save_for_backward`` and rebuilds the layout from :meth:`WindowLayout.spec` in the backward.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor

from heatformer import checks as V
from heatformer._torch_compat import func_transforming
from heatformer.graph_ops._arrays import numel
from heatformer.graph_ops.protocol import SLAB_ELEMENTS

__all__ = ["WindowLayout", "check_window", "flat_key_mask", "window_allowed"]


def check_window(
    num_nodes: int,
    window: object,
    num_global: object,
    causal: object,
    drop: object,
    row_block: object,
) -> None:
    """The arguments of a window graph of ``num_nodes`` nodes besides ``q``, ``k`` and the key
    mask, checked (by :class:`~heatformer.graph_ops.WindowGraph`,
    :class:`~heatformer.graph_ops.window.sharding.ShardedWindowGraph` and the FlexAttention
    block mask): ``window``, ``num_global``, ``causal``, ``drop`` (``drop_masked_queries``) and
    ``row_block`` (None passes).

    Raises:
        TypeError: a window, ``num_global`` or ``row_block`` that is not an int, flags that
            are not bools.
        ValueError: ``window < 1``, ``num_global`` outside ``[0, num_nodes]``, ``row_block < 1``.
    """
    V.check_positive_int("window", window)
    if isinstance(num_global, bool) or not isinstance(num_global, int):
        raise V.bad_type("num_global", f"expected an int >= 0, got {type(num_global).__name__}")
    if num_global < 0:
        raise V.bad_value("num_global", f"expected an int >= 0, got {num_global}")
    if num_global > num_nodes:
        raise V.bad_value("num_global", f"expected at most N = {num_nodes}, got {num_global}")
    V.check_bool("causal", causal)
    V.check_bool("drop_masked_queries", drop)
    V.check_positive_int("row_block", row_block, optional=True)


def flat_key_mask(key_mask: Tensor | None, batch: torch.Size, num_nodes: int) -> Tensor | None:
    """A checked key mask ``(B, N)`` (leading batch dims of ``batch``) broadcast over the
    graph's batch ``batch`` and flattened: ``(Bf, N)``, ``Bf`` the batch's size; None passes."""
    if key_mask is None:
        return None
    lead = key_mask.shape[:-1]
    view = key_mask.reshape(*lead, *([1] * (len(batch) - len(lead))), num_nodes)
    return view.expand(*batch, num_nodes).reshape(numel(batch), num_nodes)  # (Bf, N)


def window_allowed(
    rows: Tensor, cols: Tensor, *, window: int | Tensor, causal: bool, num_global: int | Tensor
) -> Tensor:
    """Bool, the broadcast shape of ``rows`` and ``cols`` (absolute query and key positions):
    whether query ``rows`` may attend key ``cols`` (the module's predicate, without ``N`` and
    key mask)."""
    gap = rows - cols
    glob = (rows < num_global) | (cols < num_global)
    if causal:
        return (gap >= 0) & ((gap < window) | glob)
    return (gap.abs() <= window) | glob


def _padded_rows(t: Tensor, lo: int, hi: int) -> Tensor:
    """Rows ``lo ... hi - 1`` of ``t`` ``(Bf, R, ...)``, zeros where they fall outside
    ``[0, R)``: ``(Bf, hi - lo, ...)``, a view unless some do."""
    rows = t[:, max(lo, 0) : max(hi, 0)]
    front = min(max(-lo, 0), hi - lo)
    back = (hi - lo) - front - rows.shape[1]
    if front or back:
        rows = F.pad(rows, [0, 0] * (t.dim() - 2) + [front, back])
    return rows


#: The ints of a layout, in :class:`WindowLayout`'s field order (what a backward rebuilds it
#: from, with the key mask).
Spec = tuple[int, int, bool, int, int, bool, float, int]


@dataclasses.dataclass(eq=False)
class WindowLayout:
    """Where a window graph's edges are, and how its queries are cut into blocks (unchecked:
    :class:`~heatformer.graph_ops.WindowGraph` checks its arguments once).

    Attributes:
        n: ``N`` nodes.
        window: ``w``, already ``min(w, max(N, 1))``.
        causal: causal order.
        num_global: ``g``.
        row_block: ``b`` query rows per block.
        drop_masked_queries: padded queries have no out-edges.
        scale: the logit scale.
        q_offset: graph rows before the first row of the queries ``q``: the queries of
            those rows (and of the rows past ``q``'s end) are never read but taken as zeros,
            so that a graph whose first rows are not its own (the halo of a
            :class:`~heatformer.graph_ops.window.sharding.ShardedWindowGraph`) needs no padded copy
            of ``q``. Their outputs are computed (uniform rows) and meant to be discarded.
        device: where the masks are made.
        key_mask: bool ``(Bf, N)`` or None.
    """

    n: int
    window: int
    causal: bool
    num_global: int
    row_block: int
    drop_masked_queries: bool
    scale: float
    q_offset: int
    device: torch.device
    key_mask: Tensor | None = None
    _masks: dict[object, object] = dataclasses.field(default_factory=dict, init=False, repr=False)

    def spec(self) -> Spec:
        """The ints (and scale) of the layout: ``WindowLayout(*spec, device, key_mask)`` is the
        same layout."""
        return (self.n, self.window, self.causal, self.num_global, self.row_block,
                self.drop_masked_queries, self.scale, self.q_offset)  # fmt: skip

    @property
    def before(self) -> int:
        """Keys of a block's slab before its first query (``w - 1``, or ``w`` bidirectional)."""
        return self.window - 1 if self.causal else self.window

    @property
    def slab(self) -> int:
        """``L``: keys in one block's slab, ``b + w - 1`` (causal) or ``b + 2 w``."""
        return self.row_block + self.before + (0 if self.causal else self.window)

    @property
    def num_blocks(self) -> int:
        """``ceil(N / b)``, at least 1: with no nodes, one block of padding gives every product
        its empty ``(Bf, 0, ...)`` result without a case of its own."""
        return max(1, -(-self.n // self.row_block))

    @property
    def dense_rows(self) -> int:
        """Global rows computed as dense rows over all ``N`` keys: ``g`` bidirectional, 0 causal
        (a causal global row's keys are all global keys, in its block)."""
        return 0 if self.causal else self.num_global

    def allowed(self, rows: Tensor, cols: Tensor) -> Tensor:
        """Bool ``(Bf or 1, *broadcast(rows, cols))``: :func:`window_allowed` for keys inside
        ``[0, N)`` (a column out of it is never allowed) and real keys (and queries)."""
        ok = window_allowed(
            rows, cols, window=self.window, causal=self.causal, num_global=self.num_global
        )
        ok = (ok & (cols >= 0) & (cols < self.n)).unsqueeze(0)
        km, last = self.key_mask, self.n - 1
        if km is not None and self.n:

            def at(t: Tensor) -> Tensor:  # (Bf, 1..., *t.shape), aligned with ok
                return km[:, t.clamp(0, last)].view(-1, *[1] * (ok.dim() - 1 - t.dim()), *t.shape)

            ok = ok & at(cols)
            if self.drop_masked_queries:
                ok = ok & at(rows) & (rows < self.n)
        return ok

    def block_cols(self, blocks: slice) -> Tensor:
        """Key positions ``(nb', g + L)`` of the blocks: the global keys, then the slab (-1 for a
        slab position below ``g``, which is a global key already)."""
        m = torch.arange(self.num_blocks, device=self.device)[blocks]  # (nb',)
        slab = m[:, None] * self.row_block - self.before + torch.arange(self.slab, device=m.device)
        glob = torch.arange(self.num_global, device=m.device).expand(len(m), -1)
        return torch.cat([glob, torch.where(slab >= self.num_global, slab, -1)], dim=-1)

    def block_query_rows(self, blocks: slice) -> Tensor:
        """Absolute query positions ``(nb', b)`` of the blocks."""
        m = torch.arange(self.num_blocks, device=self.device)[blocks]
        return m[:, None] * self.row_block + torch.arange(self.row_block, device=self.device)

    def block_allowed(self, blocks: slice) -> Tensor:
        """Bool ``(Bf or 1, nb', b, g + L)``: the allowed (query, block key) pairs."""
        rows = self.block_query_rows(blocks).unsqueeze(-1)  # (nb', b, 1)
        return self.allowed(rows, self.block_cols(blocks).unsqueeze(1))

    def dense_allowed(self, start: int, stop: int) -> Tensor:
        """Bool ``(Bf or 1, stop - start, N)``: rows ``start ... stop - 1`` over all keys."""
        rows = torch.arange(start, stop, device=self.device).unsqueeze(-1)
        return self.allowed(rows, torch.arange(self.n, device=self.device))

    # ---- rows and slabs ------------------------------------------------------------------

    def span(self, blocks: slice) -> tuple[int, int]:
        """``(start, stop)`` of a run of blocks given as a step-less slice of non-negative
        bounds or ``slice(None)``: ``slice.indices`` without the call that torch 2.5's
        compiler cannot trace."""
        start = 0 if blocks.start is None else blocks.start
        stop = self.num_blocks if blocks.stop is None else min(blocks.stop, self.num_blocks)
        return start, stop

    def block_rows(self, t: Tensor, blocks: slice, offset: int = 0) -> Tensor:
        """Query rows of the blocks ``blocks`` of ``t`` ``(Bf, R, ...)``, whose row ``i`` is
        graph row ``offset + i``: ``(Bf, nb', b, ...)``, zero-padded where the run reaches
        before ``offset`` or past ``t``'s last row (a view unless it does)."""
        start, stop = self.span(blocks)
        b = self.row_block
        rows = _padded_rows(t, start * b - offset, stop * b - offset)  # (Bf, nb' b, ...)
        return rows.reshape(t.shape[0], stop - start, b, *t.shape[2:])

    def block_queries(self, q: Tensor, blocks: slice) -> Tensor:
        """The queries ``(Bf, nb', b, E)`` of the blocks ``blocks`` (:meth:`block_rows` of
        ``q`` ``(Bf, R, E)`` at :attr:`q_offset`)."""
        return self.block_rows(q, blocks, self.q_offset)

    def query_rows(self, q: Tensor, start: int, stop: int) -> Tensor:
        """The queries of graph rows ``start ... stop - 1``: ``(Bf, stop - start, E)`` from
        ``q`` ``(Bf, R, E)`` at :attr:`q_offset`, zeros outside ``q`` (a view of ``q`` when it
        holds those rows)."""
        return _padded_rows(q, start - self.q_offset, stop - self.q_offset)

    def keys(self, t: Tensor, blocks: slice, glob: bool = True) -> Tensor:
        """``(Bf, N, D)`` -> the keys (or values) of each block of the run ``blocks``:
        ``(Bf, nb', g + L, D)``, overlapping views of one padded copy of the run's own rows
        (``O(run)`` memory, never a padded copy of all of ``t``); ``glob=False``: the slabs
        ``(Bf, nb', L, D)`` only, a view of ``t`` for a run inside ``[0, N)``."""
        start, stop = self.span(blocks)
        b, n = self.row_block, self.n
        lo = start * b - self.before  # first slab position of the run (may be < 0)
        hi = (stop - 1) * b - self.before + self.slab  # one past its last
        piece = t[:, max(lo, 0) : min(hi, n)]
        if lo < 0 or hi > n:
            piece = F.pad(piece, [0, 0] * (t.dim() - 2) + [max(-lo, 0), max(hi - n, 0)])
        if func_transforming():  # vmap has no batching rule for unfold's backward
            at = torch.arange(stop - start, device=t.device)[:, None] * b  # (nb', 1)
            slabs = piece[:, at + torch.arange(self.slab, device=t.device)]  # (Bf, nb', L, D)
        else:
            slabs = piece.unfold(1, self.slab, b).movedim(-1, 2)  # (Bf, nb', L, D)
        if not (self.num_global and glob):
            return slabs
        first = t[:, : self.num_global].unsqueeze(1).expand(-1, slabs.shape[1], -1, -1)
        return torch.cat([first, slabs], dim=2)

    # ---- runs of blocks and their masks --------------------------------------------------

    def interior(self) -> tuple[int, int]:
        """Blocks ``[lo, hi)`` that all share one allowed pattern: no key mask, every row a
        real query past the global ones, the whole slab inside ``[g, N)``; ``lo >= hi`` when
        there are none."""
        if self.key_mask is not None:
            return 0, 0
        b, n, before = self.row_block, self.n, self.before
        lo = -(-(self.num_global + before) // b)  # m b - before >= g, so also m b >= g
        last = n - self.slab + before  # m b <= last: the slab ends inside N
        hi = min(last // b + 1 if last >= 0 else 0, n // b)  # and every row is real
        return lo, hi

    def in_interior(self, blocks: slice) -> bool:
        """Whether the run ``blocks`` lies inside :meth:`interior`."""
        start, stop = self.span(blocks)
        lo, hi = self.interior()
        return lo <= start and stop <= hi

    def chunks(self, batch: int) -> list[slice]:
        """Runs of blocks whose ``(batch, blocks, b, g + L)`` scores stay near SLAB_ELEMENTS,
        cut where the interior (one shared mask pattern, :meth:`interior`) begins and ends."""
        rows = batch * self.row_block * max(1, self.num_global + self.slab)
        step = max(1, SLAB_ELEMENTS // rows)
        nb = self.num_blocks
        lo, hi = self.interior()
        cuts = sorted({0, nb} | ({lo, hi} & set(range(1, nb)) if lo < hi else set()))
        return [
            slice(s, min(s + step, cuts[i + 1]))
            for i in range(len(cuts) - 1)  # not itertools.pairwise: torch 2.5 cannot compile it
            for s in range(cuts[i], cuts[i + 1], step)
        ]

    def run_masks(self, blocks: slice) -> tuple[Tensor, Tensor, Tensor | None]:
        """``(allowed, disallowed, empty)`` of a run of blocks: bool ``(Bf or 1, nb', b,
        g + L)`` each, and the rows without any allowed key ``(Bf or 1, nb', b, 1)`` or None.

        An interior run (:meth:`interior`) gets one shared ``(b, g + L)`` pattern, expanded
        (no memory per block); the runs at the ends (a few blocks) are made once each; with a
        key mask every block differs, and the masks of all blocks are made once. All are kept
        by the layout: a heat series propagates one graph many times. The rows without keys
        are a mask whether or not there are any: deciding that would read it on the host."""
        start, stop = self.span(blocks)
        cache = self._masks
        if self.in_interior(blocks):
            if "pattern" not in cache:  # any interior block's: they are all the same
                allowed = self.block_allowed(slice(start, start + 1))  # (1, 1, b, g + L)
                cache["pattern"] = (allowed, ~allowed)
            pattern: tuple[Tensor, Tensor] = cache["pattern"]  # type: ignore[assignment]
            allowed, disallowed = pattern
            shape = (1, stop - start, *allowed.shape[2:])
            return allowed.expand(shape), disallowed.expand(shape), None
        key = (start, stop) if self.key_mask is None else "all"
        if key not in cache:  # the ends: a few blocks, kept per run; or all blocks at once
            allowed = self.block_allowed(blocks if self.key_mask is None else slice(None))
            cache[key] = (allowed, ~allowed, ~allowed.any(-1, keepdim=True))
        masks: tuple[Tensor, Tensor, Tensor] = cache[key]  # type: ignore[assignment]
        if self.key_mask is None:
            return masks
        return masks[0][:, blocks], masks[1][:, blocks], masks[2][:, blocks]

    def sdpa_mask(self, blocks: slice, dtype: torch.dtype | None = None) -> Tensor:
        """The mask of a run for the fused kernels: rows without keys attend everywhere (their
        output is then set to 0), so that no row of the kernel is all ``-inf``; bool, or with
        ``dtype`` the additive float mask (0 or ``-inf``; shared across an interior run)."""
        allowed, disallowed, empty = self.run_masks(blocks)
        if dtype is None:
            return allowed if empty is None else allowed | empty
        if self.in_interior(blocks):  # one pattern
            if ("additive", dtype) not in self._masks:
                self._masks["additive", dtype] = torch.zeros(
                    allowed.shape[2:], dtype=dtype, device=allowed.device
                ).masked_fill_(disallowed[0, 0], float("-inf"))  # (b, g + L)
            additive: Tensor = self._masks["additive", dtype]  # type: ignore[assignment]
            return additive.expand(allowed.shape)
        if empty is not None:
            disallowed = disallowed & ~empty
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
            disallowed, float("-inf")
        )
