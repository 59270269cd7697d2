"""``Laplacian()``: the Laplacian head ``step * L x`` (= ``x - P x`` with ``"rw"``)."""

from __future__ import annotations

import torch
from torch import Tensor

from heatformer import checks as V
from heatformer.graph_ops.laplacian import GraphLaplacian
from heatformer.graph_ops.operators.base import NormalizedOperator
from heatformer.graph_ops.protocol import Graph

__all__ = ["Laplacian"]


class Laplacian(NormalizedOperator):
    r"""The Laplacian head: ``step * L x``; with ``"rw"`` on attention, ``x - P x``.

    This is the update of Zhang & Papyan (2026), whose Laplacian heads output ``(I - P) V``.

    Args:
        normalization: ``"rw"`` (default), ``"sym"`` or ``"combinatorial"``.
        step: a scale on the output (default 1).
        learnable: make ``step`` a parameter.

    Shape:
        ``x``: ``(..., N, C)`` -> ``(..., N, C)``.

    Example:
        With ``"rw"``, each node's departure from its neighbours' mean; constants go to 0:

        >>> import torch
        >>> from heatformer.graph_ops import DenseGraph
        >>> path = DenseGraph(torch.tensor([[0., 1., 0.], [1., 0., 1.], [0., 1., 0.]]))
        >>> lap = Laplacian()
        >>> lap(path, torch.ones(3, 1)).squeeze(-1)
        tensor([0., 0., 0.])
        >>> lap(path, torch.tensor([[1.], [2.], [3.]])).squeeze(-1)
        tensor([-1.,  0.,  1.])
    """

    name = "laplacian"
    examples = (
        {},
        {"step": 0.5},
        {"normalization": "sym"},
        {"normalization": "combinatorial", "learnable": True},
    )

    def __init__(
        self,
        normalization: str = "rw",
        *,
        step: float = 1.0,
        learnable: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.normalization = V.check_normalization(normalization)
        self.step: Tensor
        self.learnable = V.check_bool("learnable", learnable)
        self._register_factor("step", step, learnable, device, dtype)

    def forward(self, graph: Graph, x: Tensor) -> Tensor:
        self._check(graph, x)
        y = GraphLaplacian(graph, self.normalization).laplacian(x)
        return self._times(y, self.step, self.learnable)

    def frequency_response(self, lam: Tensor) -> Tensor:
        return self.step.to(lam.dtype) * lam

    def affine_coefficients(self) -> tuple[Tensor, Tensor] | None:
        if self.normalization != "rw":  # "sym" and "combinatorial" are not a function of P v
            return None
        return -self.step, self.step  # step (I' v - P v)

    def affine_constants(self) -> tuple[float, float] | None:
        if self.normalization != "rw" or self.learnable:
            return None
        step: float = self.__dict__["_host_factors"]["step"]
        return -step, step

    def extra_repr(self) -> str:
        step = float(self.step.detach())
        learnable = ", learnable=True" if self.learnable else ""
        return f"normalization={self.normalization!r}, step={step:g}{learnable}"
