"""Aggregate run records into the comparison report: numbers, table, CSV and plots.

Statistics over seeds: ``mean`` is the arithmetic mean and ``std`` the *sample*
standard deviation (``ddof=1``, the usual error bar for a handful of seeds); with one
seed ``std`` is 0. A metric that is NaN in any seed is NaN in the summary (a diverged
run is not averaged away).

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
from typing import Any

import torch

from heatformer.checks import bad_value

__all__ = [
    "aggregate",
    "environment",
    "format_table",
    "mean_std",
    "plot_report",
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
        (``{metric: {"mean", "std", "values"}}``) and ``analysis``
        (``{metric: {"mean": [per layer], "std": [per layer]}}``).
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
            final[name] = {"mean": mean, "std": std, "values": values}
        analysis: dict[str, Any] = {}
        for name in analysis_names:
            per_run = [r.get("analysis", {}).get(name) for r in runs]
            if any(not v for v in per_run):
                continue
            layers = min(len(v) for v in per_run)
            stats = [mean_std([v[i] for v in per_run]) for i in range(layers)]
            analysis[name] = {"mean": [m for m, _ in stats], "std": [s for _, s in stats]}
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


def plot_report(
    out_dir: str | os.PathLike[str],
    records: Sequence[dict[str, Any]],
    summary: Sequence[dict[str, Any]],
    metric_names: Sequence[str],
    eval_loss_name: str,
    analysis_names: Sequence[str],
) -> list[Path]:
    """Write the report figures as PNG into ``out_dir/plots``.

    - ``loss_curves.png``: training loss (EMA-smoothed) and evaluation loss against the
      step, one colour per configuration, one line per seed.
    - ``final_<metric>.png``: each final metric per configuration, mean ± std error
      bars with the seeds as dots.
    - ``layers_<metric>.png``: each analysis metric against the layer, one line per
      configuration (mean ± std over seeds).

    Uses matplotlib's Agg backend (imported here, only when plotting).

    Args:
        out_dir: the comparison folder.
        records: run records.
        summary: the output of :func:`aggregate`.
        metric_names: final metrics to plot.
        eval_loss_name: the evaluation metric drawn next to the training loss.
        analysis_names: analysis metrics to plot per layer.

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
        path = plots / name
        tmp = plots / f".{name}.tmp-{os.getpid()}.png"
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
        plt.close(fig)
        os.replace(tmp, path)
        written.append(path)

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
    return written
