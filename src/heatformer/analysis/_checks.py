"""Input checks and the accumulation dtype shared by the token-geometry metrics.

Errors come from :mod:`heatformer.checks` (:func:`~heatformer.checks.bad_type` for a wrong
kind, :func:`~heatformer.checks.bad_value` for a wrong value), so they carry the argument's
name in ``.argument``; messages read ``"name: expected X, got Y"``.
"""

from __future__ import annotations

from typing import NoReturn

import torch
from torch import Tensor

from heatformer.checks import bad_type, bad_value


def accumulation_dtype(device: torch.device) -> torch.dtype:
    """float64, except on devices that have no float64 (MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


def checked_float(value: object, name: str, *, min_ndim: int, shape: str) -> Tensor:
    """``value`` if it is a floating tensor with at least ``min_ndim`` dims (``shape`` is the
    expected shape, as the message shows it)."""
    if not isinstance(value, Tensor):
        raise bad_type(name, f"expected a torch.Tensor of shape {shape}, got {type(value)}")
    if not value.is_floating_point():
        raise bad_type(name, f"expected a floating-point tensor, got dtype {value.dtype}")
    if value.ndim < min_ndim:
        raise bad_value(name, f"expected shape {shape}, got {tuple(value.shape)}")
    return value


def checked_int(value: object, name: str, shape: tuple[int, ...], x: Tensor) -> Tensor:
    """``value`` if it is an integer (or bool) tensor of exactly ``shape`` on ``x``'s device."""
    if not isinstance(value, Tensor):
        raise bad_type(name, f"expected a torch.Tensor of shape {shape}, got {type(value)}")
    if value.is_floating_point() or value.is_complex():
        raise bad_type(name, f"expected an integer (or bool) tensor, got dtype {value.dtype}")
    if tuple(value.shape) != shape:
        raise bad_value(name, f"expected shape {shape}, got {tuple(value.shape)}")
    if value.device != x.device:
        raise bad_value(name, f"expected a tensor on {x.device}, got one on {value.device}")
    return value


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
