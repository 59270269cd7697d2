"""``Attention()``: the ordinary attention head, ``D_out^+ W x`` (= ``P x``)."""

from __future__ import annotations

import torch
from torch import Tensor

from heatformer.graph_ops.laplacian import GraphLaplacian
from heatformer.graph_ops.operators.base import DiffusionOperator
from heatformer.graph_ops.protocol import Graph

__all__ = ["Attention"]


class Attention(DiffusionOperator):
    r"""Ordinary attention: the random-walk average ``D_out^+ W x``.

    For an attention graph (rows of ``P`` sum to 1) this is ``P x``, one fused SDPA call on a
    :class:`~heatformer.graph_ops.SoftmaxGraph`; fully masked rows give 0.

    Shape:
        ``x``: ``(..., N, C)`` -> ``(..., N, C)``.

    Example:
        >>> import torch
        >>> from heatformer.graph_ops import DenseGraph
        >>> g = DenseGraph(torch.tensor([[0., 1., 0.], [1., 0., 1.], [0., 1., 0.]]))
        >>> Attention()(g, torch.tensor([[1.], [2.], [3.]])).squeeze(-1)
        tensor([2., 2., 2.])
    """

    name = "attention"
    examples = ({},)

    def forward(self, graph: Graph, x: Tensor) -> Tensor:
        self._check(graph, x)
        return GraphLaplacian(graph, "rw").adjacency(x)

    def frequency_response(self, lam: Tensor) -> Tensor:
        return 1.0 - lam

    def affine_coefficients(self) -> tuple[Tensor, Tensor]:
        return torch.tensor(1.0), torch.tensor(0.0)  # P v

    def affine_constants(self) -> tuple[float, float]:
        return 1.0, 0.0
