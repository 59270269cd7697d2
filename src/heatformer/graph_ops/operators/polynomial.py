r"""``Polynomial(c)``: a polynomial filter ``sum_k c_k L^k x``, or ``sum_k c_k A^k x`` (Horner's
scheme), learnable, optionally started at personalized PageRank's coefficients.

In the adjacency basis with ``init="ppr"`` it is the GPR-GNN filter (Chien et al., 2021), the
polynomial heads of ParaFormer-style models: :math:`\sum_{k=0}^{K} \gamma_k A^k x` with
:math:`\gamma_k` starting at :math:`\alpha (1 - \alpha)^k`, the truncated personalized
PageRank series, and learned from there (signs free: a low-pass start that may turn
high-pass).

References:
    Chien, E., Peng, J., Li, P. & Milenkovic, O. (2021). Adaptive universal generalized
    PageRank graph neural network (GPR-GNN). ICLR.
    Klicpera, J., Bojchevski, A. & Günnemann, S. (2019). Predict then propagate (APPNP). ICLR.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from heatformer import checks as V
from heatformer.graph_ops._precision import accumulation_dtype
from heatformer.graph_ops.heat import propagation_step
from heatformer.graph_ops.laplacian import GraphLaplacian
from heatformer.graph_ops.operators.base import NormalizedOperator, _parameter
from heatformer.graph_ops.protocol import Graph

__all__ = ["POLYNOMIAL_BASES", "POLYNOMIAL_INITS", "Polynomial", "ppr_coefficients"]

#: the bases of a polynomial filter: powers of the Laplacian ``L`` or of the normalized
#: adjacency ``A = I - L / c`` (``c = 1`` but for ``"combinatorial"``)
POLYNOMIAL_BASES = ("laplacian", "adjacency")
#: the named starts of the coefficients (``init=``)
POLYNOMIAL_INITS = ("ppr",)
#: ``init="ppr"``'s defaults (GPR-GNN's): teleport probability and order
PPR_INIT_ALPHA, PPR_INIT_ORDER = 0.1, 10


def ppr_coefficients(alpha: float, order: int) -> list[float]:
    """Personalized PageRank's series coefficients ``alpha (1 - alpha)^k``, ``k = 0 .. order``.

    Example:
        >>> ppr_coefficients(0.5, 2)
        [0.5, 0.25, 0.125]
    """
    return [alpha * (1.0 - alpha) ** k for k in range(order + 1)]


class Polynomial(NormalizedOperator):
    r"""A polynomial filter (Horner's scheme: ``K`` propagations), in one of two bases:

    .. math::

        \text{laplacian: } \sum_{k=0}^{K} c_k L^k x, \qquad
        \text{adjacency: } \sum_{k=0}^{K} c_k A^k x

    with ``A`` the normalized adjacency (:class:`~heatformer.graph_ops.GraphLaplacian`):
    ``D_out^+ W`` for ``"rw"`` (``P`` on attention), ``D^{+1/2} W_s D^{+1/2}`` for ``"sym"``,
    ``I - L / c`` for ``"combinatorial"`` (``c`` the largest out-degree). ``Polynomial([1, -1])`` is
    :class:`Attention` and ``Polynomial([0, 1])`` is :class:`Laplacian` (both with ``"rw"`` on
    an attention graph); ``Polynomial([0, 1], basis="adjacency")`` is :class:`Attention` too.

    ``init="ppr"`` starts the coefficients at personalized PageRank's truncated series,
    ``c_k = alpha (1 - alpha)^k`` for ``k = 0 .. order`` in the adjacency basis
    (:func:`ppr_coefficients`; GPR-GNN's start), so the filter starts as
    :class:`PersonalizedPageRank` cut after ``order`` propagations and, with
    ``learnable=True``, learns from there (spec: ``polynomial[init=ppr,alpha=0.2,order=8,
    learnable=true]``). Its response :math:`\sum_k c_k (1 - \lambda)^k` is low-pass at the
    start (all ``c_k > 0``: largest at ``lam = 0``) and may turn high-pass as it learns
    (alternating signs: largest at ``lam = 2``).

    Args:
        coeffs: ``c_0, ..., c_K`` (default ``(1, -1)``); not with ``init``.
        normalization: ``"rw"``, ``"sym"`` or ``"combinatorial"``.
        learnable: make the coefficients a parameter.
        basis: ``"laplacian"`` (powers of ``L``) or ``"adjacency"`` (powers of ``A``); the
            default is ``"adjacency"`` with ``init="ppr"``, else ``"laplacian"``.
        init: ``"ppr"``: the coefficients ``alpha (1 - alpha)^k`` (adjacency basis only);
            None: ``coeffs``.
        alpha: ``init="ppr"``'s teleport probability in (0, 1) (default 0.1).
        order: ``init="ppr"``'s highest power ``K >= 0`` (default 10).

    Raises:
        ValueError: naming the argument: ``coeffs`` together with ``init``; ``alpha`` or
            ``order`` without ``init="ppr"``; ``init="ppr"`` with ``basis="laplacian"``;
            values out of range.
        TypeError: naming the argument, for a value of the wrong type.

    Example:
        >>> import torch
        >>> from heatformer.graph_ops import DenseGraph
        >>> g = DenseGraph(torch.tensor([[0., 1., 0.], [1., 0., 1.], [0., 1., 0.]]))
        >>> Polynomial([1.0, -1.0])(g, torch.tensor([[1.], [2.], [3.]])).squeeze(-1)
        tensor([2., 2., 2.])
        >>> Polynomial(init="ppr", alpha=0.5, order=2).coeffs.tolist()  # 0.5 * 0.5^k
        [0.5, 0.25, 0.125]
    """

    name = "polynomial"
    examples = (
        {},
        {"coeffs": [0.5, -1.0, 0.25], "normalization": "sym"},
        {"coeffs": [0.0, 1.0, -0.5], "learnable": True},
        {"init": "ppr", "alpha": 0.2, "order": 8, "learnable": True},
    )

    def __init__(
        self,
        coeffs: list[float] | tuple[float, ...] | Tensor | None = None,
        normalization: str = "rw",
        learnable: bool = False,
        basis: str | None = None,
        init: str | None = None,
        alpha: float | None = None,
        order: int | None = None,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.init = None if init is None else V.check_choice("init", init, POLYNOMIAL_INITS)
        values: list[float] | Tensor
        if self.init == "ppr":
            if coeffs is not None:
                raise V.bad_value(
                    "coeffs",
                    "expected no coeffs with init='ppr' (it sets them to alpha (1 - alpha)^k), "
                    f"got {coeffs!r}",
                )
            self.alpha = V.check_open_unit("alpha", PPR_INIT_ALPHA if alpha is None else alpha)
            self.order = _check_order(PPR_INIT_ORDER if order is None else order)
            values = ppr_coefficients(self.alpha, self.order)
        else:
            for name, start in (("alpha", alpha), ("order", order)):
                if start is not None:
                    raise V.bad_value(
                        name, f"expected {name} only with init='ppr' (its start), got {start!r}"
                    )
            values = V.check_coeffs((1.0, -1.0) if coeffs is None else coeffs)
        default_basis = "adjacency" if self.init == "ppr" else "laplacian"
        self.basis = V.check_choice(
            "basis", default_basis if basis is None else basis, POLYNOMIAL_BASES
        )
        if self.init == "ppr" and self.basis != "adjacency":
            raise V.bad_value(
                "basis",
                "expected basis='adjacency' with init='ppr' (alpha (1 - alpha)^k are the "
                f"coefficients of A^k), got {self.basis!r}",
            )
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
        step = gen.laplacian if self.basis == "laplacian" else gen.adjacency
        acc = accumulation_dtype(x.dtype)  # half precision: Horner's sums in float32
        self._checked_in("coeffs", acc)  # once per dtype: 1e39 is inf in float32
        c = self.coeffs.to(dtype=acc, device=x.device)
        xa = x.to(acc)
        y = c[-1] * xa
        elements = graph.signal_elements(x)  # the same choice on every rank of a split graph
        for k in range(c.numel() - 2, -1, -1):
            y = propagation_step(step, y.to(x.dtype), elements).to(acc) + c[k] * xa
        return y.to(x.dtype)

    def polynomial_coefficients(self) -> tuple[Tensor, str]:
        """``(coeffs, basis)``: the coefficients ``c_0 .. c_K`` (the parameter when learnable)
        and the basis they multiply powers of."""
        return self.coeffs, self.basis

    def frequency_response(self, lam: Tensor, *, scale: float | Tensor = 1.0) -> Tensor:
        """Response at eigenvalue ``lam`` of the Laplacian ``L``: ``sum_k c_k lam^k``, or
        ``sum_k c_k (1 - lam / scale)^k`` in the adjacency basis (``scale``: 1 for
        ``"rw"``/``"sym"``, the graph's largest out-degree for ``"combinatorial"``)."""
        c = self.coeffs.to(lam.dtype)
        z = lam if self.basis == "laplacian" else 1.0 - lam / scale
        y = torch.zeros_like(z) + c[-1]
        for k in range(c.numel() - 2, -1, -1):
            y = y * z + c[k]
        return y

    def gains(self) -> tuple[float, float]:
        """``(h(0), h(2))``: the response to the smoothest signal (``lam = 0``, the constant on
        an attention graph) and to the roughest (``lam = 2``, eigenvalue ``-1`` of ``A``), the
        ends of the real spectrum of a ``"rw"`` or ``"sym"`` Laplacian; in the adjacency basis
        ``sum_k c_k`` and ``sum_k (-1)^k c_k``. Read once, on the host (for reports).

        Example:
            >>> Polynomial(init="ppr", alpha=0.5, order=2).gains()  # 0.5 + 0.25 + 0.125
            (0.875, 0.375)
        """
        with torch.no_grad():
            h = self.frequency_response(torch.tensor([0.0, 2.0], dtype=torch.float64))
        return float(h[0]), float(h[1])

    @property
    def passband(self) -> str:
        """``"low-pass"`` when ``|h(0)| >= |h(2)|`` (:meth:`gains`), else ``"high-pass"``:
        GPR-GNN's reading of learned coefficients (all positive: low-pass; alternating signs:
        high-pass). A PageRank start is low-pass.

        Example:
            >>> Polynomial(init="ppr").passband, Polynomial([0.0, 1.0]).passband  # L: high
            ('low-pass', 'high-pass')
        """
        low, high = self.gains()
        return "low-pass" if abs(low) >= abs(high) else "high-pass"

    def extra_repr(self) -> str:
        coeffs = [round(float(v), 4) for v in self.coeffs.detach()]
        start = f", init='ppr', alpha={self.alpha:g}, order={self.order}" if self.init else ""
        basis = f", basis={self.basis!r}" if self.basis != "laplacian" else ""
        learnable = ", learnable=True" if self.learnable else ""
        return f"coeffs={coeffs}, normalization={self.normalization!r}{basis}{start}{learnable}"


def _check_order(order: object) -> int:
    """A polynomial's highest power: an int ``>= 0`` (TypeError / ValueError naming ``order``)."""
    if isinstance(order, bool) or not isinstance(order, int):
        raise V.bad_type("order", f"expected an int >= 0, got {type(order).__name__}")
    if order < 0:
        raise V.bad_value("order", f"expected an int >= 0, got {order}")
    return order
