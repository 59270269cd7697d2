r"""``Differential()``: differential attention, the difference of two attention maps per head.

The Differential Transformer (Ye et al., 2024) gives every head two attention maps, from the
two halves of its queries and keys, and subtracts the second, scaled by a learned
:math:`\lambda`, from the first; the head's output is normalised (an RMSNorm over the head's
channels, without a learned scale) and scaled by :math:`1 - \lambda_{init}`:

.. math::

    [Q_1; Q_2] = Q_h, \quad [K_1; K_2] = K_h, \quad
    P_i = \mathrm{softmax}\big(Q_i K_i^T / \sqrt{d}\big), \quad d = D_h / 2

    \mathrm{diff}(P_1, P_2, V) = (1 - \lambda_{init})\,
        \mathrm{RMSNorm}\big(P_1 V - \lambda P_2 V\big)

    \lambda = e^{\lambda_{q1} \cdot \lambda_{k1}} - e^{\lambda_{q2} \cdot \lambda_{k2}}
        + \lambda_{init}, \qquad
    \lambda_{init}(l) = 0.8 - 0.6\, e^{-0.3 (l - 1)}

with :math:`\lambda_{q1}, \lambda_{k1}, \lambda_{q2}, \lambda_{k2} \in \mathbb{R}^d` learned
vectors shared by the heads the operator serves (the paper shares :math:`\lambda` between the
heads of a layer) and :math:`l \in 1 \dots L` the layer's depth. A head keeps the projection
widths of any other head: its ``Dh`` query and key channels make the two maps of ``d = Dh / 2``
channels, and its value keeps ``Dh`` channels, the paper's ``2d`` (its number of heads is half
a Transformer's of the same width). This is transformers' ``DiffLlamaAttention`` with
``layer_idx = l - 1``, ``rms_norm_eps = eps``: its differential head ``j`` is a heatformer head
whose maps are DiffLlama's heads ``j`` and ``j + H/2`` and whose values are the two halves of
DiffLlama's values.

The two maps are one graph with a batch dim more (:attr:`~.DiffusionOperator.maps` ``= 2``):
``graph.batch_shape == (*batch, 2)``; a layer builds it with
:func:`~heatformer.graph_ops.operators.base.split_maps` on the layer's graph kind (dense,
top-k, window). The output is a function of one propagation per map
(:attr:`~.DiffusionOperator.combines_maps`), so a layer serves it from the KV cache.

A row without edges (a fully masked query) is 0, as an attention head's.

References:
    Ye, T., Dong, L., Xia, Y., Sun, Y., Zhu, Y., Huang, G. & Wei, F. (2024). Differential
    Transformer. arXiv:2410.05258 (ICLR 2025).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from heatformer import checks as V
from heatformer.graph_ops._precision import accumulation_dtype
from heatformer.graph_ops.laplacian import GraphLaplacian
from heatformer.graph_ops.operators.base import DiffusionOperator
from heatformer.graph_ops.protocol import Graph

__all__ = ["Differential", "lambda_init_at"]

#: the names of the four vectors of the lambda reparameterisation (DiffLlama's names)
LAMBDA_VECTORS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


def lambda_init_at(depth: int) -> float:
    r"""The paper's :math:`\lambda_{init}` of the layer at 1-based ``depth``:
    :math:`0.8 - 0.6 e^{-0.3 (depth - 1)}` (DiffLlama's ``lambda_init_fn(layer_idx)`` with
    ``layer_idx = depth - 1``).

    Raises:
        ValueError: naming ``depth``, when it is not a positive int.

    Example:
        >>> round(lambda_init_at(1), 6), round(lambda_init_at(12), 4)
        (0.2, 0.7779)
    """
    depth = V.check_positive_int("depth", depth)
    return 0.8 - 0.6 * math.exp(-0.3 * (depth - 1))


def _float_in(name: str, value: object, low: float, high: float, *, closed: bool) -> float:
    """A finite float in ``[low, high)`` (``closed``) or ``(low, high)``, else one error naming
    ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise V.bad_type(name, f"expected a float, got {type(value).__name__}")
    value = float(value)
    inside = (low <= value if closed else low < value) and value < high
    if not (math.isfinite(value) and inside):
        interval = f"{'[' if closed else '('}{low:g}, {high:g})"
        raise V.bad_value(name, f"expected a finite value in {interval}, got {value}")
    return value


class Differential(DiffusionOperator):
    r"""Differential attention: ``(1 - lambda_init) RMSNorm(P_1 x - lambda P_2 x)``.

    Args:
        lambda_init: :math:`\lambda_{init}` in ``[0, 1)``; None (the default): the paper's
            depth rule, :func:`lambda_init_at` of ``depth``.
        depth: the 1-based depth of the layer, for the rule; None (the default): the depth
            the model stacking the layer tells (:meth:`set_depth`; 1 for a layer on its own).
            Give ``lambda_init`` or ``depth``, not both.
        lambda_std: standard deviation of the normal draws of the four vectors (0 gives
            :math:`\lambda = \lambda_{init}`); DiffLlama's ``lambda_std_dev``.
        eps: the RMSNorm's ``eps`` (DiffLlama's ``rms_norm_eps``), a float > 0.
        dim: the width ``d`` of each map (``Dh / 2``), to make the vectors now; a layer gives
            it otherwise (:meth:`shape_parameters`). Without it the operator has no vector and
            :math:`\lambda = \lambda_{init}`, its value when the vectors are 0.
        device, dtype: factory kwargs of the vectors.

    Attributes:
        lambda_q1, lambda_k1, lambda_q2, lambda_k2: ``(d,)`` parameters (None until shaped).

    Raises:
        ValueError: naming the argument, for a value outside the ranges above, or both
            ``lambda_init`` and ``depth``.
        TypeError: naming the argument, for a value of the wrong type.

    Shape:
        ``graph``: batch shape ``(*batch, 2)``, map 1 then map 2; ``x``: ``(*batch, N, C)``
        -> ``(*batch, N, C)``.

    Equivalent to::

        P = graph.to_dense()                               # (*batch, 2, N, N), rows sum to 1
        u = P[..., 0, :, :] @ x - op.lambda_full() * (P[..., 1, :, :] @ x)
        y = u * torch.rsqrt(u.square().mean(-1, keepdim=True) + eps) * (1 - op.lambda_init)

    Example:
        >>> import torch
        >>> from heatformer.graph_ops import SoftmaxGraph, split_maps
        >>> q = k = torch.tensor([[1., 0.], [0., 1.], [1., 1.]])  # 3 tokens, 2 maps of d = 1
        >>> graph = SoftmaxGraph(split_maps(q, 2), split_maps(k, 2))
        >>> graph.batch_shape                                     # the maps
        torch.Size([2])
        >>> op = Differential(lambda_init=0.5)
        >>> y = op(graph, torch.tensor([[1., 0.], [0., 1.], [1., 1.]]))
        >>> y.square().mean(-1).sqrt()                          # every row's RMS: 1 - 0.5
        tensor([0.5000, 0.5000, 0.5000])
    """

    name = "diff"
    examples = ({}, {"lambda_init": 0.5, "eps": 1e-6})

    def __init__(
        self,
        *,
        lambda_init: float | None = None,
        depth: int | None = None,
        lambda_std: float = 0.1,
        eps: float = 1e-5,
        dim: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if lambda_init is not None and depth is not None:
            raise V.bad_value(
                "depth",
                f"expected lambda_init or depth, not both; got lambda_init={lambda_init}, "
                f"depth={depth} (depth sets lambda_init = 0.8 - 0.6 exp(-0.3 (depth - 1)))",
            )
        self._lambda_init = (
            None
            if lambda_init is None
            else _float_in("lambda_init", lambda_init, 0, 1, closed=True)
        )
        self._depth = V.check_positive_int("depth", depth, optional=True)
        self._told_depth: int | None = None
        self.lambda_std = _float_in("lambda_std", lambda_std, 0.0, math.inf, closed=True)
        self.eps = _float_in("eps", eps, 0.0, math.inf, closed=False)
        V.check_positive_int("dim", dim, optional=True)
        self._device, self._dtype = device, dtype  # the factory kwargs, for shape_parameters
        self.lambda_q1: nn.Parameter | None
        self.lambda_k1: nn.Parameter | None
        self.lambda_q2: nn.Parameter | None
        self.lambda_k2: nn.Parameter | None
        for name in LAMBDA_VECTORS:
            self.register_parameter(name, None)
        if dim is not None:
            self._make_vectors(dim)

    # ---- capabilities ----------------------------------------------------------------------

    @property
    def maps(self) -> int:
        return 2

    @property
    def combines_maps(self) -> bool:
        return True

    @property
    def needs_shape(self) -> bool:
        return self.lambda_q1 is None

    @property
    def depth(self) -> int:
        """The layer depth the depth rule uses: given, told by the model, or 1."""
        return self._depth or self._told_depth or 1

    @property
    def lambda_init(self) -> float:
        r""":math:`\lambda_{init}`: given, or :func:`lambda_init_at` of :attr:`depth`."""
        if self._lambda_init is not None:
            return self._lambda_init
        return lambda_init_at(self.depth)

    def set_depth(self, depth: int) -> None:
        """Take ``depth`` for the depth rule, unless ``lambda_init`` or ``depth`` was given.

        Raises:
            ValueError: naming ``depth``, when one instance is told two depths (one operator
                shared by two layers: each layer needs its own).
        """
        depth = V.check_positive_int("depth", depth)
        if self._lambda_init is not None or self._depth is not None:
            return
        if self._told_depth is not None and self._told_depth != depth:
            raise V.bad_value(
                "depth",
                f"expected one depth per differential operator, got {self._told_depth} and "
                f"{depth} (one instance serving two layers); give each layer its own",
            )
        self._told_depth = depth

    def shape_parameters(self, heads: int, channels: int) -> None:
        """Make the four vectors of width ``channels / 2`` (the map width ``d`` of heads of
        ``channels`` query channels), drawn from ``N(0, lambda_std^2)``; kept when they have
        that width already.

        Raises:
            ValueError: naming ``channels``, when it is odd; naming ``heads``, when the vectors
                have another width (one instance shared by layers of different widths).
        """
        V.check_positive_int("heads", heads)
        V.check_positive_int("channels", channels)
        if channels % 2:
            raise V.bad_value(
                "channels",
                f"expected an even head width (two maps of Dh / 2 query channels), got {channels}",
            )
        if self.lambda_q1 is not None:
            if self.lambda_q1.shape[-1] != channels // 2:
                raise V.bad_value(
                    "heads",
                    f"expected heads of width {2 * self.lambda_q1.shape[-1]} (the lambda "
                    f"vectors' {self.lambda_q1.shape[-1]} per map), got width {channels} (one "
                    "instance shared by layers of different widths)",
                )
            return
        self._make_vectors(channels // 2)

    def _make_vectors(self, dim: int) -> None:
        dtype = self._dtype or torch.get_default_dtype()
        for name in LAMBDA_VECTORS:
            setattr(self, name, nn.Parameter(torch.empty(dim, device=self._device, dtype=dtype)))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw the four vectors from ``N(0, lambda_std^2)`` (nothing without a shape)."""
        with torch.no_grad():
            for name in LAMBDA_VECTORS:
                vector = getattr(self, name)
                if vector is not None:
                    vector.normal_(0.0, self.lambda_std)

    # ---- the operator ----------------------------------------------------------------------

    def lambda_full(
        self, dtype: torch.dtype | None = None, device: torch.device | str | None = None
    ) -> Tensor:
        r""":math:`\lambda = e^{\lambda_{q1} \cdot \lambda_{k1}} - e^{\lambda_{q2} \cdot
        \lambda_{k2}} + \lambda_{init}`, a 0-dim tensor in ``dtype`` (default: the vectors'),
        differentiable in the vectors; :math:`\lambda_{init}` without them."""
        vectors = [getattr(self, name) for name in LAMBDA_VECTORS]
        if any(v is None for v in vectors):
            return torch.tensor(self.lambda_init, dtype=dtype, device=device)
        q1, k1, q2, k2 = (v.to(dtype=dtype, device=device) for v in vectors)
        return torch.exp((q1 * k1).sum()) - torch.exp((q2 * k2).sum()) + self.lambda_init

    def forward(self, graph: Graph, x: Tensor) -> Tensor:
        self._check(graph, x)
        batch = torch.broadcast_shapes((*x.shape[:-2], 1), graph.batch_shape)  # (*batch, 2)
        xs = x.unsqueeze(-3).expand(*batch, *x.shape[-2:])  # (*batch, 2, N, C)
        pv = GraphLaplacian(graph, "rw").adjacency(xs)  # P_i x: (*batch, 2, N, C)
        return self.combine(pv)

    def combine(self, pv: Tensor) -> Tensor:
        """``(1 - lambda_init) RMSNorm(P_1 x - lambda P_2 x)`` from ``pv`` ``(*batch, 2, Nq,
        C)``, in float32 for half-precision ``pv``; the result has ``pv``'s dtype."""
        if pv.dim() < 3 or pv.shape[-3] != 2:
            raise V.bad_value(
                "pv", f"expected shape (*batch, 2, Nq, C) (the two maps), got {tuple(pv.shape)}"
            )
        acc = accumulation_dtype(pv.dtype)
        first, second = pv.to(acc).unbind(-3)  # (*batch, Nq, C) each
        u = first - self.lambda_full(acc, pv.device) * second
        y = u * torch.rsqrt(u.square().mean(-1, keepdim=True) + self.eps)  # RMSNorm per row
        return (y * (1.0 - self.lambda_init)).to(pv.dtype)

    def token_map(self, graph: Graph, x: Tensor) -> Tensor:
        r""":math:`P_1 x - \lambda P_2 x` for ``x`` of any width: the head's map between tokens
        (that of :meth:`frequency_response`), without the per-row RMSNorm and the factor
        :math:`1 - \lambda_{init}`, which rescale each output token and mix none."""
        self._check(graph, x)
        batch = torch.broadcast_shapes((*x.shape[:-2], 1), graph.batch_shape)  # (*batch, 2)
        xs = x.unsqueeze(-3).expand(*batch, *x.shape[-2:])  # (*batch, 2, N, C)
        first, second = GraphLaplacian(graph, "rw").adjacency(xs).unbind(-3)  # (*batch, N, C)
        return first - self.lambda_full(x.dtype, x.device) * second

    def frequency_response(self, lam: Tensor) -> Tensor:
        r"""``(1 - lambda)(1 - lam)``: the response of the linear map :math:`P_1 - \lambda P_2`
        where the two maps are one graph (:math:`(1 - \lambda) P`), before the per-row
        RMSNorm, which rescales each row and has no response of its own."""
        lam_full = self.lambda_full().detach().to(device=lam.device, dtype=lam.dtype)
        return (1.0 - lam_full) * (1.0 - lam)

    def extra_repr(self) -> str:
        rule = "" if self._lambda_init is not None else f", depth={self.depth}"
        shape = "" if self.lambda_q1 is None else f", dim={self.lambda_q1.shape[-1]}"
        return f"lambda_init={self.lambda_init:.4g}{rule}, eps={self.eps:g}{shape}"
