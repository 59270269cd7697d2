"""The report's figures: loss curves, final metrics, per-layer analysis and sweeps, as PNG.

:func:`plot_report` draws the comparison's figures; sweeps
(:mod:`heatformer.lab.sweep`) get their own (:func:`plot_sweeps`): every metric against
the number of swept heads per layer (or the layer holding them), mean with 95 % intervals.
Every figure is one private function that returns it; the two public ones write them.

matplotlib (the ``viz`` extra) is imported only when plotting, with its Agg backend.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from heatformer.lab.sweep import SweepLine

__all__ = [
    "plot_report",
    "plot_sweeps",
]

#: ``(heads per layer or layer, the configuration's summary row)``, one per point of a sweep.
_Points = list[tuple[int, dict[str, Any]]]


def _ema(values: Sequence[float], alpha: float = 0.1) -> list[float]:
    out, current = [], math.nan
    for v in values:
        current = v if math.isnan(current) else (1 - alpha) * current + alpha * v
        out.append(current)
    return out


def _pyplot() -> Any:
    """``matplotlib.pyplot``, on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plots_folder(out_dir: str | os.PathLike[str]) -> Path:
    plots = Path(out_dir) / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    return plots


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
        summary: the output of :func:`~heatformer.lab.report.aggregate`.
        metric_names: final metrics to plot.
        eval_loss_name: the evaluation metric drawn next to the training loss.
        analysis_names: analysis metrics to plot per layer.
        sweeps: the sweep lines found among the configurations
            (:func:`~heatformer.lab.sweep.find_sweeps`).

    Returns:
        The written files.
    """
    plt = _pyplot()
    plots = _plots_folder(out_dir)
    heads_order = [row["heads"] for row in summary]
    colors = {h: plt.get_cmap("tab10")(i % 10) for i, h in enumerate(heads_order)}
    fig = _loss_curves(plt, records, heads_order, colors, eval_loss_name)
    written = [_save_png(fig, plots / "loss_curves.png")]
    for name in metric_names:
        fig = _final_metric(plt, summary, colors, name)
        written.append(_save_png(fig, plots / f"final_{name}.png"))
    for name in analysis_names:
        rows = [row for row in summary if name in row["analysis"]]
        if rows:
            fig = _per_layer(plt, rows, colors, name)
            written.append(_save_png(fig, plots / f"layers_{name}.png"))
    if sweeps:
        written += plot_sweeps(out_dir, summary, sweeps, metric_names, analysis_names)
    return written


def _loss_curves(
    plt: Any,
    records: Sequence[dict[str, Any]],
    heads_order: Sequence[str],
    colors: dict[str, Any],
    eval_loss_name: str,
) -> Any:
    """Training loss (EMA 0.1) and ``eval_loss_name`` against the step, a line per run."""
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
    return fig


def _final_metric(
    plt: Any, summary: Sequence[dict[str, Any]], colors: dict[str, Any], name: str
) -> Any:
    """One final metric per configuration: mean ± std, the seeds as grey dots."""
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(summary) + 1), 4))
    for x, row in enumerate(summary):
        stats = row["final"][name]
        spread = stats["std"]  # NaN for one seed or a metric with no value (matplotlib 3.7 fails)
        ax.errorbar(
            [x],
            [stats["mean"]],
            yerr=[spread] if spread is not None and math.isfinite(spread) else None,
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
    return fig


def _finite_or_nan(values: Sequence[float | None]) -> list[float]:
    """``values`` as floats, ``None`` (a non-finite number in JSON) as NaN."""
    return [math.nan if v is None else float(v) for v in values]


def _per_layer(plt: Any, rows: Sequence[dict[str, Any]], colors: dict[str, Any], name: str) -> Any:
    """One analysis metric against the layer, a line per configuration (mean ± std)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for row in rows:
        stats = row["analysis"][name]
        mean, std = _finite_or_nan(stats["mean"]), _finite_or_nan(stats["std"])
        if all(math.isnan(v) for v in mean):  # nothing to draw (matplotlib 3.7 fails on it)
            continue
        layers = range(len(mean))
        ax.errorbar(
            layers,
            mean,
            yerr=None if all(math.isnan(v) for v in std) else std,
            marker="o",
            capsize=3,
            color=colors[row["heads"]],
            label=row["heads"],
        )
    ax.set(xlabel="layer", ylabel=name, title=f"{name} per layer (mean ± std over seeds)")
    ax.set_xticks(list(range(max(len(r["analysis"][name]["mean"]) for r in rows))))
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # not when every configuration was NaN throughout
        ax.legend(fontsize=8)
    return fig


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
    :func:`~heatformer.lab.report.add_paired`) with their intervals and a line at 0.
    For each analysis metric, ``plots/sweep_<line>_<metric>.png`` with the same two panels,
    one line per layer.

    Args:
        out_dir: the comparison folder.
        summary: the output of :func:`~heatformer.lab.report.aggregate`.
        sweeps: the lines to draw.
        metric_names: final metrics.
        analysis_names: per-layer analysis metrics.

    Returns:
        The written files.
    """
    plt = _pyplot()
    plots = _plots_folder(out_dir)
    rows = {row["heads"]: row for row in summary}
    baseline = next((row["paired"]["baseline"] for row in summary if row.get("paired")), None)
    written: list[Path] = []
    for line in sweeps:
        points = [(x, rows[h]) for x, h in line.points if h in rows]
        if len(points) < 2:
            continue
        on_line = {row["heads"] for _, row in points}
        others = [row for row in summary if row["heads"] not in on_line][:6]
        for name in metric_names:
            fig = _sweep_final(plt, line, points, others, name, baseline)
            written.append(_save_png(fig, plots / f"sweep_{line.slug}_{name}.png"))
        for name in analysis_names:
            if any(name not in row["analysis"] for _, row in points):
                continue
            fig = _sweep_layers(plt, line, points, name, baseline)
            written.append(_save_png(fig, plots / f"sweep_{line.slug}_{name}.png"))
    return written


def _finite_or_zero(values: Sequence[float]) -> list[float]:
    """Error-bar lengths: NaN (one seed, no interval) drawn as no bar."""
    return [0.0 if not math.isfinite(v) else v for v in values]


def _paired(
    row: dict[str, Any], name: str, baseline: str | None, layer: int | None = None
) -> tuple[float, float]:
    """``(mean, ci95)`` of the paired difference; the baseline itself is ``(0, 0)``."""
    if not row.get("paired"):
        return (0.0, 0.0) if row["heads"] == baseline else (math.nan, math.nan)
    if layer is None:
        stats = row["paired"]["final"][name]
        return stats["mean"], stats["ci95"]
    stats = row["paired"]["analysis"].get(name)
    return (stats["mean"][layer], stats["ci95"][layer]) if stats else (math.nan, math.nan)


def _sweep_final(
    plt: Any,
    line: SweepLine,
    points: _Points,
    others: Sequence[dict[str, Any]],
    name: str,
    baseline: str | None,
) -> Any:
    """A final metric along a sweep line: means with 95 % intervals, and paired differences."""
    xs = [x for x, _ in points]
    fig, (ax, ax_d) = plt.subplots(1, 2, figsize=(11, 4))
    means = [row["final"][name]["mean"] for _, row in points]
    cis = [row["final"][name].get("ci95", math.nan) for _, row in points]
    ax.errorbar(xs, means, yerr=_finite_or_zero(cis), marker="o", capsize=5, color="C0",
                label=f"{line.operator} (mean, 95% CI)")  # fmt: skip
    for x, row in points:
        values = [v for v in row["final"][name]["values"] if v is not None]
        ax.scatter([x + 0.08] * len(values), values, s=10, color="gray", zorder=3)
    for i, row in enumerate(others):
        ax.axhline(row["final"][name]["mean"], color=f"C{i + 1}", ls="--", lw=1,
                   label=row["heads"])  # fmt: skip
    ax.set(xlabel=line.label, ylabel=name,
           title=f"{name} (seeds: {len(points[0][1]['seeds'])})")  # fmt: skip
    diffs = [_paired(row, name, baseline) for _, row in points]
    ax_d.errorbar(xs, [d[0] for d in diffs], yerr=_finite_or_zero([d[1] for d in diffs]),
                  marker="o", capsize=5, color="C0", label=line.operator)  # fmt: skip
    for i, row in enumerate(others):
        if row.get("paired"):
            ax_d.axhline(_paired(row, name, baseline)[0], color=f"C{i + 1}", ls="--", lw=1,
                         label=row["heads"])  # fmt: skip
    _finish_sweep(ax, ax_d, line, xs, name)
    return fig


def _sweep_layers(
    plt: Any, line: SweepLine, points: _Points, name: str, baseline: str | None
) -> Any:
    """An analysis metric along a sweep line, a line per layer (viridis), both panels."""
    xs = [x for x, _ in points]
    layers = min(len(row["analysis"][name]["mean"]) for _, row in points)
    fig, (ax, ax_d) = plt.subplots(1, 2, figsize=(11, 4))
    cmap = plt.get_cmap("viridis")
    for layer in range(layers):
        means = [row["analysis"][name]["mean"][layer] for _, row in points]
        cis = [row["analysis"][name].get("ci95", [math.nan] * layers)[layer]
               for _, row in points]  # fmt: skip
        color = cmap(layer / max(1, layers - 1))
        ax.errorbar(xs, means, yerr=_finite_or_zero(cis), marker="o", capsize=3, color=color,
                    label=f"layer {layer}")  # fmt: skip
        diffs = [_paired(row, name, baseline, layer) for _, row in points]
        ax_d.errorbar(xs, [d[0] for d in diffs], yerr=_finite_or_zero([d[1] for d in diffs]),
                      marker="o", capsize=3, color=color)  # fmt: skip
    ax.set(xlabel=line.label, ylabel=name, title=f"{name} per layer (mean, 95% CI)")
    _finish_sweep(ax, ax_d, line, xs, name)
    return fig


def _finish_sweep(ax: Any, ax_d: Any, line: SweepLine, xs: list[int], name: str) -> None:
    """The paired panel's zero line and labels, the ticks, grids and legends of both panels."""
    ax_d.axhline(0.0, color="black", lw=0.8)
    title = f"paired against {line.baseline or 'the baseline'} (95% CI)"
    ax_d.set(xlabel=line.label, ylabel=f"Δ {name}", title=title)
    for axis in (ax, ax_d):
        axis.set_xticks(xs)
        axis.grid(alpha=0.3)
    ax.legend(fontsize=7)
    if ax_d.get_legend_handles_labels()[0]:
        ax_d.legend(fontsize=7)
