"""``HeatKernel(t)``: heat diffusion ``exp(-t L) x``, with a learnable time if asked."""

from __future__ import annotations

import math
from typing import ClassVar, cast

import torch
from torch import Tensor, nn

from heatformer import checks as V
from heatformer.graph_ops._precision import accumulation_dtype
from heatformer.graph_ops.heat import TAU_CONVERGED, _heat_kernel, check_heat_method
from heatformer.graph_ops.operators.base import NormalizedOperator, _parameter
from heatformer.graph_ops.poisson import SeriesCertificate, series_certificate
from heatformer.graph_ops.protocol import Graph

__all__ = ["HeatKernel"]

#: A learnable ``t = exp(log_t)`` is computed from ``min(log_t, LOG_T_MAX)``: ``2^100`` is
#: finite in float32 and past ``TAU_CONVERGED = 2^58`` for every ``c >= 2^-42`` (``tau = c t``),
#: so a time that grew past convergence gives the converged result and a zero gradient, never
#: ``exp`` overflowing to inf (and NaN in backward).
LOG_T_MAX = 100 * math.log(2.0)
#: A learnable ``t`` is clamped at ``t_max``, by default this many times its largest initial
#: value: the series is planned for ``t_max`` on the host, so a call reads nothing of ``t``
#: (no device sync; traceable by :func:`torch.compile`) and always costs the propagations of
#: ``t_max`` (``t = 1``, ``tol = 1e-6``: 9 terms for ``t`` itself, 17 for ``t_max = 4``).
T_MAX_FACTOR = 4.0


def _largest(values: float | list[float] | Tensor) -> float | None:
    """The largest time, read once at construction (None for a tensor on the meta device)."""
    if isinstance(values, Tensor):
        if values.device.type == "meta" or values.numel() == 0:
            return None
        return float(values.detach().max())
    return max(values) if isinstance(values, list) else float(values)


class HeatKernel(NormalizedOperator):
    r"""Heat diffusion ``exp(-t L) x``; see :func:`~heatformer.graph_ops.heat_kernel`.

    Any finite ``t`` is accepted: past convergence (``c t > 2^58``) the result is the limit
    ``t -> inf`` to float64's resolution (see :func:`~heatformer.graph_ops.heat_kernel` for the
    guarantee).

    No call reads ``t`` on the host (no device sync; the layer traces under
    :func:`torch.compile`): the series is planned, on the host, for a fixed ``t`` (a Python
    float kept at construction) or for the bound ``t_max`` of a learnable one.

    Args:
        t: diffusion time ``>= 0``: a float or a sequence/tensor of one time per head
            (broadcast from the right against the graph's batch shape, e.g. ``(H,)``).
        normalization: ``"rw"``, ``"sym"`` or ``"combinatorial"``.
        method: ``"auto"``, ``"series"`` or ``"exact"`` (see ``HEAT_METHODS``).
        tol: series truncation tolerance, relative to ``max|x|``, ``0 < tol < 1``: the series
            runs the fewest terms whose Poisson tail is within it, and :attr:`certificate`
            says how many and the error bound they guarantee. A spec without it
            (``heat[t=0.5]``) keeps the default ``1e-6``.
        learnable: learn ``t`` (parametrized as ``t = exp(log_t)``, so ``t > 0`` is required).
        t_max: a learnable ``t`` is clamped at ``t_max`` (``t = exp(min(log_t, log t_max))``;
            its gradient is 0 above it), default :data:`T_MAX_FACTOR` (4) times the largest
            initial ``t``; at most ``2^100``. Every call costs the series of ``t_max``: set it
            close to the range you expect ``t`` to explore. Only for a learnable ``t``.

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
        t_max: float | None = None,
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
        largest = _largest(values)  # None: a tensor on the meta device, unknown until used
        if t_max is not None:
            if not self.learnable:
                raise V.bad_value("t_max", "expected None: a fixed t is its own bound")
            if isinstance(t_max, bool) or not isinstance(t_max, (int, float)):
                raise V.bad_type("t_max", f"expected a float, got {type(t_max).__name__}")
            t_max = float(V.check_time(float(t_max), name="t_max"))
            if largest is not None and t_max < largest:
                raise V.bad_value("t_max", f"expected t_max >= t = {largest:g}, got {t_max:g}")
            if t_max > math.exp(LOG_T_MAX):
                raise V.bad_value("t_max", f"expected t_max <= 2^100, got {t_max:g}")
        elif self.learnable and largest is not None:
            t_max = min(T_MAX_FACTOR * largest, math.exp(LOG_T_MAX))
        #: the host-side bound the series is planned for (learnable: the clamp of ``t``)
        self.t_max: float | None = t_max if self.learnable else largest
        self._log_t_max = math.log(t_max) if self.learnable and t_max else LOG_T_MAX
        #: a fixed scalar time as a Python float: exact, read once here, never per call
        self._t_host: float | None = (
            largest if not self.learnable and not isinstance(values, list)
            and not (isinstance(values, Tensor) and values.dim() > 0) else None
        )  # fmt: skip
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

    @property
    def certificate(self) -> SeriesCertificate:
        r"""The plan of the series and the truncation bound it guarantees
        (:func:`~heatformer.graph_ops.poisson.series_certificate` of ``tau = t`` and :attr:`tol`).

        ``t`` is the largest time (over heads), or ``t_max`` for a learnable time: every time
        at or below it has a smaller Poisson tail with the same terms. Then, for every signal,

        .. math::

            \max |y - e^{-tL} x| \le \text{bound} \cdot \max |x|,
            \qquad \text{bound} = 1 - (1 - \text{tail})^s \le \text{tol}

        (equality for a constant ``x``; in the 2-norm of each channel for ``"sym"``), on any
        graph with ``"rw"`` or ``"sym"``, and with ``"combinatorial"`` on row-stochastic
        graphs (attention; otherwise ``tau = d_max t``: call ``series_certificate`` with it).
        It holds for every call that runs the series: ``method="series"`` or
        ``"series-dense"``, and ``"auto"`` while :attr:`~heatformer.graph_ops.poisson.
        SeriesCertificate.propagations` is at most ``SERIES_MAX_TERMS`` (beyond, ``"auto"``
        computes ``"exact"``: no truncation). Floating point adds its rounding.

        Raises:
            ValueError: naming ``t``, for an operator without a time (an empty tensor).

        Example:
            >>> op = HeatKernel(t=1.0, tol=1e-6)
            >>> op.certificate.order, f"{op.certificate.bound:.2e}"
            (9, '1.11e-07')
            >>> HeatKernel(t=1.0, tol=1e-10).certificate.order
            12
        """
        if self.t_max is None:
            raise V.bad_value("t", "expected at least one time to plan the series for, got none")
        return series_certificate(min(self.t_max, TAU_CONVERGED), self.tol)  # as the series

    def forward(self, graph: Graph, x: Tensor) -> Tensor:
        self._check(graph, x)
        t: Tensor | float
        if self.learnable:  # exp in the signal's precision (float32 for half), not the param's
            t = self.log_t.to(accumulation_dtype(x.dtype)).clamp(max=self._log_t_max).exp()
        elif self._t_host is not None:
            t = self._t_host  # a fixed scalar time: exact, no tensor arithmetic, no read
        else:
            t = cast(Tensor, self._t)
        # the series is planned for t_max on the host: no read of t per call
        return _heat_kernel(graph, x, t, self.normalization, self.method, self.tol, self.t_max)

    def frequency_response(self, lam: Tensor) -> Tensor:
        t = self.t.to(lam.dtype)
        return torch.exp(-t.reshape(*t.shape, *([1] * lam.dim())) * lam)

    def extra_repr(self) -> str:
        t = self.t.detach()
        ts = f"{float(t):g}" if t.dim() == 0 else str([round(float(v), 4) for v in t])
        bound = f", t_max={self.t_max:g}" if self.learnable and self.t_max is not None else ""
        return (
            f"t={ts}, normalization={self.normalization!r}, method={self.method!r}, "
            f"tol={self.tol:g}, learnable={self.learnable}{bound}"
        )
