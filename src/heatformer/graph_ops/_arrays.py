"""The array helpers every graph kind shares: folding a signal into one batched product, the
diagonal's pseudo-inverses, row normalization, the one masked softmax, the key mask's check.

Not part of the API: the graph kinds (:mod:`~heatformer.graph_ops.protocol`'s derived methods,
:mod:`~heatformer.graph_ops.softmax`, :mod:`~heatformer.graph_ops.sparse`,
:mod:`~heatformer.graph_ops.window`), the builders, :mod:`~heatformer.graph_ops.sparsify` and
:mod:`~heatformer.graph_ops.laplacian` call them on tensors whose shapes they checked at their
own public boundary; nothing here checks a shape again (but :func:`check_key_mask`, which is
that check for a key mask, and :func:`fold`, which refuses a signal that would broadcast the
graph).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from heatformer import checks as V

__all__ = [
    "check_key_mask",
    "fold",
    "masked_softmax",
    "numel",
    "row_normalize",
    "safe_reciprocal",
    "safe_rsqrt",
]


def numel(shape: torch.Size | tuple[int, ...]) -> int:
    """The number of elements of ``shape`` (1 for ``()``), a Python int: the flattened batch
    ``Bf = prod(batch_shape)`` of the graph kinds."""
    return int(math.prod(shape))


def fold(x: Tensor, batch_shape: torch.Size) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
    """Fold a signal into ``(Bf, N, C')`` with ``Bf = prod(batch_shape)``.

    Leading dims of ``x`` in front of the graph's batch dims are moved into the channel dim,
    so one batched product serves them all. Returns the folded tensor and the inverse map.

    Raises:
        ValueError: naming ``x``, leading dims that would broadcast the graph's batch shape.
    """
    m = len(batch_shape)
    lead = x.shape[:-2]  # equal in a series: torch.broadcast_shapes costs ~60 us a call
    out = batch_shape if lead == batch_shape else torch.broadcast_shapes(lead, batch_shape)
    if tuple(out[len(out) - m :]) != tuple(batch_shape):
        raise V.bad_value(
            "x",
            f"leading dims {tuple(x.shape[:-2])} would broadcast the graph's batch shape "
            f"{tuple(batch_shape)} to {tuple(out)}; expand the graph instead",
        )
    extra = out[: len(out) - m]
    n, c = x.shape[-2], x.shape[-1]
    e, bf = numel(extra), numel(batch_shape)
    xf = x.expand(*out, n, c).reshape(e, bf, n, c)  # (E, Bf, N, C)
    xf = xf.permute(1, 2, 0, 3).reshape(bf, n, e * c)  # (Bf, N, E*C)

    def unfold(y: Tensor) -> Tensor:
        y = y.reshape(bf, n, e, c).permute(2, 0, 1, 3)  # (E, Bf, N, C)
        return y.reshape(*out, n, c)

    return xf, unfold


def check_key_mask(key_mask: object, batch_shape: torch.Size, n: int) -> Tensor:
    """A key mask: bool ``(B, N)`` (``True`` = a real key), or with more of the graph's leading
    batch dims, each that of ``batch_shape`` or 1. Checked where a graph or a graph kind is
    given one (its public boundary), never per product.

    Raises:
        TypeError: not a bool tensor.
        ValueError: a shape that does not fit the graph's batch shape and ``N``.
    """
    if not isinstance(key_mask, Tensor) or key_mask.dtype != torch.bool:
        got = getattr(key_mask, "dtype", type(key_mask).__name__)
        raise V.bad_type("key_mask", f"expected a bool tensor (True = a real key), got {got}")
    lead = tuple(key_mask.shape[:-1])
    fits = (
        key_mask.dim() >= 1
        and key_mask.shape[-1] == n
        and len(lead) <= len(batch_shape)
        and all(dim in (1, want) for dim, want in zip(lead, batch_shape))
    )
    if not fits:
        expected = f"({batch_shape[0]}, {n})" if batch_shape else f"({n},)"
        raise V.bad_value(
            "key_mask",
            f"expected shape {expected}, (B, N) for queries of batch shape "
            f"{tuple(batch_shape)} and N = {n} (a leading dim may be 1), got "
            f"{tuple(key_mask.shape)}",
        )
    return key_mask


def safe_reciprocal(d: Tensor) -> Tensor:
    """``1/d`` where ``d > 0`` and 0 elsewhere (the pseudo-inverse of a diagonal)."""
    pos = d > 0
    return torch.where(pos, 1.0 / torch.where(pos, d, torch.ones_like(d)), torch.zeros_like(d))


def safe_rsqrt(d: Tensor) -> Tensor:
    """``1/sqrt(d)`` where ``d > 0`` and 0 elsewhere, with finite gradients at ``d = 0``."""
    pos = d > 0
    return torch.where(pos, torch.where(pos, d, torch.ones_like(d)).rsqrt(), torch.zeros_like(d))


def row_normalize(w: Tensor) -> Tensor:
    """Divide each row (last dim) by its sum; rows summing to 0 stay 0."""
    return w * safe_reciprocal(w.sum(-1, keepdim=True))


def masked_softmax(s: Tensor, allowed: Tensor | None, *, exact_zeros: bool = True) -> Tensor:
    """The one masked-score softmax of every graph kind: the softmax of scores ``s`` over the
    ``allowed`` entries of each row (bool, broadcast with ``s``; None = all).

    With ``exact_zeros`` the others, and every entry of a row with none, are structural zeros
    (0, not NaN; no gradient reaches, or in half precision overflows at, an entry that cannot
    carry weight); without, the plain softmax of the ``-inf``-filled scores (exact when every
    row keeps an allowed entry, and cheaper). A NaN score of an allowed entry stays NaN.
    """
    if allowed is None:
        return torch.softmax(s, dim=-1)
    s = s.masked_fill(~allowed, float("-inf"))
    if not exact_zeros:
        return torch.softmax(s, dim=-1)
    has = allowed.any(-1, keepdim=True)
    return torch.where(allowed, torch.softmax(torch.where(has, s, 0.0), dim=-1), 0.0)
