"""Registries of the ways to compute one operator, each entry saying when it refuses.

The heat kernel (:data:`~heatformer.graph_ops.HEAT_METHODS`) and personalized PageRank
(:data:`~heatformer.graph_ops.PPR_METHODS`) each have several methods: a series of
propagations (``O(N)`` memory, cost grows with ``t`` or ``1/alpha``) and a dense route
(``O(N^3)``, cost independent of them). An entry's ``refuse`` returns ``None`` when it can serve
a call, or the reason it cannot, so ``method="auto"`` takes the first entry that accepts and a
refused call lists every reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from heatformer import checks as V

__all__ = ["Method", "check_method", "select_method"]


@dataclass(frozen=True)
class Method:
    """One way to compute an operator.

    Attributes:
        name: registry key.
        compute: ``(graph, x, *params) -> y``.
        refuse: ``(graph, *params) -> reason or None`` (no signal: it decides from the graph's
            size and the parameters alone).
        summary: one line for error messages and docs.
    """

    name: str
    compute: Callable[..., Any]
    refuse: Callable[..., str | None]
    summary: str


def check_method(method: object, registry: Mapping[str, Method]) -> str:
    """Check a method name: ``"auto"`` or a key of ``registry``."""
    if not isinstance(method, str):
        raise V.bad_type("method", f"expected a str, got {type(method).__name__}")
    return V.check_choice("method", method, ["auto", *registry])


def select_method(registry: Mapping[str, Method], method: str, what: str, *args: Any) -> Method:
    """Resolve ``method`` for the call ``args``; ``"auto"`` takes the first entry accepting it.

    Args:
        registry: name -> :class:`Method`, in order of preference.
        method: ``"auto"`` or a key of ``registry``.
        what: the operator's name for messages, e.g. ``"heat-kernel"``.
        *args: the call's arguments as ``refuse`` takes them.

    Raises:
        ValueError: unknown method (lists the valid names), a refused method, or no method
            accepting the call; the message gives every reason.
    """
    if check_method(method, registry) == "auto":
        reasons = []
        for candidate in registry.values():
            reason = candidate.refuse(*args)
            if reason is None:
                return candidate
            reasons.append(f"{candidate.name!r}: {reason}")
        raise V.bad_value("method", f"no {what} method accepts this call: " + "; ".join(reasons))
    chosen = registry[method]
    reason = chosen.refuse(*args)
    if reason is not None:
        raise V.bad_value("method", f"{method!r} refused: {reason}")
    return chosen
