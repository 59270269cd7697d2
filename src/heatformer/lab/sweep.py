"""Sweeps over head schedules: how many heads of one operator per layer, or in which layer.

Zhang & Papyan sweep the number ``k`` of Laplacian heads per layer (``kL``, the same ``k`` in
every layer, the rest plain attention). ``heatformer compare --sweep SPEC`` writes such a
family of head schedules for you (:func:`expand_sweep`); the report then finds the families
among the configurations (:func:`find_sweeps`) -- whether they came from ``--sweep`` or from
``--heads`` flags -- and plots every metric against ``k`` (or the layer), with 95 %
confidence intervals over seeds and paired differences against the all-attention baseline
(:mod:`heatformer.lab.report`).

Syntax of a sweep (``OP`` is any operator spec, parameters in brackets: ``heat[t=0.5]``):

=================== ===================================================================
``OP=0..4``         ``k`` heads of ``OP`` in every layer, ``k = 0, 1, ..., 4``, the rest
                    ``attention`` (``k = 0`` is the all-attention baseline)
``OP=0,2,4``        the listed ``k``
``OP=0..4@2,3``     only in layers 2 and 3 (0-based; ``@1..3`` works too); the other
                    layers stay all attention
``OP=2@each``       2 heads of ``OP`` in one layer at a time, each layer in turn (a
                    per-layer schedule sweep), plus the all-attention baseline
=================== ===================================================================

Examples:
    >>> expand_sweep("laplacian=0..2", n_head=4, n_layer=2)
    ('attention:4', 'attention:3,laplacian:1', 'attention:2,laplacian:2')
    >>> expand_sweep("heat[t=0.5]=4@each", n_head=4, n_layer=2)
    ('attention:4', 'heat[t=0.5]:4;attention:4', 'attention:4;heat[t=0.5]:4')
    >>> [line.label for line in find_sweeps(expand_sweep("laplacian=0..4", n_head=4,
    ...                                                      n_layer=2), n_layer=2)]
    ['laplacian heads per layer']

This module imports no torch at import time.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from heatformer.checks import bad_type, bad_value

__all__ = ["BASE_OPERATOR", "SweepLine", "baseline_heads", "expand_sweep", "find_sweeps"]

#: The operator of the heads a sweep does not replace.
BASE_OPERATOR = "attention"

_SWEEP = re.compile(r"^\s*(?P<op>[A-Za-z_]+\s*(?:\[[^\]]*\])?)\s*=\s*(?P<ks>[^@]+?)\s*"
                    r"(?:@\s*(?P<where>.+?))?\s*$")  # fmt: skip
_ENTRY = re.compile(r"^\s*([A-Za-z_]+)\s*(\[[^\]]*\])?\s*(?::\s*(\d+))?\s*$")


@dataclass(frozen=True)
class SweepLine:
    """One family of configurations that differ in one number, as the report plots it.

    Attributes:
        operator: the swept operator spec (``"laplacian"``, ``"heat[t=0.5]"``).
        axis: ``"heads"`` (x = heads of ``operator`` per layer) or ``"layer"`` (x = the layer
            that holds them).
        where: for ``axis="heads"`` the layers that hold the swept heads (every layer or a
            subset); for ``axis="layer"`` the number of swept heads in that layer.
        points: ``(x, heads)`` in increasing ``x``; a ``"heads"`` line includes the baseline at
            ``x = 0`` when the comparison has one.
        baseline: the all-attention schedule of the comparison, or ``None``.
    """

    operator: str
    axis: str
    where: tuple[int, ...] | int
    points: tuple[tuple[int, str], ...]
    baseline: str | None

    @property
    def label(self) -> str:
        """The x-axis label: ``"laplacian heads per layer"``, ``"layer with 2 heat heads"``."""
        if self.axis == "heads":
            if isinstance(self.where, tuple) and self.where:
                layers = ",".join(str(i) for i in self.where)
                return f"{self.operator} heads per layer (layers {layers})"
            return f"{self.operator} heads per layer"
        return f"layer with {self.where} {self.operator} heads"

    @property
    def slug(self) -> str:
        """A file-name-safe name of the line (for the plots)."""
        text = f"{self.operator}-{self.axis}"
        if self.axis == "heads" and isinstance(self.where, tuple) and self.where:
            text += "-L" + "_".join(str(i) for i in self.where)
        elif self.axis == "layer":
            text += f"-k{self.where}"
        return re.sub(r"[^A-Za-z0-9_.=-]", "", text.replace(";", "_").replace("=", "-"))


def _numbers(text: str, name: str, spec: str, *, upper: int) -> list[int]:
    """``"0..4"`` / ``"0,2,4"`` -> ints in ``[0, upper]``, increasing and distinct."""
    values: list[int] = []
    for part in text.split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)\s*\.\.\s*(\d+)", part)
        if match:
            low, high = int(match.group(1)), int(match.group(2))
            if low > high:
                raise bad_value(name, f"expected a range low..high with low <= high in {spec!r}")
            values += range(low, high + 1)
        elif part.isdigit():
            values.append(int(part))
        else:
            raise bad_value(name, f"expected numbers like 0..4 or 0,2,4 in {spec!r}, got {part!r}")
    if len(set(values)) != len(values):
        raise bad_value(name, f"expected distinct numbers in {spec!r}, got {values}")
    if any(v > upper for v in values):
        raise bad_value(name, f"expected numbers in [0, {upper}] in {spec!r}, got {values}")
    return sorted(values)


def _layer_spec(op: str, k: int, n_head: int) -> str:
    if k == 0:
        return f"{BASE_OPERATOR}:{n_head}"
    if k == n_head:
        return f"{op}:{n_head}"
    return f"{BASE_OPERATOR}:{n_head - k},{op}:{k}"


def expand_sweep(spec: str, *, n_head: int, n_layer: int) -> tuple[str, ...]:
    """The head schedules of a sweep (syntax in the module docstring), baseline first.

    Args:
        spec: ``"laplacian=0..4"``, ``"heat[t=0.5]=0,2,4@1"``, ``"laplacian=2@each"``.
        n_head: heads per layer ``H`` (the swept count runs up to ``H``).
        n_layer: layers of the model.

    Returns:
        Distinct schedules in increasing ``k`` (or layer) order; the all-attention schedule
        ``"attention:H"`` stands for ``k = 0`` and, in an ``@each`` sweep, comes first.

    Raises:
        TypeError: ``spec`` is not a string.
        ValueError: bad syntax, ``k`` outside ``[0, H]``, a layer outside
            ``[0, n_layer)``, or ``@each`` with other than one ``k``; the message names
            ``sweep``.
    """
    if not isinstance(spec, str):
        raise bad_type("sweep", f"expected a sweep spec string, got {type(spec).__name__}")
    match = _SWEEP.match(spec)
    if match is None:
        raise bad_value(
            "sweep",
            f"expected OP=K0..K1[@LAYERS] (e.g. laplacian=0..4, heat[t=0.5]=0,2,4@1, "
            f"laplacian=2@each), got {spec!r}",
        )
    op = _operator_key(match.group("op"))
    if op.split("[")[0] == BASE_OPERATOR:
        raise bad_value("sweep", f"expected an operator other than {BASE_OPERATOR!r}, got {spec!r}")
    ks = _numbers(match.group("ks"), "sweep", spec, upper=n_head)
    where = (match.group("where") or "").strip()
    if where == "each":
        if len(ks) != 1 or ks[0] == 0:
            raise bad_value(
                "sweep",
                f"expected one head count k >= 1 with @each (e.g. {op}=2@each), got {spec!r}",
            )
        schedules = [f"{BASE_OPERATOR}:{n_head}"]
        for layer in range(n_layer):
            layers = [_layer_spec(op, ks[0] if i == layer else 0, n_head) for i in range(n_layer)]
            schedules.append(";".join(layers))
        return tuple(dict.fromkeys(schedules))
    if where:
        chosen = set(_numbers(where, "sweep", spec, upper=n_layer - 1))
        schedules = []
        for k in ks:
            layers = [_layer_spec(op, k if i in chosen else 0, n_head) for i in range(n_layer)]
            uniform = len(set(layers)) == 1
            schedules.append(layers[0] if uniform else ";".join(layers))
        return tuple(dict.fromkeys(schedules))
    return tuple(_layer_spec(op, k, n_head) for k in ks)


def _operator_key(spec: str) -> str:
    """``"heat [t = 0.5]"`` -> ``"heat[t = 0.5]"``: the name glued to its brackets, runs of
    blanks inside them made one (blanks separate the values of a tuple, ``coeffs=(0.5 -1)``)."""
    name, _, params = spec.strip().partition("[")
    return name.strip() + ("[" + re.sub(r"\s+", " ", params).strip() if params else "")


def _layer_counts(heads: str, n_layer: int, n_head: int) -> list[dict[str, int]] | None:
    """Per layer, ``{operator spec: heads}``; ``None`` when the schedule cannot be read."""
    from heatformer._spec import split_outside_brackets

    layers = [part.strip() for part in split_outside_brackets(heads, "|;")]
    if len(layers) == 1:
        layers = layers * n_layer
    if len(layers) != n_layer:
        return None
    out: list[dict[str, int]] = []
    for layer in layers:
        counts: dict[str, int] = {}
        for entry in split_outside_brackets(layer, ","):
            match = _ENTRY.match(entry)
            if match is None:
                return None
            key = _operator_key(match.group(1) + (match.group(2) or ""))
            counts[key] = counts.get(key, 0) + (int(match.group(3)) if match.group(3) else n_head)
        out.append(counts)
    return out


def baseline_heads(
    heads: Sequence[str], *, n_layer: int, n_head: Callable[[str], int] | int | None = None
) -> str | None:
    """The first schedule whose heads are all ``attention`` in every layer, else ``None``.

    Args:
        heads: the configurations of a comparison.
        n_layer: layers of the model.
        n_head: heads per layer, or a function of the schedule giving it (default: the
            schedule's counts, 4 without counts).
    """
    for schedule in heads:
        counts = _layer_counts(schedule, n_layer, _heads_of(schedule, n_head))
        if counts is not None and all(set(layer) == {BASE_OPERATOR} for layer in counts):
            return schedule
    return None


def _heads_of(schedule: str, n_head: Callable[[str], int] | int | None) -> int:
    if callable(n_head):
        return n_head(schedule)
    if n_head is not None:
        return n_head
    from heatformer.models.heads import infer_num_heads

    return infer_num_heads(schedule)


def find_sweeps(
    heads: Sequence[str], *, n_layer: int, n_head: Callable[[str], int] | int | None = None
) -> list[SweepLine]:
    """The sweep families among a comparison's configurations.

    A configuration belongs to a family when its non-attention heads are of one operator
    ``OP`` and every layer that holds them holds the same number ``k``:

    - a ``"heads"`` line: the same layers, different ``k`` (the baseline is ``k = 0``);
    - a ``"layer"`` line: the same ``k`` in one layer, a different layer each.

    A family needs at least two points besides the baseline (which a ``"heads"`` line adds
    at ``k = 0``).
    Configurations that fit no family (two operators, uneven counts) are in none; the report
    still shows them in its tables.

    Args:
        heads: the configurations, in report order.
        n_layer: layers of the model.
        n_head: heads per layer, or a function of the schedule (default: its counts).

    Returns:
        The lines, ``"heads"`` lines first, each in order of first appearance.
    """
    base = baseline_heads(heads, n_layer=n_layer, n_head=n_head)
    members: list[tuple[str, str, tuple[int, ...], int]] = []  # heads, op, layers, k
    for schedule in heads:
        counts = _layer_counts(schedule, n_layer, _heads_of(schedule, n_head))
        if counts is None:
            continue
        ops = {op for layer in counts for op in layer} - {BASE_OPERATOR}
        if len(ops) != 1:
            continue
        op = ops.pop()
        per_layer = [layer.get(op, 0) for layer in counts]
        layers = tuple(i for i, k in enumerate(per_layer) if k)
        if len({per_layer[i] for i in layers}) == 1:
            members.append((schedule, op, layers, per_layer[layers[0]]))

    lines: list[SweepLine] = []
    by_layers: dict[tuple[str, tuple[int, ...]], dict[int, str]] = {}
    for schedule, op, layers, k in members:
        by_layers.setdefault((op, layers), {}).setdefault(k, schedule)
    for (op, layers), points in by_layers.items():
        if len(points) < 2:  # one count and the baseline: the plain report shows it
            continue
        if base is not None:
            points = {0: base, **points}
        where = () if len(layers) == n_layer else layers
        lines.append(SweepLine(op, "heads", where, tuple(sorted(points.items())), base))
    by_count: dict[tuple[str, int], dict[int, str]] = {}
    for schedule, op, layers, k in members:
        if len(layers) == 1 and n_layer > 1:
            by_count.setdefault((op, k), {}).setdefault(layers[0], schedule)
    for (op, k), points in by_count.items():
        if len(points) >= 2:
            lines.append(SweepLine(op, "layer", k, tuple(sorted(points.items())), base))
    return lines
