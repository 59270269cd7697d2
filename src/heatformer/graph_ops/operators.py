r"""Diffusion operators: one contract, ``op(graph, x) -> y``.

Every operator is an :class:`torch.nn.Module` (so it can own parameters such as a learnable
diffusion time) whose ``forward(graph, x)`` maps a signal ``x`` of shape ``(..., N, C)`` on a
:class:`~heatformer.graph_ops.Graph` to ``(..., N, C)``, differentiably in ``x``, in the graph's
tensors (weights, ``q``, ``k``) and in its own parameters. Each also gives its
``frequency_response(lam)``: the factor it applies to an eigenvector of its Laplacian with
eigenvalue ``lam``.

- ``Attention()``: ``D_out^+ W x`` (= ``P x`` on attention); response ``1 - lam``.
- ``Laplacian()``: ``step * L x`` (= ``x - P x``); response ``step * lam``.
- ``HeatKernel(t)``: ``exp(-t L) x``; response ``exp(-t lam)``.
- ``PersonalizedPageRank(alpha)``: ``alpha sum_k (1-alpha)^k A^k x``; response
  ``alpha / (1 - (1-alpha)(1-lam))``.
- ``Polynomial(c)``: ``sum_k c_k L^k x``; response ``sum_k c_k lam^k``.

Strings become operators only through :func:`resolve_operator`.

References:
    Zhang, A. & Papyan, V. (2026). Laplacian heads. arXiv:2602.09297.
    Kondor, R. & Lafferty, J. (2002). Diffusion kernels on graphs. ICML.
    Klicpera, J., Weißenberger, S. & Günnemann, S. (2019). Diffusion improves graph
    learning (GDC). NeurIPS.
    Chamberlain, B. et al. (2021). GRAND: Graph neural diffusion. ICML.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any, ClassVar, cast

import torch
from torch import Tensor, nn

from heatformer.graph_ops import _validation as V
from heatformer.graph_ops._methods import Method, check_method, select_method
from heatformer.graph_ops._precision import accumulation_dtype, full_precision
from heatformer.graph_ops.graphs import Graph
from heatformer.graph_ops.heat import (
    DENSE_DTYPE,
    EXACT_MAX_NODES,
    SERIES_MAX_TERMS,
    check_heat_method,
    heat_kernel,
)
from heatformer.graph_ops.laplacian import GraphGenerator, _check_graph, adjacency_matrix

__all__ = [
    "OPERATORS",
    "PPR_METHODS",
    "Attention",
    "DiffusionOperator",
    "HeatKernel",
    "Laplacian",
    "PersonalizedPageRank",
    "Polynomial",
    "ppr_order",
    "resolve_operator",
]


def _parameter(
    value: float | list[float],
    device: torch.device | str | None,
    dtype: torch.dtype | None,
    *,
    transform: Callable[[float], float] | None = None,
) -> Tensor:
    """A parameter's initial tensor in the factory dtype (default: torch's default dtype),
    rounded once from the float64 ``value`` (optionally ``transform``-ed in float64)."""
    values = value if isinstance(value, list) else [value]
    if transform is not None:
        values = [transform(v) for v in values]
    data = torch.tensor(values, dtype=torch.float64)
    data = data if isinstance(value, list) else data[0]
    return data.to(device=device, dtype=dtype or torch.get_default_dtype())


class DiffusionOperator(nn.Module):
    """Base class: ``forward(graph, x) -> y`` with ``x, y`` of shape ``(..., N, C)``."""

    #: registry name used in head specs such as ``"attention:6,laplacian:2"``.
    name: str = "operator"
    #: constructor keyword arguments worth trying, the defaults first: the docs show them and
    #: the test-suite's combination matrix runs every one (a new operator lists its own).
    examples: ClassVar[tuple[dict[str, Any], ...]] = ({},)

    def forward(self, graph: Graph, x: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def frequency_response(self, lam: Tensor) -> Tensor:  # pragma: no cover - abstract
        """The factor applied to a Laplacian eigenvector with eigenvalue ``lam``."""
        raise NotImplementedError

    def _check(self, graph: Graph, x: Tensor) -> None:
        graph = _check_graph(graph)
        V.check_signal(x, graph.num_nodes, graph.batch_shape, graph.dtype)


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
        return GraphGenerator(graph, "rw").adjacency(x)

    def frequency_response(self, lam: Tensor) -> Tensor:
        return 1.0 - lam


class Laplacian(DiffusionOperator):
    r"""The Laplacian head: ``step * L x``; with ``"rw"`` on attention, ``x - P x``.

    This is the update of Zhang & Papyan (2026), whose Laplacian heads output ``(I - P) V``.

    Args:
        normalization: ``"rw"`` (default), ``"sym"`` or ``"combinatorial"``.
        step: a scale on the output (default 1).
        learnable: make ``step`` a parameter.

    Shape:
        ``x``: ``(..., N, C)`` -> ``(..., N, C)``.

    Example:
        >>> import torch
        >>> from heatformer.graph_ops import DenseGraph
        >>> g = DenseGraph(torch.tensor([[0., 1., 0.], [1., 0., 1.], [0., 1., 0.]]))
        >>> Laplacian()(g, torch.tensor([[1.], [2.], [3.]])).squeeze(-1)
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
        if isinstance(step, bool) or not isinstance(step, (int, float)):
            raise TypeError(f"step: expected a float, got {type(step).__name__}")
        if not math.isfinite(step):
            raise ValueError(f"step: expected a finite value, got {step}")
        self.step: Tensor
        self.learnable = V.check_bool("learnable", learnable)
        if learnable:
            self.step = nn.Parameter(_parameter(float(step), device, dtype))
        else:  # float64, cast to the signal's dtype at use
            value = torch.tensor(float(step), dtype=torch.float64, device=device)
            self.register_buffer("step", value, persistent=False)

    def forward(self, graph: Graph, x: Tensor) -> Tensor:
        self._check(graph, x)
        y = GraphGenerator(graph, self.normalization).laplacian(x)
        if self.learnable or float(self.step) != 1.0:
            y = y * self.step.to(y.dtype)
        return y

    def frequency_response(self, lam: Tensor) -> Tensor:
        return self.step.to(lam.dtype) * lam

    def extra_repr(self) -> str:
        step = float(self.step.detach())
        learnable = ", learnable=True" if self.learnable else ""
        return f"normalization={self.normalization!r}, step={step:g}{learnable}"


class HeatKernel(DiffusionOperator):
    r"""Heat diffusion ``exp(-t L) x``; see :func:`~heatformer.graph_ops.heat_kernel`.

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
                raise TypeError(f"t: expected a list of floats, got an entry {bad[0]!r}")
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
                raise ValueError("t: a learnable t is parametrized as exp(log_t); expected t > 0")
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
            t = self.log_t.to(accumulation_dtype(x.dtype)).exp()
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


class PersonalizedPageRank(DiffusionOperator):
    r"""Personalized PageRank diffusion ``y = alpha (I - (1 - alpha) A)^{-1} x``.

    ``A`` is the normalized adjacency of ``normalization`` (``D_out^+ W`` for ``"rw"``; see
    :class:`~heatformer.graph_ops.laplacian.GraphGenerator`). Two methods
    (:data:`PPR_METHODS`), chosen per call by ``method="auto"``:

    - ``"series"``: ``alpha sum_{k=0}^{K} (1-alpha)^k A^k x`` with ``K`` the smallest order
      whose tail ``(1-alpha)^{K+1}`` is at most ``tol`` (:attr:`order` propagations, about
      ``ln(1/tol) / alpha``); refused beyond ``SERIES_MAX_TERMS`` propagations.
    - ``"solve"``: a dense solve of ``(I - (1-alpha) A) y = alpha x``: ``O(N^3)``, whatever
      ``alpha``; refused for ``N > EXACT_MAX_NODES``.

    A small ``alpha`` on a large graph is refused with a message that states the cost.

    Dangling nodes: a node without out-edges (e.g. a fully masked attention row) has a zero
    row of ``A``, so the walk loses the mass that reaches it and ``y_i = alpha x_i`` there.
    NetworkX's :func:`~networkx.pagerank` instead redistributes a dangling node's mass
    (``dangling=``); heatformer does not.

    Precision: float16/bfloat16 signals accumulate the series in float32; the dense solve
    runs in float64 for every input dtype (its condition number grows as ``1/alpha``); the
    result has the input dtype.

    Args:
        alpha: teleport probability in (0, 1).
        normalization: ``"rw"``, ``"sym"`` or ``"combinatorial"``.
        tol: truncation tolerance of the series in (0, 1).
        method: ``"auto"``, ``"series"`` or ``"solve"``.

    Raises:
        ValueError: ``alpha`` or ``tol`` outside (0, 1), or ``method="series"`` with an
            ``alpha`` so small that the series needs more than ``SERIES_MAX_TERMS`` terms.

    Example:
        >>> import torch
        >>> from heatformer.graph_ops import DenseGraph
        >>> g = DenseGraph(torch.tensor([[0., 1.], [1., 0.]], dtype=torch.float64))
        >>> x = torch.tensor([[1.], [0.]], dtype=torch.float64)
        >>> PersonalizedPageRank(alpha=0.5)(g, x).squeeze(-1)   # 0.5 (I - 0.5 A)^{-1} e_0
        tensor([0.6667, 0.3333], dtype=torch.float64)
        >>> PersonalizedPageRank(alpha=1e-9).order > SERIES_MAX_TERMS   # auto: dense solve
        True
    """

    name = "ppr"
    examples = (
        {},
        {"alpha": 0.5, "normalization": "sym"},
        {"alpha": 0.05, "normalization": "combinatorial"},
        {"alpha": 1e-6},  # beyond the series: the dense solve
    )

    def __init__(
        self,
        alpha: float = 0.15,
        normalization: str = "rw",
        tol: float = 1e-6,
        method: str = "auto",
    ) -> None:
        super().__init__()
        self.alpha = V.check_open_unit("alpha", alpha)
        self.normalization = V.check_normalization(normalization)
        self.tol = V.check_tol(tol)
        self.method = check_method(method, PPR_METHODS)
        #: propagations of the ``"series"`` method
        self.order = ppr_order(self.alpha, self.tol)
        if self.method == "series":
            reason = _ppr_series_reason(self.alpha, self.tol)
            if reason is not None:
                raise ValueError(f"alpha: method 'series' refused: {reason}")

    def forward(self, graph: Graph, x: Tensor) -> Tensor:
        self._check(graph, x)
        chosen = select_method(
            PPR_METHODS, self.method, "personalized-PageRank", graph, self.alpha,
            self.normalization, self.tol,
        )  # fmt: skip
        y: Tensor = chosen.compute(graph, x, self.alpha, self.normalization, self.tol)
        return y

    def frequency_response(self, lam: Tensor, *, scale: float | Tensor = 1.0) -> Tensor:
        """Response at eigenvalue ``lam`` of the Laplacian ``L = scale (I - A)``.

        ``scale`` is 1 for ``"rw"``/``"sym"`` and the graph's largest out-degree for
        ``"combinatorial"`` (``A = I - L / d_max``).
        """
        return self.alpha / (1.0 - (1.0 - self.alpha) * (1.0 - lam / scale))

    def extra_repr(self) -> str:
        return (
            f"alpha={self.alpha:g}, normalization={self.normalization!r}, tol={self.tol:g}, "
            f"method={self.method!r}, order={self.order}"
        )


def ppr_order(alpha: float, tol: float) -> int:
    """Smallest ``K`` with ``(1 - alpha)^{K+1} <= tol``: the series' propagations.

    Example:
        >>> ppr_order(0.15, 1e-6), ppr_order(0.5, 0.25)
        (85, 1)
    """
    return max(0, math.ceil(math.log(tol) / math.log1p(-alpha)) - 1)


def _ppr_series_reason(alpha: float, tol: float) -> str | None:
    order = ppr_order(alpha, tol)
    if order <= SERIES_MAX_TERMS:
        return None
    smallest = -math.expm1(math.log(tol) / (SERIES_MAX_TERMS + 1))
    return (
        f"needs {order} propagations (about ln(1/tol)/alpha for alpha={alpha:g}, tol={tol:g}), "
        f"more than SERIES_MAX_TERMS = {SERIES_MAX_TERMS}; alpha >= {smallest:.3g} stays under "
        f"it at this tol"
    )


def _ppr_series(graph: Graph, x: Tensor, alpha: float, normalization: str, tol: float) -> Tensor:
    gen = GraphGenerator(graph, normalization)
    term, acc = x, alpha * x.to(accumulation_dtype(x.dtype))  # half precision sums in float32
    weight = alpha
    for _ in range(ppr_order(alpha, tol)):
        term = gen.adjacency(term)
        weight *= 1.0 - alpha
        acc = torch.add(acc, term, alpha=weight)
    return acc.to(x.dtype)


def _ppr_series_refuse(graph: Graph, alpha: float, normalization: str, tol: float) -> str | None:
    return _ppr_series_reason(alpha, tol)


def _ppr_solve(graph: Graph, x: Tensor, alpha: float, normalization: str, tol: float) -> Tensor:
    # float64 whatever the input: the system's condition number grows as 1/alpha, and a row
    # sum of A rounded to 1 + 1e-7 > alpha would flip its smallest eigenvalue's sign
    with full_precision(x.device.type):
        a = adjacency_matrix(graph.to(DENSE_DTYPE), normalization)  # (..., N, N)
        eye = torch.eye(graph.num_nodes, dtype=DENSE_DTYPE, device=a.device)
        y = alpha * torch.linalg.solve(eye - (1.0 - alpha) * a, x.to(DENSE_DTYPE))
    return y.to(x.dtype)


def _ppr_solve_refuse(graph: Graph, alpha: float, normalization: str, tol: float) -> str | None:
    if graph.num_nodes > EXACT_MAX_NODES:
        return (
            f"forms the dense N x N adjacency and costs O(N^3); N = {graph.num_nodes} > "
            f"EXACT_MAX_NODES = {EXACT_MAX_NODES}"
        )
    return None


#: The ways to compute personalized PageRank, in the order ``method="auto"`` tries them.
PPR_METHODS: dict[str, Method] = {
    "series": Method(
        "series", _ppr_series, _ppr_series_refuse,
        "truncated series alpha sum (1-alpha)^k A^k x; about ln(1/tol)/alpha propagations",
    ),
    "solve": Method(
        "solve", _ppr_solve, _ppr_solve_refuse,
        "dense solve of (I - (1-alpha) A) y = alpha x; O(N^3), small graphs, any alpha",
    ),
}  # fmt: skip


class Polynomial(DiffusionOperator):
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

    def forward(self, graph: Graph, x: Tensor) -> Tensor:
        self._check(graph, x)
        gen = GraphGenerator(graph, self.normalization)
        acc = accumulation_dtype(x.dtype)  # half precision: Horner's sums in float32
        c = self.coeffs.to(dtype=acc, device=x.device)
        xa = x.to(acc)
        y = c[-1] * xa
        for k in range(c.numel() - 2, -1, -1):
            y = gen.laplacian(y.to(x.dtype)).to(acc) + c[k] * xa
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


#: name -> operator class; the one place strings become operators.
OPERATORS: dict[str, type[DiffusionOperator]] = {
    "attention": Attention,
    "laplacian": Laplacian,
    "heat": HeatKernel,
    "ppr": PersonalizedPageRank,
    "polynomial": Polynomial,
}
_ALIASES = {"pagerank": "ppr", "personalized_pagerank": "ppr", "poly": "polynomial"}


def resolve_operator(
    name: str | DiffusionOperator,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    **kwargs: Any,
) -> DiffusionOperator:
    """Turn a name (and keyword arguments) into an operator; an operator passes through.

    Args:
        name: one of ``"attention"``, ``"laplacian"``, ``"heat"``, ``"ppr"`` (alias
            ``"pagerank"``), ``"polynomial"``; case-insensitive.
        device, dtype: factory kwargs for operators with parameters (a learnable ``t`` is
            created in ``dtype`` directly, never rounded through float32 first).
        **kwargs: the operator's constructor arguments, e.g. ``t=2.0``.

    Raises:
        ValueError: unknown name (the message lists the valid names).
        TypeError: ``name`` of the wrong type, or keyword arguments the operator does not take.

    Example:
        >>> resolve_operator("heat", t=2.0)
        HeatKernel(t=2, normalization='rw', method='auto', tol=1e-06, learnable=False)
    """
    if isinstance(name, DiffusionOperator):
        if kwargs:
            raise TypeError("kwargs: an operator instance was given; it takes no keyword arguments")
        return name
    if not isinstance(name, str):
        raise TypeError(f"name: expected an operator name or instance, got {type(name).__name__}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in OPERATORS:
        raise ValueError(
            f"name: unknown operator {name!r}; expected one of {sorted(OPERATORS)} "
            f"(aliases: {sorted(_ALIASES)})"
        )
    factory = OPERATORS[key]
    signature = inspect.signature(factory).parameters
    accepted = [p for p in signature if p not in _FACTORY_KWARGS]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise TypeError(f"{key}: unknown parameter(s) {unknown}; expected some of {accepted}")
    factory_kwargs = {
        k: v for k, v in (("device", device), ("dtype", dtype)) if v is not None and k in signature
    }
    try:
        return factory(**kwargs, **factory_kwargs)
    except TypeError as err:
        raise TypeError(f"{key}: {err}") from None


#: constructor arguments that are not operator parameters (never written in a head spec)
_FACTORY_KWARGS = ("device", "dtype")
