r"""The heads of a fused ``q, k, v`` projection, unbound so that their gradients can come back
in the projection's own layout without a copy.

``qkv.unbind(2)`` of a ``(B, N, 3, H, Dh)`` projection gives ``q``, ``k``, ``v``; autograd's
backward of that unbind stacks the three gradients into a fresh ``(B, N, 3, H, Dh)`` tensor (a
copy of ``3 B N H Dh`` elements). :func:`unbind_packed` is the same unbind whose backward
first asks whether the three gradients already *are* that tensor: three views of one buffer
at the offsets and strides the parts have in the projection, as the window graph's backward
writes them (:class:`~heatformer.graph_ops.window.kernels.GradSink`). Then it returns the
buffer as it is; otherwise it stacks, as autograd would.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["unbind_packed"]


def _as_packed(grads: tuple[Tensor, ...], shape: torch.Size) -> Tensor | None:
    """The ``shape`` ``(B, N, 3, H, Dh)`` tensor whose parts along dim 2 are ``grads`` (each
    ``(B, N, H, Dh)``), as a view of their common buffer, or None when they are not laid out
    as its parts (the parts' strides, one part of ``H Dh`` elements after the other)."""
    first = grads[0]
    part = shape[3] * shape[4]
    try:  # a tensor without storage (a torch.func transform's wrapper) is stacked
        storages = {g.untyped_storage().data_ptr() for g in grads}
    except (RuntimeError, NotImplementedError):
        return None
    offsets = [g.storage_offset() - first.storage_offset() for g in grads]
    same = len(storages) == 1 and all(
        g.dtype == first.dtype and g.stride() == first.stride() for g in grads
    )
    b_stride, n_stride, h_stride, d_stride = first.stride()
    if not (same and offsets == [0, part, 2 * part] and n_stride == 3 * part):
        return None
    if (h_stride, d_stride) != (shape[4], 1) or (shape[0] > 1 and b_stride < n_stride * shape[1]):
        return None
    strides = (b_stride, n_stride, part, h_stride, d_stride)
    return first.as_strided(shape, strides, first.storage_offset())


class _UnbindPacked(torch.autograd.Function):
    generate_vmap_rule = True  # torch.func transforms: the rule of unbind and stack

    @staticmethod
    def forward(qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = qkv.unbind(2)
        return q, k, v

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Tensor], output: Any) -> None:
        ctx.shape = inputs[0].shape

    @staticmethod
    def backward(ctx: Any, dq: Tensor, dk: Tensor, dv: Tensor) -> Tensor:
        grads = (dq, dk, dv)
        packed = None if torch.is_grad_enabled() else _as_packed(grads, ctx.shape)
        return torch.stack(grads, dim=2) if packed is None else packed


def unbind_packed(qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``qkv.unbind(2)`` of a ``(B, N, 3, H, Dh)`` projection: ``q``, ``k``, ``v``, each
    ``(B, N, H, Dh)`` (views), whose gradients are returned to ``qkv`` without a copy when the
    consumer wrote them as the three parts of one buffer in that layout (else stacked).

    Inside a compiled program, or for a ``qkv`` that needs no gradient, it is ``unbind``
    itself.
    """
    if torch.compiler.is_compiling() or not (qkv.requires_grad and torch.is_grad_enabled()):
        q, k, v = qkv.unbind(2)
        return q, k, v
    q, k, v = _UnbindPacked.apply(qkv)
    return q, k, v
