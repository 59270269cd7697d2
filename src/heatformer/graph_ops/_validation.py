"""Input checks shared by every graph and operator.

Every check raises :class:`TypeError` (wrong kind of object or dtype) or :class:`ValueError`
(wrong shape or value) with a message of the form "``name``: expected X, got Y", so the user
learns which argument was wrong. Nothing here uses ``assert``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

NORMALIZATIONS: tuple[str, ...] = ("rw", "sym", "combinatorial")


def check_float_tensor(name: str, value: object, *, min_dim: int = 0) -> Tensor:
    """Check that ``value`` is a floating-point tensor with at least ``min_dim`` dims."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if not (value.is_floating_point()):
        raise TypeError(
            f"{name}: expected a floating-point tensor (float16/bfloat16/float32/float64), "
            f"got dtype {value.dtype}"
        )
    if value.dim() < min_dim:
        raise ValueError(
            f"{name}: expected at least {min_dim} dimensions, got shape {tuple(value.shape)}"
        )
    return value


def check_square(name: str, weight: Tensor) -> int:
    """Check that the last two dims of ``weight`` are equal; return N."""
    if weight.shape[-1] != weight.shape[-2]:
        raise ValueError(
            f"{name}: expected a square (..., N, N) weight matrix, got shape {tuple(weight.shape)}"
        )
    return int(weight.shape[-1])


def check_normalization(normalization: object) -> str:
    """Check that ``normalization`` is one of ``"rw"``, ``"sym"``, ``"combinatorial"``."""
    if not isinstance(normalization, str) or normalization not in NORMALIZATIONS:
        raise ValueError(
            f"normalization: expected one of {list(NORMALIZATIONS)}, got {normalization!r}"
        )
    return normalization


def check_signal(
    x: object,
    num_nodes: int,
    batch_shape: torch.Size,
    dtype: torch.dtype | None = None,
    *,
    name: str = "x",
) -> Tensor:
    """Check a signal ``x`` of shape ``(..., N, C)`` against a graph with ``num_nodes`` nodes.

    The leading dims of ``x`` must broadcast with the graph's ``batch_shape``; its dtype must
    be the graph's ``dtype`` when given.
    """
    x = check_float_tensor(name, x, min_dim=2)
    if dtype is not None and x.dtype != dtype:
        raise TypeError(f"{name}: expected the graph's dtype {dtype}, got {x.dtype}")
    if x.shape[-2] != num_nodes:
        raise ValueError(
            f"{name}: expected shape (..., N={num_nodes}, C), got {tuple(x.shape)} "
            f"(dim -2 must equal the graph's num_nodes)"
        )
    try:
        torch.broadcast_shapes(x.shape[:-2], batch_shape)
    except RuntimeError:
        raise ValueError(
            f"{name}: leading dims {tuple(x.shape[:-2])} do not broadcast with the graph's "
            f"batch shape {tuple(batch_shape)}"
        ) from None
    return x


def check_mask(mask: object, batch_shape: torch.Size, num_nodes: int) -> Tensor:
    """Check a boolean attention mask broadcastable to ``(*batch_shape, N, N)``."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask: expected a bool torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask: expected dtype torch.bool (True = may attend, as in "
            f"scaled_dot_product_attention), got {mask.dtype}"
        )
    target = (*batch_shape, num_nodes, num_nodes)
    try:
        shape = torch.broadcast_shapes(mask.shape, target)
    except RuntimeError:
        shape = None
    if shape is None or tuple(shape) != target:
        raise ValueError(
            f"mask: expected a shape broadcastable to {target}, got {tuple(mask.shape)}"
        )
    return mask


def check_positive_int(name: str, value: object, *, upper: int | None = None) -> int:
    """Check ``1 <= value (<= upper)`` for an integer ``value``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < 1 or (upper is not None and value > upper):
        bound = f"1 <= {name} <= {upper}" if upper is not None else f"{name} >= 1"
        raise ValueError(f"{name}: expected {bound}, got {value}")
    return value


def check_threshold(eps: object) -> float:
    """Check an edge-weight threshold: a float ``> 0``."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps: expected a float threshold > 0, got {type(eps).__name__}")
    if not eps > 0:
        raise ValueError(f"eps: expected a threshold > 0, got {eps!r}")
    return float(eps)


def check_time(t: object, *, name: str = "t") -> Tensor | float:
    """Check a diffusion time: a finite, non-negative float or floating tensor."""
    if isinstance(t, bool):
        raise TypeError(f"{name}: expected a float or a floating-point tensor, got bool")
    if isinstance(t, (int, float)):
        if not math.isfinite(t) or t < 0:
            raise ValueError(f"{name}: expected a finite value >= 0, got {t}")
        return float(t)
    if isinstance(t, Tensor):
        if not t.is_floating_point():
            raise TypeError(f"{name}: expected a floating-point tensor, got dtype {t.dtype}")
        if not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
            shown = t.detach().cpu().flatten()[:8].tolist()
            raise ValueError(f"{name}: expected finite values >= 0, got {shown}")
        return t
    raise TypeError(f"{name}: expected a float or a floating-point tensor, got {type(t).__name__}")


def check_open_unit(name: str, value: object) -> float:
    """Check ``0 < value < 1``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a float in (0, 1), got {type(value).__name__}")
    if not (0.0 < float(value) < 1.0):
        raise ValueError(f"{name}: expected a value in the open interval (0, 1), got {value}")
    return float(value)


def check_tol(tol: object) -> float:
    """Check a tolerance ``0 < tol < 1``."""
    return check_open_unit("tol", tol)


def check_coeffs(coeffs: object) -> list[float] | Tensor:
    """Check polynomial coefficients: a non-empty 1-D float sequence or tensor.

    A sequence is checked as Python numbers and returned as a list of floats, so no tensor is
    made here (the check also works while modules are built on the meta device).
    """
    if isinstance(coeffs, Tensor):
        if not coeffs.is_floating_point():
            raise TypeError(f"coeffs: expected a floating-point tensor, got dtype {coeffs.dtype}")
        if coeffs.dim() != 1 or coeffs.numel() == 0:
            raise ValueError(
                f"coeffs: expected a non-empty 1-D sequence, got shape {tuple(coeffs.shape)}"
            )
        if coeffs.device.type != "meta" and not bool(torch.isfinite(coeffs).all()):
            raise ValueError("coeffs: expected finite values, got NaN or inf")
        return coeffs
    if not isinstance(coeffs, Sequence) or isinstance(coeffs, str):
        raise TypeError(f"coeffs: expected a sequence of floats or a tensor, got {coeffs!r}")
    if not all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in coeffs):
        raise TypeError(f"coeffs: expected a sequence of numbers, got {coeffs!r}")
    if len(coeffs) == 0:
        raise ValueError("coeffs: expected a non-empty 1-D sequence, got an empty one")
    values = [float(c) for c in coeffs]
    if not all(math.isfinite(c) for c in values):
        raise ValueError(f"coeffs: expected finite values, got {values}")
    return values


def check_bool(name: str, value: object) -> bool:
    """Check a flag: ``True`` or ``False`` (not 0/1, not a string)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    return value
