"""Head specs: which diffusion operator each attention head applies.

A spec is a comma-separated list of ``name[params]:count`` entries, heads assigned in the
order the spec lists them::

    "attention:6,laplacian:2"            heads 0-5 attention, 6-7 Laplacian
    "attention:4,heat[t=0.5]:2,ppr:2"    parameters in brackets, separated by ';'
    "laplacian[normalization=sym]:8"
    "attention"                          a bare name: every head

A per-layer schedule is one spec per layer: a sequence of specs, or one string with the
layers separated by ``'|'`` or ``';'`` outside brackets
(``"attention:4|attention:2,laplacian:2"``). Strings become
operators only here, through :func:`heatformer.graph_ops.resolve_operator`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from heatformer import checks
from heatformer._spec import format_entry, parse_params, split_outside_brackets
from heatformer.graph_ops import DiffusionOperator, resolve_operator

__all__ = [
    "DEFAULT_NUM_HEADS",
    "HeadSchedule",
    "adds_identity",
    "check_heads",
    "count_heads",
    "format_heads",
    "format_operator",
    "group_heads",
    "infer_num_heads",
    "parse_heads",
    "parse_layer_graphs",
    "parse_layer_heads",
    "split_layers",
    "split_schedule",
]

_ENTRY = re.compile(r"^\s*([A-Za-z_]+)\s*(?:\[([^\]]*)\])?\s*(?::\s*(\S+))?\s*$")
LAYER_SEPARATORS = "|;"


def _split_entries(spec: str, separators: str = ",") -> list[str]:
    """Split on ``separators`` that are not inside brackets."""
    return split_outside_brackets(spec, separators)


def split_layers(heads: str) -> list[str]:
    """Split a schedule at ``'|'`` or ``';'`` outside brackets; one stripped spec per layer.

    Example:
        >>> split_layers("attention:4|heat[t=0.5;tol=1e-8]:4")
        ['attention:4', 'heat[t=0.5;tol=1e-8]:4']
    """
    return [part.strip() for part in _split_entries(heads, LAYER_SEPARATORS)]


def count_heads(spec: str) -> int | None:
    """Number of heads a one-layer spec names: the sum of its counts (None for a bare name).

    Only the syntax is checked here; :func:`parse_heads` checks names and parameters.

    Raises:
        ValueError: a malformed entry or a count that is not a positive integer.

    Example:
        >>> count_heads("attention:6,heat[t=2]:2"), count_heads("attention")
        (8, None)
    """
    total = 0
    for entry in _split_entries(spec):
        count = _parse_entry(entry, spec)[2]
        if count is None:
            return None
        total += count
    return total


def _parse_entry(entry: str, spec: str) -> tuple[str, str | None, int | None]:
    """``(name, params text, count)`` of one entry ``name[params]:count`` of ``spec``
    (``None`` for what it omits), its syntax and count checked."""
    match = _ENTRY.match(entry)
    if match is None:
        raise checks.bad_value(
            "heads",
            f"cannot parse {entry.strip()!r} in {spec!r}; expected entries like "
            f"'attention:6', 'heat[t=0.5]:2'",
        )
    name, params_text, count_text = match.groups()
    if count_text is None:
        return name, params_text, None
    if not count_text.isdigit() or int(count_text) < 1:
        raise checks.bad_value(
            "heads", f"expected a positive head count in {entry.strip()!r}, got {count_text!r}"
        )
    return name, params_text, int(count_text)


def _parse_params(text: str | None, spec: str) -> dict[str, object]:
    params = parse_params(text, spec, what="heads")
    layer_owned = sorted(set(params) & {"device", "dtype"})
    if layer_owned:
        key = layer_owned[0]
        raise checks.bad_value(
            "heads",
            f"expected operator parameters in {spec!r}, got {key!r}, which belongs to the "
            f"layer: DiffusionAttention(..., {key}=...)",
        )
    return params


def parse_heads(
    spec: str | Sequence[DiffusionOperator | str],
    num_heads: int,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> list[DiffusionOperator]:
    """One operator per head from a spec string or a per-head list.

    Heads of one spec entry share one operator instance (so they run as one batched call).

    Args:
        spec: a spec string (see the module docstring) or a sequence of ``num_heads``
            operators / operator names.
        num_heads: ``H``.
        device, dtype: factory kwargs for the operators made from names (instances in
            ``spec`` are returned as they are).

    Returns:
        A list of ``num_heads`` operators.

    Raises:
        ValueError: unknown operator names (listing the valid ones), malformed entries, or
            counts that do not add up to ``num_heads``.

    Example:
        >>> ops = parse_heads("attention:2,laplacian:1", 3)
        >>> [op.name for op in ops]
        ['attention', 'attention', 'laplacian']
    """
    if isinstance(spec, str):
        return _operators_of_spec(spec, num_heads, device=device, dtype=dtype)
    if isinstance(spec, Sequence):
        return _operators_of_list(spec, num_heads, device=device, dtype=dtype)
    raise checks.bad_type(
        "operators", f"expected a spec string or a list of operators, got {type(spec).__name__}"
    )


def _operators_of_spec(
    spec: str,
    num_heads: int,
    *,
    device: torch.device | str | None,
    dtype: torch.dtype | None,
) -> list[DiffusionOperator]:
    """:func:`parse_heads` of a spec string: one instance per entry, repeated ``count`` times."""
    entries = [e for e in _split_entries(spec) if e.strip()]
    if not entries:
        raise checks.bad_value("heads", f"empty head spec {spec!r}")
    ops: list[DiffusionOperator] = []
    for entry in entries:
        name, params_text, count = _parse_entry(entry, spec)
        if count is None:
            if len(entries) != 1:
                raise checks.bad_value(
                    "heads",
                    f"{entry.strip()!r} has no ':count' in {spec!r}; only a spec "
                    f"with a single entry may omit the count",
                )
            count = num_heads
        params = _parse_params(params_text, spec)
        try:
            op = resolve_operator(name, device=device, dtype=dtype, **params)
        except (ValueError, TypeError) as err:
            raise checks.bad_value("heads", f"in {spec!r}: {err}") from None
        ops.extend([op] * count)
    if len(ops) != num_heads:
        raise checks.bad_value(
            "heads",
            f"expected counts adding up to num_heads = {num_heads}, got {len(ops)} "
            f"heads in {spec!r}",
        )
    return ops


def _operators_of_list(
    spec: Sequence[DiffusionOperator | str],
    num_heads: int,
    *,
    device: torch.device | str | None,
    dtype: torch.dtype | None,
) -> list[DiffusionOperator]:
    """:func:`parse_heads` of a per-head list: instances as they are, equal names one instance."""
    if len(spec) != num_heads:
        raise checks.bad_value(
            "operators", f"expected one operator per head ({num_heads}), got {len(spec)}"
        )
    resolved: dict[str, DiffusionOperator] = {}
    out = []
    for item in spec:
        if isinstance(item, str):  # equal names share one instance
            if item not in resolved:
                resolved[item] = resolve_operator(item, device=device, dtype=dtype)
            out.append(resolved[item])
        elif isinstance(item, DiffusionOperator):
            out.append(item)
        else:
            raise checks.bad_type(
                "operators",
                f"expected DiffusionOperator instances or names, got {type(item).__name__}",
            )
    return out


def parse_layer_heads(heads: str | Sequence[str], n_layer: int) -> list[str]:
    """One spec string per layer.

    Args:
        heads: one spec for every layer, ``'|'``/``';'``-separated specs, or a sequence.
        n_layer: number of layers.

    Raises:
        ValueError: if the number of per-layer specs is not ``n_layer``.
    """
    if isinstance(heads, str):
        layers = split_layers(heads)
        if len(layers) == 1:
            layers = layers * n_layer
    else:
        layers = list(heads)
    if len(layers) != n_layer:
        raise checks.bad_value(
            "heads", f"expected one spec per layer ({n_layer} layers), got {len(layers)}: {heads!r}"
        )
    return [str(h).strip() for h in layers]


def parse_layer_graphs(graph: str | Sequence[str], n_layer: int) -> list[str]:
    """One graph spec per layer, with the syntax of head schedules.

    Args:
        graph: one spec for every layer (``"topk[k=32]"``), ``';'``-separated specs
            (``"topk[k=8];topk[k=8];softmax"``), or a sequence.
        n_layer: number of layers.

    Raises:
        ValueError: if the number of per-layer specs is not ``n_layer``.

    Example:
        >>> parse_layer_graphs("topk[k=8];softmax", 2)
        ['topk[k=8]', 'softmax']
    """
    layers = split_layers(graph) if isinstance(graph, str) else [str(g).strip() for g in graph]
    if len(layers) == 1:
        layers = layers * n_layer
    if len(layers) != n_layer or any(not part for part in layers):
        raise checks.bad_value(
            "graph", f"expected one spec per layer ({n_layer} layers), got {graph!r}"
        )
    return layers


def format_operator(name: str, params: Mapping[str, object] | None = None) -> str:
    """One spec entry (no count) from a name and constructor arguments: the inverse of the
    parser, e.g. for :attr:`~heatformer.graph_ops.DiffusionOperator.examples`.

    Example:
        >>> format_operator("polynomial", {"coeffs": [0.5, -1.0], "learnable": True})
        'polynomial[coeffs=(0.5 -1.0);learnable=true]'
        >>> format_operator("attention")
        'attention'
    """
    return format_entry(name, params, sep=";")


def format_heads(ops: Sequence[DiffusionOperator]) -> str:
    """A short spec-like summary, e.g. ``"attention:6,laplacian:2"`` (for reprs and reports)."""
    parts: list[tuple[str, int]] = []
    for op in ops:
        if parts and parts[-1][0] == op.name:
            parts[-1] = (op.name, parts[-1][1] + 1)
        else:
            parts.append((op.name, 1))
    return ",".join(f"{name}:{count}" for name, count in parts)


def adds_identity(op: DiffusionOperator) -> bool:
    """Whether a fused (affine) operator adds ``b I' v`` with ``b`` possibly nonzero: decided
    on the host from :meth:`~heatformer.graph_ops.DiffusionOperator.affine_constants` (True for
    a learnable ``b`` or an operator that gives no constants: adding ``b v`` is then always
    correct); False for an operator that is not affine."""
    if op.affine_coefficients() is None:
        return False
    constants = op.affine_constants()
    return constants is None or constants[1] != 0.0


def group_heads(ops: Sequence[DiffusionOperator]) -> list[tuple[DiffusionOperator, list[int]]]:
    """The distinct operator objects of a head list (parameters register once) and the heads
    each one serves, in order of first appearance: ``[(op, [h, ...]), ...]``."""
    groups: list[tuple[DiffusionOperator, list[int]]] = []
    for h, op in enumerate(ops):
        for u, heads in groups:
            if u is op:
                heads.append(h)
                break
        else:
            groups.append((op, [h]))
    return groups


# ------------------------------------------------------------------ schedules, parsed once

#: Heads per layer when a schedule gives no counts (a bare ``"attention"``).
DEFAULT_NUM_HEADS = 4


def split_schedule(heads: str) -> str | tuple[str, ...]:
    """A schedule's layer specs: the stripped string when it names one spec for every layer,
    else the tuple of layer specs (what a model config's ``heads`` takes).

    Raises:
        ValueError: an empty layer spec (``"a;;b"``).

    Example:
        >>> split_schedule("attention:4;attention:2,laplacian:2")
        ('attention:4', 'attention:2,laplacian:2')
        >>> split_schedule(" attention:6,heat:2 ")
        'attention:6,heat:2'
    """
    layers = tuple(split_layers(heads))
    if len(layers) == 1:
        return layers[0]
    if any(not part for part in layers):
        raise checks.bad_value(
            "heads", f"expected a non-empty spec between every ';', got {heads!r}"
        )
    return layers


def infer_num_heads(heads: str) -> int:
    """Heads per layer implied by a schedule's counts (:data:`DEFAULT_NUM_HEADS` without any):
    the sum of the counts of the first layer spec with counts.

    Example:
        >>> infer_num_heads("attention:6,heat:2"), infer_num_heads("attention")
        (8, 4)
    """
    layers = split_schedule(heads)
    for spec in (layers,) if isinstance(layers, str) else layers:
        total = count_heads(spec)
        if total is not None:
            return total
    return DEFAULT_NUM_HEADS


@dataclass(frozen=True)
class HeadSchedule:
    """A head schedule, parsed and checked once: what a model config's ``heads`` takes.

    Made by :meth:`parse` (or :func:`check_heads`) from the text of a schedule; a run's spec
    holds one per schedule and the models are built from :attr:`config_heads`, so the text is
    split, counted and its operators built once, not again at every step of a run's set-up.

    Attributes:
        text: the schedule as given (``"attention:4;attention:2,laplacian:2"``).
        config_heads: one spec for every layer (a str) or one per layer (a tuple).
        num_heads: heads per layer.
        n_layer: layers of the model it is for.
    """

    text: str
    config_heads: str | tuple[str, ...]
    num_heads: int
    n_layer: int

    @classmethod
    def parse(cls, heads: str, *, n_layer: int, n_head: int | None = None) -> HeadSchedule:
        """Check a schedule: syntax, operator names and parameters, layers, head counts.

        Each distinct layer spec is parsed by :func:`parse_heads`, exactly as a model parses
        it, so a schedule that passes here builds.

        Args:
            heads: a head schedule, one spec for every layer or one per layer (``;``).
            n_layer: layers of the model.
            n_head: heads per layer, or ``None`` to infer it from the counts.

        Raises:
            ValueError: bad syntax, an unknown operator (valid names listed), bad operator
                parameters, a per-layer schedule whose length is not ``n_layer``, counts that
                do not sum to ``n_head``, or layers with different head totals.

        Example:
            >>> HeadSchedule.parse("attention:4;attention:2,laplacian:2", n_layer=2).num_heads
            4
        """
        if not isinstance(heads, str) or not heads.strip():
            raise checks.bad_value("heads", f"expected a non-empty schedule string, got {heads!r}")
        layers = split_schedule(heads)
        specs = (layers,) if isinstance(layers, str) else layers
        if not isinstance(layers, str) and len(specs) != n_layer:
            raise checks.bad_value(
                "heads",
                f"expected {n_layer} layer specs separated by ';' (n_layer={n_layer}), "
                f"got {len(specs)} in {heads!r}",
            )
        totals = {total for total in map(count_heads, specs) if total is not None}
        if len(totals) > 1:
            raise checks.bad_value(
                "heads",
                f"expected the same number of heads in every layer, got {sorted(totals)} in "
                f"{heads!r}",
            )
        if n_head is not None and totals and totals != {n_head}:
            raise checks.bad_value(
                "heads",
                f"expected head counts summing to n_head={n_head}, got {totals.pop()} in {heads!r}",
            )
        num_heads = (
            n_head if n_head is not None else (totals.pop() if totals else DEFAULT_NUM_HEADS)
        )
        for spec in dict.fromkeys(specs):
            parse_heads(spec, num_heads)
        return cls(text=heads, config_heads=layers, num_heads=num_heads, n_layer=n_layer)

    def __str__(self) -> str:
        return self.text


def check_heads(heads: str, *, n_layer: int, n_head: int | None = None) -> HeadSchedule:
    """:meth:`HeadSchedule.parse`: the schedule checked, and parsed for the model."""
    return HeadSchedule.parse(heads, n_layer=n_layer, n_head=n_head)
