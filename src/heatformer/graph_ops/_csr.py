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
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from heatformer._torch_compat import func_transforming
from heatformer.graph_ops._precision import accumulation_dtype, full_precision


def index_dtype(size: int, nnz: int) -> torch.dtype:
    """The narrowest index dtype ``torch.sparse`` CSR takes for ``size`` rows and ``nnz`` entries:
    int32 (4 bytes an entry) below ``2**31``, else int64."""
    return torch.int32 if max(size + 1, nnz) < 2**31 else torch.int64


@dataclass(frozen=True)
class CSRStructure:
    """Index structure of a CSR matrix of shape ``(size, size)``, entries in row-major order.

    ``crow`` and ``col`` share one dtype (:func:`index_dtype`: int32 unless the matrix needs
    int64), so a top-k graph's structure costs 4 bytes an edge; the row of each entry is not
    stored but expanded from ``crow`` when asked (:meth:`rows`).

    Attributes:
        crow: ``(size + 1,)`` row pointers.
        col: ``(E,)`` column indices, grouped by row.
        size: number of rows (= columns).
    """

    crow: Tensor
    col: Tensor
    size: int

    @classmethod
    def from_rows(cls, row: Tensor, col: Tensor, size: int) -> CSRStructure:
        """The structure of entries with row indices ``row`` (ascending) and ``col`` ``(E,)``."""
        dtype = index_dtype(size, col.numel())
        counts = torch.bincount(row, minlength=size)
        crow = torch.zeros(size + 1, dtype=dtype, device=col.device)
        crow[1:] = torch.cumsum(counts, 0)
        return cls(crow, col.to(dtype), size)

    def rows(self) -> Tensor:
        """``(E,)`` the row index of each entry (made on each call, in the index dtype)."""
        # each row's end marks where the next rows begin; their running count is the row (no
        # host sync, unlike repeat_interleave, and empty rows add up at one mark)
        nnz = self.col.numel()
        marks = torch.zeros(nnz + 1, dtype=self.crow.dtype, device=self.crow.device)
        marks.index_add_(0, self.crow[1:], torch.ones_like(self.crow[1:]))
        return marks[:nnz].cumsum(0, dtype=self.crow.dtype)

    def transpose(self) -> tuple[CSRStructure, Tensor]:
        """Structure of ``A^T`` and the permutation ``perm`` with ``vals_T = vals[perm]``."""
        # entries are in row-major order, so a stable sort by column gives (col, row) order
        perm = torch.sort(self.col, stable=True).indices.to(self.col.dtype)
        row_t = self.col[perm]
        col_t = self.rows()[perm]
        return CSRStructure.from_rows(row_t, col_t, self.size), perm


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
    return (grad[struct.rows()] * x[struct.col]).sum(-1)


class TransposeCache:
    """The structure of ``A^T`` and its permutation (:meth:`CSRStructure.transpose`), made
    on first need and kept for every product with the same matrix (a heat series makes K).

    Backward reads ``A``'s structure from its saved tensors and holds only this small object
    beside them, so activation checkpointing can drop the structure of a recomputed graph.
    """

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: tuple[CSRStructure, Tensor] | None = None

    def get(self, struct: CSRStructure) -> tuple[CSRStructure, Tensor]:
        if self.value is None:
            self.value = struct.transpose()
        return self.value


class _CSRMatmul(torch.autograd.Function):
    """``y = A @ x`` with ``A`` given by a CSR structure and differentiable ``values``."""

    @staticmethod
    def forward(
        ctx: Any,
        values: Tensor,
        x: Tensor,
        struct: CSRStructure,
        transposed: TransposeCache,
    ) -> Tensor:
        # every tensor backward reads goes through save_for_backward (none on ctx): saved
        # tensor hooks (activation checkpointing, offloading) then see all of them
        ctx.save_for_backward(values, x, struct.crow, struct.col)
        ctx.size, ctx.transposed = struct.size, transposed
        return _csr(struct, values) @ x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        values, x, crow, col = ctx.saved_tensors
        struct = CSRStructure(crow, col, ctx.size)
        grad_values = grad_x = None
        if ctx.needs_input_grad[0]:
            grad_values = _sampled_dot(struct, grad, x)
        if ctx.needs_input_grad[1]:
            struct_t, perm = ctx.transposed.get(struct)  # once per matrix, on first need
            grad_x = _csr(struct_t, values[perm]) @ grad
        return grad_values, grad_x, None, None


def csr_matmul(
    values: Tensor,
    x: Tensor,
    struct: CSRStructure,
    transposed: TransposeCache,
) -> Tensor:
    """Differentiable ``A @ x`` for the CSR matrix ``A = (struct, values)``.

    Inside a :mod:`torch.func` transform (:func:`heatformer._torch_compat.func_transforming`)
    the product is a gather and scatter-add that autograd differentiates.

    float16/bfloat16 operands are multiplied in float32 (``torch.sparse`` has no half
    precision CSR kernel on the CPU) and the product is rounded to ``x``'s dtype; autocast is
    off inside, so the float32 product is not cast back.

    Args:
        values: ``(E,)`` entries of ``A`` in ``struct`` order.
        x: ``(size, C)`` dense right-hand side.
        struct: structure of ``A``.
        transposed: where the structure of ``A^T`` is kept once made (one per matrix; made
            only when the gradient of ``x`` is needed).

    Returns:
        ``(size, C)`` product.
    """
    compute = accumulation_dtype(x.dtype)
    with full_precision(x.device.type):
        if func_transforming():  # see below
            return _gathered_matmul(values.to(compute), x.to(compute), struct).to(x.dtype)
        y = _CSRMatmul.apply(values.to(compute), x.to(compute), struct, transposed)
    return y.to(x.dtype)


def _gathered_matmul(values: Tensor, x: Tensor, struct: CSRStructure) -> Tensor:
    """``A @ x`` by gather and scatter-add, ``(size, C)``, differentiated by autograd: the
    path inside a :mod:`torch.func` transform, whose wrapped tensors ``torch.sparse`` does not
    take (and whose ``vmap`` adds a batch dimension a CSR product has no rule for). Keeps the
    ``(E, C)`` gathered rows."""
    msgs = values.unsqueeze(-1) * x[struct.col.long()]  # (E, C)
    return x.new_zeros(struct.size, x.shape[-1]).index_add(0, struct.rows().long(), msgs)
