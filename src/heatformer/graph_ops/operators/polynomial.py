"""``Polynomial(c)``: a polynomial filter ``sum_k c_k L^k x`` (Horner's scheme)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from heatformer import checks as V
from heatformer.graph_ops._precision import accumulation_dtype
from heatformer.graph_ops.heat import propagation_step
from heatformer.graph_ops.laplacian import GraphLaplacian
from heatformer.graph_ops.operators.base import NormalizedOperator, _parameter
from heatformer.graph_ops.protocol import Graph

__all__ = ["Polynomial"]


class Polynomial(NormalizedOperator):
    r"""A polynomial filter ``sum_k c_k L^k x`` (Horner's scheme: ``K`` propagations).

    ``Polynomial([1, -1])`` is :class:`Attention` and ``Polynomial([0, 1])`` is
    :class:`Laplacian` (both with ``"rw"`` on an attention graph).

    Args:
        coeffs: ``c_0, ..., c_K``.
        normalization: ``"rw"``, ``"sym"`` or ``"combinatorial"``.
        learnable: make the coefficients a parameter.

    Example:
        >>> import torch
        >>> from heatformer.graph_ops import DenseGraph
        >>> g = DenseGraph(torch.tensor([[0., 1., 0.], [1., 0., 1.], [0., 1., 0.]]))
        >>> Polynomial([1.0, -1.0])(g, torch.tensor([[1.], [2.], [3.]])).squeeze(-1)
        tensor([2., 2., 2.])
    """

    name = "polynomial"
    examples = (
        {},
        {"coeffs": [0.5, -1.0, 0.25], "normalization": "sym"},
        {"coeffs": [0.0, 1.0, -0.5], "learnable": True},
    )

    def __init__(
        self,
        coeffs: list[float] | tuple[float, ...] | Tensor = (1.0, -1.0),
        normalization: str = "rw",
        learnable: bool = False,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        values = V.check_coeffs(coeffs)
        self.normalization = V.check_normalization(normalization)
        self.learnable = V.check_bool("learnable", learnable)
        self.coeffs: Tensor
        if self.learnable:
            c = (
                values.detach().clone().to(device=device, dtype=dtype)
                if isinstance(values, Tensor)
                else _parameter(values, device, dtype)
            )
            self.coeffs = nn.Parameter(c)
        else:  # float64 (a tensor keeps its dtype), cast to the signal's dtype at use
            c = torch.as_tensor(values, dtype=None if isinstance(values, Tensor) else torch.float64)
            self.register_buffer("coeffs", c.detach().clone().to(device), persistent=False)
        given = torch.as_tensor(values, dtype=None if isinstance(values, Tensor) else torch.float64)
        self._checked_in("coeffs", self.coeffs.dtype, given)  # learnable: the factory dtype
        if dtype is not None:  # used in the accumulation dtype of signals of that dtype
            self._checked_in("coeffs", accumulation_dtype(dtype), given)
        else:  # torch's default dtype, quietly: a first call in it then reads nothing
            self._precheck("coeffs", accumulation_dtype(torch.get_default_dtype()), given)

    def forward(self, graph: Graph, x: Tensor) -> Tensor:
        self._check(graph, x)
        gen = GraphLaplacian(graph, self.normalization)
        acc = accumulation_dtype(x.dtype)  # half precision: Horner's sums in float32
        self._checked_in("coeffs", acc)  # once per dtype: 1e39 is inf in float32
        c = self.coeffs.to(dtype=acc, device=x.device)
        xa = x.to(acc)
        y = c[-1] * xa
        elements = graph.signal_elements(x)  # the same choice on every rank of a split graph
        for k in range(c.numel() - 2, -1, -1):
            y = propagation_step(gen.laplacian, y.to(x.dtype), elements).to(acc) + c[k] * xa
        return y.to(x.dtype)

    def frequency_response(self, lam: Tensor) -> Tensor:
        c = self.coeffs.to(lam.dtype)
        y = torch.zeros_like(lam) + c[-1]
        for k in range(c.numel() - 2, -1, -1):
            y = y * lam + c[k]
        return y

    def extra_repr(self) -> str:
        coeffs = [round(float(v), 4) for v in self.coeffs.detach()]
        learnable = ", learnable=True" if self.learnable else ""
        return f"coeffs={coeffs}, normalization={self.normalization!r}{learnable}"
