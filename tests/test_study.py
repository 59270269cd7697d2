"""The committed study results regenerate the tables that ``docs/reproducing.md`` shows.

A study under ``docs/study/<study>/`` holds what ``heatformer compare`` wrote (``results.json``
without each run's per-step history, ``results.csv``, ``spec.json``, ``invocations.json``).
From the runs' final and per-layer values alone, the summary, the paired differences and the
primary endpoints (Holm over the family, equivalence bounds) are computed again and printed
as the command prints them; the text must be the block in the docs, and the recomputed
summary the committed one.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import pytest

from heatformer.lab.report import (
    add_paired,
    aggregate,
    format_endpoints,
    format_paired_table,
    format_table,
    primary_endpoints,
)
from heatformer.lab.spec import CompareSpec
from heatformer.lab.sweep import find_sweeps
from heatformer.lab.tasks import resolve_task
from heatformer.lab.tuning import format_selection, select, setting_label

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reproducing.md"
#: The studies of benchmarks/paper_study.py (committed with its --commit): the docs show its
#: markdown; then the others, whose docs show what ``heatformer compare`` printed.
PAPER_STUDIES = ["stdlib", "digits", "digits-layers", "chars", "chars-deep", "masked"]
COMPARE_STUDIES = ["digits-controls", "chars-lr"]
STUDIES = [*PAPER_STUDIES, *COMPARE_STUDIES]

_spec = importlib.util.spec_from_file_location(
    "paper_study", ROOT / "benchmarks" / "paper_study.py"
)
assert _spec is not None and _spec.loader is not None
paper_study = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(paper_study)


def regenerate(results: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The summary, the primary endpoints and the report text of a study, from its runs only:
    with a selection (``--select-by``), each configuration's setting is chosen again from the
    runs' validation values and the report is the chosen runs' test values; with a sweep in
    k, the trend tests."""
    spec = CompareSpec.from_dict(results["spec"])
    metrics, analysis = results["metrics"], results["analysis_metrics"]
    runs, blocks = results["runs"], []
    if results.get("selection"):
        task = resolve_task(spec.task)
        higher = task.higher_is_better[task.metric_names.index(spec.select_by)]
        runs, selection = select(runs, spec.heads, spec.select_by, higher)
        blocks.append(format_selection(selection))
    summary = aggregate(runs, spec.heads, metrics, analysis)
    add_paired(summary, results["baseline"], metrics, analysis)
    sweeps = find_sweeps(spec.heads, n_layer=spec.n_layer, n_head=spec.heads_per_layer)
    primary = primary_endpoints(summary, results["baseline"], spec.primary, sweeps)
    blocks.append(format_endpoints(primary))
    text = "\n\n".join([format_table(summary, metrics), format_paired_table(summary, metrics)])
    return {"summary": summary, "primary": primary}, "\n\n".join([text, *blocks])


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a) and b is None:  # results.json writes NaN as null
        return True
    if isinstance(a, float) and isinstance(b, float):
        # 1e-8, not round-off: scipy's Student-t quantile differs between releases by about
        # 3e-10 relative (scipy 1.10 in the oldest venv against 1.17, which wrote the figures).
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-8, abs_tol=0)
    return bool(a == b)


@pytest.mark.parametrize("study", STUDIES)
def test_committed_results_are_regenerated_from_the_runs(study: str) -> None:
    """The summary and the primary endpoints (Holm, equivalence bounds, trends) computed again
    from the committed runs are the committed ones, and the CSV holds the runs' values."""
    folder = ROOT / "docs" / "study" / study
    results = json.loads((folder / "results.json").read_text())
    again, _ = regenerate(results)
    assert _close(again["summary"], results["summary"])
    assert _close(again["primary"], results["primary"])
    with (folder / "results.csv").open() as f:
        rows = {(r["heads"], r.get("setting", ""), int(r["seed"])): r for r in csv.DictReader(f)}
    assert len(rows) == len(results["runs"])
    for run in results["runs"]:
        row = rows[(run["heads"], setting_label(run.get("setting") or {}), run["seed"])]
        for name in results["metrics"]:
            assert math.isclose(float(row[name]), run["final"][name], rel_tol=1e-12)


@pytest.mark.parametrize("study", COMPARE_STUDIES)
def test_the_compare_tables_in_the_docs_are_regenerated(study: str) -> None:
    """The text ``heatformer compare`` prints, made again from the committed runs, is the
    block in docs/reproducing.md."""
    results = json.loads((ROOT / "docs" / "study" / study / "results.json").read_text())
    _, text = regenerate(results)
    block = f"<!-- study {study}: generated from docs/study/{study}/results.json -->\n```text\n"
    doc = DOC.read_text()
    assert block in doc, f"docs/reproducing.md has no block for {study}"
    shown = doc.split(block, 1)[1].split("\n```", 1)[0]
    assert shown.strip("\n") == text.strip("\n")


@pytest.mark.parametrize("study", PAPER_STUDIES)
def test_the_paper_study_tables_are_regenerated(study: str) -> None:
    """The markdown of ``benchmarks/paper_study.py`` (the declared endpoints with their
    corrected verdicts, the descriptive tables) computed from the regenerated statistics is
    the section of docs/reproducing.md."""
    results = json.loads((ROOT / "docs" / "study" / study / "results.json").read_text())
    again, _ = regenerate(results)
    text = paper_study.report(study, {**results, **again})
    begin = f"<!-- paper_study {study}: generated from docs/study/{study}/results.json -->\n"
    doc = DOC.read_text()
    assert begin in doc, f"docs/reproducing.md has no paper_study section for {study}"
    shown = doc.split(begin, 1)[1].split("<!-- /paper_study -->", 1)[0]
    assert shown.strip("\n") == text.strip("\n")
