"""The learned polynomial filters in a comparison: each run's ``filters``, their mean over
seeds in the summary, and the report's table of them (only when some configuration has
polynomial heads), end to end through ``heatformer compare`` and ``analyze``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from heatformer.analysis import filter_response
from heatformer.graph_ops.operators.polynomial import ppr_coefficients
from heatformer.lab.cli import main
from heatformer.lab.report import aggregate, format_filter_table, mean_filters

POLY = "polynomial[init=ppr,alpha=0.2,order=4,learnable=true]"
HEADS = f"attention:1,{POLY}:1"


def _entry(layer: int, coefficients: list[float]) -> dict[str, Any]:
    label = filter_response(coefficients).label
    return {"layer": layer, "heads": [1], "operator": "polynomial", "basis": "adjacency",
            "coefficients": coefficients, "label": label}  # fmt: skip


def test_the_mean_over_seeds_is_labelled_as_the_mean_filter() -> None:
    low, high = [0.6, 0.3, 0.1], [0.2, -0.5, 0.3]
    runs = [
        {"heads": HEADS, "seed": 0, "final": {}, "filters": [_entry(0, low), _entry(1, low)]},
        {"heads": HEADS, "seed": 1, "final": {}, "filters": [_entry(0, high), _entry(1, low)]},
        {"heads": "attention:2", "seed": 0, "final": {}, "filters": []},
        {"heads": "attention:2", "seed": 1, "final": {}},  # a record from before filters
    ]
    summary = aggregate(runs, [HEADS, "attention:2"], [], [])
    assert "filters" not in summary[1]
    first, second = summary[0]["filters"]
    assert first == mean_filters(runs[:2])[0]
    mean = [(a + b) / 2 for a, b in zip(low, high)]
    assert first["coefficients"] == pytest.approx(mean)
    assert first["coefficients_std"] == pytest.approx(
        [abs(a - b) / 2**0.5 for a, b in zip(low, high)]
    )
    response = filter_response(mean)
    assert (first["label"], first["gains"]) == (response.label, list(response.gains))
    assert first["labels"] == ["low-pass", "high-pass"] and first["seeds"] == 2
    assert second["coefficients"] == pytest.approx(low) and second["labels"] == ["low-pass"] * 2
    assert response.label == "high-pass"  # 0.4 - 0.1 z + 0.2 z^2, z = 1 - lam: larger at z < 0
    lines = format_filter_table(summary).splitlines()
    assert lines[0].startswith("learned polynomial filters, mean over seeds")
    rows = [line.split() for line in lines[4:]]
    assert [row[1:5] for row in rows] == [
        ["L0", "1", "high-pass", "(1/2)"],  # one seed's filter of the two is high-pass
        ["L1", "1", "low-pass", "+1.000"],  # both agree: no count, g(0) = sum_k gamma_k next
    ]
    assert "+0.4000 -0.1000 +0.2000" in lines[4] and "+0.6000 +0.3000 +0.1000" in lines[5]
    assert format_filter_table(summary[1:]) == ""  # no polynomial heads: no table


def test_compare_records_reports_and_reanalyzes_the_learned_coefficients(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main([
        "compare", "--task", "parity", "--seq-len", "8", "--steps", "6", "--batch-size", "4",
        "--lr", "1e-2", "--layers", "2", "--embd", "16", "--heads", HEADS, "--heads", "attention:2",
        "--seeds", "2", "--eval-every", "6", "--eval-size", "4", "--analysis-size", "4",
        "--device", "cpu", "--threads", "1", "--no-progress", "--out", str(out),
    ])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    start = ppr_coefficients(0.2, 4)
    runs = [r for r in results["runs"] if r["heads"] == HEADS]
    for run in runs:
        assert [(f["layer"], f["heads"], f["learnable"]) for f in run["filters"]] == [
            (0, [1], True),
            (1, [1], True),
        ]
        for f in run["filters"]:
            moved = [abs(c - s) for c, s in zip(f["coefficients"], start, strict=True)]
            assert max(moved) > 1e-3  # trained: no longer alpha (1 - alpha)^k
            assert f["label"] == filter_response(f["coefficients"]).label
    assert all(r["filters"] == [] for r in results["runs"] if r["heads"] == "attention:2")
    poly, plain = results["summary"]
    assert "filters" not in plain
    for layer, row in enumerate(poly["filters"]):
        per_seed = [run["filters"][layer]["coefficients"] for run in runs]
        assert row["coefficients"] == pytest.approx([sum(c) / 2 for c in zip(*per_seed)])
        assert row["label"] == filter_response(row["coefficients"]).label
        coefficients = " ".join(f"{c:+.4f}" for c in row["coefficients"])
        assert f"L{layer}" in printed and coefficients in printed  # the printed table
    assert format_filter_table(results["summary"]) in printed
    for path in (out / "runs").glob("*/result.json"):  # drop the entry: analyze writes it back
        record = json.loads(path.read_text())
        record.pop("filters")
        path.write_text(json.dumps(record))
    assert main(["analyze", str(out), "--no-progress"]) == 0
    again = json.loads((out / "results.json").read_text())
    assert [r["filters"] for r in again["runs"]] == [r["filters"] for r in results["runs"]]
    assert again["summary"][0]["filters"] == poly["filters"]
