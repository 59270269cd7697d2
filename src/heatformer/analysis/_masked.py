"""Token masks and the accumulation dtype shared by the token-geometry metrics.

The metrics check their tensors with :mod:`heatformer.checks`; the token masks are checked
here, with the same errors (:func:`~heatformer.checks.bad_type` for a wrong kind,
:func:`~heatformer.checks.bad_value` for a wrong value).
"""

from __future__ import annotations

from typing import NoReturn

import torch
from torch import Tensor

from heatformer.checks import bad_type, bad_value


def accumulation_dtype(device: torch.device) -> torch.dtype:
    """float64, except on devices that have no float64 (MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


def resolve_mask(mask: Tensor | None, x: Tensor, name: str = "mask") -> Tensor:
    """Return a bool mask of shape ``x.shape[:-1]`` (all True when ``mask`` is None)."""
    shape = tuple(x.shape[:-1])
    if mask is None:
        return torch.ones(shape, dtype=torch.bool, device=x.device)
    if not isinstance(mask, Tensor):
        raise bad_type(name, f"expected a torch.Tensor of shape {shape}, got {type(mask)}")
    if mask.dtype != torch.bool:
        raise bad_type(name, f"expected dtype torch.bool (True = real token), got {mask.dtype}")
    if tuple(mask.shape) != shape:
        raise bad_value(name, f"expected shape {shape}, got {tuple(mask.shape)}")
    if mask.device != x.device:
        raise bad_value(name, f"expected a tensor on {x.device}, got one on {mask.device}")
    return mask


def raise_no_tokens(x: Tensor, mask: Tensor | None) -> NoReturn:
    """Refuse an input without a single real token, naming ``x`` or ``mask``."""
    if mask is None:
        raise bad_value("x", f"expected at least one token, got shape {tuple(x.shape)}")
    raise bad_value("mask", "expected at least one real token, got every token masked")


def masked_float(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` in the accumulation dtype with masked tokens set to 0 (NaN-safe)."""
    xf = x.to(accumulation_dtype(x.device))
    return torch.where(mask.unsqueeze(-1), xf, torch.zeros((), dtype=xf.dtype, device=xf.device))
