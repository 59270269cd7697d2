r"""The diffusion heads of one attention layer of another library's model.

Every adapter of this package hands its layer's queries, keys and values to a
:class:`HeadOperators` module, with an :class:`~heatformer.models.masks.AttentionMask`
saying which keys each query may attend. The module holds the operators (their parameters
belong to the host model) and routes the heads through the same
:class:`~heatformer.models.routing.HeadRouter` as :class:`~heatformer.models.DiffusionAttention`:
affine heads share one propagation (on the dense ``"softmax"`` kind the SDPA call the host
library makes itself), other heads build the layer's graph kind, heads that read ``W^T`` are
refused under a causal mask, and a rectangular graph (a KV cache, cross-attention) serves
affine heads only.

:class:`~heatformer.integrations._convert.Adapter` is the skeleton every adapter's ``convert``
and ``load_state_dict`` share; :func:`heads_for` is what its ``make`` gives a module converted
before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from heatformer import checks
from heatformer.graph_ops import DiffusionOperator, Graph, GraphBuilder, resolve_graph
from heatformer.models.masks import AttentionMask
from heatformer.models.routing import HeadRouter

__all__ = [
    "CaptureSink",
    "HeadOperators",
    "head_width",
    "heads_for",
    "in_module",
]


class CaptureSink(Protocol):
    """Where a layer's square graphs go while :attr:`HeadOperators._capture` is set: a list
    (:func:`heatformer.integrations.hf.attention_graphs` keeps them), or anything with an
    ``append`` (:func:`heatformer.integrations.hf.attention_stats` reduces each to its
    statistics as the layer runs)."""

    def append(self, item: tuple[Graph, Tensor], /) -> None: ...


def in_module(name: str, err: ValueError) -> checks.ArgumentValueError:
    """``err`` (raised for one module of a model) with the module's name in its detail,
    naming the same argument."""
    argument = err.argument if isinstance(err, checks.ArgumentError) else "heads"
    detail = err.detail if isinstance(err, checks.ArgumentError) else str(err)
    return checks.bad_value(argument, f"module {name!r}: {detail}")


def heads_for(
    current: object, spec: str, kind: str, num_heads: int, like: nn.Module
) -> HeadOperators:
    """The heads a converted attention module gets: ``current`` when they were built from
    ``spec`` and ``kind`` (converting again keeps them, learned parameters included), else new
    heads in the dtype and on the device of ``like``'s first parameter (the module's weights).

    Args:
        current: the module's heads (None, or anything else, for a module without them).
        spec, kind: the head spec and graph kind of the conversion.
        num_heads: the module's ``H``.
        like: the attention module.

    Raises:
        ValueError: a spec that does not fit ``num_heads``, an unknown graph kind.
    """
    if isinstance(current, HeadOperators) and current.built_from(spec, kind):
        return current
    param = next(like.parameters(), None)
    device = None if param is None else param.device
    dtype = param.dtype if param is not None and param.is_floating_point() else None
    return HeadOperators(
        spec, num_heads, graph=kind, head_dim=head_width(like, num_heads), device=device,
        dtype=dtype,
    )  # fmt: skip


def head_width(module: nn.Module, num_heads: int) -> int | None:
    """The head width ``Dh`` of another library's attention module: its ``head_dim`` (or its
    config's), else its ``embed_dim`` (or its config's ``hidden_size``) over ``num_heads``;
    None when it tells none of them (operators with per-head parameters are then refused)."""
    config = getattr(module, "config", None)
    for value in (getattr(module, "head_dim", None), getattr(config, "head_dim", None)):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    for value in (getattr(module, "embed_dim", None), getattr(config, "hidden_size", None)):
        if isinstance(value, int) and not isinstance(value, bool) and value % num_heads == 0:
            return value // num_heads
    return None


class HeadOperators(nn.Module):
    r"""One diffusion operator per head, applied to another library's ``q``, ``k``, ``v``.

    Holds the operators (so learnable ones, such as a heat head's time, are parameters of the
    host model) and routes the heads with a :class:`~heatformer.models.routing.HeadRouter`;
    owns no projection.

    Args:
        heads: a head spec (``"attention:10,laplacian:2"``) or ``num_heads`` operators.
        num_heads: ``H``.
        graph: the graph kind (``"softmax"``, ``"topk[k=32]"``, ...; see
            :data:`~heatformer.graph_ops.GRAPHS`).
        head_dim: ``Dh``, for operators with per-head parameters (an untied skip's weight);
            None refuses them.
        device, dtype: factory kwargs for operators made from names.

    Shape:
        ``forward(q, k, v, mask)``: ``q`` ``(B, H, Nq, Dh)``, ``k`` ``(B, H, T, Dh)``, ``v``
        ``(B, H, T, C)`` -> ``(B, H, Nq, C)``.

    Equivalent to::

        P = softmax(q k^T * scale, masked as mask says)    # (B, H, Nq, T), never formed
        y[:, h] = op_h(P[:, h], v[:, h])                   # a P v + b v for affine heads
    """

    def __init__(
        self,
        heads: str | Sequence[DiffusionOperator | str],
        num_heads: int,
        *,
        graph: str | GraphBuilder = "softmax",
        head_dim: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.router = HeadRouter(
            heads, num_heads, graph=graph, head_dim=head_dim, device=device, dtype=dtype
        )
        self.num_heads = num_heads
        #: a short summary (``"attention:2,heat:2"``, no operator parameters), for reprs
        self.spec = self.router.spec
        #: the head spec the heads were built from, parameters included (None when built
        #: from operator instances); what :mod:`~heatformer.integrations._record` records
        self.source: str | None = heads.strip() if isinstance(heads, str) else None
        self.graph_kind = self.router.graph_kind
        self.operators = nn.ModuleList(self.router.operators)  # registers parameters
        #: where ``(graph, values)`` of each pass go, set by
        #: :func:`heatformer.integrations.hf.attention_graphs` and ``attention_stats`` for one
        #: forward pass (None: off, the forward reads nothing more)
        self._capture: CaptureSink | None = None

    @property
    def head_operators(self) -> list[DiffusionOperator]:
        """The operator of every head, in head order."""
        return self.router.head_operators

    @property
    def all_affine(self) -> bool:
        """Whether every head is affine in one propagation (a KV cache needs
        :attr:`HeadRouter.all_one_step <heatformer.models.routing.HeadRouter.all_one_step>`,
        which differential heads meet too)."""
        return self.router.all_affine

    def built_from(self, spec: str, graph: str | GraphBuilder) -> bool:
        """Whether these heads were built from the head spec ``spec`` and the graph kind
        ``graph``: converting again with them keeps the heads, and their learned parameters,
        instead of building new ones."""
        return self.source == spec.strip() and self.graph_kind.spec == resolve_graph(graph).spec

    def extra_repr(self) -> str:
        return f"heads={self.spec!r}, graph={self.graph_kind.spec!r}"

    def graph(
        self, q: Tensor, k: Tensor, mask: AttentionMask, *, scale: float | None = None
    ) -> Graph:
        """The layer's graph for square ``q``, ``k`` ``(..., N, Dh)`` (batch ``(B, H)``):
        :meth:`HeadRouter.graph <heatformer.models.routing.HeadRouter.graph>`."""
        return self.router.graph(q, k, mask, scale=scale)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, **options: Any
    ) -> Tensor:
        """Apply each head's operator: :meth:`HeadRouter.diffuse
        <heatformer.models.routing.HeadRouter.diffuse>` (``q``, ``k``, ``v``, ``mask`` and the
        keyword ``options`` -- ``scale``, ``dropout``, ``own_values``, ``cross`` -- as there)."""
        return self.router.diffuse(q, k, v, mask, **options)
