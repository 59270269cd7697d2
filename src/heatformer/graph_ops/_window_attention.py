r"""``P x`` on a window graph's slabs, with a backward that recomputes instead of storing.

:meth:`WindowGraph.propagate <heatformer.graph_ops.WindowGraph.propagate>` multiplies by the
row-softmax ``P`` of a sliding-window graph. Autograd through a plain implementation would
keep every block's key and value slab (``(b + w) / b`` copies of ``k`` and ``x``, about two
each), the ``(b, g + L)`` weights or a float mask of that size: five to six tensors the size of
``x`` per call, and a heat series calls it once per term. :class:`WindowAttention` keeps its
inputs ``q``, ``k``, ``x`` (tensors the caller holds anyway), and rebuilds the slabs of each run
of blocks in the backward. On CPU, where the values are as wide as the keys, both passes are
PyTorch's fused flash-attention kernels per run of blocks, and the output and one log-sum-exp
per row are kept too (in a series the output is the next term's input, so nothing new); else
the weights are recomputed from plain products, as flash attention does:

.. math::

    P = \mathrm{softmax}(S),\quad
    \mathrm{d}x_{\text{slab}} = P^\top \mathrm{d}y,\quad
    \mathrm{d}S = P \odot (\mathrm{d}y\, x_{\text{slab}}^\top
        - \mathrm{rowsum}(P \odot \mathrm{d}y\, x_{\text{slab}}^\top)),

``dq = s dS k_slab`` and ``dk_slab = s dS^T q`` (``s`` the scale), the slab gradients folded back
onto positions. Memory is ``O(chunk)`` beyond the inputs and outputs (and one padded copy of
``k`` and ``x`` during a call). A row with no allowed key gives 0. On the generic path,
half-precision inputs are computed in float32 per chunk (the result is cast back), as the
library's other softmax paths do.

Measured (``benchmarks/bench_long.py``, window(128) layer, H = 4, Dh = 64, N = 262144, fwd +
bwd): peak 3.47 GB for Laplacian heads and 6.23 GB for heat heads, against 4.02 and 7.64 GB
through autograd of the masked SDPA call; the same speed (0.94x-1.05x for ``propagate``
forward + backward at N = 65536).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from heatformer.graph_ops.window import WindowGraph

__all__ = ["WindowAttention", "window_attention"]

_HALF = (torch.float16, torch.bfloat16)


def _work(t: Tensor) -> Tensor:
    return t.float() if t.dtype in _HALF else t


class _Slabs:
    """The padded ``q`` blocks, ``k`` and ``x`` of one call, made once and viewed per run of
    blocks (in the working dtype: float32 for half-precision inputs)."""

    def __init__(self, graph: WindowGraph, q: Tensor, k: Tensor, x: Tensor, work: bool) -> None:
        self.graph = graph
        self.q, self.k, self.x = (_work(q), _work(k), _work(x)) if work else (q, k, x)
        self.q_blocks = graph._blocks_of(self.q)  # (Bf, nb, b, E)
        self.k_pad = graph._pad_for_slabs(self.k)  # (Bf, P, E)
        self.x_pad = graph._pad_for_slabs(self.x)  # (Bf, P, C)

    def keys(self, blocks: slice) -> Tensor:
        """``(Bf, nb', g + L, E)``, contiguous (a product with the overlapping view would copy
        each block apart)."""
        return self.graph._keys(self.k, blocks, self.k_pad).contiguous()

    def values(self, blocks: slice) -> Tensor:
        """``(Bf, nb', g + L, C)``, contiguous."""
        return self.graph._keys(self.x, blocks, self.x_pad).contiguous()

    def weights(self, blocks: slice, keys: Tensor) -> Tensor:
        """``P`` of the blocks, ``(Bf, nb', b, g + L)`` (rows without keys: 0), from their
        :meth:`keys`."""
        disallowed, empty = self.graph._allowed_slabs()
        s = self.q_blocks[:, blocks] @ keys.transpose(-1, -2)  # (Bf, nb', b, g + L)
        s = s.mul_(self.graph.scale).masked_fill_(disallowed[:, blocks], float("-inf"))
        if empty is None:
            return torch.softmax(s, dim=-1)
        rows = empty[:, blocks]
        return torch.softmax(s.masked_fill_(rows, 0.0), dim=-1).masked_fill_(rows, 0.0)


def _fold_add(out: Tensor, parts: Tensor, first_block: int, graph: WindowGraph) -> None:
    """Add slab contributions ``parts`` ``(Bf, nb', L, C)`` of blocks ``first_block ...`` into
    ``out`` ``(Bf, P', C)`` (``P'`` a multiple of ``b``), whose row ``m b + l`` is slab position
    ``l`` of block ``m``: slab piece ``j`` (positions ``j b ... j b + b - 1``) of every block
    lands on block ``m + j``, so ``ceil(L / b)`` strided additions do it."""
    bf, nb, slab, c = parts.shape
    b = graph.row_block
    by_block = out.view(bf, -1, b, c)  # (Bf, P' / b, b, C)
    for j in range(-(-slab // b)):
        piece = parts[:, :, j * b : (j + 1) * b]  # (Bf, nb', <= b, C)
        start = first_block + j
        by_block[:, start : start + nb, : piece.shape[2]] += piece


#: Use the fused flash-attention kernels of PyTorch's CPU backend where they apply (CPU tensors,
#: values of the key width): the same algorithm, each run of blocks in one kernel call. False
#: (or another device) takes the generic recomputing path of plain tensor products.
FUSED_CPU = True


def _fused(q: Tensor, x: Tensor) -> bool:
    return FUSED_CPU and q.device.type == "cpu" and x.shape[-1] == q.shape[-1]


def _additive(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """A bool mask as the additive float mask the fused kernels take: 0 or ``-inf``."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, float("-inf")
    )


class WindowAttention(torch.autograd.Function):
    """``y = P x`` over a window graph's query blocks; see the module docstring."""

    @staticmethod
    def forward(ctx: Any, graph: WindowGraph, q: Tensor, k: Tensor, x: Tensor) -> Tensor:
        """``q``, ``k`` ``(Bf, N, E)``, ``x`` ``(Bf, N, C)`` -> ``(Bf, nb, b, C)``."""
        allowed, empty = graph._sdpa_mask()
        q_blocks = graph._blocks_of(q)  # (Bf, nb, b, E)
        k_pad, x_pad = graph._pad_for_slabs(k), graph._pad_for_slabs(x)
        fused = _fused(q, x)
        ys, lses = [], []
        for blocks in graph._chunks(graph.num_global + graph._slab()):
            qb, kb = q_blocks[:, blocks], graph._keys(k, blocks, k_pad)
            xb = graph._keys(x, blocks, x_pad)
            if fused:  # (Bf, nb', b, C) and the log-sum-exp of each row (Bf, nb', b)
                y, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    qb, kb, xb, attn_mask=_additive(allowed[:, blocks], q.dtype), scale=graph.scale
                )
                lses.append(lse)
            else:
                y = F.scaled_dot_product_attention(
                    qb, kb, xb, attn_mask=allowed[:, blocks], scale=graph.scale
                )
            ys.append(y if empty is None else y.masked_fill_(empty[:, blocks], 0.0))
        out = torch.cat(ys, dim=1)
        ctx.graph, ctx.fused = graph, fused
        if fused:  # the kernel's backward needs the output (the next term's input in a series)
            ctx.save_for_backward(q, k, x, out, torch.cat(lses, dim=1))
        else:
            ctx.save_for_backward(q, k, x)
        return out

    @staticmethod
    def backward(ctx: Any, dy: Tensor) -> tuple[None, Tensor | None, Tensor | None, Tensor | None]:
        graph: WindowGraph = ctx.graph
        saved = ctx.saved_tensors  # unpacked once (a checkpointed caller allows no more)
        q, k, x = saved[:3]
        slabs = _Slabs(graph, q, k, x, work=not ctx.fused)  # the fused kernels take half too
        bf, n = q.shape[0], graph.num_nodes
        g, before = graph.num_global, graph._before()
        b = graph.row_block
        rows = (graph._num_blocks() - 1 + -(-graph._slab() // b)) * b  # >= P, a multiple of b
        acc = torch.float32 if q.dtype in _HALF else q.dtype  # sums of blocks in float32
        dk_pad = q.new_zeros(bf, rows, k.shape[-1], dtype=acc)
        dx_pad = q.new_zeros(bf, rows, x.shape[-1], dtype=acc)
        nb = graph._num_blocks()
        dq = q.new_empty(bf, nb, b, q.shape[-1], dtype=acc)  # (Bf, nb, b, E)
        allowed, empty = graph._sdpa_mask()
        for blocks in graph._chunks(g + graph._slab()):
            kb = slabs.keys(blocks)  # (Bf, nb', g + L, E)
            dyb = dy[:, blocks]  # (Bf, nb', b, C)
            if empty is not None:  # rows set to 0 in the forward pass pass no gradient
                dyb = dyb.masked_fill(empty[:, blocks], 0.0)
            if ctx.fused:
                out, lse = saved[3:]
                dqb, dkb, dxb = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                    dyb.contiguous(), slabs.q_blocks[:, blocks].contiguous(), kb,
                    slabs.values(blocks), out[:, blocks].contiguous(), lse[:, blocks].contiguous(),
                    0.0, False, attn_mask=_additive(allowed[:, blocks], q.dtype),
                    scale=graph.scale,
                )  # fmt: skip
            else:
                p = slabs.weights(blocks, kb)  # (Bf, nb', b, g + L), recomputed
                dyb = _work(dyb)
                dp = dyb @ slabs.values(blocks).transpose(-1, -2)  # (Bf, nb', b, g + L)
                ds = torch.ops.aten._softmax_backward_data(dp, p, -1, p.dtype)  # P (dp - rowsum)
                dqb = (ds @ kb).mul_(graph.scale)  # (Bf, nb', b, E)
                dkb = (ds.transpose(-1, -2) @ slabs.q_blocks[:, blocks]).mul_(graph.scale)
                dxb = p.transpose(-1, -2) @ dyb  # (Bf, nb', g + L, C)
            dq[:, blocks] = dqb
            start = blocks.start or 0
            _fold_add(dk_pad, dkb[:, :, g:], start, graph)
            _fold_add(dx_pad, dxb[:, :, g:], start, graph)
            if g:  # the global keys: the first g positions, in every block's keys
                dk_pad[:, before : before + g] += dkb[:, :, :g].sum(1)
                dx_pad[:, before : before + g] += dxb[:, :, :g].sum(1)
        dq_rows = dq.view(bf, nb * b, -1)[:, :n]
        dk = dk_pad[:, before : before + n]
        dx = dx_pad[:, before : before + n]
        return None, dq_rows.to(q.dtype), dk.to(k.dtype), dx.to(x.dtype)


def window_attention(graph: WindowGraph, q: Tensor, k: Tensor, x: Tensor) -> Tensor:
    """``P x`` of ``graph`` by :class:`WindowAttention`: ``(Bf, N, ...)`` -> ``(Bf, nb, b, C)``."""
    out: Tensor = WindowAttention.apply(graph, q, k, x)
    return out
