r"""The declared primary endpoints of a comparison, tested as a reviewer asks.

An endpoint is a final metric (``val_bpc``) or a per-layer metric at one layer
(``within_seq_frac@-1``, ``@last`` the same), declared before the runs (``--primary``,
:attr:`~heatformer.lab.spec.CompareSpec.primary`). For each, :func:`primary_endpoints`
gives:

- every configuration against the shared baseline, paired by seed: the mean difference
  ``config - baseline`` with its 95 % interval and paired t-test
  (:func:`~heatformer.lab.report.stats.paired_difference`); the family is every
  comparison of every primary endpoint, :math:`m` tests, whose p-values are Holm-adjusted
  (:func:`~heatformer.lab.report.inference.holm`) and whose ``ci_simultaneous`` is
  the Bonferroni interval at level :math:`1 - 0.05/m` -- for one endpoint exactly
  :func:`~heatformer.lab.report.inference.many_to_one` (the Dunnett-style many-to-one
  family; its docstring says why Holm rather than Dunnett's critical value);
- the effect in seed-SD units, Cohen's :math:`d_z` with its exact interval
  (:func:`~heatformer.lab.report.inference.effect_size`);
- for a comparison that is not significant after adjustment: the smallest effect the design
  detects at 80 % power (:func:`~heatformer.lab.report.inference.detectable_effect`,
  times the seed-SD of the differences) and, when TOST shows the difference is within it,
  the statement "no effect larger than X"
  (:func:`~heatformer.lab.report.inference.equivalence_statement`); otherwise the
  result is undetermined, not "no effect";
- for every sweep in k (a ``"heads"`` line of :func:`~heatformer.lab.sweep.find_sweeps`):
  the trend test across k (a slope per seed, t-test of the slopes,
  :func:`~heatformer.lab.report.inference.trend_test`), Holm-adjusted over the trend
  tests of every endpoint.

This module imports no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from heatformer.lab.report.inference import (
    detectable_effect,
    effect_size,
    equivalence_statement,
    holm,
    trend_test,
)
from heatformer.lab.report.stats import mean_std, one_sample_t, paired_difference

__all__ = ["endpoint_values", "format_endpoints", "primary_endpoints"]

#: The family-wise error rate of the report's corrections (and each test's size).
ALPHA = 0.05


def endpoint_values(row: Mapping[str, Any], endpoint: str) -> dict[int, float] | None:
    """Seed -> value of ``endpoint`` in one summary row (``None`` when the row lacks it, e.g.
    after ``--no-analysis``).

    Args:
        row: a row of :func:`~heatformer.lab.report.stats.aggregate`.
        endpoint: ``"metric"`` or ``"metric@layer"`` (layer an index, negative from the end,
            or ``"last"``).
    """
    metric, at, layer = endpoint.partition("@")
    if not at:
        stats = row["final"].get(metric)
        values = stats["values"] if stats else None
    else:
        stats = row["analysis"].get(metric)
        if not stats or "values" not in stats:
            return None
        index = -1 if layer == "last" else int(layer)
        per_seed = stats["values"]
        if not per_seed or not -len(per_seed[0]) <= index < len(per_seed[0]):
            return None
        values = [layers[index] for layers in per_seed]
    if values is None:
        return None
    return {seed: math.nan if v is None else float(v) for seed, v in zip(row["seeds"], values)}


def _comparisons(
    summary: Sequence[Mapping[str, Any]], baseline: str, endpoint: str
) -> dict[str, dict[str, Any]]:
    rows = {row["heads"]: row for row in summary}
    base = endpoint_values(rows[baseline], endpoint) if baseline in rows else None
    out: dict[str, dict[str, Any]] = {}
    if base is None:
        return out
    for heads, row in rows.items():
        mine = endpoint_values(row, endpoint)
        if heads == baseline or mine is None:
            continue
        seeds = [seed for seed in mine if seed in base]
        if seeds:
            diff = paired_difference([mine[s] for s in seeds], [base[s] for s in seeds])
            out[heads] = {**diff, "seeds": seeds}
    return out


def _judge(row: dict[str, Any], m: int) -> None:
    """Add the simultaneous interval, the effect size and, when not significant, the
    detectable effect and the equivalence statement to one comparison."""
    values = row["values"]
    row["ci_simultaneous"] = one_sample_t(values, 1 - ALPHA / m)["ci95"] if m else math.nan
    row["effect"] = effect_size(values)
    row["significant"] = bool(row["p_adjusted"] < ALPHA)
    row["detectable"] = row["detectable_sd"] = math.nan
    row["equivalence"] = None
    std = mean_std(values)[1]
    if not row["significant"] and len(values) >= 2 and math.isfinite(std):
        row["detectable_sd"] = detectable_effect(len(values), ALPHA, 0.8)
        row["detectable"] = row["detectable_sd"] * std
        row["equivalence"] = equivalence_statement(values, alpha=ALPHA, power=0.8)


def _trends(
    summary: Sequence[Mapping[str, Any]], endpoint: str, sweeps: Sequence[Any]
) -> list[dict[str, Any]]:
    rows = {row["heads"]: row for row in summary}
    out = []
    for line in sweeps:
        if line.axis != "heads":
            continue
        points: list[tuple[int, dict[int, float]]] = []
        for k, heads in line.points:
            values = endpoint_values(rows[heads], endpoint) if heads in rows else None
            if values is not None:
                points.append((k, values))
        if len({k for k, _ in points}) < 2:
            continue
        seeds = sorted(set.intersection(*(set(values) for _, values in points)))
        if not seeds:
            continue
        ks = [k for k, _ in points]
        test = trend_test([[values[s] for _, values in points] for s in seeds], ks)
        out.append({"sweep": line.label, "ks": ks, "seeds": seeds, **test})
    return out


def primary_endpoints(
    summary: Sequence[Mapping[str, Any]],
    baseline: str,
    endpoints: Sequence[str],
    sweeps: Sequence[Any] = (),
) -> list[dict[str, Any]]:
    """The statistics of the module docstring, one dict per endpoint.

    Args:
        summary: the output of :func:`~heatformer.lab.report.stats.aggregate`.
        baseline: the configuration every other is compared with.
        endpoints: the declared endpoints (``"val_bpc"``, ``"nc1@last"``).
        sweeps: the comparison's :class:`~heatformer.lab.sweep.SweepLine` s.

    Returns:
        Per endpoint ``{"endpoint", "baseline", "family_size", "comparisons": {heads: {"mean",
        "ci95", "p", "n", "values", "seeds", "p_adjusted", "ci_simultaneous", "effect",
        "significant", "detectable", "detectable_sd", "equivalence"}}, "trends": [{"sweep",
        "ks", "seeds", "slope", "ci95", "t", "p", "df", "n", "slopes", "p_adjusted"}]}``.
    """
    out: list[dict[str, Any]] = [
        {
            "endpoint": endpoint,
            "baseline": baseline,
            "comparisons": _comparisons(summary, baseline, endpoint),
            "trends": _trends(summary, endpoint, sweeps),
        }
        for endpoint in endpoints
    ]
    family: list[dict[str, Any]] = [row for item in out for row in item["comparisons"].values()]
    for row, p in zip(family, holm([row["p"] for row in family]) if family else []):
        row["p_adjusted"] = p
    for row in family:
        _judge(row, len(family))
    trends: list[dict[str, Any]] = [trend for item in out for trend in item["trends"]]
    for trend, p in zip(trends, holm([t["p"] for t in trends]) if trends else []):
        trend["p_adjusted"] = p
    for item in out:
        item["family_size"] = len(family)
    return out


def _signed(value: float, digits: int = 4) -> str:
    return "nan" if not math.isfinite(value) else f"{value:+.{digits}f}"


def format_endpoints(endpoints: Sequence[Mapping[str, Any]]) -> str:
    """The primary endpoints as text: per configuration the paired difference, its Holm-adjusted
    p-value and simultaneous interval, :math:`d_z`, and the equivalence verdict; the trends."""
    lines: list[str] = []
    for item in endpoints:
        lines.append(
            f"primary endpoint {item['endpoint']}: config - {item['baseline']} paired by seed; "
            f"Holm over the {item['family_size']} comparison(s) of every primary endpoint, "
            f"simultaneous 95% intervals"
        )
        for heads, row in item["comparisons"].items():
            half, effect = row["ci_simultaneous"], row["effect"]
            verdict = "significant" if row["significant"] else (
                row["equivalence"] or (
                    f"undetermined (detectable at 80% power: {row['detectable']:.3g})"
                    if math.isfinite(row["detectable"]) else "undetermined"))  # fmt: skip
            lines.append(
                f"  {heads}: {_signed(row['mean'])} ± {half:.4f}, p_holm {row['p_adjusted']:.3g}"
                f", d_z {effect['d']:.2f} [{effect['low']:.2f}, {effect['high']:.2f}] "
                f"(n={row['n']}): {verdict}"
            )
        for trend in item["trends"]:
            lines.append(
                f"  trend across k ({trend['sweep']}, k={trend['ks']}): slope "
                f"{_signed(trend['slope'], 5)} ± {trend['ci95']:.5f} per k, p {trend['p']:.3g}, "
                f"p_holm {trend['p_adjusted']:.3g} (n={trend['n']})"
            )
    return "\n".join(lines)
