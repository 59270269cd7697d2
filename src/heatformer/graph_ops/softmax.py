"""The implicit attention graph ``P = softmax(q k^T * scale)``: never ``N x N``."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from heatformer import checks as V
from heatformer._torch_compat import func_transforming, sdpa
from heatformer.graph_ops._arrays import fold, masked_softmax, numel
from heatformer.graph_ops._precision import accumulation_dtype, attention_scores
from heatformer.graph_ops._walk_stats import logit_rows
from heatformer.graph_ops.protocol import UNIFORM_DIM, Graph

__all__ = ["SoftmaxGraph"]


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
        row_block: query rows per block in chunked methods (default: slabs of about
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
        row_block: int | None = None,
    ) -> None:
        q = V.check_float_tensor("q", q, min_dim=2)
        k = V.check_float_tensor("k", k, min_dim=2)
        if q.dtype != k.dtype:
            raise V.bad_type("k", f"expected the dtype of q ({q.dtype}), got {k.dtype}")
        if q.shape[-1] != k.shape[-1]:
            raise V.bad_value(
                "k", f"expected the feature dim of q ({q.shape[-1]}), got shape {tuple(k.shape)}"
            )
        if q.shape[-2] != k.shape[-2]:
            raise V.bad_value(
                "k",
                f"a SoftmaxGraph is square; expected N = {q.shape[-2]} keys (as many as "
                f"queries), got shape {tuple(k.shape)}",
            )
        try:
            batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
        except RuntimeError:
            raise V.bad_value(
                "k",
                f"batch dims {tuple(k.shape[:-2])} do not broadcast with q's {tuple(q.shape[:-2])}",
            ) from None
        if scale is not None:
            if isinstance(scale, bool) or not isinstance(scale, (int, float)):
                raise V.bad_type("scale", f"expected a finite float or None, got {scale!r}")
            if not math.isfinite(scale):
                raise V.bad_value("scale", f"expected a finite float or None, got {scale!r}")
        if not isinstance(causal, bool):
            raise V.bad_type("causal", f"expected a bool, got {type(causal).__name__}")
        n = int(q.shape[-2])
        if mask is not None:
            V.check_mask(mask, batch, n)
        self.q = self._tensor = q.expand(*batch, *q.shape[-2:])
        self.k = k.expand(*batch, *k.shape[-2:])
        self.scale = float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1])
        self.mask = mask
        self.causal = causal
        self.row_block = row_block
        self._row_has_edge: Tensor | None = None
        self.rows_nonempty = mask is None  # a causal row keeps its diagonal
        self._flat_qk: dict[bool, tuple[Tensor, Tensor]] = {}

    def _default_row_block(self) -> int | None:
        return self.row_block

    def _kept_row_entries(self, k_top: int) -> int:
        # the kept weights gather k_top keys of E features per query (see _kept_weights), and
        # their backward holds about 3 more such blocks (the keys' gradient and the products)
        return max(self.num_nodes, 4 * k_top * int(self.q.shape[-1]))

    def materialized_bytes(self) -> int:
        n = self.num_nodes
        return numel(self.batch_shape) * n * n * self.q.element_size()

    def materialized(self) -> Graph:
        """``DenseGraph(self.to_dense())``, keeping what is known of the rows (stochastic,
        non-empty) so that the Laplacians skip the work they would do for unknown weights."""
        from heatformer.graph_ops.dense import DenseGraph

        dense = object.__new__(DenseGraph)  # trusted: NaN in, NaN out
        dense.weight = dense._tensor = self.to_dense()
        dense.row_stochastic = True
        dense.rows_nonempty = self.rows_nonempty
        return dense

    def to(self, dtype: torch.dtype) -> SoftmaxGraph:
        if dtype == self.dtype:
            return self
        return SoftmaxGraph(
            self.q.to(dtype), self.k.to(dtype), scale=self.scale, mask=self.mask,
            causal=self.causal, row_block=self.row_block,
        )  # fmt: skip

    # ---- slabs -----------------------------------------------------------------------------

    def _flat(self) -> tuple[Tensor, Tensor]:
        """``q``, ``k`` as ``(Bf, N, E)``, made once per graph and grad mode.

        A batch of heads cut from one projection is not contiguous, so the reshape copies;
        every block (and every block's recompute in backward) reads the same copy instead of
        one each (measured: 16 saved copies of ``q`` and ``k`` per top-k layer at N = 2048).
        A copy made without gradients carries none, hence one per grad mode.
        """
        grad = torch.is_grad_enabled()
        flat = self._flat_qk.get(grad)
        if flat is None:
            n, e = self.q.shape[-2:]
            bf = numel(self.batch_shape)  # not -1: N may be 0
            flat = self.q.reshape(bf, n, e), self.k.reshape(bf, n, e)  # (Bf, N, E) each
            self._flat_qk[grad] = flat
        return flat

    def _allowed_rows(self, start: int, stop: int, keys: int | None = None) -> Tensor | None:
        """Bool ``(Bf or 1, rows, W)`` of allowed edges in rows ``start:stop`` to the first
        ``W = keys`` keys (default all ``N``); None = all."""
        n = self.num_nodes
        w = n if keys is None else keys
        allowed: Tensor | None = None
        if self.mask is not None:
            m = self.mask.expand(*self.batch_shape, n, n)[..., start:stop, :w]
            allowed = m.reshape(numel(self.batch_shape), stop - start, w)  # (Bf, rows, W)
        if self.causal:
            i = torch.arange(start, stop, device=self.device).unsqueeze(-1)
            tri = (torch.arange(w, device=self.device) <= i).unsqueeze(0)  # (1, rows, W)
            allowed = tri if allowed is None else allowed & tri
        return allowed

    def _score_rows(self, start: int, stop: int, k_top: int) -> Tensor:
        # causal: the rows' allowed keys are the first `stop`, and a row with fewer than k_top
        # of them completes its k_top with the lowest-index disallowed keys (ties go to the
        # lower index), all among the first k_top: keys from max(stop, k_top) on are never
        # chosen, and the slab leaves them out (half the work of a causal selection)
        width = min(self.num_nodes, max(stop, k_top)) if self.causal else self.num_nodes
        q, k = self._flat()
        s = attention_scores(q[:, start:stop], k[:, :width], self.scale)  # (Bf, rows, W)
        allowed = self._allowed_rows(start, stop, width)
        if allowed is not None:  # in place: the selection holds one score slab, not two
            s.masked_fill_(~allowed, float("-inf"))
        return s

    def weight_rows(self, start: int, stop: int) -> Tensor:
        return self._weight_rows_from(*self._flat(), start, stop)

    def _weight_rows_from(self, q: Tensor, k: Tensor, start: int, stop: int) -> Tensor:
        """Rows ``start:stop`` of ``P`` from ``q``, ``k`` ``(Bf, N, E)``: ``(Bf, rows, N)``,
        scores and softmax in float32 for half inputs, rounded to the graph's dtype once."""
        s = attention_scores(q[:, start:stop], k, self.scale)  # (Bf, rows, N)
        return self._masked_softmax(s, self._allowed_rows(start, stop)).to(q.dtype)

    def _masked_softmax(
        self, s: Tensor, allowed: Tensor | None, *, cut_gradient: bool = False
    ) -> Tensor:
        """:func:`~heatformer.graph_ops._arrays.masked_softmax` of every slab (dense rows,
        transpose products, top-k). Only a key mask can leave a row without an allowed key (a
        causal row keeps its diagonal), so without one (and without ``cut_gradient``) the
        plain softmax of the ``-inf``-filled scores is exact."""
        return masked_softmax(s, allowed, exact_zeros=self.mask is not None or cut_gradient)

    def _kept_weights(self, idx: Tensor, blocks: list[tuple[int, int]]) -> Tensor:
        """Weights of the kept keys ``idx`` ``(Bf, N, k)``: the softmax over each row's kept
        scores, with gradients to ``q`` and ``k`` (see :class:`_KeptScores`); ``(Bf, N, k)``."""
        q, k = self._flat()
        if func_transforming():  # autograd through the gather (see _KeptScores)
            bf = torch.arange(k.shape[0], device=k.device)[:, None, None]
            s = attention_scores(q[:, :, None], k[bf, idx], self.scale).squeeze(-2)
        else:
            s = _KeptScores.apply(q, k, idx, self.scale, blocks)  # (Bf, N, kk), f32 for half
        allowed = self._kept_allowed(idx, blocks)
        # a kept entry that is not allowed (a row with fewer than k keys) stays a structural
        # zero: no gradient flows through it
        p = self._masked_softmax(s, allowed, cut_gradient=True).to(q.dtype)
        # a kept allowed key keeps a positive weight where its softmax underflows (at least
        # the dtype's smallest subnormal, below its rounding), so that the positive entries
        # of a top-k graph are its edges in every dtype (what mean pooling reads)
        info = torch.finfo(p.dtype)
        least = p.clamp_min(info.tiny * info.eps)
        return least if allowed is None else torch.where(allowed, least, p)

    def _kept_allowed(self, idx: Tensor, blocks: list[tuple[int, int]]) -> Tensor | None:
        """Whether each kept entry ``idx`` ``(Bf, N, k)`` is an allowed edge; None = all."""
        if self.mask is None and not self.causal:
            return None
        if self.mask is None:  # causal: key index <= query index
            rows = torch.arange(self.num_nodes, device=idx.device, dtype=idx.dtype)
            return idx <= rows[:, None]  # (Bf, N, kk)
        bf = idx.shape[0]
        parts = []
        for start, stop in blocks:
            allowed = self._allowed_rows(start, stop)
            assert allowed is not None  # a mask is given
            parts.append(allowed.expand(bf, -1, -1).gather(-1, idx[:, start:stop].long()))
        return torch.cat(parts, dim=1)  # (Bf, N, kk)

    # ---- protocol --------------------------------------------------------------------------

    def propagate(self, x: Tensor) -> Tensor:
        x = self._check_x(x)
        if self.mask is None:
            return _sdpa_4d(self.q, self.k, x, is_causal=self.causal, scale=self.scale)
        if not self.causal:
            # fully masked rows attend everywhere inside SDPA, then are zeroed: no NaN anywhere
            has = self.mask.any(-1, keepdim=True)  # broadcast shape of mask, last dim 1
            y = _sdpa_4d(self.q, self.k, x, attn_mask=self.mask | ~has, scale=self.scale)
            return y * has
        xf, unfold = fold(x, self.batch_shape)
        q, k = self._flat()
        outs = []
        for s, e in self._blocks(None):
            allowed = self._allowed_mask_rows(s, e)
            has = allowed.any(-1, keepdim=True)  # (Bf, rows, 1)
            y = sdpa(q[:, s:e], k, xf, attn_mask=allowed | ~has, scale=self.scale)
            outs.append(y * has)
        return unfold(torch.cat(outs, dim=1))

    def _allowed_mask_rows(self, start: int, stop: int) -> Tensor:
        allowed = self._allowed_rows(start, stop)
        if allowed is None:
            return torch.ones(1, stop - start, self.num_nodes, dtype=torch.bool, device=self.device)
        return allowed

    def propagate_transpose(self, x: Tensor) -> Tensor:
        x = self._check_x(x)
        xf, unfold = fold(x, self.batch_shape)
        q, k = self._flat()

        def block(s: int, e: int) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
            def f(q: Tensor, k: Tensor, xb: Tensor) -> Tensor:
                w = self._weight_rows_from(q, k, s, e)  # (Bf, rows, N)
                return w.transpose(-1, -2) @ xb  # (Bf, N, C')

            return f

        grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or xf.requires_grad)
        out = torch.zeros_like(xf, dtype=accumulation_dtype(xf.dtype))  # sums of blocks: float32
        for s, e in self._blocks(None):
            fn = block(s, e)
            xb = xf[:, s:e]
            out = out + (checkpoint(fn, q, k, xb, use_reentrant=False) if grad else fn(q, k, xb))
        return unfold(out.to(xf.dtype))

    def uniform(self, x: Tensor) -> Tensor:
        """``U x`` (see :meth:`Graph.uniform <heatformer.graph_ops.Graph.uniform>`): the
        attention of constant queries and keys under the same mask and causal order, where
        every allowed score is 0 and every row uniform; one fused product, as
        :meth:`propagate`. The constant queries and keys have ``x``'s width, as in
        :meth:`propagate`: fused CPU kernels need equal widths, and with other widths SDPA's
        reference path kept the ``(N, N)`` weights for backward (measured: ``N`` floats per
        query and head, where this keeps ``C``)."""
        width = int(x.shape[-1]) or UNIFORM_DIM
        z = self.q.new_zeros(*self.batch_shape, self.num_nodes, width)  # (..., N, C)
        uniform = SoftmaxGraph(z, z, mask=self.mask, causal=self.causal, row_block=self.row_block)
        return uniform.propagate(x)

    def row_has_edge(self) -> Tensor:
        """Bool ``(..., N)``: which rows have at least one allowed key."""
        if self._row_has_edge is None:
            shape = (*self.batch_shape, self.num_nodes)
            if self.mask is None:
                has = torch.ones(shape, dtype=torch.bool, device=self.device)
            elif not self.causal:
                has = self.mask.any(-1).expand(shape)
            else:
                bf = numel(self.batch_shape)
                blocks = [
                    self._allowed_mask_rows(s, e).any(-1).expand(bf, -1)
                    for s, e in self._blocks(None)
                ]
                has = torch.cat(blocks, dim=-1).reshape(shape)
            self._row_has_edge = has
        return self._row_has_edge

    def out_degree(self) -> Tensor:
        return self.row_has_edge().to(self.dtype)

    def walk_statistics(self, row_block: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`Graph.walk_statistics <heatformer.graph_ops.Graph.walk_statistics>` from
        blocks of rows of the logits ``q k^T * scale`` (masked), ``(Bf, rows, N)`` each: one
        pass, ``O(N^2 E)`` work and ``O(rows N)`` memory; ``P`` is never stored (with
        gradients, each block is recomputed in backward); a causal block reads the keys up to
        its last row only (half the work). The largest logit is the scaled score itself,
        before any softmax shift."""
        q, k = self._flat()
        n, bf = self.num_nodes, numel(self.batch_shape)

        def block(start: int, stop: int) -> Callable[[Tensor, Tensor], tuple[Tensor, ...]]:
            width = stop if self.causal else n  # causal rows read no key past their own

            def f(q: Tensor, k: Tensor) -> tuple[Tensor, ...]:
                s = attention_scores(q[:, start:stop], k[:, :width], self.scale)  # (Bf, rows, W)
                allowed = self._allowed_rows(start, stop, width)
                entropy, top, column = logit_rows(s, allowed, columns=True)
                assert column is not None
                return F.pad(column, (0, n - width)), entropy, top  # (Bf, N), (Bf, rows) x 2

            return f

        grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
        acc = accumulation_dtype(self.dtype)
        column = torch.zeros(bf, n, dtype=acc, device=self.device)  # (Bf, N)
        entropy, top = [], []
        for start, stop in self._blocks(row_block):
            fn = block(start, stop)
            c, h, m = checkpoint(fn, q, k, use_reentrant=False) if grad else fn(q, k)
            column = column + c
            entropy.append(h)
            top.append(m)
        shape = (*self.batch_shape, n)
        return (
            column.reshape(shape),
            torch.cat(entropy, dim=1).reshape(shape),
            torch.cat(top, dim=1).reshape(shape),
        )


def _sdpa_4d(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    """:func:`~heatformer._torch_compat.sdpa`; inputs with more than two batch dims (the maps
    of differential heads, ``(B, H, 2, N, d)``) in the form SDPA's fused kernels take: the
    batch dims folded into two, ``(*batch, L, E) -> (prod(batch[:-1]), batch[-1], L, E)``,
    and values as wide as the queries (the narrower side padded with zeros, which changes no
    score and no output; the scale stays that of the queries' own width).

    Otherwise SDPA runs its reference path, which forms and keeps the ``N x N`` weights:
    measured on the CPU at ``N = 1024``, forward and backward, 4.7x the time for 5-D inputs
    and 4.7x again for values twice as wide as the queries (a differential head's). Inputs of
    at most 4 dims go to SDPA as they are.
    """
    if max(q.dim(), k.dim(), v.dim()) <= 4 or func_transforming():
        return sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)
    e, ev = int(q.shape[-1]), int(v.shape[-1])
    scale = 1.0 / math.sqrt(e) if scale is None else scale
    if e < ev:  # zero channels: the same scores
        q, k = (torch.nn.functional.pad(t, (0, ev - e)) for t in (q, k))
    elif ev < e:
        v = torch.nn.functional.pad(v, (0, e - ev))
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    folded = math.prod(batch[:-1])  # explicit, not -1: a tensor of N = 0 has no elements

    def flat(t: Tensor) -> Tensor:  # (*batch, ., .) -> (Bf', batch[-1], ., .)
        return t.expand(*batch, *t.shape[-2:]).reshape(folded, batch[-1], *t.shape[-2:])

    mask = None if attn_mask is None else flat(attn_mask)
    y = sdpa(flat(q), flat(k), flat(v), attn_mask=mask, is_causal=is_causal, scale=scale)
    return y.reshape(*batch, *y.shape[-2:])[..., :ev]  # (*batch, L, Ev)


class _KeptScores(torch.autograd.Function):
    r"""``s[b, i, j] = scale * <q[b, i], k[b, idx[b, i, j]]>``, the logits of the kept keys.

    Computed in the query blocks of the selection, each gathering its ``(Bf, rows, k, E)``
    keys once; backward saves only ``q``, ``k`` and ``idx`` and gathers again block by block,
    adding each block's key gradient into one ``(Bf, N, E)`` buffer. Autograd through the
    gather would instead keep nothing but give every block full-size ``(Bf, N, E)`` gradients
    of ``q`` and ``k`` to sum: time and memory traffic quadratic in ``N``.

    .. math::

        \frac{\partial L}{\partial q_i} = \text{scale} \sum_j g_{ij}\, k_{idx_{ij}}, \qquad
        \frac{\partial L}{\partial k_m} = \text{scale} \sum_{(i, j):\, idx_{ij} = m} g_{ij}\, q_i

    Inside a :mod:`torch.func` transform (whose wrapped tensors the loop's buffers cannot
    take) the graph takes autograd through the gather instead, keeping its ``(Bf, N, k, E)``
    keys.

    Shapes: ``q``, ``k`` ``(Bf, N, E)``; ``idx`` ``(Bf, N, k)`` integer; out ``(Bf, N, k)``
    in :func:`~heatformer.graph_ops._precision.accumulation_dtype` (float32 for half inputs,
    as :func:`~heatformer.graph_ops._precision.attention_scores`).
    """

    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, idx: Tensor, scale: float, blocks: list[tuple[int, int]]
    ) -> Tensor:
        ctx.save_for_backward(q, k, idx)
        ctx.scale, ctx.blocks = scale, blocks
        out = q.new_empty(idx.shape, dtype=accumulation_dtype(q.dtype))  # (Bf, N, kk)
        bf = torch.arange(k.shape[0], device=k.device)[:, None, None]
        for start, stop in blocks:
            k_sel = k[bf, idx[:, start:stop]]  # (Bf, rows, kk, E)
            s = attention_scores(q[:, start:stop, None], k_sel, scale)  # (Bf, rows, 1, kk)
            out[:, start:stop] = s.squeeze(-2)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k, idx = ctx.saved_tensors
        work = grad.dtype
        bf_n, n, e = k.shape
        grad_q = torch.zeros_like(q, dtype=work) if ctx.needs_input_grad[0] else None
        grad_k = k.new_zeros(bf_n * n, e, dtype=work) if ctx.needs_input_grad[1] else None
        bf = torch.arange(bf_n, device=k.device)[:, None, None]
        base = bf * n  # (Bf, 1, 1): the first row of each graph in the flat (Bf * N, E) buffer
        for start, stop in ctx.blocks:
            g = grad[:, start:stop] * ctx.scale  # (Bf, rows, kk)
            if grad_q is not None:
                k_sel = k[bf, idx[:, start:stop]].to(work)  # (Bf, rows, kk, E)
                grad_q[:, start:stop] = (g.unsqueeze(-2) @ k_sel).squeeze(-2)  # (Bf, rows, E)
            if grad_k is not None:
                contrib = g.unsqueeze(-1) * q[:, start:stop, None, :].to(work)  # (Bf, rows, kk, E)
                target = (idx[:, start:stop].long() + base).reshape(-1)  # (Bf * rows * kk,)
                grad_k.index_put_((target,), contrib.reshape(-1, e), accumulate=True)
        return (
            None if grad_q is None else grad_q.to(q.dtype),
            None if grad_k is None else grad_k.view_as(k).to(k.dtype),
            None,
            None,
            None,
        )
