r"""The heads of a fused ``q, k, v`` projection, unbound so that their gradients can come back
in the projection's own layout without a copy.

``qkv.unbind(2)`` of a ``(B, N, 3, H, Dh)`` projection gives ``q``, ``k``, ``v``; autograd's
backward of that unbind stacks the three gradients into a fresh ``(B, N, 3, H, Dh)`` tensor (a
copy of ``3 B N H Dh`` elements). :func:`unbind_packed` is the same unbind whose backward
first asks whether the three gradients already *are* that tensor, three parts of one buffer in
the projection's layout, as the window kernels' backward writes them: the contract of
:mod:`heatformer.graph_ops.window.packed`
(:func:`~heatformer.graph_ops.window.packed.projection_gradient`). Then it returns the buffer
as it is; otherwise it stacks, as autograd would.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from heatformer.graph_ops.window.packed import projection_gradient

__all__ = ["unbind_packed"]


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
        packed = None if torch.is_grad_enabled() else projection_gradient(grads, ctx.shape)
        return torch.stack(grads, dim=2) if packed is None else packed


def unbind_packed(qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``qkv.unbind(2)`` of a ``(B, N, 3, H, Dh)`` projection: ``q``, ``k``, ``v``, each
    ``(B, N, H, Dh)`` (views), whose gradients are returned to ``qkv`` without a copy when the
    consumer wrote them as the three parts of one buffer in that layout
    (:func:`~heatformer.graph_ops.window.packed.projection_gradient`; else stacked).

    Inside a compiled program, or for a ``qkv`` that needs no gradient, it is ``unbind``
    itself.
    """
    if torch.compiler.is_compiling() or not (qkv.requires_grad and torch.is_grad_enabled()):
        q, k, v = qkv.unbind(2)
        return q, k, v
    q, k, v = _UnbindPacked.apply(qkv)
    return q, k, v
