"""Zhang & Papyan's study at small scale: declared endpoints, corrected verdicts, raw results.

Six comparisons, each one ``heatformer compare`` (printed before it runs; a finished one is
read back, an interrupted one resumed), 5 seeds each:

- ``stdlib``: which standard-library package a 128-byte snippet comes from (8 classes),
  a bidirectional 2-layer classifier, ``--sweep laplacian=0..4`` plus the mean-pooling control
  ``attention:2,mean:2``;
- ``digits``: the 8x8 digits with a DeiT-3 ViT (``--recipe deit3``), 4 layers, the same sweep
  and control;
- ``digits-layers``: the per-layer schedule sweep ``--sweep laplacian=2@each`` (2 Laplacian
  heads in one layer at a time) on the same ViT;
- ``chars``: byte-level language modelling with a 2-layer GPT, ``--sweep laplacian=0..4``;
- ``chars-deep``: the same GPT with 6 layers, k = 0 and 2, each at its own best learning
  rate of {2e-3, 4e-3} (``--select-by val_loss``);
- ``masked``: masked-byte modelling (the self-supervised task), a bidirectional 2-layer
  encoder, ``--sweep laplacian=0..2``.

Each declares its primary endpoints (``--primary``): one per claim of the paper at the last
layer (in its study file, :data:`STUDIES`). From each ``results.json`` the
markdown of docs/reproducing.md: first the endpoints, every configuration against k = 0
paired by seed with the p-value Holm-adjusted over the study's family and the verdict
(:func:`verdict`): "supported after correction", "the other way", "no effect larger than X"
(TOST at the design's detectable effect) or "undetermined"; then, descriptive and not
corrected, every metric's mean [95 % interval] and the paired differences. ``--commit
docs/study`` copies each study's results (``results.json`` without the per-step history,
``results.csv``, ``spec.json``, ``invocations.json``) to ``docs/study/<study>/``, from which
tests/test_study.py computes the tables again; ``--figures docs/study`` copies the sweep
figures (``plots/sweep_*.png``) beside them; ``--docs docs/reproducing.md`` writes each
study's markdown into its section of the page.

    python benchmarks/paper_study.py --out runs/study --figures docs/study --commit docs/study \
        --docs docs/reproducing.md
    python benchmarks/paper_study.py --out runs/study --only chars       # one study
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from heatformer.lab.report import paired_difference
from heatformer.lab.report.endpoints import ALPHA
from heatformer.lab.report.inference import holm

#: The study files (``studies/<study>.toml`` at the repository's root), one per study: each
#: names its settings, its head schedules and its declared primary endpoints, one per claim
#: of the paper at the last layer (Holm over every comparison of every endpoint of a study;
#: see heatformer.lab.report.endpoints).
STUDY_FILES = Path(__file__).resolve().parents[1] / "studies"
STUDIES: dict[str, list[str]] = {
    name: ["--config", str(STUDY_FILES / f"{name}.toml")]
    for name in ("stdlib", "digits", "digits-layers", "chars", "chars-deep", "masked")
}

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
CLAIMS["ssl"] = [
    ("val_bpc", -1, "Laplacian heads improve self-supervised learning (bits per hidden byte)"),
    ("probe_acc", +1, "hidden positions' states separate by the byte they hide (probe accuracy)"),
    *CLAIMS["lm"][2:],
    ("seg_score", +1, "top principal components segment the source (Python token categories)"),
]
KIND = {"stdlib": "supervised", "digits": "supervised", "digits-layers": "supervised",
        "chars": "lm", "chars-deep": "lm", "masked": "ssl"}  # fmt: skip


def run(name: str, out: Path, threads: int) -> dict[str, Any]:
    """Run (or resume, or read back) one study; return its results.json."""
    folder = out / name
    cmd = [sys.executable, "-m", "heatformer", "compare", *STUDIES[name], "--out", str(folder)]
    cmd += ["--threads", str(threads)]  # with compare's progress: bars, or lines when piped
    if (folder / "spec.json").exists() and not (folder / "results.json").exists():
        cmd = [*cmd[:4], "--resume", str(folder), "--threads", str(threads)]
    if not (folder / "results.json").exists():
        shown = [os.path.relpath(word) if word.startswith("/") else word for word in cmd[3:]]
        print("$ " + shlex.join(["heatformer", *shown]), flush=True)
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


def claim_of(name: str, endpoint: str) -> tuple[int, str]:
    """The paper's claimed direction (+1 Laplacian heads raise the metric, -1 lower it) and
    the claim's words, for a declared endpoint ``metric`` or ``metric@layer`` (as the spec
    resolved it: ``bpc`` is ``val_bpc`` there)."""
    metric = endpoint.split("@")[0]
    return next((d, what) for m, d, what in CLAIMS[KIND[name]] if m == metric)


def verdict(row: dict[str, Any], direction: int, laplacian: bool) -> str:
    """A corrected verdict on one comparison of a primary endpoint: "supported after
    correction" / "the other way" (Holm-adjusted p < 0.05, the claimed side / the other),
    "no effect larger than X" (TOST at the design's detectable effect), else "undetermined".
    A control (no Laplacian heads) gets "higher" / "lower" instead of the claim's words."""
    if row["significant"]:
        up = row["mean"] > 0
        if not laplacian:
            return "higher after correction" if up else "lower after correction"
        return "supported after correction" if up == (direction > 0) else "the other way"
    if row.get("equivalence"):
        return str(row["equivalence"])
    return f"undetermined (detectable: {fmt(row['detectable'], 2)})"


def trend_verdict(trend: dict[str, Any], direction: int) -> str:
    """The verdict on a trend across k (Holm over the trend tests), in :func:`verdict`'s
    words."""
    if trend["p_adjusted"] >= ALPHA:
        return "undetermined"
    return "supported after correction" if (trend["slope"] > 0) == (direction > 0) else (
        "the other way")  # fmt: skip


def endpoints_table(name: str, results: dict[str, Any]) -> list[str]:
    """The declared endpoints (``--primary``) with Holm-corrected verdicts, as markdown."""
    primary = results.get("primary") or []
    if not primary:
        return []
    m = primary[0]["family_size"]
    trends = sum(len(item["trends"]) for item in primary)
    lines = [f"Declared endpoints, each configuration against `{results['baseline']}` paired by "
             f"seed: Δ with its simultaneous 95 % interval and the p-value Holm-adjusted over "
             f"the {m} comparisons" + (f" (trends across k: over the {trends} trend tests)"
             if trends else "") + "; `d_z` is the effect in seed-SD units:", "",
             "| endpoint | claim | heads | Δ [simultaneous 95 %] | p (Holm) | d_z | verdict |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for item in primary:
        direction, what = claim_of(name, item["endpoint"])
        sign = "higher" if direction > 0 else "lower"
        claim = f"{what}; paper: {sign}"
        for i, (heads, row) in enumerate(item["comparisons"].items()):
            laplacian = "laplacian" in heads
            first = (f"`{item['endpoint']}`", claim) if i == 0 else ("", "")  # once per endpoint
            cells = [*first, f"`{heads}`",
                     interval(row["mean"], row["ci_simultaneous"], signed=True),
                     fmt(row["p_adjusted"], 2), f"{row['effect']['d']:+.2f}",
                     verdict(row, direction, laplacian)]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
        for trend in item["trends"]:
            cells = ["", "", f"trend over k = {trend['ks']}",
                     f"{interval(trend['slope'], trend['ci95'], signed=True)} per k",
                     fmt(trend["p_adjusted"], 2), "", trend_verdict(trend, direction)]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def report(name: str, results: dict[str, Any]) -> str:
    """The markdown of one study: the declared endpoints with corrected verdicts, then every
    metric with its 95 % interval and the (uncorrected, descriptive) paired differences."""
    claims = CLAIMS[KIND[name]]
    summary = results["summary"]
    layers = max(len(v["mean"]) for row in summary for v in row["analysis"].values())
    last = layers - 1
    metrics = [m for m, _, _ in claims if any(stats_of(r, m, last) for r in summary)]
    lines = [f"#### `{name}`: {len(summary)} configurations x {len(results['seeds'])} seeds, "
             f"{results['wall_time_s'] / 60:.0f} min ({results['environment']['cpu_count']} "
             f"CPU cores, torch {results['environment']['torch']})", ""]  # fmt: skip
    if results.get("selection"):
        chosen = [f"`{row['heads']}` {row['chosen_label']}"
                  for row in results["selection"]["configurations"]]  # fmt: skip
        lines += ["Setting chosen per configuration on the validation half (reported on the "
                  "test half): " + ", ".join(chosen), ""]  # fmt: skip
    table = endpoints_table(name, results)
    lines += [*table, ""] if table else []
    lines.append("Descriptive, not corrected: mean [95 % interval] over seeds; analysis metrics "
                 f"at the last layer (L{last}):")  # fmt: skip
    lines.append("")
    lines.append("| heads | " + " | ".join(metrics) + " |")
    lines.append("|---|" + "---|" * len(metrics))
    for row in summary:
        cells = [interval(*s) if (s := stats_of(row, m, last)) else "-" for m in metrics]
        lines.append(f"| `{row['heads']}` | " + " | ".join(cells) + " |")
    lines += ["", f"Paired differences against `{results['baseline']}` (same seeds; 95 % "
              "intervals, each on its own):", ""]  # fmt: skip
    lines.append("| heads | " + " | ".join(metrics) + " |")
    lines.append("|---|" + "---|" * len(metrics))
    for row in summary:
        if not row.get("paired"):
            continue
        cells = []
        for metric in metrics:
            diff = paired_of(row, metric, last)
            cells.append("-" if diff is None else interval(*diff, signed=True))
        lines.append(f"| `{row['heads']}` | " + " | ".join(cells) + " |")
    control = next((row for row in summary if "mean" in row["heads"].replace("laplacian", "")),
                   None)  # fmt: skip
    twin = control and next(
        (row for row in summary if row["heads"] == control["heads"].replace("mean", "laplacian")),
        None,
    )
    if control and twin:
        rows = []
        for metric in metrics:
            for layer_name, layer in ([("", last)] if metric in summary[0]["final"] else
                                      [(f" L{i}", i) for i in range(layers)]):  # fmt: skip
                a, b = values_of(twin, metric, layer), values_of(control, metric, layer)
                if a is not None and b is not None:
                    rows.append((f"{metric}{layer_name}", paired_difference(a, b)))
        adjusted = holm([d["p"] for _, d in rows]) if rows else []
        lines += ["", f"The mean-pooling control: `{twin['heads']}` against `{control['heads']}` "
                  f"(paired over seeds; negative = lower with Laplacian heads; Holm over these "
                  f"{len(rows)} rows):", ""]  # fmt: skip
        lines.append("| metric | Δ (Laplacian − mean) [95 % interval] | p | p (Holm) |")
        lines.append("|---|---|---|---|")
        for (label, d), p_holm in zip(rows, adjusted, strict=True):
            lines.append(f"| {label} | {interval(d['mean'], d['ci95'], True)} | {d['p']:.3f} "
                         f"| {p_holm:.3f} |")  # fmt: skip
    return "\n".join(lines)


def values_of(row: dict[str, Any], metric: str, layer: int) -> list[float] | None:
    """Per-seed values of a final metric, or of an analysis metric at ``layer``."""
    if metric in row["final"]:
        return list(row["final"][metric]["values"])
    stats = row["analysis"].get(metric)
    return None if not stats else [v[layer] for v in stats["values"]]


NOTE = (
    "committed copy: each run's per-step train_loss and evaluation history dropped (they are "
    "in the run folders of the command); everything else as written by heatformer compare"
)


def commit(name: str, out: Path, target: Path) -> None:
    """Copy what ``heatformer compare`` wrote for one study into ``target/<name>/``:
    ``results.json`` without each run's per-step history (``train_loss``, ``evals``),
    ``results.csv``, ``spec.json`` and ``invocations.json`` (what tests/test_study.py reads)."""
    source, folder = out / name, target / name
    folder.mkdir(parents=True, exist_ok=True)
    results = json.loads((source / "results.json").read_text())
    for record in results["runs"]:
        record.pop("train_loss", None)
        record.pop("evals", None)
    results["note"] = NOTE
    (folder / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    for file in ("results.csv", "spec.json", "invocations.json"):
        shutil.copy2(source / file, folder / file)


def write_docs(page: Path, sections: dict[str, str]) -> None:
    """Replace each study's section of ``page`` (between ``<!-- paper_study NAME: ... -->``
    and ``<!-- /paper_study -->``) by its markdown; a study without a section is an error
    (the page says where each one goes)."""
    text = page.read_text()
    for name, markdown in sections.items():
        begin = f"<!-- paper_study {name}: generated from docs/study/{name}/results.json -->\n"
        if begin not in text:
            raise SystemExit(f"--docs: {page} has no section for {name} ({begin.strip()})")
        head, rest = text.split(begin, 1)
        _, tail = rest.split("<!-- /paper_study -->", 1)
        text = f"{head}{begin}{markdown}\n<!-- /paper_study -->{tail}"
    page.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/study"))
    parser.add_argument("--only", choices=sorted(STUDIES), action="append")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--figures", type=Path, help="copy each study's plots/ here")
    parser.add_argument("--commit", type=Path, help="copy each study's results here (see commit)")
    parser.add_argument(
        "--docs", type=Path,
        help="rewrite each study's section of this page (docs/reproducing.md; see write_docs)",
    )  # fmt: skip
    args = parser.parse_args()
    sections: dict[str, str] = {}
    for name in args.only or list(STUDIES):
        results = run(name, args.out, args.threads)
        sections[name] = report(name, results)
        if args.commit:
            commit(name, args.out, args.commit)
        if args.figures:
            target = args.figures / name
            target.mkdir(parents=True, exist_ok=True)
            for png in sorted((args.out / name / "plots").glob("sweep_*.png")):
                shutil.copy2(png, target / png.name)
    if args.docs:
        write_docs(args.docs, sections)
    print("\n\n".join(sections.values()))


if __name__ == "__main__":
    main()
