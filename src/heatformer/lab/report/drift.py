"""How far the untied skip heads' ``W_S`` moved from their start, over a configuration's seeds.

Each run record holds the ``drift`` of its final weights
(:func:`~heatformer.analysis.weight_drift`: per layer, for every operator that learns a matrix
per head, the relative distance ``||W - W0||_F / ||W0||_F`` from its start and ``c = tr(W) / C``,
the multiple of ``I`` nearest to it). :func:`mean_drift` averages them over a configuration's
seeds (its summary row's ``drift``, :func:`~heatformer.lab.report.aggregate`),
:func:`format_drift_table` prints them: a ``skip[init=-1]`` head that stays at distance ~0 and
``c = -1`` is still the Laplacian head it started as; one that moved to ``c`` near 0 became
attention.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from heatformer.lab.report.stats import mean_std
from heatformer.lab.report.tables import _aligned

__all__ = ["format_drift_table", "mean_drift"]


def mean_drift(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The drift of one configuration's learned per-head weights, averaged over its seeds.

    Args:
        runs: the run records of one configuration (a record without ``drift``, from before
            it was recorded, counts as having none).

    Returns:
        One dict per layer, heads and operator, in layer order: ``layer``, ``heads``,
        ``operator``, ``start`` (``tr(W0) / C``), ``seeds`` (how many runs have it), and
        ``distance``, ``identity`` as ``{"mean", "std", "values"}`` over those runs; empty
        without such heads.

    Example:
        >>> runs = [{"drift": [{"layer": 0, "heads": [1], "operator": "skip", "start": -1.0,
        ...          "distance": d, "identity": c}]} for d, c in ((0.1, -0.9), (0.3, -0.7))]
        >>> (row,) = mean_drift(runs)
        >>> row["distance"]["mean"], row["identity"]["mean"], row["seeds"]
        (0.2, -0.8, 2)
    """
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for run in runs:
        for entry in run.get("drift") or []:
            key = (entry["layer"], tuple(entry["heads"]), entry["operator"])
            groups.setdefault(key, []).append(entry)
    out = []
    for (layer, heads, operator), entries in sorted(groups.items()):
        row: dict[str, Any] = {
            "layer": layer,
            "heads": list(heads),
            "operator": operator,
            "start": entries[0]["start"],
            "seeds": len(entries),
        }
        for name in ("distance", "identity"):
            values = [e[name] for e in entries]
            mean, std = mean_std(values)
            row[name] = {"mean": mean, "std": std, "values": values}
        out.append(row)
    return out


def _cell(stats: dict[str, Any], seeds: int, sign: str = "") -> str:
    mean, std = stats["mean"], stats["std"]
    if not math.isfinite(mean):
        return "nan"
    return f"{mean:{sign}.4f}" if seeds < 2 else f"{mean:{sign}.4f} ± {std:.4f}"


def format_drift_table(summary: Sequence[dict[str, Any]]) -> str:
    """The learned per-head weights per configuration and layer, mean ± std over seeds: where
    they started (``c0``), their relative distance from there and the multiple of ``I`` nearest
    to them now (``c``).

    Args:
        summary: the output of :func:`~heatformer.lab.report.aggregate` (rows with a
            ``drift`` entry shown).

    Returns:
        The table under its title, lines joined with newlines; ``""`` when no configuration
        has such heads.
    """
    rows: list[list[str]] = []
    for row in summary:
        for d in row.get("drift") or []:
            heads = ",".join(map(str, d["heads"]))
            rows.append(
                [
                    row["heads"],
                    f"L{d['layer']}",
                    heads,
                    f"{d['operator']} {d['start']:+g}",
                    _cell(d["distance"], d["seeds"]),
                    _cell(d["identity"], d["seeds"], "+"),
                ]
            )
    if not rows:
        return ""
    header = ["heads", "layer", "head", "op c0", "‖W - W0‖/‖W0‖", "c = tr(W)/C"]
    title = [
        "learned per-head weights (untied skip heads' W_S), mean ± std over seeds: distance from",
        "the start W0 = c0 I (‖I‖ when c0 = 0); c = -1: the Laplacian head's path, 0: attention:",
    ]
    return "\n".join([*title, *_aligned(header, rows)])
