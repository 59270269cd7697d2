"""Precision policy: what half-precision graphs and signals compute in.

One rule, applied where a kernel or a sum needs it:

- Products with the graph (one :meth:`~heatformer.graph_ops.Graph.propagate`) run in the
  signal's dtype, as ``scaled_dot_product_attention`` does (it accumulates in float32
  internally), except the sparse CSR product, which has no half-precision kernel on the CPU
  and runs in float32.
- Sums over many terms (the heat series, PPR, polynomial filters) accumulate in float32
  (:func:`accumulation_dtype`) and round to the input dtype once, at the end.
- Dense factorizations (``matrix_exp``, ``solve``, eigenvalues) run in float32 for half inputs:
  they have no half kernels, or return NaN in half precision.
- Attention scores ``q k^T * scale``, their softmax and the degree sums of a half-precision
  graph are formed in float32 (:func:`attention_scores`): a float16 product overflows past
  65504, which ``|q|, |k|`` of a few hundred reach, while float32 holds every product of
  finite float16 or bfloat16 inputs. The weights are rounded to the graph's dtype once.

float32 and float64 inputs compute in their own dtype throughout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

HALF_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float16/bfloat16, else ``dtype`` itself.

    Example:
        >>> accumulation_dtype(torch.bfloat16), accumulation_dtype(torch.float64)
        (torch.float32, torch.float64)
    """
    return torch.float32 if dtype in HALF_DTYPES else dtype


@contextlib.contextmanager
def full_precision(device_type: str) -> Iterator[None]:
    """Turn autocast off inside: explicit float32 work must not be cast back to half."""
    with torch.autocast(device_type=device_type, enabled=False):
        yield


def attention_scores(q: Tensor, k: Tensor, scale: float) -> Tensor:
    r"""The attention logits ``q k^T * scale`` where they cannot overflow.

    Half-precision inputs are multiplied in float32 (autocast off, so the product is not cast
    back). For float16 inputs nothing can overflow: ``|q \cdot k| \le 65504^2 E \approx 4.3
    \cdot 10^9 E``, far below float32's ``3.4 \cdot 10^{38}``, where the float16 product
    overflows once ``|q \cdot k|`` passes 65504 (``|q|, |k|`` of about ``256 / E^{1/4}``).
    bfloat16 has float32's range already, but its 8-bit mantissa would round each logit by up
    to ``2^{-9}`` of its size (256 at a logit of 65536); in float32 a product of two
    bfloat16 numbers is exact and the sum rounds to ``2^{-24}``. float32 and float64 inputs
    stay in their dtype. Differentiable; the gradients reach ``q`` and ``k`` in their dtype.

    Args:
        q: ``(..., R, E)`` queries.
        k: ``(..., S, E)`` keys (batch dims broadcast with ``q``'s).
        scale: the logit scale.

    Returns:
        ``(..., R, S)`` in :func:`accumulation_dtype` of ``q``'s dtype.

    Example:
        >>> q = torch.full((1, 16), 100.0, dtype=torch.float16)
        >>> (q @ q.T).isinf().item(), attention_scores(q, q, 0.25).item()
        (True, 40000.0)
    """
    work = accumulation_dtype(q.dtype)
    with full_precision(q.device.type):
        return (q.to(work) @ k.to(work).transpose(-1, -2)).mul_(scale)  # in place: one slab
