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

float32 and float64 inputs compute in their own dtype throughout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

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
