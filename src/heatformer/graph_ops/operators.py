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
from typing import Any, cast

import torch
from torch import Tensor, nn

from heatformer.graph_ops import _validation as V
from heatformer.graph_ops.graphs import Graph
from heatformer.graph_ops.heat import check_heat_method, heat_kernel
from heatformer.graph_ops.laplacian import GraphGenerator, _check_graph

__all__ = [
    "OPERATORS",
    "Attention",
    "DiffusionOperator",
    "HeatKernel",
    "Laplacian",
    "PersonalizedPageRank",
    "Polynomial",
    "resolve_operator",
]


class DiffusionOperator(nn.Module):
    """Base class: ``forward(graph, x) -> y`` with ``x, y`` of shape ``(..., N, C)``."""

    #: registry name used in head specs such as ``"attention:6,laplacian:2"``.
    name: str = "operator"

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

    def __init__(
        self, normalization: str = "rw", *, step: float = 1.0, learnable: bool = False
    ) -> None:
        super().__init__()
        self.normalization = V.check_normalization(normalization)
        if isinstance(step, bool) or not isinstance(step, (int, float)):
            raise TypeError(f"step: expected a float, got {type(step).__name__}")
        if not math.isfinite(step):
            raise ValueError(f"step: expected a finite value, got {step}")
        self.step: Tensor
        self.learnable = bool(learnable)
        if learnable:
            self.step = nn.Parameter(torch.tensor(float(step)))
        else:  # float64, cast to the signal's dtype at use
            value = torch.tensor(float(step), dtype=torch.float64)
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
        return f"normalization={self.normalization!r}, step={float(self.step):g}"


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

    def __init__(
        self,
        t: float | list[float] | Tensor = 1.0,
        normalization: str = "rw",
        method: str = "auto",
        tol: float = 1e-6,
        learnable: bool = False,
    ) -> None:
        super().__init__()
        given_tensor = isinstance(t, Tensor)
        if isinstance(t, (list, tuple)):
            bad = [v for v in t if isinstance(v, bool) or not isinstance(v, (int, float))]
            if bad:
                raise TypeError(f"t: expected a list of floats, got an entry {bad[0]!r}")
            t = torch.tensor([float(v) for v in t], dtype=torch.float64)
        t = V.check_time(t)
        self.normalization = V.check_normalization(normalization)
        self.method = check_heat_method(method)
        self.tol = V.check_tol(tol)
        # a float or list keeps float64 precision; a tensor keeps its dtype
        t_tensor = torch.as_tensor(t, dtype=None if given_tensor else torch.float64)
        t_tensor = t_tensor.detach().clone()
        self.learnable = bool(learnable)
        if self.learnable:
            if bool((t_tensor <= 0).any()):
                raise ValueError("t: a learnable t is parametrized as exp(log_t); expected t > 0")
            if not given_tensor:
                t_tensor = t_tensor.to(torch.get_default_dtype())
            self.log_t = nn.Parameter(t_tensor.log())
        else:
            self.register_buffer("_t", t_tensor, persistent=False)

    @property
    def t(self) -> Tensor:
        """The diffusion time(s)."""
        if self.learnable:
            return self.log_t.exp()
        return cast(Tensor, self._t)

    def forward(self, graph: Graph, x: Tensor) -> Tensor:
        self._check(graph, x)
        t: Tensor | float = self.t
        if isinstance(t, Tensor):
            t = float(t) if (t.dim() == 0 and not self.learnable) else t.to(x.dtype)
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
    r"""Personalized PageRank diffusion ``alpha (I - (1 - alpha) A)^{-1} x``.

    Computed as the truncated series ``alpha sum_{k=0}^{K} (1-alpha)^k A^k x`` with ``K`` the
    smallest order whose tail ``(1-alpha)^{K+1}`` is at most ``tol``. ``A`` is the normalized
    adjacency of ``normalization`` (``D_out^+ W`` for ``"rw"``; see
    :class:`~heatformer.graph_ops.laplacian.GraphGenerator`).

    Args:
        alpha: teleport probability in (0, 1).
        normalization: ``"rw"``, ``"sym"`` or ``"combinatorial"``.
        tol: truncation tolerance in (0, 1).

    Example:
        >>> import torch
        >>> from heatformer.graph_ops import DenseGraph
        >>> g = DenseGraph(torch.tensor([[0., 1.], [1., 0.]], dtype=torch.float64))
        >>> x = torch.tensor([[1.], [0.]], dtype=torch.float64)
        >>> PersonalizedPageRank(alpha=0.5)(g, x).squeeze(-1)   # 0.5 (I - 0.5 A)^{-1} e_0
        tensor([0.6667, 0.3333], dtype=torch.float64)
    """

    name = "ppr"

    def __init__(self, alpha: float = 0.15, normalization: str = "rw", tol: float = 1e-6) -> None:
        super().__init__()
        self.alpha = V.check_open_unit("alpha", alpha)
        self.normalization = V.check_normalization(normalization)
        self.tol = V.check_tol(tol)
        self.order = max(0, math.ceil(math.log(self.tol) / math.log(1.0 - self.alpha)) - 1)

    def forward(self, graph: Graph, x: Tensor) -> Tensor:
        self._check(graph, x)
        gen = GraphGenerator(graph, self.normalization)
        term, acc = x, self.alpha * x
        weight = self.alpha
        for _ in range(self.order):
            term = gen.adjacency(term)
            weight *= 1.0 - self.alpha
            acc = acc + weight * term
        return acc

    def frequency_response(self, lam: Tensor, *, scale: float | Tensor = 1.0) -> Tensor:
        """Response at eigenvalue ``lam`` of the Laplacian ``L = scale (I - A)``.

        ``scale`` is 1 for ``"rw"``/``"sym"`` and the graph's largest out-degree for
        ``"combinatorial"`` (``A = I - L / d_max``).
        """
        return self.alpha / (1.0 - (1.0 - self.alpha) * (1.0 - lam / scale))

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:g}, normalization={self.normalization!r}, order={self.order}"


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

    def __init__(
        self,
        coeffs: list[float] | tuple[float, ...] | Tensor = (1.0, -1.0),
        normalization: str = "rw",
        learnable: bool = False,
    ) -> None:
        super().__init__()
        c = V.check_coeffs(coeffs).detach().clone()
        self.normalization = V.check_normalization(normalization)
        self.coeffs: Tensor
        if learnable:
            self.coeffs = nn.Parameter(c)
        else:
            self.register_buffer("coeffs", c, persistent=False)

    def forward(self, graph: Graph, x: Tensor) -> Tensor:
        self._check(graph, x)
        gen = GraphGenerator(graph, self.normalization)
        c = self.coeffs.to(dtype=x.dtype, device=x.device)
        y = c[-1] * x
        for k in range(c.numel() - 2, -1, -1):
            y = gen.laplacian(y) + c[k] * x
        return y

    def frequency_response(self, lam: Tensor) -> Tensor:
        c = self.coeffs.to(lam.dtype)
        y = torch.zeros_like(lam) + c[-1]
        for k in range(c.numel() - 2, -1, -1):
            y = y * lam + c[k]
        return y

    def extra_repr(self) -> str:
        coeffs = [round(float(v), 4) for v in self.coeffs]
        return f"coeffs={coeffs}, normalization={self.normalization!r}"


#: name -> operator class; the one place strings become operators.
OPERATORS: dict[str, type[DiffusionOperator]] = {
    "attention": Attention,
    "laplacian": Laplacian,
    "heat": HeatKernel,
    "ppr": PersonalizedPageRank,
    "polynomial": Polynomial,
}
_ALIASES = {"pagerank": "ppr", "personalized_pagerank": "ppr", "poly": "polynomial"}


def resolve_operator(name: str | DiffusionOperator, **kwargs: Any) -> DiffusionOperator:
    """Turn a name (and keyword arguments) into an operator; an operator passes through.

    Args:
        name: one of ``"attention"``, ``"laplacian"``, ``"heat"``, ``"ppr"`` (alias
            ``"pagerank"``), ``"polynomial"``; case-insensitive.
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
    accepted = list(inspect.signature(factory).parameters)
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise TypeError(f"{key}: unknown parameter(s) {unknown}; expected some of {accepted}")
    try:
        return factory(**kwargs)
    except TypeError as err:
        raise TypeError(f"{key}: {err}") from None
