"""Diffusion operators: one module each, one entry each in :data:`OPERATORS`.

See :mod:`heatformer.graph_ops.operators.base` for the contract. A new operator is a module
with a :class:`DiffusionOperator` subclass (its ``name``, ``examples`` and capabilities) plus
one line in :data:`OPERATORS` -- or, from outside the library,
``OPERATORS["name"] = MyOperator`` (see ``examples/custom_operator.py``).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from heatformer import checks as V
from heatformer._suggest import did_you_mean
from heatformer.graph_ops.operators.attention import Attention
from heatformer.graph_ops.operators.base import DiffusionOperator, NormalizedOperator
from heatformer.graph_ops.operators.center import Centering
from heatformer.graph_ops.operators.heat import HeatKernel
from heatformer.graph_ops.operators.laplacian import Laplacian
from heatformer.graph_ops.operators.mean import MeanPooling
from heatformer.graph_ops.operators.polynomial import Polynomial
from heatformer.graph_ops.operators.ppr import PPR_METHODS, PersonalizedPageRank, ppr_order
from heatformer.graph_ops.operators.skip import UntiedSkip

__all__ = [
    "OPERATORS",
    "PPR_METHODS",
    "Attention",
    "Centering",
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
]


#: name -> operator class; the one place strings become operators.
OPERATORS: dict[str, type[DiffusionOperator]] = {
    "attention": Attention,
    "laplacian": Laplacian,
    "heat": HeatKernel,
    "ppr": PersonalizedPageRank,
    "polynomial": Polynomial,
    "mean": MeanPooling,
    "center": Centering,
    "skip": UntiedSkip,
}
_ALIASES = {
    "pagerank": "ppr",
    "personalized_pagerank": "ppr",
    "poly": "polynomial",
    "untied_skip": "skip",
}


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
            ``"pagerank"``), ``"polynomial"``, ``"mean"`` (mean pooling), ``"center"``
            (centring: ``x`` minus that mean), ``"skip"`` (alias ``"untied_skip"``:
            attention plus a learned per-token path); case-insensitive.
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
    if isinstance(name, DiffusionOperator):
        if kwargs:
            raise V.bad_type(
                "kwargs", "an operator instance was given; it takes no keyword arguments"
            )
        return name
    if not isinstance(name, str):
        raise V.bad_type(
            "name", f"expected an operator name or instance, got {type(name).__name__}"
        )
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in OPERATORS:
        raise V.bad_value(
            "name",
            f"unknown operator {name!r}{did_you_mean(key, [*OPERATORS, *_ALIASES])}; "
            f"expected one of {sorted(OPERATORS)} (aliases: {sorted(_ALIASES)})",
        )
    factory = OPERATORS[key]
    signature = inspect.signature(factory).parameters
    accepted = [p for p in signature if p not in _FACTORY_KWARGS]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise V.bad_type(key, f"unknown parameter(s) {unknown}; expected some of {accepted}")
    factory_kwargs = {
        k: v for k, v in (("device", device), ("dtype", dtype)) if v is not None and k in signature
    }
    try:
        return factory(**kwargs, **factory_kwargs)
    except TypeError as err:
        raise V.bad_type(key, f"{err}") from None


#: constructor arguments that are not operator parameters (never written in a head spec)
_FACTORY_KWARGS = ("device", "dtype")
