"""What the report writes as text: the terminal tables, the CSV, the environment facts.

Nothing here prints: :func:`format_table`, :func:`format_paired_table` and
:func:`format_filter_table` return the table as a string. The numbers come from
:mod:`heatformer.lab.report.stats`.
"""

from __future__ import annotations

import csv
import math
import os
import platform
import sys
from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "environment",
    "format_filter_table",
    "format_paired_table",
    "format_table",
    "write_csv",
]


def _aligned(header: list[str], rows: list[list[str]]) -> list[str]:
    """The header, a rule under it and the rows: the first column left-aligned, the others
    right-aligned, two spaces between columns."""
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]

    def fmt(line: list[str]) -> str:
        first = line[0].ljust(widths[0])
        return "  ".join([first, *(cell.rjust(w) for cell, w in zip(line[1:], widths[1:]))])

    return [fmt(header), "-" * len(fmt(header)), *(fmt(line) for line in rows)]


def _pm(mean: float, std: float, count: int, significant: bool = False) -> str:
    if not math.isfinite(mean):
        return "nan"
    if significant:  # a scale-dependent size (a variance): 3 significant digits, any scale
        return f"{mean:.3g}" if count < 2 else f"{mean:.3g} ± {std:.2g}"
    digits = 4 if abs(mean) < 10 else 2
    if count < 2:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def format_table(
    summary: Sequence[dict[str, Any]],
    metric_names: Sequence[str],
    analysis_names: Sequence[str] = (
        "within_seq_frac",
        "within_seq_var",
        "between_seq_var",
        "effective_rank",
        "nc1",
    ),
) -> str:
    """The terminal table: one row per configuration, ``mean ± std`` over seeds.

    A configuration with a single seed shows its value without ``± std``.

    Analysis columns show the last layer (``name@L<i>``); the per-layer values are in
    ``results.json`` and the plots. The within-sequence share ``within_seq_frac`` comes with
    its two parts, the absolute ``within_seq_var`` and ``between_seq_var`` (the share falls
    when either the first falls or the second rises), shown to 3 significant digits.

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
            significant = name.endswith("_var")
            cells.append(_pm(stats["mean"][-1], stats["std"][-1], count, significant))
        rows.append(cells)
    suffix = f"@L{last_layer}" if last_layer is not None else ""
    header += [f"{name}{suffix}" for name in shown_analysis]
    return "\n".join(_aligned(header, rows))


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
    title = f"paired differences against {baseline} (same seeds; paired t-test):"
    return "\n".join([title, *_aligned(header, lines)])


def format_filter_table(summary: Sequence[dict[str, Any]]) -> str:
    """The learned polynomial filters per configuration, layer and heads, mean over seeds: the
    band of the mean filter (``"low-pass"``, ``"band"``, ``"high-pass"``, with ``(k/n)`` when
    only ``k`` of the ``n`` seeds' own filters fall in it), its response ``g`` at ``lam = 0, 1,
    2`` and the mean coefficients ``gamma_0 .. gamma_K``.

    Args:
        summary: the output of :func:`aggregate` (rows with a ``filters`` entry:
            :func:`~heatformer.lab.report.mean_filters`).

    Returns:
        The table under its title, lines joined with newlines; ``""`` when no configuration
        has polynomial heads.
    """
    rows: list[list[str]] = []
    for row in summary:
        for f in row.get("filters") or []:
            agree = sum(label == f["label"] for label in f["labels"])
            label = f["label"] + ("" if agree == f["seeds"] else f" ({agree}/{f['seeds']})")
            basis = "" if f["basis"] == "adjacency" else f" ({f['basis']} basis: c_k L^k)"
            coefficients = " ".join(f"{c:+.4f}" for c in f["coefficients"]) + basis
            heads = ",".join(map(str, f["heads"]))
            gains = [f"{g:+.3f}" for g in f["gains"]]
            rows.append([row["heads"], f"L{f['layer']}", heads, label, *gains, coefficients])
    if not rows:
        return ""
    header = ["heads", "layer", "head", "band", "g(0)", "g(1)", "g(2)", "γ_0 .. γ_K"]
    title = [
        "learned polynomial filters, mean over seeds: g(λ) = Σ_k γ_k (1 - λ)^k on the eigenvalues",
        "λ of I - P in [0, 2]; band: the third of [0, 2] that holds most of ∫ g(λ)² dλ:",
    ]
    return "\n".join([*title, *_aligned(header, rows)])


def write_csv(
    path: str | os.PathLike[str],
    records: Sequence[dict[str, Any]],
    metric_names: Sequence[str],
    analysis_names: Sequence[str],
) -> None:
    """One row per run: configuration, optimiser setting (with a sweep), seed, final metrics,
    per-layer analysis, time.

    Analysis columns are named ``<metric>@L<layer>``. Written atomically.

    Args:
        path: the CSV file.
        records: run records.
        metric_names: final-metric columns.
        analysis_names: analysis metrics (one column per layer each).
    """
    from heatformer.lab.checkpoint import atomic_write_text

    num_layers = max((len(v) for r in records for v in r.get("analysis", {}).values()), default=0)
    tuned = any("setting" in record for record in records)  # an optimiser sweep: its column
    columns = ["heads", *(["setting"] if tuned else []), "seed", "steps", "num_params"]
    columns += list(metric_names)
    columns += [f"{name}@L{i}" for name in analysis_names for i in range(num_layers)]
    columns += ["train_time_s"]
    lines: list[list[Any]] = []
    for record in records:
        row: list[Any] = [record["heads"]]
        if tuned:
            row.append(" ".join(f"{k}={v:g}" for k, v in record.get("setting", {}).items()))
        row += [record["seed"], record["steps"], record["num_params"]]
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
