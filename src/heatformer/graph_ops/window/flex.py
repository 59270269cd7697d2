r"""A FlexAttention backend for window graphs: ``P x`` by ``flex_attention`` on a block mask
built from the window's arithmetic.

:meth:`WindowGraph.propagate <heatformer.graph_ops.WindowGraph.propagate>` multiplies by the
row-softmax of a sliding window with global tokens. PyTorch's FlexAttention
(:func:`torch.nn.attention.flex_attention.flex_attention`) computes exactly such a product in
one fused kernel (Triton on CUDA, forward and backward; a C++ kernel on the CPU, forward only in
torch 2.13) from two descriptions of the mask:

- a ``mask_mod(b, h, q_idx, kv_idx) -> bool``, the window predicate itself
  (:func:`window_mask_mod`), evaluated inside the kernel on the tiles that need it;
- a :class:`~torch.nn.attention.flex_attention.BlockMask`: for every tile of ``B`` query rows,
  the key tiles that hold an allowed pair (*partial*: the predicate is applied) and those whose
  every pair is allowed (*full*: no predicate), so the kernel skips every other tile.

``create_block_mask`` finds the tiles by evaluating the predicate on all ``N^2`` pairs
(seconds at 64k tokens, impossible at 1M). :func:`window_block_mask` finds them arithmetically:
query tile ``m`` (rows ``[mB, mB + B)``) can only meet the global key tiles and the key tiles
that its band reaches (``ceil((B + w) / B) + 1`` of them, ``ceil((B + 2w) / B) + 1``
bidirectional), and the global query tiles meet every key tile; each candidate tile is
classified empty / partial / full from the ranges of ``i``, ``j`` and ``i - j`` it spans
(exact, see :func:`_tile_classes`). That is ``O(N/B (w + g) / B + g/B N/B)`` candidates.

The index tensors themselves are ``(N/B) x (N/B)`` int32: BlockMask's layout lists, per query
tile, the key tiles in the first ``kv_num_blocks`` slots of a row as wide as all key tiles (the
CPU kernel checks that width, and ``BlockMask.from_kv_blocks`` derives the transposed lists for
the backward pass from it). So the mask costs ``4 (N/B)^2`` bytes per index tensor (4 of them):
4 MiB at 128k tokens, 256 MiB at 1M with ``B = 128`` -- which is why ``"auto"`` takes this
backend only up to :data:`MAX_TILE_PAIRS` tile pairs.

Semantics are those of :class:`~heatformer.graph_ops.WindowGraph` (its ``window`` already
clipped to ``N``): a row without any allowed key gives 0 (FlexAttention's convention too), the
scale is the graph's, a key mask removes keys (and with ``drop_masked_queries`` the padded
queries' rows). In half precision the kernel forms scores and softmax in float32 (its
accumulators), as :func:`~heatformer.graph_ops._precision.attention_scores` requires, and
returns the product in the input dtype, as the window kernels' forward does.
"""

from __future__ import annotations

import functools
import inspect
import math
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from heatformer import checks as V
from heatformer.graph_ops._arrays import fold
from heatformer.graph_ops.window.layout import WindowLayout, window_allowed

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

    from heatformer.graph_ops.window.graph import WindowGraph

__all__ = [
    "BACKENDS",
    "DEFAULT_BLOCK_SIZE",
    "MAX_TILE_PAIRS",
    "flex_available",
    "use_flex",
    "window_block_mask",
    "window_mask_mod",
    "window_propagate",
]

#: The engines of :meth:`WindowGraph.propagate <heatformer.graph_ops.WindowGraph.propagate>`,
#: chosen by ``heatformer.graph_ops.window.BACKEND``.
BACKENDS = ("auto", "kernels", "flex")

#: Rows (and keys) per tile of the block mask: FlexAttention's default sparse block size, a
#: multiple of its CUDA kernels' tiles.
DEFAULT_BLOCK_SIZE = 128

#: ``"auto"`` takes FlexAttention while the block mask's ``(N/B)^2`` tile pairs stay at or
#: below this (``2^26``: 256 MiB per int32 index tensor, ``N`` up to 1M tokens with ``B = 128``);
#: longer sequences keep the window kernels, whose memory is ``O(N w)``.
MAX_TILE_PAIRS = 1 << 26

#: FlexAttention's CUDA kernels need head dims of at least 16 (``tl.dot``): smaller ones are
#: padded with zeros, which changes no score and no output.
_MIN_DIM = 16
#: Signals wider than this go through the kernel in channel groups (``P x`` is linear in x): a
#: heat series may fold extra leading dims into the channels (``fold``), and the CUDA kernels
#: compile per value width, with shared memory growing with it.
_MAX_VALUE_DIM = 128

_FLEX_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INT = torch.int32


_AVAILABLE: bool | None = None  # flex_available(), once probed


def flex_available() -> bool:
    """Whether this torch has FlexAttention with ``BlockMask.from_kv_blocks(seq_lengths=...)``
    (torch 2.6 and later; the declared floor, 2.5, has neither the keyword nor, for lengths not
    a multiple of the block size, the semantics this module needs). Probed once; a constant
    inside ``torch.compile``."""
    global _AVAILABLE
    if _AVAILABLE is None:
        _AVAILABLE = _probe()
    return _AVAILABLE


def _probe() -> bool:
    try:
        from torch.nn.attention.flex_attention import BlockMask, flex_attention  # noqa: F401
    except ImportError:
        return False
    return "seq_lengths" in inspect.signature(BlockMask.from_kv_blocks).parameters


# What ``@torch.compiler.assume_constant_result`` does (torch 2.5 to 2.13: it sets this flag),
# without its ``import torch._dynamo`` when this module is imported (1.5 s and 70 MB in every
# process that only runs the graphs eagerly, e.g. each rank of a split sequence);
# tests/test_compile.py checks that the decorator still sets only this flag.
_probe._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _check_backend(backend: object) -> str:
    if backend not in BACKENDS:
        raise V.bad_value(
            "heatformer.graph_ops.window.BACKEND",
            f"expected one of {', '.join(map(repr, BACKENDS))}, got {backend!r}",
        )
    return str(backend)


def use_flex(graph: WindowGraph, backend: object) -> bool:
    """Whether ``graph.propagate`` runs on FlexAttention under ``backend``.

    ``"flex"``: always (and :func:`window_propagate` raises where it cannot run);
    ``"kernels"``: never; ``"auto"``: on CUDA, where FlexAttention imports
    (:func:`flex_available`), for float16 / bfloat16 / float32 graphs with at least one node and
    at most :data:`MAX_TILE_PAIRS` tile pairs. The CPU keeps the window kernels: FlexAttention
    has no backward there (torch 2.13) and measured no faster forward (0.64--1.08x,
    ``docs/benchmarks.md``).

    Raises:
        ValueError: ``backend`` not one of :data:`BACKENDS`.
    """
    backend = _check_backend(backend)
    if backend != "auto":
        return backend == "flex"
    n = graph.num_nodes
    tiles = -(-n // DEFAULT_BLOCK_SIZE)
    return (
        graph.device.type == "cuda"
        and flex_available()
        and graph.dtype in _FLEX_DTYPES
        and n >= 1
        and tiles * tiles <= MAX_TILE_PAIRS
    )


# ---- the predicate ------------------------------------------------------------------------


def window_mask_mod(layout: WindowLayout) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
    """The window predicate of ``layout`` as a FlexAttention ``mask_mod(b, h, q_idx, kv_idx) ->
    bool``.

    Query ``i`` may attend key ``j`` when ``0 <= i - j < w`` (causal) or ``|i - j| <= w``, or
    when ``i < g`` or ``j < g`` (global tokens; causal order still applies), and
    ``key_mask[b, j]`` (and ``key_mask[b, i]`` with ``drop_masked_queries``).

    Args:
        layout: a window graph's edges (:attr:`WindowGraph.layout
            <heatformer.graph_ops.WindowGraph.layout>`, its arguments checked by the graph): its
            ``window`` (already clipped to ``N``), ``causal``, ``num_global``,
            ``drop_masked_queries`` and ``key_mask`` (bool ``(Bf, N)``, indexed by the kernel's
            batch index ``b``, the flattened batch of the graph; None = every key is real); ``w``
            and ``g`` are kept as 0-dim tensors on its ``device`` (the kernel's).

    Returns:
        A function of scalar (or broadcasting) int tensors ``b, h, q_idx, kv_idx``; the head
        index is unused.

    Example:
        >>> from heatformer.graph_ops import WindowGraph
        >>> q = k = torch.zeros(1, 5, 2)
        >>> mod = window_mask_mod(WindowGraph(q, k, window=2, causal=True).layout)
        >>> i, j = torch.arange(5)[:, None], torch.arange(5)[None]
        >>> mod(torch.tensor(0), torch.tensor(0), i, j).int()
        tensor([[1, 0, 0, 0, 0],
                [1, 1, 0, 0, 0],
                [0, 1, 1, 0, 0],
                [0, 0, 1, 1, 0],
                [0, 0, 0, 1, 1]], dtype=torch.int32)
    """
    # w and g as tensors: torch.compile lifts a captured tensor into an input, where it would
    # guard on a captured int and compile the kernel again for every window and g
    w = torch.tensor(layout.window, device=layout.device)
    g = torch.tensor(layout.num_global, device=layout.device)
    causal, key_mask, drop = layout.causal, layout.key_mask, layout.drop_masked_queries

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        allowed = window_allowed(q_idx, kv_idx, window=w, causal=causal, num_global=g)
        if key_mask is not None:
            allowed = allowed & key_mask[b, kv_idx]
            if drop:
                allowed = allowed & key_mask[b, q_idx]
        return allowed

    return mask_mod


# ---- the block mask, from kv blocks -------------------------------------------------------


def _tile_classes(
    m: Tensor, c: Tensor, *, n: int, w: int, g: int, bs: int, causal: bool
) -> tuple[Tensor, Tensor]:
    """``(any, all)``: whether tile (query tile ``m``, key tile ``c``) holds an allowed pair,
    and whether every pair of it is allowed (no key mask), for broadcasting int tensors.

    A tile spans rows ``[i0, i1]`` and keys ``[j0, j1]``. Some real pair (``i, j < N``) is
    allowed iff one of three regions meets it: the band (``i - j`` ranges over
    ``[i0 - j1, i1 - j0]``, which must meet ``[0, w - 1]``, or ``[-w, w]``), the global rows
    ``i < g`` or the global keys ``j < g`` (causal: with some ``j <= i``). Every pair is
    allowed iff the tile is not cut by ``N`` (its padding counts as masked, as in
    ``create_block_mask``), causal order holds for all (``j1 <= i0``) and the band holds on the
    sub-tile of pairs with neither end global (``i >= g``, ``j >= g``), or that sub-tile is
    empty. Both tests are exact, so the block mask is ``create_block_mask``'s ("partial" = any
    and not all).
    """
    i0, j0 = m * bs, c * bs
    i1, j1 = (i0 + bs).clamp_max(n) - 1, (j0 + bs).clamp_max(n) - 1
    lo, hi = i0 - j1, i1 - j0  # the range of i - j over the tile's real pairs
    if causal:
        band_any = (hi >= 0) & (lo <= w - 1)
        q_glob = (i0 < g) & (j0 <= i1.clamp_max(g - 1))
        k_glob = (j0 < g) & (j0 <= i1)
    else:
        band_any = (hi >= -w) & (lo <= w)
        q_glob, k_glob = i0 < g, j0 < g
    any_ = band_any | q_glob | k_glob
    si0, sj0 = i0.clamp_min(g), j0.clamp_min(g)  # the sub-tile without global ends
    sub_empty = (si0 > i1) | (sj0 > j1)
    if causal:
        all_ = (j1 <= i0) & (sub_empty | ((i1 - sj0 < w) & (si0 - j1 >= 0)))
    else:
        all_ = sub_empty | ((i1 - sj0 <= w) & (j1 - si0 <= w))
    uncut = (i0 + bs <= n) & (j0 + bs <= n)  # padding past N counts as masked
    return any_, all_ & uncut


def _compact(selected: Tensor, cols: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """Per row, the ``cols`` where ``selected``, ascending, in the first slots of a
    ``width``-wide row (the rest 0): ``(num (R,), indices (R, width))``, int32."""
    big = torch.iinfo(cols.dtype).max
    ordered = torch.where(selected, cols, big).sort(dim=-1).values
    ordered = torch.where(ordered == big, 0, ordered)
    if ordered.shape[-1] >= width:
        ordered = ordered[..., :width]
    else:
        ordered = F.pad(ordered, [0, width - ordered.shape[-1]])
    return selected.sum(-1).to(_INT), ordered.to(_INT)


def _kv_blocks(
    n: int, w: int, g: int, bs: int, *, causal: bool, no_full: bool, device: torch.device
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(kv_num, kv_idx, full_num, full_idx)`` of :func:`window_block_mask`: per query tile
    (``ceil(N/B)`` of them), its partial and its full key tiles, ascending, int32; with
    ``no_full`` (a key mask) every tile that holds an allowed pair is partial.

    Only candidate tiles are classified (:func:`_tile_classes`): the band tiles a query tile
    can meet and the global key tiles, and every key tile for the global query tiles.
    """
    nb = -(-n // bs)  # tiles per side
    gb = -(-g // bs)  # tiles holding global tokens (keys and queries)
    before, after = (w - 1, 0) if causal else (w, w)  # band keys before / after a row
    span = -(-(bs + before + after) // bs) + 1  # band tiles a query tile can meet
    classify = functools.partial(_tile_classes, n=n, w=w, g=g, bs=bs, causal=causal)

    m = torch.arange(nb, device=device).unsqueeze(-1)  # (nb, 1)
    first = (m * bs - before).clamp_min(0) // bs
    band = first + torch.arange(span, device=device)  # (nb, span) candidate band tiles
    band_ok = (band < nb) & (band >= gb)  # the global tiles come next, once
    cand = torch.cat([torch.arange(gb, device=device).expand(nb, gb), band], dim=-1)
    ok = torch.cat([torch.ones(nb, gb, dtype=torch.bool, device=device), band_ok], dim=-1)
    any_, all_ = classify(m, cand.clamp_max(nb - 1))
    partial, full = ok & any_ & ~all_, ok & all_
    if no_full:
        partial, full = partial | full, torch.zeros_like(full)
    kv_num, kv_idx = _compact(partial, cand, nb)  # (nb,), (nb, nb)
    full_num, full_idx = _compact(full, cand, nb)
    if gb:  # the global query tiles: every key tile is a candidate
        mg, cg = torch.arange(gb, device=device).unsqueeze(-1), torch.arange(nb, device=device)
        any_g, all_g = classify(mg, cg)  # (gb, nb)
        part_g, full_g = any_g & ~all_g, all_g
        if no_full:
            part_g, full_g = any_g, torch.zeros_like(all_g)
        kv_num[:gb], kv_idx[:gb] = _compact(part_g, cg.expand(gb, nb), nb)
        full_num[:gb], full_idx[:gb] = _compact(full_g, cg.expand(gb, nb), nb)
    return kv_num, kv_idx, full_num, full_idx


def window_block_mask(layout: WindowLayout, *, block_size: int = DEFAULT_BLOCK_SIZE) -> BlockMask:
    r"""The FlexAttention block mask of a window graph's ``layout``, from kv blocks, without
    ``N^2`` work.

    Args:
        layout: the graph's edges (:attr:`WindowGraph.layout
            <heatformer.graph_ops.WindowGraph.layout>`, see :func:`window_mask_mod`), of
            ``N >= 1`` nodes. With a key mask no tile is *full* (the mask decides inside the
            kernel); the tiles are the same. The index tensors live on its ``device``.
        block_size: ``B``, rows and keys per tile.

    Returns:
        A ``BlockMask`` of shape ``(1, 1, N, N)`` (broadcast over batch and heads; the
        ``mask_mod`` reads the key mask by batch index) with ``BLOCK_SIZE = (B, B)``.

    Shape:
        index tensors ``(1, 1, ceil(N/B), ceil(N/B))`` int32; ``O(N/B (w + g) / B + g N / B^2)``
        candidate tiles are classified, the rest of the rows is zero padding.

    Equivalent to (in ``O(N^2)`` evaluations)::

        create_block_mask(window_mask_mod(layout), 1, 1, N, N, BLOCK_SIZE=B)

    (up to the key mask: ``create_block_mask`` drops tiles whose keys are all masked, this
    keeps them as partial tiles, which the kernel then masks entirely).

    Raises:
        ValueError: a graph without nodes, or a ``block_size`` that is not a positive int.
        RuntimeError: FlexAttention is not available in this torch (:func:`flex_available`).
    """
    n = V.check_positive_int("num_nodes", layout.n)
    bs = V.check_positive_int("block_size", block_size)
    _require_flex()
    from torch.nn.attention.flex_attention import BlockMask

    kv_num, kv_idx, full_num, full_idx = _kv_blocks(
        n, layout.window, layout.num_global, bs, causal=layout.causal,
        no_full=layout.key_mask is not None, device=layout.device,
    )  # fmt: skip
    return BlockMask.from_kv_blocks(
        kv_num[None, None], kv_idx[None, None], full_num[None, None], full_idx[None, None],
        BLOCK_SIZE=bs, mask_mod=window_mask_mod(layout), seq_lengths=(n, n),
    )  # fmt: skip


# ---- propagate ----------------------------------------------------------------------------


def _require_flex() -> None:
    if not flex_available():
        raise RuntimeError(
            f"FlexAttention with BlockMask.from_kv_blocks(seq_lengths=...) is not available in "
            f"torch {torch.__version__} (it needs torch >= 2.6): set "
            "heatformer.graph_ops.window.BACKEND to 'kernels' or 'auto'"
        )


@functools.cache
def _kernel() -> Callable[..., Any]:
    """``torch.compile(flex_attention)``: the fused kernel. (Called without ``torch.compile``,
    ``flex_attention`` runs an unfused reference that forms all ``N^2`` scores.)"""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


#: Block masks of live graphs (a heat series propagates one graph many times), by block size.
_MASKS: weakref.WeakKeyDictionary[WindowGraph, tuple[int, BlockMask]] = weakref.WeakKeyDictionary()


def _graph_block_mask(graph: WindowGraph) -> BlockMask:
    """The block mask of ``graph``, built once per graph (but inside ``torch.compile`` every
    time, as part of the traced program)."""

    def build() -> BlockMask:
        return window_block_mask(graph.layout, block_size=DEFAULT_BLOCK_SIZE)

    if torch.compiler.is_compiling():
        return build()
    found = _MASKS.get(graph)
    if found is None or found[0] != DEFAULT_BLOCK_SIZE:
        found = (DEFAULT_BLOCK_SIZE, build())
        _MASKS[graph] = found
    return found[1]


def _pad_last(t: Tensor, size: int) -> Tensor:
    return t if t.shape[-1] >= size else F.pad(t, [0, size - t.shape[-1]])


def window_propagate(graph: WindowGraph, x: Tensor) -> Tensor:
    """``P x`` of a window graph by FlexAttention (the ``"flex"`` backend of
    :meth:`WindowGraph.propagate <heatformer.graph_ops.WindowGraph.propagate>`).

    Args:
        graph: the window graph (its ``q``, ``k``, scale, window, global tokens, key mask).
        x: ``(..., N, C)`` signal, any ``C`` (zero-padded to 16 channels for CUDA's kernels,
            run in groups of at most 128 channels).

    Returns:
        ``(..., N, C)``; rows without an allowed key are 0.

    Raises:
        NotImplementedError: gradients on the CPU (FlexAttention has no backward there in
            torch 2.13).
        RuntimeError: FlexAttention is not available (:func:`flex_available`).
    """
    _require_flex()
    xf, unfold = fold(graph._check_x(x), graph.batch_shape)  # (Bf, N, C)
    q, k = graph._flat()  # (Bf, R, E), (Bf, N, E)
    q = graph.layout.query_rows(q, 0, graph.num_nodes)  # (Bf, N, E): a view unless q_offset
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or xf.requires_grad)
    if not grad:  # FlexAttention refuses CPU inputs that require grad, even without grad mode
        q, k, xf = q.detach(), k.detach(), xf.detach()
    elif q.device.type == "cpu":
        raise NotImplementedError(
            "WindowGraph.propagate with heatformer.graph_ops.window.BACKEND = 'flex': "
            f"FlexAttention has no backward on the CPU in torch {torch.__version__}, and these "
            "inputs require grad; use BACKEND = 'auto' or 'kernels' on the CPU (or no gradients)"
        )
    n, c = graph.num_nodes, xf.shape[-1]
    if n == 0 or c == 0:
        return unfold(xf.new_zeros(xf.shape))
    cuda = q.device.type == "cuda"
    q4, k4 = q.unsqueeze(1), k.unsqueeze(1)  # (Bf, 1, N, E): one "head" per graph in the batch
    if cuda:
        q4, k4 = _pad_last(q4, _MIN_DIM), _pad_last(k4, _MIN_DIM)
    if torch.compiler.is_compiling():  # inside a compiled program: flex_attention itself
        from torch.nn.attention.flex_attention import flex_attention as kernel
    else:
        kernel = _kernel()
    mask = _graph_block_mask(graph)
    outs = []
    for lo in range(0, c, _MAX_VALUE_DIM):
        xc = xf[..., lo : lo + _MAX_VALUE_DIM].unsqueeze(1)  # (Bf, 1, N, C')
        width = xc.shape[-1]
        if cuda:
            xc = _pad_last(xc, _MIN_DIM)
        y = kernel(q4, k4, xc, block_mask=mask, scale=graph.scale)  # (Bf, 1, N, C')
        outs.append(y[..., :width])
    y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
    return unfold(y.squeeze(1))  # (..., N, C)


def block_mask_bytes(num_nodes: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """Bytes of the four int32 ``(N/B)^2`` index tensors of a window block mask (the partial
    and full lists and their transposes), for planning memory."""
    tiles = math.ceil(num_nodes / block_size)
    return 4 * 4 * tiles * tiles
