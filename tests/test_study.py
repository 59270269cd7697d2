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
import re
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


_families_spec = importlib.util.spec_from_file_location(
    "study_families", ROOT / "benchmarks" / "study_families.py"
)
assert _families_spec is not None and _families_spec.loader is not None
study_families = importlib.util.module_from_spec(_families_spec)
_families_spec.loader.exec_module(study_families)

#: The rows of docs/reproducing.md's family table: (study, endpoint, test).
FAMILY_ROWS = [
    ("digits", "decay_rate@last", "trend in k"),
    ("chars-deep", "decay_rate@last", "attention:2,laplacian:2"),
    ("digits-layers", "within_seq_frac@last",
     "attention:4;attention:2,laplacian:2;attention:4;attention:4"),
    ("chars", "val_bpc", "laplacian:4"),
    ("chars", "val_bpc", "trend in k"),
    ("chars-deep", "val_bpc", "attention:2,laplacian:2"),
    ("digits", "nc2@last", "trend in k"),
    ("stdlib", "within_seq_frac@last", "trend in k"),
]  # fmt: skip


def test_the_family_table_is_what_study_families_computes() -> None:
    """Each row of the page's table of the first study's tests in three families: the
    estimate and the Holm-adjusted p with its family's size, computed again from the committed
    results by benchmarks/study_families.py; the page's own family is the one its tables use
    (the page's p for the digits decay trend is the generated table's 0.039)."""
    tests = [
        t for s in study_families.STUDIES
        for t in study_families.primary_tests(ROOT / "docs" / "study" / s)
    ]  # fmt: skip
    study_families.families(tests)
    doc = DOC.read_text()
    table = doc[doc.index("| test | this page's family |") :].split("\n\n", 1)[0]
    lines = table.splitlines()[2:]
    assert len(lines) == len(FAMILY_ROWS)
    for line, key in zip(lines, FAMILY_ROWS):
        (test,) = [t for t in tests if (t["study"], t["endpoint"], t["test"]) == key]
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert cells[0].startswith(f"`{key[0]}`")
        signed = re.search(r"[+−]\d[\d.]*", cells[0])
        assert signed is not None, line
        estimate = float(signed.group().replace("−", "-"))
        assert estimate == pytest.approx(test["estimate"], rel=5e-3, abs=5e-4)
        for cell, family in zip(cells[1:], ("page", "study", "claim")):
            p, n = cell.replace("(", "").split()[:2]
            assert float(p) == pytest.approx(test[f"p_{family}"], rel=6e-3), (key, family)
            assert int(n) == test[f"n_{family}"], (key, family)
    # the stated power and the tuned selections at the grid's edge
    assert study_families.paired_power(5, 1.7, 0.05 / 25) == pytest.approx(0.131, abs=5e-4)
    assert "at Holm's first step over 25 tests (α/25) the power against the same effect is 0.13" \
        in doc.replace("\n  ", " ")  # fmt: skip
    edges = [
        study_families.lr_edges(ROOT / "docs" / "study" / s) for s in ("chars-lr", "chars-deep")
    ]
    assert [sum(e[i] for e in edges) for i in range(4)] == [5, 5, 34, 34]


_PLAN_BLOCK = re.compile(r"<!-- heatformer plan (\S+) ((?:\S+ ?)+) -->\n```text\n(.*?)\n```", re.S)


def test_the_plan_verdicts_on_the_page_are_the_committed_results() -> None:
    """Each ``heatformer plan`` block of docs/reproducing.md (after its marker comment, which
    names the plan and the folders) is the claims part of ``format_plan`` computed again from
    the committed results."""
    from heatformer.lab.plan import read_plan
    from heatformer.lab.report.plan import evaluate_plan, format_plan

    blocks = _PLAN_BLOCK.findall(DOC.read_text())
    assert len(blocks) >= 1
    for plan, folders, shown in blocks:
        evaluation = evaluate_plan(read_plan(ROOT / plan), [ROOT / f for f in folders.split()])
        text = format_plan(evaluation)
        claims = text[text.index("\nclaim ") + 1 :]
        assert shown.strip("\n") == claims.strip("\n"), plan


def test_the_stopped_induction_runs_say_what_the_page_says() -> None:
    """The two runs of the stopped ``induction-ops`` study: equal test accuracies at every
    evaluation, the ones the page lists, and a training loss around ln 14 after step 200."""
    runs = sorted((ROOT / "docs" / "study" / "induction-ops").glob("*.result.json"))
    records = [json.loads(path.read_text()) for path in runs]
    assert [r["heads"] for r in records] == ["attention:2", "attention:1,laplacian:1"]
    accs = [[round(e["val_acc"], 3) for e in r["evals"]] for r in records]
    assert accs[0] == accs[1] == [0.096, 0.096, 0.059, 0.072, 0.070, 0.082]
    for record in records:
        late = record["train_loss"][200:]
        assert len(record["train_loss"]) == 1500 and 2.58 <= min(late) and max(late) <= 2.79
    assert "(0.096, 0.096, 0.059, 0.072,\n0.070, 0.082; chance 0.071)" in DOC.read_text()


def test_the_stopped_passkey_runs_are_at_chance_as_the_page_says() -> None:
    """The two runs of the stopped ``passkey-window`` study: test accuracy 0.09-0.11 at every
    evaluation and every grid cell within 0.06-0.16, as docs/reproducing.md states."""
    runs = sorted((ROOT / "docs" / "study" / "passkey-window").glob("*.result.json"))
    records = [json.loads(path.read_text()) for path in runs]
    assert [r["heads"] for r in records] == ["attention:2", "attention:1,heat:1"]
    grid = []
    for record in records:
        assert all(0.09 <= e["val_acc"] <= 0.11 for e in record["evals"])
        cells = [v for k, v in record["final"].items() if k.startswith("acc_L")]
        assert len(cells) == 15 and 0.06 <= min(cells) and max(cells) <= 0.1625
        grid.append(round(record["final"]["grid_acc"], 3))
    assert grid == [0.112, 0.121]
    assert "`grid_acc` 0.112 and 0.121" in DOC.read_text().replace("\n", " ")
