"""``HeatKernel(t)``: heat diffusion ``exp(-t L) x``, with a learnable time if asked."""

from __future__ import annotations

import math
from typing import ClassVar, cast

import torch
from torch import Tensor, nn

from heatformer import checks as V
from heatformer.graph_ops._precision import accumulation_dtype
from heatformer.graph_ops.heat import check_heat_method, heat_kernel
from heatformer.graph_ops.operators.base import NormalizedOperator, _parameter
from heatformer.graph_ops.protocol import Graph

__all__ = ["HeatKernel"]

#: A learnable ``t = exp(log_t)`` is computed from ``min(log_t, LOG_T_MAX)``: ``2^100`` is
#: finite in float32 and past ``TAU_CONVERGED = 2^58`` for every ``c >= 2^-42`` (``tau = c t``),
#: so a time that grew past convergence gives the converged result and a zero gradient, never
#: ``exp`` overflowing to inf (and NaN in backward).
LOG_T_MAX = 100 * math.log(2.0)


class HeatKernel(NormalizedOperator):
    r"""Heat diffusion ``exp(-t L) x``; see :func:`~heatformer.graph_ops.heat_kernel`.

    Any finite ``t`` is accepted: past convergence (``c t > 2^58``) the result is the limit
    ``t -> inf`` to float64's resolution (see :func:`~heatformer.graph_ops.heat_kernel` for the
    guarantee); a learnable ``t`` past ``2^100`` gives that limit and a zero gradient.

    Args:
        t: diffusion time ``>= 0``: a float or a sequence/tensor of one time per head
            (broadcast from the right against the graph's batch shape, e.g. ``(H,)``).
        normalization: ``"rw"``, ``"sym"`` or ``"combinatorial"``.
        method: ``"auto"``, ``"series"`` or ``"exact"`` (see ``HEAT_METHODS``).
        tol: series truncation tolerance, relative to ``max|x|``.
        learnable: learn ``t`` (parametrized as ``t = exp(log_t)``, so ``t > 0`` is required).

    Shape:
        ``x``: ``(..., N, C)`` -> ``(..., N, C)``.

    Example:
        >>> import torch
        >>> from heatformer.graph_ops import DenseGraph
        >>> g = DenseGraph(torch.tensor([[0., 1.], [1., 0.]], dtype=torch.float64))
        >>> x = torch.tensor([[1.], [0.]], dtype=torch.float64)
        >>> HeatKernel(t=0.0)(g, x).squeeze(-1)
        tensor([1., 0.], dtype=torch.float64)
    """

    name = "heat"
    argument_names: ClassVar[dict[str, str]] = {"_t": "t", "log_t": "t"}
    examples = (
        {},
        {"t": 0.3, "normalization": "sym"},
        {"t": 40.0, "normalization": "combinatorial", "tol": 1e-8},
        {"t": 1.7, "learnable": True},
        {"t": 1e4},  # beyond the series: the exact method
    )

    def __init__(
        self,
        t: float | list[float] | Tensor = 1.0,
        normalization: str = "rw",
        method: str = "auto",
        tol: float = 1e-6,
        learnable: bool = False,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        given_tensor = isinstance(t, Tensor)
        if isinstance(t, (list, tuple)):
            bad = [v for v in t if isinstance(v, bool) or not isinstance(v, (int, float))]
            if bad:
                raise V.bad_type("t", f"expected a list of floats, got an entry {bad[0]!r}")
            for v in t:  # checked as numbers, before any tensor exists (meta-device safe)
                V.check_time(float(v))
            values: float | list[float] | Tensor = [float(v) for v in t]
        else:
            values = V.check_time(t)
        self.normalization = V.check_normalization(normalization)
        self.method = check_heat_method(method)
        self.tol = V.check_tol(tol)
        self.learnable = V.check_bool("learnable", learnable)
        if self.learnable:
            positive = (
                bool((values > 0).all()) if isinstance(values, Tensor)
                else min(values if isinstance(values, list) else [values]) > 0
            )  # fmt: skip
            if not positive:
                raise V.bad_value(
                    "t", "a learnable t is parametrized as exp(log_t); expected t > 0"
                )
            if isinstance(values, Tensor):  # a tensor keeps its dtype unless one is asked for
                log_t = values.detach().clone().log().to(device=device, dtype=dtype)
            else:  # log in float64, then the factory dtype: no float32 detour
                log_t = _parameter(values, device, dtype, transform=math.log)
            self.log_t = nn.Parameter(log_t)
        else:  # a float or list keeps float64 precision; a tensor keeps its dtype
            fixed = torch.as_tensor(values, dtype=None if given_tensor else torch.float64)
            self.register_buffer("_t", fixed.detach().clone().to(device), persistent=False)

    @property
    def t(self) -> Tensor:
        """The diffusion time(s)."""
        if self.learnable:
            return self.log_t.exp()
        return cast(Tensor, self._t)

    def forward(self, graph: Graph, x: Tensor) -> Tensor:
        self._check(graph, x)
        t: Tensor | float
        if self.learnable:  # exp in the signal's precision (float32 for half), not the param's
            t = self.log_t.to(accumulation_dtype(x.dtype)).clamp(max=LOG_T_MAX).exp()
        else:
            t = cast(Tensor, self._t)
            if t.dim() == 0:
                t = float(t)  # a fixed scalar time: exact, and no tensor arithmetic per call
        return heat_kernel(
            graph, x, t, normalization=self.normalization, method=self.method, tol=self.tol
        )

    def frequency_response(self, lam: Tensor) -> Tensor:
        t = self.t.to(lam.dtype)
        return torch.exp(-t.reshape(*t.shape, *([1] * lam.dim())) * lam)

    def extra_repr(self) -> str:
        t = self.t.detach()
        ts = f"{float(t):g}" if t.dim() == 0 else str([round(float(v), 4) for v in t])
        return (
            f"t={ts}, normalization={self.normalization!r}, method={self.method!r}, "
            f"tol={self.tol:g}, learnable={self.learnable}"
        )
