r"""``UntiedSkip()``: an attention head with its own per-token path, ``P x + I' x W_S``.

A Laplacian head outputs ``(I - P) V``; through the layer's output projection ``W_O`` that is

.. math:: (V - P V) W_O = P V (-W_O) + V W_O,

an attention path ``P V`` with the output map ``-W_O`` plus a per-token path ``V`` whose output
map is tied to minus the attention path's. The untied skip head learns that per-token map:

.. math:: \mathrm{skip}(G, V)_h = P_h V_h + I' V_h W_{S,h}
          \quad\Longrightarrow\quad \text{layer output } (P V + V W_S) W_O,

one ``(Dh, Dh)`` matrix ``W_{S,h}`` per head, applied to the head's values before the output
projection (``I'`` keeps the nodes with out-edges, as the Laplacian head has it). With
``W_S = 0`` it is exactly an attention head; with ``W_S = -I`` it is ``P V - V = -(I - P) V``,
the Laplacian head with its output projection negated (which ``W_O`` learns as freely), so
the family holds both and a comparison of ``skip`` heads with ``laplacian`` heads tells
"subtracting the attention average with a tied sign" from "any learned per-token path" (the
control of issue 25). The weight starts at ``init * I`` (default 0: a plain attention head).

``W_S`` has one matrix per head that the operator serves, so its shape is the layer's: a
layer (:class:`~heatformer.models.routing.HeadRouter`) calls :meth:`shape_parameters` with the
heads and their width when it is built (before any optimizer sees the parameter). Standalone,
pass ``heads`` and ``dim``; an operator without a shape computes ``P x + init I' x`` (its value
at initialization) and has no parameter to learn.

The output reads ``P`` once and is not affine in ``P v`` with scalar coefficients (``W_S``
mixes channels), so it builds its own graph (no fused SDPA path, no KV cache); it reads only
the keys a query may attend (allowed in causal layers).

References:
    Zhang, A. & Papyan, V. (2026). Laplacian heads. arXiv:2602.09297.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from heatformer import checks as V
from heatformer.graph_ops.laplacian import GraphLaplacian
from heatformer.graph_ops.operators.base import DiffusionOperator
from heatformer.graph_ops.protocol import Graph

__all__ = ["UntiedSkip"]


class UntiedSkip(DiffusionOperator):
    r"""Attention plus an untied per-token path: ``P x + I' x W_S``, one ``W_S`` per head.

    Args:
        init: ``W_S`` starts as ``init * I`` (default 0: exactly an attention head; ``-1``:
            minus the Laplacian head ``(I - P) x``).
        heads, dim: the shape of ``W_S``, ``(heads, dim, dim)``, made now (both or neither);
            a layer gives it otherwise (:meth:`shape_parameters`).

    Attributes:
        skip_weight: ``(heads, C, C)`` parameter (None until shaped); head ``h`` of the heads
            the operator serves (in their order) maps its values by ``skip_weight[h]``.

    Shape:
        ``x``: ``(..., heads, N, C)`` -> ``(..., heads, N, C)`` (any ``(..., N, C)`` for one
        head or no shape).

    Equivalent to::

        P = graph.to_dense()                       # rows sum to 1 (0 with no keys)
        has = P.sum(-1, keepdim=True) > 0          # I'
        P @ x + has * (x @ skip_weight)            # skip_weight (H, C, C) against x (B, H, N, C)

    Example:
        >>> import torch
        >>> from heatformer.graph_ops import Attention, DenseGraph
        >>> g = DenseGraph(torch.tensor([[0., 1., 0.], [1., 0., 1.], [0., 1., 0.]]))
        >>> x = torch.tensor([[1.], [2.], [3.]])
        >>> torch.equal(UntiedSkip(heads=1, dim=1)(g, x), Attention()(g, x))
        True
        >>> UntiedSkip(init=-1.0)(g, x).squeeze(-1)     # P x - x: minus the Laplacian head
        tensor([ 1.,  0., -1.])
    """

    name = "skip"
    examples = ({}, {"init": -1.0}, {"init": 0.5})

    def __init__(
        self,
        *,
        init: float = 0.0,
        heads: int | None = None,
        dim: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if isinstance(init, bool) or not isinstance(init, (int, float)):
            raise V.bad_type("init", f"expected a float, got {type(init).__name__}")
        if not math.isfinite(init):
            raise V.bad_value("init", f"expected a finite value, got {init}")
        self.init = float(init)
        V.check_positive_int("heads", heads, optional=True)
        V.check_positive_int("dim", dim, optional=True)
        if (heads is None) != (dim is None):
            raise V.bad_value("dim", f"expected heads and dim together, got {heads=}, {dim=}")
        self._device, self._dtype = device, dtype  # the factory kwargs, for shape_parameters
        self.skip_weight: nn.Parameter | None
        self.register_parameter("skip_weight", None)
        if heads is not None and dim is not None:
            self.shape_parameters(heads, dim)

    @property
    def needs_shape(self) -> bool:
        return self.skip_weight is None

    def shape_parameters(self, heads: int, channels: int) -> None:
        """Make ``skip_weight`` ``(heads, channels, channels) = init * I`` (kept when it has
        that shape already)."""
        V.check_positive_int("heads", heads)
        V.check_positive_int("channels", channels)
        if self.skip_weight is not None:
            if tuple(self.skip_weight.shape) != (heads, channels, channels):
                raise V.bad_value(
                    "heads",
                    f"expected the shape this skip weight has, {tuple(self.skip_weight.shape)}, "
                    f"got {heads} heads of width {channels} (one instance shared by layers of "
                    "different shapes)",
                )
            return
        dtype = self._dtype or torch.get_default_dtype()
        weight = torch.empty(heads, channels, channels, device=self._device, dtype=dtype)
        self.skip_weight = nn.Parameter(weight)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``skip_weight = init * I`` for every head."""
        if self.skip_weight is None:
            return
        with torch.no_grad():
            eye = torch.eye(self.skip_weight.shape[-1], device=self.skip_weight.device)
            self.skip_weight.copy_((self.init * eye).expand_as(self.skip_weight))

    def learned_weight(self) -> tuple[Tensor, Tensor] | None:
        """``(skip_weight, init * I)`` per head (None before the weight has its shape): how
        far ``W_S`` moved from its start (:func:`~heatformer.analysis.weight_drift`)."""
        weight = self.skip_weight
        if weight is None:
            return None
        eye = torch.eye(weight.shape[-1], device=weight.device, dtype=weight.dtype)
        return weight, (self.init * eye).expand_as(weight).clone()

    def forward(self, graph: Graph, x: Tensor) -> Tensor:
        self._check(graph, x)
        walk = GraphLaplacian(graph, "rw")
        pv = walk.adjacency(x)  # P x
        weight = self.skip_weight
        if weight is None:  # no shape: the value at initialization, W_S = init I
            return pv if self.init == 0.0 else pv + walk.identity(x) * self.init
        return pv + walk.identity(self._per_token(x, weight))

    def _per_token(self, x: Tensor, weight: Tensor) -> Tensor:
        """``x W_S``: head ``h`` (dim ``-3`` of ``x``) by ``weight[h]``, in ``x``'s dtype."""
        heads, channels = int(weight.shape[0]), int(weight.shape[-1])
        if x.shape[-1] != channels:
            raise V.bad_value(
                "x", f"expected {channels} channels (the skip weight's), got {tuple(x.shape)}"
            )
        if heads == 1:
            return x @ weight[0].to(x.dtype)
        if x.dim() < 3 or x.shape[-3] != heads:
            raise V.bad_value(
                "x", f"expected {heads} heads at dim -3 (the skip weight's), got {tuple(x.shape)}"
            )
        return torch.matmul(x, weight.to(x.dtype))  # (..., h, N, C) @ (h, C, C)

    def token_map(self, graph: Graph, x: Tensor) -> Tensor:
        """``P x + c I' x`` for ``x`` of any width, ``c = tr(W_S) / C`` per head: the mean over
        the channels of the head's map on each channel (``P``, plus ``(W_S)_cc`` on the
        diagonal), exactly the head while ``W_S = c I``."""
        self._check(graph, x)
        walk = GraphLaplacian(graph, "rw")
        weight = self.skip_weight
        if weight is None:
            c = torch.tensor(self.init, dtype=x.dtype, device=x.device)
        else:
            c = torch.diagonal(weight, dim1=-2, dim2=-1).mean(-1).to(x.dtype)  # (heads,)
            if c.shape[0] == 1:
                c = c[0]
            elif x.dim() < 3 or x.shape[-3] != c.shape[0]:
                raise V.bad_value(
                    "x", f"expected {c.shape[0]} heads at dim -3 (the skip weight's), got "
                    f"{tuple(x.shape)}",
                )  # fmt: skip
            else:
                c = c[:, None, None]  # (heads, 1, 1) against (..., heads, N, C)
        return walk.adjacency(x) + walk.identity(x) * c

    def frequency_response(self, lam: Tensor) -> Tensor:
        """``1 - lam + c`` while ``W_S = c I`` (``(heads, len(lam))`` for a shaped weight,
        whose heads may differ); a weight that mixes channels has no response per eigenvalue.

        Raises:
            ValueError: naming ``skip_weight``, when a head's ``W_S`` is not a multiple of I.
        """
        weight = self.skip_weight
        if weight is None:
            return 1.0 - lam + self.init
        w = weight.detach().to(lam.dtype)
        c = torch.diagonal(w, dim1=-2, dim2=-1).mean(-1)  # (heads,)
        eye = torch.eye(w.shape[-1], dtype=w.dtype, device=w.device)
        if not torch.equal(w, c[:, None, None] * eye):
            raise V.bad_value(
                "skip_weight", "expected c I per head for a frequency response, got a weight "
                "that mixes channels (its response is not a function of the eigenvalue)"
            )  # fmt: skip
        return 1.0 - lam + c.to(lam.device)[:, None]

    def extra_repr(self) -> str:
        shape = "" if self.skip_weight is None else f", shape={tuple(self.skip_weight.shape)}"
        return f"init={self.init:g}{shape}"
