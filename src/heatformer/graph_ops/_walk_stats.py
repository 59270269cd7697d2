r"""The row statistics of a walk ``P``, one block of rows at a time: what every graph kind's
:meth:`~heatformer.graph_ops.Graph.walk_statistics` reduces its blocks with.

Two forms of a block of rows, each row's entries in any order (each edge once):

- **logits** ``s`` ``(..., M)`` and the allowed entries, ``P = softmax(s)`` over those
  (:func:`logit_rows`): the attention kinds, which never round ``P`` before the logarithm;
- **weights** ``p`` ``(..., M)`` of rows already divided by their sums (:func:`weight_rows`).

The entropy is ``H_i = -sum_j P_ij log P_ij`` (nats, ``0 log 0 = 0``); from logits it is summed
as ``log z + sum_j P_ij (m - s_ij)`` (``m`` the row's largest logit, ``z = sum_j e^{s_ij - m}
>= 1``, ``log z`` as ``log1p`` of the terms below the maximum): non-negative terms only, so a
peaked row keeps its small entropy to relative rounding. A row without entries has entropy 0
and largest logit ``-inf``. Every expression is finite in forward and backward (no
``0 * inf``): the statistics are differentiable.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["entropy_terms", "logit_rows", "weight_rows"]


def logit_rows(
    s: Tensor, allowed: Tensor | None, *, columns: bool = False
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``(entropy, max_logit, column sums)`` of ``P = softmax(s)`` over the allowed entries.

    Six passes over the block (the largest logit, the shift, ``exp``, two sums and, with
    ``columns``, one matrix-vector product), ``P`` never formed: ``P_ij = e^{s_ij - m_i} / z_i``
    enters the column sums as ``(1/z)^T e^{s - m}``. The largest term (``e^0 = 1``) is kept
    apart from ``z - 1``, so that ``log z = log1p(z - 1)`` keeps the other terms of a peaked
    row. A missing edge is filled with ``-finfo.max / 4`` rather than ``-inf`` (its ``e^{.}``
    is 0 and its product with it is 0, not NaN).

    Args:
        s: ``(..., M)`` logits, consumed: modified in place unless a gradient needs it.
        allowed: bool broadcastable to ``s`` (None: every entry is an edge).
        columns: also return ``P.sum(-2)`` (``s`` of at least 2 dims).

    Returns:
        The entropy ``(...)`` (0 on a row without edges), the largest allowed logit ``(...)``
        (``-inf`` on a row without edges) and, with ``columns``, the column sums
        ``(..., M)`` of the rows (else None).
    """
    inplace = not (torch.is_grad_enabled() and s.requires_grad)
    far = -torch.finfo(s.dtype).max / 4  # a missing edge: finite, e^{far - m} = 0
    if allowed is not None:
        s = s.masked_fill_(~allowed, far) if inplace else s.masked_fill(~allowed, far)
    top, idx = s.max(-1, keepdim=True)  # (..., 1): the largest logit and (one of) its entries
    has = top > far / 2  # rows with an edge
    shift = torch.where(has, top, torch.zeros_like(top))
    shifted = s.sub_(shift) if inplace else s - shift  # <= 0 on the edges, about `far` off them
    ex = torch.exp(shifted)  # e^{s - m}: 0 off the edges
    zero = torch.zeros_like(top)
    ex = ex.scatter_(-1, idx, zero) if inplace else ex.scatter(-1, idx, zero)  # its 1 apart
    below = ex.sum(-1, keepdim=True)  # z - 1 (0 on a row without edges)
    inv = has.to(s.dtype) / (below + 1.0)  # 1 / z, 0 on a row without edges
    gap = -torch.einsum("...j,...j->...", ex, shifted).unsqueeze(-1)  # sum_j e^{s_j - m} (m - s_j)
    entropy = (torch.log1p(below) + gap * inv).squeeze(-1)
    top = torch.where(has, top, torch.full_like(top, float("-inf"))).squeeze(-1)
    if not columns:
        return entropy, top, None
    column = (inv.transpose(-1, -2) @ ex).squeeze(-2)  # (..., M): sum_i e^{s_ij - m_i} / z_i
    rows = (*inv.shape[:-2], inv.shape[-2])
    column = column.scatter_add(-1, idx.reshape(rows), inv.reshape(rows))  # the maxima's 1 / z
    return entropy, top, column


def entropy_terms(p: Tensor) -> Tensor:
    """``-p log p`` elementwise, 0 where ``p == 0`` (finite gradients there too)."""
    log_p = torch.log(torch.where(p > 0, p, torch.ones_like(p)))  # 0 where p == 0
    return -(p * log_p)


def weight_rows(p: Tensor) -> Tensor:
    """The entropy ``(...)`` of rows ``p`` ``(..., M)`` that sum to 1 (or 0)."""
    return entropy_terms(p).sum(-1)
