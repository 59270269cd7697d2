"""benchmarks/paper_study.py: its commands are valid specs, its verdicts and tables are right."""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from heatformer.cli import _experiments, build_parser
from heatformer.experiments.compare import run_compare
from heatformer.experiments.spec import CompareSpec
from heatformer.experiments.sweep import expand_sweep, find_sweeps

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "paper_study.py"


@pytest.fixture(scope="module")
def study() -> ModuleType:
    spec = importlib.util.spec_from_file_location("paper_study", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["stdlib", "digits", "digits-layers", "chars"])
def test_every_study_command_is_a_spec_with_a_sweep_and_five_seeds(
    study: ModuleType, name: str
) -> None:
    args = build_parser().parse_args(["compare", *study.STUDIES[name]])
    spec = _experiments._build_spec(args, compare=True)
    assert len(spec.seeds) == 5
    lines = find_sweeps(spec.heads, n_layer=spec.n_layer, n_head=spec.heads_per_layer)
    assert lines and lines[0].baseline == spec.heads[0]
    if name == "digits-layers":
        assert [line.axis for line in lines] == ["layer"]
        assert len(lines[0].points) == spec.n_layer
    else:
        assert lines[0].axis == "heads" and [k for k, _ in lines[0].points] == [0, 1, 2, 3, 4]
    if name.startswith("digits"):
        assert spec.options.recipe == "deit3"
    for metric, _, _ in study.CLAIMS[study.KIND[name]]:
        assert isinstance(metric, str)


@pytest.mark.parametrize(
    ("mean", "half", "direction", "expected"),
    [
        (0.5, 0.1, +1, "reproduces"),
        (0.5, 0.1, -1, "opposite"),
        (-0.5, 0.1, -1, "reproduces"),
        (-0.5, 0.1, +1, "opposite"),
        (0.05, 0.1, +1, "noise"),
        (0.05, math.nan, +1, "n/a"),
    ],
)
def test_verdicts_follow_the_paired_interval(
    study: ModuleType, mean: float, half: float, direction: int, expected: str
) -> None:
    assert study.verdict(mean, half, direction) == expected


def test_the_report_of_a_small_sweep_has_every_configuration_and_the_control(
    study: ModuleType, tiny_spec: Callable[..., CompareSpec], tmp_path: Path
) -> None:
    heads = (*expand_sweep("laplacian=0..2", n_head=2, n_layer=2), "attention:1,mean:1")
    spec = tiny_spec(task="digits", heads=heads, seeds=(0, 1), steps=2, eval_every=2, n_head=2)
    run_compare(spec, tmp_path / "out")
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    text = study.report("digits", results)
    for schedule in heads:
        assert f"| `{schedule}` |" in text
    assert "Paired differences against `attention:2`" in text
    assert "`attention:1,laplacian:1` against `attention:1,mean:1`" in text
    rows = [line for line in text.splitlines() if line.startswith("| `laplacian:2` |")]
    assert len(rows) == 2 and any(
        word in rows[1] for word in ("reproduces", "opposite", "noise")
    )  # the means row, then the paired row with its verdicts
