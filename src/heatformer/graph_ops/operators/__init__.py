"""Diffusion operators: one module each, one entry each in :data:`OPERATORS`.

See :mod:`heatformer.graph_ops.operators.base` for the contract. A new operator is a module
with a :class:`DiffusionOperator` subclass (its ``name``, ``examples`` and capabilities) plus
one registration, ``OPERATORS.register(MyOperator)``, from inside the library or outside it
(see ``examples/custom_operator.py``); the registration checks the class once.
"""

from __future__ import annotations

from typing import Any

import torch

from heatformer import checks as V
from heatformer.graph_ops.operators.attention import Attention
from heatformer.graph_ops.operators.base import DiffusionOperator, NormalizedOperator, split_maps
from heatformer.graph_ops.operators.center import Centering
from heatformer.graph_ops.operators.diff import Differential
from heatformer.graph_ops.operators.heat import HeatKernel
from heatformer.graph_ops.operators.laplacian import Laplacian
from heatformer.graph_ops.operators.mean import MeanPooling
from heatformer.graph_ops.operators.polynomial import Polynomial
from heatformer.graph_ops.operators.ppr import PPR_METHODS, PersonalizedPageRank, ppr_order
from heatformer.graph_ops.operators.skip import UntiedSkip
from heatformer.registry import Registry

__all__ = [
    "OPERATORS",
    "PPR_METHODS",
    "Attention",
    "Centering",
    "Differential",
    "DiffusionOperator",
    "HeatKernel",
    "Laplacian",
    "MeanPooling",
    "NormalizedOperator",
    "PersonalizedPageRank",
    "Polynomial",
    "UntiedSkip",
    "ppr_order",
    "resolve_operator",
    "split_maps",
]


#: name -> operator class; the one place strings become operators
#: (:class:`~heatformer.registry.Registry`: ``OPERATORS.register(cls)`` adds one, checked).
OPERATORS: Registry[type[DiffusionOperator]] = Registry(
    "operator",
    argument="name",
    base=DiffusionOperator,
    examples=True,
    aliases={
        "pagerank": "ppr",
        "personalized_pagerank": "ppr",
        "poly": "polynomial",
        "untied_skip": "skip",
        "differential": "diff",
    },
    case_insensitive=True,
    factory_kwargs=("device", "dtype"),
)
for _operator in (
    Attention,
    Laplacian,
    HeatKernel,
    PersonalizedPageRank,
    Polynomial,
    MeanPooling,
    Centering,
    UntiedSkip,
    Differential,
):
    OPERATORS.register(_operator)


def resolve_operator(
    name: str | DiffusionOperator,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    **kwargs: Any,
) -> DiffusionOperator:
    """Turn a name (and keyword arguments) into an operator; an operator passes through.

    :meth:`OPERATORS.resolve <heatformer.registry.Registry.resolve>` with the factory keywords:
    ``name`` may also be a spec entry such as ``"heat[t=0.5]"``.

    Args:
        name: one of ``"attention"``, ``"laplacian"``, ``"heat"``, ``"ppr"`` (alias
            ``"pagerank"``), ``"polynomial"``, ``"mean"`` (mean pooling), ``"center"``
            (centring: ``x`` minus that mean), ``"skip"`` (alias ``"untied_skip"``:
            attention plus a learned per-token path), ``"diff"`` (alias ``"differential"``:
            differential attention, two maps per head); case-insensitive.
        device, dtype: factory kwargs for operators with parameters (a learnable ``t`` is
            created in ``dtype`` directly, never rounded through float32 first).
        **kwargs: the operator's constructor arguments, e.g. ``t=2.0``.

    Raises:
        ValueError: unknown name (the message lists the valid names and suggests the closest).
        TypeError: ``name`` of the wrong type, or keyword arguments the operator does not take.

    Example:
        >>> resolve_operator("heat", t=2.0)
        HeatKernel(t=2, normalization='rw', method='auto', tol=1e-06, learnable=False)
    """
    if isinstance(name, DiffusionOperator) and kwargs:
        raise V.bad_type("kwargs", "an operator instance was given; it takes no keyword arguments")
    op: DiffusionOperator = OPERATORS.resolve(name, device=device, dtype=dtype, **kwargs)
    return op
