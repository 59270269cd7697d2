"""benchmarks/paper_study.py: its commands are valid specs, its verdicts and tables are right."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from heatformer.lab.cli import _experiments, build_parser
from heatformer.lab.compare import run_compare
from heatformer.lab.spec import CompareSpec
from heatformer.lab.sweep import expand_sweep, find_sweeps

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "paper_study.py"


@pytest.fixture(scope="module")
def study() -> ModuleType:
    spec = importlib.util.spec_from_file_location("paper_study", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "name", ["stdlib", "digits", "digits-layers", "chars", "chars-deep", "masked"]
)
def test_every_study_command_is_a_spec_with_five_seeds_and_declared_endpoints(
    study: ModuleType, name: str
) -> None:
    args = build_parser().parse_args(["compare", *study.STUDIES[name]])
    spec = _experiments._build_spec(args, compare=True)
    assert len(spec.seeds) == 5
    # every declared endpoint is a claim of the paper that the report can name
    assert spec.primary
    for endpoint in spec.primary:
        direction, what = study.claim_of(name, endpoint)
        assert direction in (-1, +1) and what
    lines = find_sweeps(spec.heads, n_layer=spec.n_layer, n_head=spec.heads_per_layer)
    if name == "chars-deep":  # k = 0 and 2 at the better of two learning rates
        assert spec.n_layer == 6 and spec.select_by == "val_loss" and spec.tune
        assert spec.heads == ("attention:4", "attention:2,laplacian:2")
        return
    assert lines and lines[0].baseline == spec.heads[0]
    if name == "digits-layers":
        assert [line.axis for line in lines] == ["layer"]
        assert len(lines[0].points) == spec.n_layer
    else:
        ks = [0, 1, 2] if name == "masked" else [0, 1, 2, 3, 4]
        assert lines[0].axis == "heads" and [k for k, _ in lines[0].points] == ks
    if name.startswith("digits"):
        assert spec.options.recipe == "deit3"


def test_a_verdict_follows_the_corrected_test(study: ModuleType) -> None:
    """Significance after Holm decides "supported" / "the other way" by the claimed
    direction (a control, without Laplacian heads, gets "higher" / "lower"); otherwise TOST's
    statement, else "undetermined" with the detectable effect."""
    row = {"significant": True, "mean": -0.1, "equivalence": None, "detectable": 0.05}
    assert study.verdict(row, -1, True) == "supported after correction"
    assert study.verdict(row, +1, True) == "the other way"
    assert study.verdict(row, +1, False) == "lower after correction"
    assert study.verdict({**row, "mean": 0.1}, +1, False) == "higher after correction"
    row = {**row, "significant": False, "equivalence": "no effect larger than 0.031"}
    assert study.verdict(row, -1, True) == "no effect larger than 0.031"
    row = {**row, "equivalence": None}
    assert study.verdict(row, -1, True) == "undetermined (detectable: 0.05)"
    trend = {"p_adjusted": 0.01, "slope": 0.2}
    assert study.trend_verdict(trend, +1) == "supported after correction"
    assert study.trend_verdict(trend, -1) == "the other way"
    assert study.trend_verdict({**trend, "p_adjusted": 0.2}, -1) == "undetermined"


def test_the_report_of_a_small_sweep_has_the_endpoints_every_configuration_and_the_control(
    study: ModuleType, tiny_spec: Callable[..., CompareSpec], tmp_path: Path
) -> None:
    heads = (*expand_sweep("laplacian=0..2", n_head=2, n_layer=2), "attention:1,mean:1")
    spec = tiny_spec(
        task="digits", heads=heads, seeds=(0, 1, 2), steps=2, eval_every=2, n_head=2,
        primary=("test_acc",),
    )  # fmt: skip
    run_compare(spec, tmp_path / "out")
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    text = study.report("digits", results)
    for schedule in heads:
        assert f"| `{schedule}` |" in text
    assert "Paired differences against `attention:2`" in text
    assert "`attention:1,laplacian:1` against `attention:1,mean:1`" in text
    # the endpoints table: one row per configuration against the baseline, and the trend
    assert "Holm-adjusted over the 3 comparisons" in text
    rows = [ln for ln in text.splitlines() if ln.startswith("| `test_acc` |") or
            ln.startswith("|  |  |")]  # fmt: skip
    assert len(rows) == 4  # 3 configurations and the trend over k = 0, 1, 2
    words = ("supported after correction", "the other way", "no effect larger than",
             "undetermined", "higher after correction", "lower after correction")  # fmt: skip
    assert all(any(w in row for w in words) for row in rows)


def test_docs_sections_are_rewritten_in_place_and_a_missing_one_is_refused(
    study: ModuleType, tmp_path: Path
) -> None:
    begin = "<!-- paper_study chars: generated from docs/study/chars/results.json -->\n"
    page = tmp_path / "page.md"
    page.write_text(f"intro\n{begin}old table\n<!-- /paper_study -->\nrest\n")
    study.write_docs(page, {"chars": "new table"})
    assert page.read_text() == f"intro\n{begin}new table\n<!-- /paper_study -->\nrest\n"
    study.write_docs(page, {"chars": "new table"})  # idempotent
    assert page.read_text() == f"intro\n{begin}new table\n<!-- /paper_study -->\nrest\n"
    with pytest.raises(SystemExit, match="no section for masked"):
        study.write_docs(page, {"masked": "x"})
