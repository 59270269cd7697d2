"""The one conversion skeleton of every adapter: :class:`Adapter` ``(find, make, install)``.

An adapter (:mod:`~heatformer.integrations.hf`, :mod:`~heatformer.integrations.timm`,
:mod:`~heatformer.integrations.torch`) says three things: how to *find* a model's attention
modules, how to *make* one module's replacement (or new heads for a module converted before)
from a head spec and a graph kind, and how to *install* what it made. Its ``convert`` is
:meth:`Adapter.convert` and its ``load_state_dict`` :meth:`Adapter.load_state_dict`; both
run :meth:`Adapter.apply`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from torch import nn

from heatformer.graph_ops import GraphBuilder
from heatformer.integrations._heads import in_module
from heatformer.integrations._record import recorded
from heatformer.models.heads import parse_layer_graphs, parse_layer_heads

__all__ = ["Adapter", "layer_specs"]

#: ``(name, module)`` of a model's attention modules (``""``: the model itself)
Found = Sequence[tuple[str, nn.Module]]
#: what an adapter makes for one attention module: its replacement, or new heads for it
_Made = TypeVar("_Made", bound=nn.Module)


def layer_specs(
    heads: str | Sequence[str], graph: str | GraphBuilder | Sequence[str], n_layer: int
) -> list[tuple[str, str]]:
    """``(head spec, graph kind)`` of each of ``n_layer`` attention modules, from a
    ``convert`` call's ``heads`` and ``graph`` (one for every module, or one per module)."""
    specs = parse_layer_heads(heads, n_layer)
    kinds = parse_layer_graphs(graph.spec if isinstance(graph, GraphBuilder) else graph, n_layer)
    return list(zip(specs, kinds, strict=True))


@dataclass(frozen=True)
class Adapter(Generic[_Made]):
    """The three pieces of an adapter; ``convert`` and ``load_state_dict`` follow from them.

    Attributes:
        find: ``find(root)``: ``(name, module)`` of the attention modules of ``root``,
            converted or not; raises ``ValueError``/``TypeError`` when there are none.
        make: ``make(name, module, spec, kind)``: the module's replacement, or the
            :class:`~heatformer.integrations._heads.HeadOperators` to give a module converted
            before (its own when they were built from ``spec`` and ``kind``).
        install: ``install(root, found, made)`` puts them in place; its result (``root``, or
            its replacement) is what the conversion returns.
    """

    find: Callable[[nn.Module], Found]
    make: Callable[[str, nn.Module, str, str], _Made]
    install: Callable[[nn.Module, Found, list[_Made]], nn.Module]

    def apply(self, root: nn.Module, found: Found, plan: Sequence[tuple[str, str]]) -> nn.Module:
        """Convert the modules ``found`` of ``root`` by ``plan``, their ``(head spec, graph
        kind)`` (:func:`layer_specs`, or :func:`~heatformer.integrations._record.recorded`).

        Raises:
            ValueError: what ``make`` raises, with the module's name in its detail
                (:func:`~heatformer.integrations._heads.in_module`).
        """
        made: list[_Made] = []
        for (name, module), (spec, kind) in zip(found, plan, strict=True):
            try:
                made.append(self.make(name, module, spec, kind))
            except ValueError as err:
                raise in_module(name or type(module).__name__, err) from None
        return self.install(root, found, made)

    def convert(
        self, root: nn.Module, heads: str | Sequence[str], graph: str | GraphBuilder | Sequence[str]
    ) -> nn.Module:
        """Every adapter's ``convert``: ``heads`` and ``graph`` for every attention module of
        ``root``, or one per module."""
        found = self.find(root)
        return self.apply(root, found, layer_specs(heads, graph, len(found)))

    def load_state_dict(
        self, root: nn.Module, state_dict: Mapping[str, object], *, strict: bool
    ) -> nn.Module:
        """Every adapter's ``load_state_dict``: convert the modules ``state_dict`` records as
        it records them, then load it (``strict`` as in
        :meth:`torch.nn.Module.load_state_dict`)."""
        found, plan = recorded(self.find(root), state_dict)
        root = self.apply(root, found, plan)
        root.load_state_dict(state_dict, strict=strict)
        return root
