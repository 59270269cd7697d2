"""How the first study's verdicts depend on the family they are corrected in.

The first study (docs/reproducing.md, "The paper's study at small scale") corrected each study's
pairwise comparisons in one Holm family and its trend tests in another. This script reads,
from the committed results in ``docs/study/<study>/results.json`` alone, every primary test of
the eight studies (each Laplacian, mean, centring or skip configuration against the baseline,
paired by seed; each trend across k) and Holm-adjusts them in two other families:

- **per study**: every primary test of one study together, pairs and trends;
- **per claim, across studies**: the tests of the Laplacian configurations and trends on one
  claim's endpoint in every study that measures it (:data:`CLAIMS`: accuracy, language-model
  bits, self-supervised bits, within-sequence share, NC1, NC2, probe accuracy, spectral decay).

It prints the tests whose raw p is below 0.05 with their adjusted p in the page's family (the
study's pairs together, its trends together) and in each of the two others, and the
power of a 5-seed paired t-test against 1.7 seed-SDs at α = 0.05 and at Holm's first step
over 25 and 50 tests, and how many of the tuned selections and seeds of ``chars-lr`` and
``chars-deep`` chose the largest learning rate offered. ``--layer-scale FOLDER`` also prints
the largest LayerScale entry of each run's final checkpoint in a comparison folder (the
``digits`` ViT starts them at 1e-6).

    python benchmarks/study_families.py
    python benchmarks/study_families.py --layer-scale runs/study/digits-rep

Seconds, no training; the numbers on docs/reproducing.md are its output (tests/test_study.py
computes them again).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from heatformer.lab.report.inference import holm, paired_power

ROOT = Path(__file__).resolve().parents[1]
#: The first study's comparisons, as committed.
STUDIES = (
    "stdlib", "digits", "digits-layers", "chars", "chars-deep", "masked", "digits-controls",
    "chars-lr",
)  # fmt: skip
_LM = ("chars", "chars-deep", "chars-lr")
#: One claim of the paper -> its endpoint and the studies that measure it (None: every study).
CLAIMS: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "supervised accuracy": ("test_acc", None),
    "language-model bits": ("val_bpc", _LM),
    "self-supervised bits": ("val_bpc", ("masked",)),
    "within-sequence share": ("within_seq_frac@last", None),
    "NC1": ("nc1@last", None),
    "NC2": ("nc2@last", None),
    "next-token probe": ("probe_acc@last", None),
    "spectral decay": ("decay_rate@last", None),
}


def primary_tests(folder: Path) -> list[dict[str, Any]]:
    """Every primary test of one committed comparison, as its report made them
    (``results.json["primary"]``, :func:`~heatformer.lab.report.primary_endpoints`, which
    tests/test_study.py recomputes from the runs): each configuration against the baseline
    (paired t-test) and each trend across k, per endpoint, with its raw p."""
    results = json.loads((folder / "results.json").read_text())
    out = []
    for item in results["primary"]:
        tests = [(heads, row["mean"], row["p"]) for heads, row in item["comparisons"].items()]
        tests += [("trend in k", trend["slope"], trend["p"]) for trend in item["trends"]]
        out += [
            {"study": folder.name, "endpoint": item["endpoint"], "test": test, "estimate": estimate,
             "p": p}
            for test, estimate, p in tests
        ]  # fmt: skip
    return out


def families(tests: list[dict[str, Any]]) -> None:
    """Add to every test its Holm-adjusted p in three families, with the family's size:
    ``p_page`` (as the first study did: the study's pairs together, its trends together),
    ``p_study`` (all of the study's tests) and ``p_claim`` (the claim's Laplacian tests across
    studies; NaN for a control's test)."""
    for study in {t["study"] for t in tests}:
        mine = [t for t in tests if t["study"] == study]
        for t, p in zip(mine, holm([t["p"] for t in mine])):
            t["p_study"], t["n_study"] = p, len(mine)
        for trend in (False, True):
            part = [t for t in mine if (t["test"] == "trend in k") == trend]
            for t, p in zip(part, holm([t["p"] for t in part])):
                t["p_page"], t["n_page"] = p, len(part)
    for t in tests:
        t["p_claim"], t["claim"] = float("nan"), None
    for claim, (endpoint, studies) in CLAIMS.items():
        mine = [
            t for t in tests if t["endpoint"] == endpoint and _laplacian(t)
            and (studies is None or t["study"] in studies)
        ]  # fmt: skip
        for t, p in zip(mine, holm([t["p"] for t in mine])):
            t["p_claim"], t["claim"], t["n_claim"] = p, claim, len(mine)


def _laplacian(test: dict[str, Any]) -> bool:
    return test["test"] == "trend in k" or "laplacian" in test["test"]


def lr_edges(folder: Path) -> tuple[int, int, int, int]:
    """A tuned comparison's selections at its grid's largest learning rate: ``(configurations
    there, configurations, seeds whose own best is there, seeds)``."""
    selection = json.loads((folder / "results.json").read_text())["selection"]
    at = total = seeds_at = seeds = 0
    for config in selection["configurations"]:
        candidates = config["candidates"]
        top = max(c["setting"]["lr"] for c in candidates)
        at, total = at + (config["chosen"]["lr"] == top), total + 1
        for i in range(len(candidates[0]["values"])):
            best = min(candidates, key=lambda c: c["values"][i])
            seeds_at, seeds = seeds_at + (best["setting"]["lr"] == top), seeds + 1
    return at, total, seeds_at, seeds


def layer_scale(folder: Path) -> dict[str, float]:
    """Run -> the largest |gamma| of any LayerScale in its final checkpoint."""
    import torch

    out = {}
    for path in sorted(folder.glob("runs/*/checkpoint.pt")):
        model = torch.load(path, map_location="cpu", weights_only=False)["model"]
        gammas = [v.abs().max().item() for k, v in model.items() if k.endswith(".gamma")]
        if gammas:
            out[path.parent.name] = max(gammas)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study-dir", type=Path, default=ROOT / "docs" / "study")
    parser.add_argument("--layer-scale", type=Path, metavar="FOLDER")
    args = parser.parse_args()
    tests = [t for s in STUDIES for t in primary_tests(args.study_dir / s)]
    families(tests)
    print(f"{len(tests)} primary tests in {len(STUDIES)} studies; raw p < 0.05:")
    print(f"{'study':16} {'endpoint':22} {'test':42} {'estimate':>10} {'raw p':>8} "
          f"{'page':>7} {'study':>7} {'claim':>7}")  # fmt: skip
    for t in tests:
        if t["p"] < 0.05:
            print(f"{t['study']:16} {t['endpoint']:22} {t['test'][:42]:42} "
                  f"{t['estimate']:+10.4g} {t['p']:8.3g} {t['p_page']:7.3g} "
                  f"{t['p_study']:7.3g} {t['p_claim']:7.3g}")  # fmt: skip
    for claim in CLAIMS:
        n = sum(t["claim"] == claim for t in tests)
        print(f"claim family {claim!r}: {n} tests")
    for study in ("chars-lr", "chars-deep"):
        at, total, seeds_at, seeds = lr_edges(args.study_dir / study)
        print(f"{study}: {at} of {total} configurations and {seeds_at} of {seeds} seeds best at "
              "the grid's largest lr")  # fmt: skip
    for m in (1, 25, 50):
        power = paired_power(5, 1.7, 0.05 / m)
        print(f"power of a 5-seed paired t-test against 1.7 SD at alpha 0.05/{m}: {power:.3f}")
    if args.layer_scale:
        scales = layer_scale(args.layer_scale)
        print(
            f"largest LayerScale entry over {len(scales)} runs of {args.layer_scale}: "
            f"{max(scales.values()):.4f} (smallest run's largest: {min(scales.values()):.4f})"
        )


if __name__ == "__main__":
    main()
