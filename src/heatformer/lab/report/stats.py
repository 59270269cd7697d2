r"""Statistics over seeds: means, Student-t intervals, paired differences, the summary.

``mean`` is the arithmetic mean and ``std`` the *sample* standard deviation (``ddof=1``, the
usual error bar for a handful of seeds); with one seed ``std`` is 0. ``ci95`` is the
half-width of the 95 % Student-t confidence interval of the mean,
:math:`t_{0.975,\,n-1}\, s / \sqrt{n}` (:func:`t_interval`; NaN for one seed). A metric that
is NaN in any seed is NaN in the summary (a diverged run is not averaged away).

Paired differences (:func:`paired_difference`, :func:`add_paired`): for every configuration
and the comparison's baseline (its all-attention schedule, else its first), the differences
``metric(config, seed) - metric(baseline, seed)`` over the seeds both ran, with their mean,
95 % interval and the two-sided p-value of the paired t-test. Seeds share the data order and
initial draws, so pairing removes the variation the two runs of a seed have in common.

The learned polynomial filters of a configuration's runs (:func:`mean_filters`) are averaged
coefficient by coefficient, per layer and heads, and labelled as the mean filter is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from heatformer.checks import bad_value

__all__ = [
    "add_paired",
    "aggregate",
    "mean_filters",
    "mean_std",
    "one_sample_t",
    "paired_difference",
    "t_interval",
]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (``ddof=1``; 0 for a single value).

    Args:
        values: at least one number; ``None`` counts as NaN.

    Returns:
        ``(mean, std)``; NaN if any value is NaN or ``None``.

    Examples:
        >>> mean_std([1.0, 2.0, 3.0])
        (2.0, 1.0)
        >>> mean_std([5.0])
        (5.0, 0.0)
    """
    clean = [math.nan if v is None else float(v) for v in values]
    if not clean:
        raise bad_value("values", "expected at least one number, got none")
    n = len(clean)
    mean = math.fsum(clean) / n
    if n == 1:
        return mean, 0.0 if math.isfinite(mean) else math.nan
    var = math.fsum((v - mean) ** 2 for v in clean) / (n - 1)
    return mean, math.sqrt(var)


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    r"""Mean and half-width of the Student-t confidence interval of the mean.

    .. math:: \bar x \pm t_{(1+\text{level})/2,\; n-1}\; \frac{s}{\sqrt n},
        \qquad s^2 = \frac{1}{n-1} \sum_i (x_i - \bar x)^2

    (the interval ``scipy.stats.t.interval(level, n - 1, loc=mean, scale=s / sqrt(n))``).

    Args:
        values: at least one number; ``None`` counts as NaN.
        level: the confidence level, in ``(0, 1)``.

    Returns:
        ``(mean, half_width)``; the half-width is NaN for a single value, and both are
        NaN if any value is.

    Examples:
        >>> mean, half = t_interval([1.0, 2.0, 3.0])
        >>> mean, round(half, 4)
        (2.0, 2.4841)
    """
    if not (isinstance(level, float) and 0.0 < level < 1.0):
        raise bad_value("level", f"expected a float in (0, 1), got {level!r}")
    mean, std = mean_std(values)
    n = len(values)
    if n < 2 or not math.isfinite(mean):
        return mean, math.nan
    from scipy.stats import t

    return mean, float(t.ppf(0.5 + level / 2, n - 1)) * std / math.sqrt(n)


def one_sample_t(values: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    r"""One-sample Student-t test of ``mean == 0``, with the interval of the mean.

    .. math:: t = \frac{\bar x}{s / \sqrt n}, \qquad \nu = n - 1, \qquad
        p = 2\, P(T_\nu \ge |t|)

    (``scipy.stats.ttest_1samp(values, 0)``); the interval is :func:`t_interval`'s.

    Args:
        values: at least one number; ``None`` counts as NaN.
        level: the confidence level of ``ci95`` (the key keeps its name).

    Returns:
        ``{"mean", "ci95", "t", "p", "df", "n"}``: ``t`` and ``p`` are NaN below two values or
        with a NaN; when every value is the same, ``t`` is 0 or +-inf and ``p`` 1 or 0.

    Examples:
        >>> r = one_sample_t([1.0, 2.0, 3.0])
        >>> round(r["t"], 4), round(r["p"], 4), r["df"]
        (3.4641, 0.0742, 2)
    """
    mean, half = t_interval(values, level)
    n = len(values)
    t_stat = p = math.nan
    if n >= 2 and math.isfinite(mean):
        std = mean_std(values)[1]
        if std > 0:
            from scipy.stats import t

            t_stat = mean / (std / math.sqrt(n))
            p = float(2 * t.sf(abs(t_stat), n - 1))
        else:
            t_stat = 0.0 if mean == 0 else math.copysign(math.inf, mean)
            p = 1.0 if mean == 0 else 0.0
    return {"mean": mean, "ci95": half, "t": t_stat, "p": p, "df": n - 1, "n": n}


def paired_difference(
    values: Sequence[float], baseline: Sequence[float], level: float = 0.95
) -> dict[str, Any]:
    """Paired differences ``values[i] - baseline[i]``: mean, confidence interval, paired t-test.

    Args:
        values: a configuration's metric, one per seed.
        baseline: the baseline's metric on the same seeds, in the same order.
        level: the confidence level of ``ci95`` (the key keeps its name).

    Returns:
        ``{"mean", "ci95", "p", "n", "values"}``: mean difference, half-width of its
        Student-t interval, the two-sided p-value of the paired t-test (``scipy.stats.ttest_rel``;
        NaN below two seeds; 0 or 1 when every difference is the same), the number of pairs and
        the differences.

    Raises:
        ValueError: ``values`` and ``baseline`` of different lengths, or no pairs.
    """
    if len(values) != len(baseline):
        raise bad_value(
            "baseline", f"expected {len(values)} values (one per seed), got {len(baseline)}"
        )
    if not values:
        raise bad_value("values", "expected at least one pair, got none")
    diffs = [
        math.nan if a is None or b is None else float(a) - float(b)
        for a, b in zip(values, baseline)
    ]
    test = one_sample_t(diffs, level)
    return {key: test[key] for key in ("mean", "ci95", "p", "n")} | {"values": diffs}


def add_paired(
    summary: Sequence[dict[str, Any]],
    baseline: str,
    metric_names: Sequence[str],
    analysis_names: Sequence[str],
) -> None:
    """Add ``paired`` (differences against ``baseline`` on shared seeds) to every summary row.

    ``row["paired"]`` holds ``baseline``, ``seeds`` (those both ran), ``final``
    (``{metric: paired_difference(...)}``) and ``analysis`` (``{metric: {"mean": [per
    layer], "ci95": [per layer]}}``). The baseline's own row gets none.

    Args:
        summary: the output of :func:`aggregate` (changed in place).
        baseline: the head schedule to compare against; a summary without it is left alone.
        metric_names: final metrics.
        analysis_names: per-layer analysis metrics.
    """
    rows = {row["heads"]: row for row in summary}
    base = rows.get(baseline)
    if base is None:
        return
    for row in summary:
        if row["heads"] == baseline:
            continue
        seeds = [s for s in row["seeds"] if s in base["seeds"]]
        if not seeds:
            continue

        def pick(stats: Sequence[Any], of: dict[str, Any], seeds: list[int] = seeds) -> list[Any]:
            return [stats[of["seeds"].index(s)] for s in seeds]

        final = {
            name: paired_difference(
                pick(row["final"][name]["values"], row), pick(base["final"][name]["values"], base)
            )
            for name in metric_names
        }
        analysis: dict[str, Any] = {}
        for name in analysis_names:
            mine, theirs = row["analysis"].get(name), base["analysis"].get(name)
            if not mine or not theirs or "values" not in mine or "values" not in theirs:
                continue
            layers = min(len(mine["mean"]), len(theirs["mean"]))
            stats = [
                paired_difference(
                    pick([v[i] for v in mine["values"]], row),
                    pick([v[i] for v in theirs["values"]], base),
                )
                for i in range(layers)
            ]
            analysis[name] = {
                "mean": [d["mean"] for d in stats],
                "ci95": [d["ci95"] for d in stats],
            }
        row["paired"] = {"baseline": baseline, "seeds": seeds, "final": final, "analysis": analysis}


def aggregate(
    records: Sequence[dict[str, Any]],
    heads_order: Sequence[str],
    metric_names: Sequence[str],
    analysis_names: Sequence[str],
) -> list[dict[str, Any]]:
    """Mean ± std over seeds, per head configuration.

    Args:
        records: run records (see :func:`heatformer.lab.trainer.train_run`).
        heads_order: the configurations, in report order.
        metric_names: final metrics to summarize.
        analysis_names: per-layer analysis metrics to summarize layer by layer.

    Returns:
        One dict per configuration with runs: ``heads``, ``seeds``, ``final``
        (``{metric: {"mean", "std", "ci95", "values"}}``) and ``analysis``
        (``{metric: {"mean": [per layer], "std": [...], "ci95": [...], "values": [per seed:
        [per layer]]}}``); and ``filters`` (:func:`mean_filters`) when its runs have
        polynomial heads, ``drift`` (:func:`~heatformer.lab.report.drift.mean_drift`) when
        they have untied skip heads.
    """
    from heatformer.lab.report.drift import mean_drift  # which imports this module

    summary = []
    for heads in heads_order:
        runs = sorted((r for r in records if r["heads"] == heads), key=lambda r: r["seed"])
        if not runs:
            continue
        final: dict[str, Any] = {}
        for name in metric_names:
            values = [r["final"].get(name) for r in runs]
            mean, std = mean_std(values)
            ci95 = t_interval(values)[1]
            final[name] = {"mean": mean, "std": std, "ci95": ci95, "values": values}
        analysis: dict[str, Any] = {}
        for name in analysis_names:
            per_run = [r.get("analysis", {}).get(name) for r in runs]
            if any(not v for v in per_run):
                continue
            layers = min(len(v) for v in per_run)
            stats = [mean_std([v[i] for v in per_run]) for i in range(layers)]
            analysis[name] = {
                "mean": [m for m, _ in stats],
                "std": [s for _, s in stats],
                "ci95": [t_interval([v[i] for v in per_run])[1] for i in range(layers)],
                "values": [list(v[:layers]) for v in per_run],
            }
        row: dict[str, Any] = {
            "heads": heads,
            "seeds": [r["seed"] for r in runs],
            "final": final,
            "analysis": analysis,
        }
        filters = mean_filters(runs)
        if filters:  # polynomial heads
            row["filters"] = filters
        drift = mean_drift(runs)
        if drift:  # heads that learn a matrix (untied skip heads)
            row["drift"] = drift
        summary.append(row)
    return summary


def mean_filters(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    r"""The learned polynomial filters of one configuration's runs, averaged over its seeds.

    Each run record holds the ``filters`` of its final weights
    (:func:`~heatformer.analysis.polynomial_filters`: per layer, the coefficients
    :math:`\gamma_0 .. \gamma_K` of each polynomial head, their response and band). They are
    averaged coefficient by coefficient, per layer and heads; the label is that of the mean
    filter (its response is the mean of the runs' responses, which are linear in the
    coefficients), beside each run's own.

    Args:
        runs: the run records of one configuration (a record without ``filters``, from before
            they were recorded, counts as having none).

    Returns:
        One dict per layer and heads, in layer order: ``layer``, ``heads``, ``operator``,
        ``basis``, ``seeds`` (how many runs have it), ``coefficients`` and
        ``coefficients_std`` (mean and sample std over those runs, per ``k``), ``gains``,
        ``energy`` and ``label`` of the mean filter
        (:func:`~heatformer.analysis.filter_response`), ``labels`` (each run's own, in run
        order); empty without polynomial heads.

    Example:
        >>> runs = [{"filters": [{"layer": 0, "heads": [1], "operator": "polynomial",
        ...           "basis": "adjacency", "coefficients": c, "label": "low-pass"}]}
        ...         for c in ([0.25, 0.5], [0.75, 0.0])]
        >>> (row,) = mean_filters(runs)
        >>> row["coefficients"], row["coefficients_std"], row["label"], row["seeds"]
        ([0.5, 0.25], [0.3535..., 0.3535...], 'low-pass', 2)
    """
    from heatformer.analysis.filters import filter_response

    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for run in runs:
        for entry in run.get("filters") or []:
            key = (entry["layer"], tuple(entry["heads"]), entry["operator"], entry["basis"])
            groups.setdefault(key, []).append(entry)
    out = []
    for (layer, heads, operator, basis), entries in sorted(groups.items()):
        order = min(len(e["coefficients"]) for e in entries)
        stats = [mean_std([e["coefficients"][k] for e in entries]) for k in range(order)]
        response = filter_response([m for m, _ in stats], basis)
        out.append(
            {
                "layer": layer,
                "heads": list(heads),
                "operator": operator,
                "basis": basis,
                "seeds": len(entries),
                "coefficients": [m for m, _ in stats],
                "coefficients_std": [s for _, s in stats],
                "gains": list(response.gains),
                "energy": list(response.energy),
                "label": response.label,
                "labels": [e["label"] for e in entries],
            }
        )
    return out
