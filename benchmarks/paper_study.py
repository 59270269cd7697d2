"""Zhang & Papyan's study at small scale: kL sweeps with 95 % intervals and per-claim verdicts.

Four comparisons, each one ``heatformer compare`` (printed before it runs; a finished one is
read back, an interrupted one resumed), 5 seeds each:

- ``stdlib``: which standard-library package a 128-byte snippet comes from (8 classes),
  a bidirectional 2-layer classifier, ``--sweep laplacian=0..4`` plus the mean-pooling control
  ``attention:2,mean:2``;
- ``digits``: the 8x8 digits with a DeiT-3 ViT (``--recipe deit3``), 4 layers, the same sweep
  and control;
- ``digits-layers``: the per-layer schedule sweep ``--sweep laplacian=2@each`` (2 Laplacian
  heads in one layer at a time) on the same ViT;
- ``chars``: byte-level language modelling with a 2-layer GPT, ``--sweep laplacian=0..4``.

Then, from the ``results.json`` files, the tables of docs/reproducing.md: every metric of
every configuration as mean [95 % Student-t interval], the paired difference against k = 0 on
the same seeds, and for each of the paper's claims a verdict: ``reproduces`` when the paired
interval excludes 0 on the claimed side, ``opposite`` when it excludes 0 on the other side,
``noise`` when it contains 0. With ``--figures DIR`` the sweep figures (each metric against
k, per layer; each study's ``plots/sweep_*.png``) are copied to ``DIR/<study>/``; the ones
docs/reproducing.md shows are committed under ``docs/study/<study>/`` (``--figures
docs/study``; ``docs/figures/`` is git-ignored, for generated figures only).

    python benchmarks/paper_study.py --out runs/study --figures docs/study
    python benchmarks/paper_study.py --out runs/study --only chars       # one study
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from heatformer.experiments.report import paired_difference

SUPERVISED = [
    "--sweep", "laplacian=0..4", "--heads", "attention:2,mean:2", "--seeds", "5",
    "--eval-every", "100",
]  # fmt: skip
STUDIES: dict[str, list[str]] = {
    "stdlib": [
        "--task", "stdlib", "--num-classes", "8", "--seq-len", "128", *SUPERVISED,
        "--steps", "500", "--layers", "2", "--embd", "64", "--batch-size", "32", "--lr", "3e-3",
    ],
    "digits": [
        "--task", "digits", "--recipe", "deit3", *SUPERVISED,
        "--steps", "500", "--layers", "4", "--embd", "64", "--batch-size", "64",
    ],
    "digits-layers": [
        "--task", "digits", "--recipe", "deit3", "--sweep", "laplacian=2@each", "--seeds", "5",
        "--eval-every", "100", "--steps", "500", "--layers", "4", "--embd", "64",
        "--batch-size", "64",
    ],
    "chars": [
        "--preset", "demo", "--sweep", "laplacian=0..4", "--seeds", "5", "--steps", "1000",
        "--batch-size", "32", "--eval-every", "100",
    ],
}  # fmt: skip

#: (metric, claimed direction: +1 the paper says Laplacian heads raise it, -1 lower it, what)
CLAIMS: dict[str, list[tuple[str, int, str]]] = {
    "supervised": [
        ("test_acc", +1, "Laplacian heads improve supervised accuracy"),
        ("test_loss", -1, "... and test loss"),
        ("within_seq_frac", -1, "tokens of a sequence collapse (within-sequence variance share)"),
        ("nc1", -1, "sequence means collapse by class (NC1)"),
        ("nc2", -1, "class means approach a simplex ETF (NC2)"),
        ("decay_rate", +1, "spectra decay faster (power-law exponent)"),
        ("effective_rank", -1, "... (effective rank)"),
    ],
    "lm": [
        ("val_bpc", -1, "Laplacian heads improve language modelling (bits per byte)"),
        ("probe_acc", +1, "tokens sharing a next token are more separable (probe accuracy)"),
        ("nc1", -1, "... (NC1 of next-token groups)"),
        ("decay_rate", +1, "spectra decay faster (power-law exponent)"),
        ("effective_rank", -1, "... (effective rank)"),
    ],
}
KIND = {"stdlib": "supervised", "digits": "supervised", "digits-layers": "supervised",
        "chars": "lm"}  # fmt: skip


def run(name: str, out: Path, threads: int) -> dict[str, Any]:
    """Run (or resume, or read back) one study; return its results.json."""
    folder = out / name
    cmd = [sys.executable, "-m", "heatformer", "compare", *STUDIES[name], "--out", str(folder)]
    cmd += ["--threads", str(threads)]  # with compare's progress: bars, or lines when piped
    if (folder / "spec.json").exists() and not (folder / "results.json").exists():
        cmd = [*cmd[:4], "--resume", str(folder), "--threads", str(threads)]
    if not (folder / "results.json").exists():
        print("$ " + shlex.join(["heatformer", *cmd[3:]]), flush=True)
        subprocess.run(cmd, check=True)
    results: dict[str, Any] = json.loads((folder / "results.json").read_text())
    return results


def fmt(value: float, digits: int = 4) -> str:
    """``digits`` significant digits."""
    return "nan" if not math.isfinite(value) else f"{value:.{digits}g}"


def interval(mean: float, half: float, signed: bool = False) -> str:
    """``mean [low, high]``; differences (``signed``) with a sign and 3 digits."""
    digits = 3 if signed else 4
    sign = "+" if signed and mean > 0 else ""
    if not math.isfinite(half):
        return f"{sign}{fmt(mean, digits)}"
    return f"{sign}{fmt(mean, digits)} [{fmt(mean - half, digits)}, {fmt(mean + half, digits)}]"


def verdict(mean: float, half: float, direction: int) -> str:
    if not (math.isfinite(mean) and math.isfinite(half)):
        return "n/a"
    if mean - half > 0:
        return "reproduces" if direction > 0 else "opposite"
    if mean + half < 0:
        return "reproduces" if direction < 0 else "opposite"
    return "noise"


def stats_of(row: dict[str, Any], metric: str, layer: int) -> tuple[float, float] | None:
    """(mean, ci95) of a final metric, or of an analysis metric at ``layer``."""
    if metric in row["final"]:
        return row["final"][metric]["mean"], row["final"][metric]["ci95"]
    stats = row["analysis"].get(metric)
    if not stats:
        return None
    return stats["mean"][layer], stats["ci95"][layer]


def paired_of(row: dict[str, Any], metric: str, layer: int) -> tuple[float, float] | None:
    paired = row.get("paired")
    if not paired:
        return None
    if metric in paired["final"]:
        return paired["final"][metric]["mean"], paired["final"][metric]["ci95"]
    stats = paired["analysis"].get(metric)
    if not stats:
        return None
    return stats["mean"][layer], stats["ci95"][layer]


def report(name: str, results: dict[str, Any]) -> str:
    """The markdown of one study: metrics with intervals, paired differences, verdicts."""
    claims = CLAIMS[KIND[name]]
    summary = results["summary"]
    layers = max(len(v["mean"]) for row in summary for v in row["analysis"].values())
    last = layers - 1
    metrics = [m for m, _, _ in claims if any(stats_of(r, m, last) for r in summary)]
    lines = [f"#### `{name}`: {len(summary)} configurations x {len(results['seeds'])} seeds, "
             f"{results['wall_time_s'] / 60:.0f} min ({results['environment']['cpu_count']} "
             f"CPU cores, torch {results['environment']['torch']})", ""]  # fmt: skip
    lines.append("Mean [95 % interval] over seeds; analysis metrics at the last layer "
                 f"(L{last}):")  # fmt: skip
    lines.append("")
    lines.append("| heads | " + " | ".join(metrics) + " |")
    lines.append("|---|" + "---|" * len(metrics))
    for row in summary:
        cells = [interval(*s) if (s := stats_of(row, m, last)) else "-" for m in metrics]
        lines.append(f"| `{row['heads']}` | " + " | ".join(cells) + " |")
    lines += ["", f"Paired differences against `{results['baseline']}` (same seeds) and the "
              "verdict on the claimed direction:", ""]  # fmt: skip
    lines.append("| heads | " + " | ".join(metrics) + " |")
    lines.append("|---|" + "---|" * len(metrics))
    for row in summary:
        if not row.get("paired"):
            continue
        cells = []
        for metric, direction, _ in claims:
            if metric not in metrics:
                continue
            diff = paired_of(row, metric, last)
            cells.append("-" if diff is None else
                         f"{interval(*diff, signed=True)} {verdict(*diff, direction)}")  # fmt: skip
        lines.append(f"| `{row['heads']}` | " + " | ".join(cells) + " |")
    lines.append("")
    swept = [row for row in summary if row.get("paired") and "laplacian" in row["heads"]]
    lines.append(f"Per layer, for each claim: of the {len(swept)} Laplacian configurations, "
                 "how many have a paired interval that reproduces the claim / goes the other "
                 "way:")  # fmt: skip
    lines.append("")
    lines.append("| claim | metric | " + " | ".join(f"L{i}" for i in range(layers)) + " |")
    lines.append("|---|---|" + "---|" * layers)
    for metric, direction, what in claims:
        if metric not in metrics or metric in summary[0]["final"]:
            continue
        cells = []
        for layer in range(layers):
            ups = downs = total = 0
            for row in swept:
                diff = paired_of(row, metric, layer)
                if diff is None:
                    continue
                total += 1
                word = verdict(*diff, direction)
                ups += word == "reproduces"
                downs += word == "opposite"
            cells.append(f"{ups}/{downs} of {total}")
        lines.append(f"| {what} | {metric} | " + " | ".join(cells) + " |")
    control = next((row for row in summary if "mean" in row["heads"].replace("laplacian", "")),
                   None)  # fmt: skip
    twin = control and next(
        (row for row in summary if row["heads"] == control["heads"].replace("mean", "laplacian")),
        None,
    )
    if control and twin:
        lines += ["", f"The mean-pooling control: `{twin['heads']}` against `{control['heads']}` "
                  "(paired over seeds; negative = lower with Laplacian heads):", ""]  # fmt: skip
        lines.append("| metric | Δ (Laplacian − mean) [95 % interval] | p |")
        lines.append("|---|---|---|")
        for metric in metrics:
            for layer_name, layer in ([("", last)] if metric in summary[0]["final"] else
                                      [(f" L{i}", i) for i in range(layers)]):  # fmt: skip
                a, b = values_of(twin, metric, layer), values_of(control, metric, layer)
                if a is None or b is None:
                    continue
                d = paired_difference(a, b)
                lines.append(f"| {metric}{layer_name} | {interval(d['mean'], d['ci95'], True)} "
                             f"| {d['p']:.3f} |")  # fmt: skip
    return "\n".join(lines)


def values_of(row: dict[str, Any], metric: str, layer: int) -> list[float] | None:
    """Per-seed values of a final metric, or of an analysis metric at ``layer``."""
    if metric in row["final"]:
        return list(row["final"][metric]["values"])
    stats = row["analysis"].get(metric)
    return None if not stats else [v[layer] for v in stats["values"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/study"))
    parser.add_argument("--only", choices=sorted(STUDIES), action="append")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--figures", type=Path, help="copy each study's plots/ here")
    args = parser.parse_args()
    sections = []
    for name in args.only or list(STUDIES):
        results = run(name, args.out, args.threads)
        sections.append(report(name, results))
        if args.figures:
            target = args.figures / name
            target.mkdir(parents=True, exist_ok=True)
            for png in sorted((args.out / name / "plots").glob("sweep_*.png")):
                shutil.copy2(png, target / png.name)
    print("\n\n".join(sections))


if __name__ == "__main__":
    main()
