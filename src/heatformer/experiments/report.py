r"""Aggregate run records into the comparison report: numbers, table, CSV and plots.

Statistics over seeds: ``mean`` is the arithmetic mean and ``std`` the *sample*
standard deviation (``ddof=1``, the usual error bar for a handful of seeds); with one
seed ``std`` is 0. ``ci95`` is the half-width of the 95 % Student-t confidence interval of
the mean, :math:`t_{0.975,\,n-1}\, s / \sqrt{n}` (:func:`t_interval`; NaN for one seed). A
metric that is NaN in any seed is NaN in the summary (a diverged run is not averaged away).

Paired differences (:func:`paired_difference`, :func:`add_paired`): for every configuration
and the comparison's baseline (its all-attention schedule, else its first), the differences
``metric(config, seed) - metric(baseline, seed)`` over the seeds both ran, with their mean,
95 % interval and the two-sided p-value of the paired t-test. Seeds share the data order and
initial draws, so pairing removes the variation the two runs of a seed have in common.

Sweeps (:mod:`heatformer.experiments.sweep`) get their own figures: every metric against the
number of swept heads per layer (or the layer holding them), mean with 95 % intervals.

Nothing here prints: :func:`format_table` returns the table as a string.
"""

from __future__ import annotations

import csv
import math
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from heatformer.checks import bad_value

if TYPE_CHECKING:
    from heatformer.experiments.sweep import SweepLine

__all__ = [
    "add_paired",
    "aggregate",
    "environment",
    "format_paired_table",
    "format_table",
    "mean_std",
    "paired_difference",
    "plot_report",
    "plot_sweeps",
    "t_interval",
    "write_csv",
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
    mean, half = t_interval(diffs, level)
    n = len(diffs)
    p = math.nan
    if n >= 2 and math.isfinite(mean):
        std = mean_std(diffs)[1]
        if std > 0:
            from scipy.stats import t

            statistic = mean / (std / math.sqrt(n))
            p = float(2 * t.sf(abs(statistic), n - 1))
        else:
            p = 1.0 if mean == 0 else 0.0
    return {"mean": mean, "ci95": half, "p": p, "n": n, "values": diffs}


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
        records: run records (see :func:`heatformer.experiments.trainer.train_run`).
        heads_order: the configurations, in report order.
        metric_names: final metrics to summarize.
        analysis_names: per-layer analysis metrics to summarize layer by layer.

    Returns:
        One dict per configuration with runs: ``heads``, ``seeds``, ``final``
        (``{metric: {"mean", "std", "ci95", "values"}}``) and ``analysis``
        (``{metric: {"mean": [per layer], "std": [...], "ci95": [...], "values": [per seed:
        [per layer]]}}``).
    """
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
        summary.append(
            {
                "heads": heads,
                "seeds": [r["seed"] for r in runs],
                "final": final,
                "analysis": analysis,
            }
        )
    return summary


def _pm(mean: float, std: float, count: int) -> str:
    if not math.isfinite(mean):
        return "nan"
    digits = 4 if abs(mean) < 10 else 2
    if count < 2:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def format_table(
    summary: Sequence[dict[str, Any]],
    metric_names: Sequence[str],
    analysis_names: Sequence[str] = ("within_seq_frac", "effective_rank", "nc1"),
) -> str:
    """The terminal table: one row per configuration, ``mean ± std`` over seeds.

    A configuration with a single seed shows its value without ``± std``.

    Analysis columns show the last layer (``name@L<i>``); the per-layer values are in
    ``results.json`` and the plots.

    Args:
        summary: the output of :func:`aggregate`.
        metric_names: final-metric columns.
        analysis_names: analysis columns (shown when present).

    Returns:
        The table, lines joined with newlines.
    """
    shown_analysis = [
        name for name in analysis_names if any(name in row["analysis"] for row in summary)
    ]
    header = ["heads", "seeds", *metric_names]
    rows: list[list[str]] = []
    last_layer = None
    for row in summary:
        cells = [row["heads"], str(len(row["seeds"]))]
        count = len(row["seeds"])
        cells += [_pm(row["final"][m]["mean"], row["final"][m]["std"], count) for m in metric_names]
        for name in shown_analysis:
            stats = row["analysis"].get(name)
            if stats is None:
                cells.append("-")
                continue
            last_layer = len(stats["mean"]) - 1
            cells.append(_pm(stats["mean"][-1], stats["std"][-1], count))
        rows.append(cells)
    suffix = f"@L{last_layer}" if last_layer is not None else ""
    header += [f"{name}{suffix}" for name in shown_analysis]
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]

    def fmt(line: list[str]) -> str:
        first = line[0].ljust(widths[0])
        return "  ".join([first, *(cell.rjust(w) for cell, w in zip(line[1:], widths[1:]))])

    rule = "-" * len(fmt(header))
    return "\n".join([fmt(header), rule, *(fmt(line) for line in rows)])


def _signed(value: float, digits: int) -> str:
    return "nan" if not math.isfinite(value) else f"{value:+.{digits}f}"


def format_paired_table(summary: Sequence[dict[str, Any]], metric_names: Sequence[str]) -> str:
    """Paired differences against the baseline: ``Δ mean [95 % interval]`` and the p-value.

    One row per configuration with a ``paired`` entry (see :func:`add_paired`); empty when
    there is none (a single configuration, or no seed in common).

    Args:
        summary: the output of :func:`aggregate` after :func:`add_paired`.
        metric_names: the metrics to show.

    Returns:
        The table, lines joined with newlines (``""`` without paired rows).
    """
    rows = [row for row in summary if row.get("paired")]
    if not rows:
        return ""
    baseline = rows[0]["paired"]["baseline"]
    header = ["heads", "pairs"]
    for name in metric_names:
        header += [f"Δ{name} [95% CI]", "p"]
    lines: list[list[str]] = []
    for row in rows:
        cells = [row["heads"], str(len(row["paired"]["seeds"]))]
        for name in metric_names:
            d = row["paired"]["final"][name]
            digits = 4 if abs(d["mean"]) < 10 or not math.isfinite(d["mean"]) else 2
            low, high = d["mean"] - d["ci95"], d["mean"] + d["ci95"]
            interval = (
                f" [{_signed(low, digits)}, {_signed(high, digits)}]"
                if math.isfinite(d["ci95"]) else ""
            )  # fmt: skip
            cells += [f"{_signed(d['mean'], digits)}{interval}",
                      "-" if not math.isfinite(d["p"]) else f"{d['p']:.3f}"]  # fmt: skip
        lines.append(cells)
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]

    def fmt(line: list[str]) -> str:
        first = line[0].ljust(widths[0])
        return "  ".join([first, *(cell.rjust(w) for cell, w in zip(line[1:], widths[1:]))])

    title = f"paired differences against {baseline} (same seeds; paired t-test):"
    return "\n".join([title, fmt(header), "-" * len(fmt(header)), *(fmt(x) for x in lines)])


def write_csv(
    path: str | os.PathLike[str],
    records: Sequence[dict[str, Any]],
    metric_names: Sequence[str],
    analysis_names: Sequence[str],
) -> None:
    """One row per run: configuration, seed, final metrics, per-layer analysis, time.

    Analysis columns are named ``<metric>@L<layer>``. Written atomically.

    Args:
        path: the CSV file.
        records: run records.
        metric_names: final-metric columns.
        analysis_names: analysis metrics (one column per layer each).
    """
    from heatformer.experiments.checkpoint import atomic_write_text

    num_layers = max((len(v) for r in records for v in r.get("analysis", {}).values()), default=0)
    columns = ["heads", "seed", "steps", "num_params", *metric_names]
    columns += [f"{name}@L{i}" for name in analysis_names for i in range(num_layers)]
    columns += ["train_time_s"]
    lines: list[list[Any]] = []
    for record in records:
        row: list[Any] = [record["heads"], record["seed"], record["steps"], record["num_params"]]
        row += [record["final"].get(name) for name in metric_names]
        for name in analysis_names:
            values = record.get("analysis", {}).get(name, [])
            row += [values[i] if i < len(values) else None for i in range(num_layers)]
        row.append(round(float(record.get("train_time_s", 0.0)), 3))
        lines.append(row)

    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for line in lines:
        writer.writerow(["" if v is None else v for v in line])
    atomic_write_text(path, buffer.getvalue())


def environment(world_size: int = 1, device: str = "cpu") -> dict[str, Any]:
    """Versions and machine facts stored in ``results.json``.

    Args:
        world_size: number of DDP processes.
        device: the device the runs used.

    Returns:
        Python, torch, numpy and heatformer versions, platform, CPU count, torch
        threads, CUDA device name (if any), device and world size.
    """
    import numpy as np

    import heatformer

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": np.__version__,
        "heatformer": heatformer.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "device": device,
        "world_size": world_size,
    }


def _ema(values: Sequence[float], alpha: float = 0.1) -> list[float]:
    out, current = [], math.nan
    for v in values:
        current = v if math.isnan(current) else (1 - alpha) * current + alpha * v
        out.append(current)
    return out


def _save_png(fig: Any, path: Path) -> Path:
    """Write ``fig`` to ``path`` as PNG atomically (:func:`heatformer._atomic.atomic_write`)
    and close it."""
    import matplotlib.pyplot as plt

    from heatformer._atomic import atomic_write

    try:
        atomic_write(path, lambda handle: fig.savefig(handle, format="png", dpi=120,
                                                      bbox_inches="tight"))  # fmt: skip
    finally:
        plt.close(fig)
    return path


def plot_report(
    out_dir: str | os.PathLike[str],
    records: Sequence[dict[str, Any]],
    summary: Sequence[dict[str, Any]],
    metric_names: Sequence[str],
    eval_loss_name: str,
    analysis_names: Sequence[str],
    sweeps: Sequence[SweepLine] = (),
) -> list[Path]:
    """Write the report figures as PNG into ``out_dir/plots``.

    - ``loss_curves.png``: training loss (EMA-smoothed) and evaluation loss against the
      step, one colour per configuration, one line per seed.
    - ``final_<metric>.png``: each final metric per configuration, mean ± std error
      bars with the seeds as dots.
    - ``layers_<metric>.png``: each analysis metric against the layer, one line per
      configuration (mean ± std over seeds).
    - for each sweep line, ``sweep_<line>_<metric>.png`` (see :func:`plot_sweeps`).

    Uses matplotlib's Agg backend (imported here, only when plotting).

    Args:
        out_dir: the comparison folder.
        records: run records.
        summary: the output of :func:`aggregate`.
        metric_names: final metrics to plot.
        eval_loss_name: the evaluation metric drawn next to the training loss.
        analysis_names: analysis metrics to plot per layer.
        sweeps: the sweep lines found among the configurations
            (:func:`~heatformer.experiments.sweep.find_sweeps`).

    Returns:
        The written files.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = Path(out_dir) / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    heads_order = [row["heads"] for row in summary]
    colors = {h: plt.get_cmap("tab10")(i % 10) for i, h in enumerate(heads_order)}
    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        written.append(_save_png(fig, plots / name))

    fig, (ax_train, ax_eval) = plt.subplots(1, 2, figsize=(12, 4.5))
    for heads in heads_order:
        for i, record in enumerate(r for r in records if r["heads"] == heads):
            label = heads if i == 0 else None
            steps = range(1, len(record["train_loss"]) + 1)
            ax_train.plot(steps, _ema(record["train_loss"]), color=colors[heads], lw=1, label=label)
            evals = record["evals"]
            ax_eval.plot(
                [e["step"] for e in evals],
                [e.get(eval_loss_name) for e in evals],
                color=colors[heads],
                marker="o",
                ms=3,
                lw=1,
                label=label,
            )
    ax_train.set(xlabel="step", ylabel="training loss (EMA 0.1)", title="training loss")
    ax_eval.set(xlabel="step", ylabel=eval_loss_name, title=f"evaluation: {eval_loss_name}")
    for ax in (ax_train, ax_eval):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save(fig, "loss_curves.png")

    for name in metric_names:
        fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(summary) + 1), 4))
        for x, row in enumerate(summary):
            stats = row["final"][name]
            ax.errorbar(
                [x],
                [stats["mean"]],
                yerr=[stats["std"]],
                fmt="o",
                capsize=6,
                color=colors[row["heads"]],
                ms=8,
            )
            values = [v for v in stats["values"] if v is not None]
            ax.scatter([x + 0.12] * len(values), values, s=12, color="gray", zorder=3)
        ax.set_xticks(
            range(len(summary)),
            [row["heads"] for row in summary],
            rotation=15,
            ha="right",
            fontsize=8,
        )
        ax.set(ylabel=name, title=f"final {name} (mean ± std over seeds)")
        ax.grid(alpha=0.3, axis="y")
        save(fig, f"final_{name}.png")

    for name in analysis_names:
        rows = [row for row in summary if name in row["analysis"]]
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for row in rows:
            stats = row["analysis"][name]
            layers = range(len(stats["mean"]))
            ax.errorbar(
                layers,
                stats["mean"],
                yerr=stats["std"],
                marker="o",
                capsize=3,
                color=colors[row["heads"]],
                label=row["heads"],
            )
        ax.set(xlabel="layer", ylabel=name, title=f"{name} per layer (mean ± std over seeds)")
        ax.set_xticks(list(range(max(len(r["analysis"][name]["mean"]) for r in rows))))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, f"layers_{name}.png")
    if sweeps:
        written += plot_sweeps(out_dir, summary, sweeps, metric_names, analysis_names)
    return written


def plot_sweeps(
    out_dir: str | os.PathLike[str],
    summary: Sequence[dict[str, Any]],
    sweeps: Sequence[SweepLine],
    metric_names: Sequence[str],
    analysis_names: Sequence[str],
) -> list[Path]:
    """Every metric against a sweep's number (heads per layer, or layer), with 95 % intervals.

    For each line and each final metric, ``plots/sweep_<line>_<metric>.png``: on the left the
    mean over seeds with its Student-t 95 % interval at each point, the seeds as grey dots,
    and the configurations outside the line (e.g. a mean-pooling control) as labelled
    horizontal lines; on the right the paired differences against the baseline (see
    :func:`add_paired`) with their intervals and a line at 0. For each analysis metric,
    ``plots/sweep_<line>_<metric>.png`` with the same two panels, one line per layer.

    Args:
        out_dir: the comparison folder.
        summary: the output of :func:`aggregate`.
        sweeps: the lines to draw.
        metric_names: final metrics.
        analysis_names: per-layer analysis metrics.

    Returns:
        The written files.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = Path(out_dir) / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    rows = {row["heads"]: row for row in summary}
    baseline = next((row["paired"]["baseline"] for row in summary if row.get("paired")), None)
    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        written.append(_save_png(fig, plots / name))

    def errors(values: Sequence[float]) -> list[float]:
        return [0.0 if not math.isfinite(v) else v for v in values]

    def paired(row: dict[str, Any], name: str, layer: int | None = None) -> tuple[float, float]:
        """``(mean, ci95)`` of the paired difference; the baseline itself is ``(0, 0)``."""
        if not row.get("paired"):
            return (0.0, 0.0) if row["heads"] == baseline else (math.nan, math.nan)
        if layer is None:
            stats = row["paired"]["final"][name]
            return stats["mean"], stats["ci95"]
        stats = row["paired"]["analysis"].get(name)
        return (stats["mean"][layer], stats["ci95"][layer]) if stats else (math.nan, math.nan)

    def finish(fig: Any, ax: Any, ax_d: Any, line: SweepLine, xs: list[int], name: str) -> None:
        ax_d.axhline(0.0, color="black", lw=0.8)
        title = f"paired against {line.baseline or 'the baseline'} (95% CI)"
        ax_d.set(xlabel=line.label, ylabel=f"Δ {name}", title=title)
        for axis in (ax, ax_d):
            axis.set_xticks(xs)
            axis.grid(alpha=0.3)
        ax.legend(fontsize=7)
        if ax_d.get_legend_handles_labels()[0]:
            ax_d.legend(fontsize=7)
        save(fig, f"sweep_{line.slug}_{name}.png")

    for line in sweeps:
        points = [(x, rows[h]) for x, h in line.points if h in rows]
        if len(points) < 2:
            continue
        xs = [x for x, _ in points]
        on_line = {row["heads"] for _, row in points}
        others = [row for row in summary if row["heads"] not in on_line][:6]
        for name in metric_names:
            fig, (ax, ax_d) = plt.subplots(1, 2, figsize=(11, 4))
            means = [row["final"][name]["mean"] for _, row in points]
            cis = [row["final"][name].get("ci95", math.nan) for _, row in points]
            ax.errorbar(xs, means, yerr=errors(cis), marker="o", capsize=5, color="C0",
                        label=f"{line.operator} (mean, 95% CI)")  # fmt: skip
            for x, row in points:
                values = [v for v in row["final"][name]["values"] if v is not None]
                ax.scatter([x + 0.08] * len(values), values, s=10, color="gray", zorder=3)
            for i, row in enumerate(others):
                ax.axhline(row["final"][name]["mean"], color=f"C{i + 1}", ls="--", lw=1,
                           label=row["heads"])  # fmt: skip
            ax.set(xlabel=line.label, ylabel=name,
                   title=f"{name} (seeds: {len(points[0][1]['seeds'])})")  # fmt: skip
            diffs = [paired(row, name) for _, row in points]
            ax_d.errorbar(xs, [d[0] for d in diffs], yerr=errors([d[1] for d in diffs]),
                          marker="o", capsize=5, color="C0", label=line.operator)  # fmt: skip
            for i, row in enumerate(others):
                if row.get("paired"):
                    ax_d.axhline(paired(row, name)[0], color=f"C{i + 1}", ls="--", lw=1,
                                 label=row["heads"])  # fmt: skip
            finish(fig, ax, ax_d, line, xs, name)
        for name in analysis_names:
            if any(name not in row["analysis"] for _, row in points):
                continue
            layers = min(len(row["analysis"][name]["mean"]) for _, row in points)
            fig, (ax, ax_d) = plt.subplots(1, 2, figsize=(11, 4))
            cmap = plt.get_cmap("viridis")
            for layer in range(layers):
                means = [row["analysis"][name]["mean"][layer] for _, row in points]
                cis = [row["analysis"][name].get("ci95", [math.nan] * layers)[layer]
                       for _, row in points]  # fmt: skip
                color = cmap(layer / max(1, layers - 1))
                ax.errorbar(xs, means, yerr=errors(cis), marker="o", capsize=3, color=color,
                            label=f"layer {layer}")  # fmt: skip
                diffs = [paired(row, name, layer) for _, row in points]
                ax_d.errorbar(xs, [d[0] for d in diffs], yerr=errors([d[1] for d in diffs]),
                              marker="o", capsize=3, color=color)  # fmt: skip
            ax.set(xlabel=line.label, ylabel=name, title=f"{name} per layer (mean, 95% CI)")
            finish(fig, ax, ax_d, line, xs, name)
    return written
