r"""How far training moved the matrices that heads learn from where they started.

An operator that learns a matrix per head answers
:meth:`~heatformer.graph_ops.DiffusionOperator.learned_weight` with the weight ``W`` and its
initial value ``W0`` (an untied skip head, ``skip[init=-1]``: ``W_S``, started at ``-I``, where
the head is the Laplacian head with its output map negated). Per layer and operator,
:func:`weight_drift` gives

.. math::

    \text{distance} = \frac{\lVert W - W_0 \rVert_F}{\lVert W_0 \rVert_F}
    \qquad\text{and}\qquad
    c = \frac{\operatorname{tr} W}{C} \text{ (mean over the heads)},

over the heads the operator serves (their ``(C, C)`` matrices stacked): the relative distance
from the start, and the multiple of ``I`` nearest to ``W`` in the Frobenius norm. A weight that
starts at ``0`` (``skip``, a plain attention head at first) is measured against
:math:`\lVert I \rVert_F` of the same heads instead. For a skip head ``c = -1`` is the Laplacian
head's per-token path, ``c = 0`` none (attention alone): a distance near 0 says training left
the head where it started; ``c`` says towards which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from heatformer.analysis.filters import head_operator_groups
from heatformer.graph_ops import DiffusionOperator

__all__ = ["WeightDrift", "weight_drift"]


@dataclass(frozen=True)
class WeightDrift:
    """How far one operator's learned weight moved, on the heads of one layer
    (:func:`weight_drift`).

    Attributes:
        layer: the layer's index among the model's attention layers (0-based, in module
            order: ``blocks.0.attn`` is 0 in the reference GPT and ViT).
        module: the layer's name in ``model.named_modules()``.
        heads: the heads that share the operator, in head order.
        operator: the operator's registry name (``"skip"``).
        distance: ``||W - W0||_F / ||W0||_F`` over those heads (``||I||_F`` when ``W0 = 0``).
        identity: ``tr(W) / C``, the mean over those heads: the multiple of ``I`` nearest ``W``.
        start: ``tr(W0) / C``, the same of the start (``init`` for a skip head).
    """

    layer: int
    module: str
    heads: tuple[int, ...]
    operator: str
    distance: float
    identity: float
    start: float

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the attributes (``heads`` a list)."""
        return {
            "layer": self.layer,
            "module": self.module,
            "heads": list(self.heads),
            "operator": self.operator,
            "distance": self.distance,
            "identity": self.identity,
            "start": self.start,
        }


def weight_drift(model: nn.Module) -> list[WeightDrift]:
    r"""How far every learned per-head matrix of ``model`` moved from its start, layer by layer.

    A layer is a submodule that lists its heads' operators (``head_operators``:
    :class:`~heatformer.models.DiffusionAttention` and the layers the adapters convert), in
    ``model.named_modules()`` order; an operator counts when it answers
    :meth:`~heatformer.graph_ops.DiffusionOperator.learned_weight` (no class is tested). Heads
    that share an operator give one :class:`WeightDrift`. Read in float64 on the host, without
    gradients; no forward pass.

    Args:
        model: any module.

    Returns:
        One :class:`WeightDrift` per layer and operator with a learned weight, in layer order,
        then in the order of their first head; empty for a model without such heads.

    Raises:
        TypeError: naming ``model``, when it is not a module.

    Example:
        >>> from heatformer.models import GPT, GPTConfig
        >>> gpt = GPT(GPTConfig(vocab_size=8, block_size=4, n_layer=2, n_head=2, n_embd=8,
        ...                     heads="attention:1,skip[init=-1]:1"))
        >>> [(d.layer, d.heads, d.distance, d.identity) for d in weight_drift(gpt)]
        [(0, (1,), 0.0, -1.0), (1, (1,), 0.0, -1.0)]
    """
    found = (_drift(*group) for group in head_operator_groups(model))
    return [drift for drift in found if drift is not None]


def _drift(
    op: DiffusionOperator, layer: int, module: str, heads: tuple[int, ...]
) -> WeightDrift | None:
    """The :class:`WeightDrift` of ``op`` on ``heads``, None when it learns no matrix."""
    answer = op.learned_weight()
    if answer is None:
        return None
    with torch.no_grad():
        weight, start = (t.detach().to("cpu", torch.float64) for t in answer)
        channels = weight.shape[-1]
        scale = float(torch.linalg.norm(start))
        if scale == 0.0:  # started at 0: measured against the identity of the same heads
            scale = math.sqrt(weight.numel() / channels)
        trace = torch.diagonal(weight, dim1=-2, dim2=-1).sum(-1) / channels  # (heads,)
        start_trace = torch.diagonal(start, dim1=-2, dim2=-1).sum(-1) / channels
        return WeightDrift(
            layer=layer,
            module=module,
            heads=heads,
            operator=op.name,
            distance=float(torch.linalg.norm(weight - start)) / scale,
            identity=float(trace.mean()),
            start=float(start_trace.mean()),
        )
