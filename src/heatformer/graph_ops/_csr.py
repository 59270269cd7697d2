"""Sparse matrix products with a backward that stays sparse.

A batched sparse graph is stored as one block-diagonal CSR matrix over the ``R = prod(batch) * N``
flattened rows. ``y = A @ x`` is a ``torch.sparse`` CSR product; the backward pass computes

- ``dL/dx = A^T @ dL/dy`` with the transposed CSR structure (precomputed once per graph), and
- ``dL/dvalues[e] = <dL/dy[row[e]], x[col[e]]>`` with :func:`torch.sparse.sampled_addmm`, which
  evaluates ``dL/dy @ x^T`` only at the stored entries.

Neither direction forms a dense ``R x R`` matrix or an ``(E, C)`` gather (measured in
``docs/benchmarks.md``: about 20x faster than gather/scatter message passing on the CPU,
forward and backward).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from heatformer.graph_ops._precision import accumulation_dtype, full_precision


@dataclass(frozen=True)
class CSRStructure:
    """Index structure of a CSR matrix of shape ``(size, size)``, entries in row-major order.

    Attributes:
        crow: ``(size + 1,)`` row pointers.
        col: ``(E,)`` column indices, grouped by row.
        row: ``(E,)`` row index of each entry (expanded ``crow``).
        size: number of rows (= columns).
    """

    crow: Tensor
    col: Tensor
    row: Tensor
    size: int

    def transpose(self) -> tuple[CSRStructure, Tensor]:
        """Structure of ``A^T`` and the permutation ``perm`` with ``vals_T = vals[perm]``."""
        # entries are in row-major order, so a stable sort by column gives (col, row) order
        col = self.col.to(torch.int32) if self.size < 2**31 else self.col
        perm = torch.sort(col, stable=True).indices
        row_t = self.col[perm]
        col_t = self.row[perm]
        counts = torch.bincount(row_t, minlength=self.size)
        crow_t = torch.zeros(self.size + 1, dtype=torch.long, device=self.col.device)
        crow_t[1:] = torch.cumsum(counts, 0)
        return CSRStructure(crow_t, col_t, row_t, self.size), perm


def _csr(struct: CSRStructure, values: Tensor) -> Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse_csr_tensor(
            struct.crow, struct.col, values, (struct.size, struct.size), check_invariants=False
        )


def _sampled_dot(struct: CSRStructure, grad: Tensor, x: Tensor) -> Tensor:
    """``out[e] = <grad[row[e]], x[col[e]]>`` for every stored entry ``e``."""
    if grad.device.type == "cpu" or grad.dtype in (torch.float32, torch.float64):
        pattern = _csr(struct, torch.zeros_like(struct.col, dtype=grad.dtype))
        return torch.sparse.sampled_addmm(
            pattern, grad.contiguous(), x.t().contiguous(), beta=0.0
        ).values()
    # half precision on accelerators: gather-and-sum fallback (E x C temporary)
    return (grad[struct.row] * x[struct.col]).sum(-1)


class _CSRMatmul(torch.autograd.Function):
    """``y = A @ x`` with ``A`` given by a CSR structure and differentiable ``values``."""

    @staticmethod
    def forward(
        ctx: Any,
        values: Tensor,
        x: Tensor,
        struct: CSRStructure,
        transpose: Callable[[], tuple[CSRStructure, Tensor]],
    ) -> Tensor:
        ctx.save_for_backward(values, x)
        ctx.struct, ctx.transpose = struct, transpose
        return _csr(struct, values) @ x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        values, x = ctx.saved_tensors
        grad_values = grad_x = None
        if ctx.needs_input_grad[0]:
            grad_values = _sampled_dot(ctx.struct, grad, x)
        if ctx.needs_input_grad[1]:
            struct_t, perm = ctx.transpose()  # computed once per graph, on first need
            grad_x = _csr(struct_t, values[perm]) @ grad
        return grad_values, grad_x, None, None


def csr_matmul(
    values: Tensor,
    x: Tensor,
    struct: CSRStructure,
    transpose: Callable[[], tuple[CSRStructure, Tensor]],
) -> Tensor:
    """Differentiable ``A @ x`` for the CSR matrix ``A = (struct, values)``.

    float16/bfloat16 operands are multiplied in float32 (``torch.sparse`` has no half
    precision CSR kernel on the CPU) and the product is rounded to ``x``'s dtype; autocast is
    off inside, so the float32 product is not cast back.

    Args:
        values: ``(E,)`` entries of ``A`` in ``struct`` order.
        x: ``(size, C)`` dense right-hand side.
        struct: structure of ``A``.
        transpose: returns the structure of ``A^T`` and the permutation ``perm`` with
            ``values_T = values[perm]`` (called only when the gradient of ``x`` is needed).

    Returns:
        ``(size, C)`` product.
    """
    compute = accumulation_dtype(x.dtype)
    with full_precision(x.device.type):
        y = _CSRMatmul.apply(values.to(compute), x.to(compute), struct, transpose)
    return y.to(x.dtype)
