r"""Subsets of a layer's heads, as :class:`~heatformer.models.routing.HeadRouter` handles them:
their index, their queries, keys and masks (the maps of heads that read several attention
maps among them), their operators' parameter shapes, ``P v`` by one SDPA call, and their
outputs joined back in head order. Shapes: ``(B, H, N, Dh)`` for ``q``, ``k``, ``v``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor

from heatformer import checks
from heatformer._torch_compat import sdpa
from heatformer.graph_ops import DiffusionOperator, split_maps
from heatformer.models.masks import AttentionMask

__all__ = [
    "cat_heads",
    "check_maps",
    "coefficients",
    "head_index",
    "heads_of",
    "map_index",
    "map_scale",
    "maps_of",
    "mask_of_maps",
    "rescaled",
    "sdpa_heads",
    "shape_parameters",
]


def head_index(heads: Sequence[int]) -> slice | Tensor:
    """A slice when the heads are contiguous (a view, no copy), else an index tensor.

    Example:
        >>> head_index([2, 3]), head_index([0, 2])
        (slice(2, 4, None), tensor([0, 2]))
    """
    if list(heads) == list(range(heads[0], heads[0] + len(heads))):
        return slice(heads[0], heads[0] + len(heads))
    return torch.tensor(list(heads), dtype=torch.long)


def heads_of(t: Tensor, index: slice | Tensor) -> Tensor:
    """``t[:, index]``, or ``t`` when it takes every head (torch 2.5 copies the gradient of a
    slice of a whole dim)."""
    if isinstance(index, slice) and index.start == 0 and index.stop == t.shape[1]:
        return t
    return t[:, index]


def map_index(heads: Sequence[int], maps: int) -> slice | Tensor:
    """The index of ``heads`` with each head repeated ``maps`` times (its maps, flattened into
    the head dim): :func:`head_index` of the heads themselves for one map."""
    if maps == 1:
        return head_index(heads)
    return torch.tensor([h for h in heads for _ in range(maps)], dtype=torch.long)


def mask_of_maps(mask: AttentionMask) -> AttentionMask:
    """A mask for a graph whose heads have their maps as one more batch dim ``(B, h, maps)``:
    a dense mask ``(B or 1, h or 1, Nq, T)`` broadcast over the maps; any other as it is."""
    if mask.dense is None:
        return mask
    return replace(mask, dense=mask.dense.unsqueeze(-3))  # (B or 1, h or 1, 1, Nq, T)


def maps_of(
    q: Tensor, k: Tensor, mask: AttentionMask, maps: int
) -> tuple[Tensor, Tensor, AttentionMask]:
    """The queries, keys and mask of heads of ``maps`` maps each: the maps from the channels
    as one more batch dim, ``(B, h, N, Dh) -> (B, h, maps, N, Dh / maps)``
    (:func:`~heatformer.graph_ops.split_maps`), the mask broadcast over them; as given for one
    map."""
    if maps == 1:
        return q, k, mask
    return split_maps(q, maps, name="q"), split_maps(k, maps, name="k"), mask_of_maps(mask)


def map_scale(scale: float | None, maps: int) -> float | None:
    """The logit scale of a map of ``Dh / maps`` channels: ``scale * sqrt(maps)``, which is
    ``1 / sqrt(Dh / maps)`` at the default ``1 / sqrt(Dh)`` (None: the graph kind's default,
    ``1 / sqrt`` of the map's width)."""
    return scale if scale is None or maps == 1 else scale * math.sqrt(maps)


def check_maps(groups: Sequence[tuple[DiffusionOperator, list[int]]], head_dim: int | None) -> None:
    """Refuse, naming ``heads``, an operator whose maps do not divide the head width."""
    for op, _ in groups:
        if head_dim is not None and head_dim % op.maps:
            raise checks.bad_value(
                "heads",
                f"expected a head width divisible into the {op.maps} maps of {op.name!r} heads "
                f"(each map takes Dh / {op.maps} query and key channels), got head_dim = "
                f"{head_dim}",
            )


def shape_parameters(
    groups: Sequence[tuple[DiffusionOperator, list[int]]], head_dim: int | None
) -> None:
    """Each operator's parameters shaped for its heads (``len(heads)`` of width ``head_dim``),
    before any optimizer sees them; without ``head_dim``, operators that need it are refused."""
    for op, heads in groups:
        if head_dim is not None:
            op.shape_parameters(len(heads), head_dim)
        elif op.needs_shape:
            raise checks.bad_value(
                "heads",
                f"{op.name!r} heads have a parameter per head of the head width, and this "
                "layer does not give its head width (head_dim); build the heads with it",
            )


def sdpa_heads(
    q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, scale: float | None, dropout: float
) -> tuple[Tensor, Tensor | None]:
    """``P v`` by one SDPA call (as host libraries make it), and the rows with an edge
    ``(B or 1, 1 or H, Nq, 1)`` (None: every row)."""
    n_q, n_k = int(q.shape[-2]), int(k.shape[-2])
    plain = mask.dense is None and mask.key_mask is None
    if plain and mask.causal and n_q == n_k and mask.q_offset == mask.kv_offset:
        pv = sdpa(q, k, v, dropout_p=dropout, is_causal=True, scale=scale)
        return pv, None
    allowed = mask.allowed(n_q, n_k, q.device)
    if allowed is None:
        return sdpa(q, k, v, dropout_p=dropout, scale=scale), None
    has = allowed.any(-1, keepdim=True)  # (.., Nq, 1)
    pv = sdpa(q, k, v, attn_mask=allowed | ~has, dropout_p=dropout, scale=scale)
    return pv * has, has


def rescaled(q: Tensor, scale: float | None) -> Tensor:
    """``q`` scaled so that a graph kind's ``1 / sqrt(Dh)`` gives the logit scale ``scale``."""
    dh = q.shape[-1]
    if scale is None or scale == 1.0 / math.sqrt(dh):
        return q
    return q * (scale * math.sqrt(dh))


def cat_heads(pieces: Sequence[Tensor]) -> Tensor:
    """``(B, h_i, N, C)`` pieces -> ``(B, H, N, C)``, concatenated in the ``(B, N, H, C)``
    memory layout that layers transpose the heads back to (their transpose is then free); one
    piece is returned as it is."""
    if len(pieces) == 1:
        return pieces[0]
    return torch.cat([p.transpose(1, 2) for p in pieces], dim=2).transpose(1, 2)


def coefficients(op: DiffusionOperator, like: Tensor) -> tuple[Tensor, Tensor]:
    """``(a, b)`` of an affine operator on ``like``'s device and in its dtype."""
    pair = op.affine_coefficients()
    if pair is None:  # pragma: no cover - runs hold affine heads only
        raise RuntimeError("a fused run without coefficients")
    a, b = (c.to(device=like.device, dtype=like.dtype) for c in pair)
    return a, b
