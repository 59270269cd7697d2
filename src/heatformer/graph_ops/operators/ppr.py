"""``PersonalizedPageRank(alpha)``: ``alpha (I - (1-alpha) A)^{-1} x``, by a series or a solve."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from heatformer import checks as V
from heatformer.graph_ops._methods import Method, check_method, select_method
from heatformer.graph_ops._precision import accumulation_dtype, full_precision
from heatformer.graph_ops.heat import (
    DENSE_DTYPE,
    EXACT_MAX_NODES,
    SERIES_MAX_TERMS,
    propagation_step,
)
from heatformer.graph_ops.laplacian import GraphLaplacian, adjacency_matrix
from heatformer.graph_ops.operators.base import NormalizedOperator
from heatformer.graph_ops.protocol import Graph

__all__ = ["PPR_METHODS", "PersonalizedPageRank", "ppr_order", "smallest_alpha"]

#: float64's unit roundoff: the relative rounding error of the dense solve is about
#: ``ROUNDOFF / alpha`` (its condition number is about ``2 / alpha``; measured at most
#: ``0.07 ROUNDOFF / alpha`` on graphs of 12 to 2000 nodes)
ROUNDOFF = 2.0**-53


class PersonalizedPageRank(NormalizedOperator):
    r"""Personalized PageRank diffusion ``y = alpha (I - (1 - alpha) A)^{-1} x``.

    ``A`` is the normalized adjacency of ``normalization`` (``D_out^+ W`` for ``"rw"``; see
    :class:`~heatformer.graph_ops.GraphLaplacian`). Two methods
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

    Small ``alpha``: the solve's relative rounding error is about ``2^-53 / alpha``, so
    ``alpha`` below :func:`smallest_alpha` ``= 2^-53 / tol`` (``1.1e-10`` at the default
    ``tol``) is refused rather than answered with an error above ``tol`` (at
    ``alpha = 1e-17``, ``1 - alpha`` is 1 in float64 and the system singular). The limit
    ``alpha -> 0`` is the projection onto the eigenvectors of ``A`` for eigenvalue 1 (``1 pi^T
    x`` for an irreducible walk, ``pi`` its stationary distribution; 0 at a node without
    out-edges); on a graph whose every node has out-edges it equals the limit of the heat
    kernel, ``HeatKernel(t=1e300, normalization=...)``.

    Args:
        alpha: teleport probability in ``[2^-53 / tol, 1)``.
        normalization: ``"rw"``, ``"sym"`` or ``"combinatorial"``.
        tol: accuracy in (0, 1): the series' truncation tolerance, and the rounding error the
            dense solve may reach (which bounds ``alpha`` from below).
        method: ``"auto"``, ``"series"`` or ``"solve"``.

    Raises:
        ValueError: ``alpha`` or ``tol`` outside (0, 1), ``alpha`` below
            :func:`smallest_alpha`, or ``method="series"`` with an ``alpha`` so small that the
            series needs more than ``SERIES_MAX_TERMS`` terms.

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
        floor = smallest_alpha(self.tol)
        if self.alpha < floor:
            raise V.bad_value(
                "alpha",
                f"expected alpha >= {floor:.3g} (2^-53 / tol at tol = {self.tol:g}), got "
                f"{self.alpha:g}: the float64 dense solve, the only method for so small an "
                f"alpha, has a relative rounding error of about 2^-53 / alpha, more than tol"
                f"{' (1 - alpha rounds to 1)' if 1.0 - self.alpha == 1.0 else ''}; a larger "
                f"tol accepts a smaller alpha. The limit alpha -> 0 is the projection onto "
                f"A's eigenvalue-1 eigenvectors (1 pi^T x for an irreducible walk); where "
                f"every node has out-edges, HeatKernel(t=1e300) with the same normalization "
                f"computes it",
            )
        #: propagations of the ``"series"`` method
        self.order = ppr_order(self.alpha, self.tol)
        if self.method == "series":
            reason = _ppr_series_reason(self.alpha, self.tol)
            if reason is not None:
                raise V.bad_value("alpha", f"method 'series' refused: {reason}")

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


def smallest_alpha(tol: float) -> float:
    """The smallest ``alpha`` accepted at ``tol``: ``2^-53 / tol``, where the dense solve's
    relative rounding error (about ``2^-53 / alpha``) reaches ``tol``.

    Example:
        >>> f"{smallest_alpha(1e-6):.3g}"
        '1.11e-10'
    """
    return ROUNDOFF / tol


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
    gen = GraphLaplacian(graph, normalization)
    term, acc = x, alpha * x.to(accumulation_dtype(x.dtype))  # half precision sums in float32
    weight = alpha
    for _ in range(ppr_order(alpha, tol)):
        term = propagation_step(gen.adjacency, term, graph.signal_elements(term))
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
