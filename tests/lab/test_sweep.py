"""Head-count sweeps (``--sweep``), 95 % intervals and paired differences in the report."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from heatformer.graph_ops import OPERATORS
from heatformer.lab.cli import main
from heatformer.lab.compare import run_compare
from heatformer.lab.report import (
    add_paired,
    aggregate,
    format_paired_table,
    paired_difference,
    t_interval,
)
from heatformer.lab.spec import CompareSpec
from heatformer.lab.sweep import baseline_heads, expand_sweep, find_sweeps
from heatformer.models.heads import check_heads, format_operator

SpecFactory = Callable[..., CompareSpec]

# ----------------------------------------------------------------------------- expansion


@pytest.mark.parametrize(
    ("text", "n_head", "n_layer", "expected"),
    [
        ("laplacian=0..4", 4, 2,
         ("attention:4", "attention:3,laplacian:1", "attention:2,laplacian:2",
          "attention:1,laplacian:3", "laplacian:4")),
        ("heat[t=0.5]=0,2", 4, 3, ("attention:4", "attention:2,heat[t=0.5]:2")),
        ("laplacian=1..2@1", 4, 2,
         ("attention:4;attention:3,laplacian:1", "attention:4;attention:2,laplacian:2")),
        ("laplacian=0,2@0..1", 2, 3,
         ("attention:2", "laplacian:2;laplacian:2;attention:2")),
        ("mean=2@each", 4, 3,
         ("attention:4", "attention:2,mean:2;attention:4;attention:4",
          "attention:4;attention:2,mean:2;attention:4",
          "attention:4;attention:4;attention:2,mean:2")),
        (" laplacian = 0 .. 1 ", 8, 1, ("attention:8", "attention:7,laplacian:1")),
    ],
)  # fmt: skip
def test_a_sweep_expands_to_these_schedules_and_each_builds(
    text: str, n_head: int, n_layer: int, expected: tuple[str, ...]
) -> None:
    schedules = expand_sweep(text, n_head=n_head, n_layer=n_layer)
    assert schedules == expected
    for heads in schedules:  # exactly as the model will parse it
        check_heads(heads, n_layer=n_layer, n_head=n_head)


@pytest.mark.parametrize(
    ("text", "part"),
    [
        ("laplacian", "expected OP=K0..K1"),
        ("laplacian=0..5", "[0, 4]"),
        ("laplacian=3..1", "low <= high"),
        ("laplacian=0,0", "distinct"),
        ("laplacian=a", "numbers like 0..4"),
        ("laplacian=0..2@2", "[0, 1]"),
        ("laplacian=0..2@each", "one head count"),
        ("laplacian=0@each", "one head count"),
        ("attention=0..2", "other than 'attention'"),
    ],
)
def test_a_bad_sweep_is_a_value_error_naming_sweep(text: str, part: str) -> None:
    with pytest.raises(ValueError, match="sweep") as info:
        expand_sweep(text, n_head=4, n_layer=2)
    assert part in str(info.value)
    assert getattr(info.value, "argument", None) == "sweep"


def test_a_sweep_that_is_not_a_string_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="sweep"):
        expand_sweep(3, n_head=4, n_layer=2)  # type: ignore[arg-type]


@settings(max_examples=40, deadline=None)
@given(
    n_head=st.integers(1, 6),
    n_layer=st.integers(1, 4),
    data=st.data(),
)
def test_the_report_finds_every_sweep_it_was_given(
    n_head: int, n_layer: int, data: st.DataObject
) -> None:
    low = data.draw(st.integers(0, n_head))
    high = data.draw(st.integers(low, n_head))
    schedules = expand_sweep(f"heat[t=2]={low}..{high}", n_head=n_head, n_layer=n_layer)
    lines = find_sweeps(schedules, n_layer=n_layer, n_head=n_head)
    nonzero = [k for k in range(low, high + 1) if k]
    if len(nonzero) < 2:  # one count and the baseline is not a family
        assert lines == []
        return
    (line,) = [line for line in lines if line.axis == "heads"]
    assert line.operator == "heat[t=2]"
    assert [x for x, _ in line.points] == ([0] if low == 0 else []) + nonzero
    assert {h for _, h in line.points} == set(schedules)
    assert line.baseline == (f"attention:{n_head}" if low == 0 else None)


def test_a_per_layer_sweep_is_a_layer_line_and_mixed_schedules_are_in_none() -> None:
    schedules = (
        *expand_sweep("laplacian=2@each", n_head=4, n_layer=3),
        "attention:2,laplacian:1,heat:1",  # two operators
        "attention:4;attention:2,laplacian:2;attention:3,laplacian:1",  # uneven counts
    )
    lines = find_sweeps(schedules, n_layer=3, n_head=4)
    assert [(line.axis, line.where) for line in lines] == [("layer", 2)]
    assert [x for x, _ in lines[0].points] == [0, 1, 2]
    assert lines[0].label == "layer with 2 laplacian heads"
    assert baseline_heads(schedules, n_layer=3, n_head=4) == "attention:4"
    assert baseline_heads(("laplacian:4", "attention"), n_layer=3) == "attention"
    assert baseline_heads(("laplacian:4",), n_layer=3) is None


# ----------------------------------------------------------------------------- statistics

_samples = st.lists(
    st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False), min_size=2, max_size=12
).filter(lambda v: np.std(v) > 1e-6 * (1 + np.abs(v).max()))


@settings(max_examples=60, deadline=None)
@given(values=_samples, level=st.sampled_from([0.5, 0.9, 0.95, 0.99]))
def test_t_interval_is_scipys_student_t_interval(values: list[float], level: float) -> None:
    mean, half = t_interval(values, level)
    sem = np.std(values, ddof=1) / math.sqrt(len(values))
    low, high = scipy.stats.t.interval(level, len(values) - 1, loc=np.mean(values), scale=sem)
    assert mean == pytest.approx(np.mean(values), rel=1e-12, abs=1e-9)
    assert mean - half == pytest.approx(low, rel=1e-9, abs=1e-9)
    assert mean + half == pytest.approx(high, rel=1e-9, abs=1e-9)


def test_t_interval_of_five_seeds_uses_t_4() -> None:
    mean, half = t_interval([1.0, 2.0, 3.0, 4.0, 5.0])  # s = sqrt(2.5), t_{0.975,4} = 2.7764
    assert mean == 3.0
    assert half == pytest.approx(2.776445 * math.sqrt(2.5) / math.sqrt(5), rel=1e-6)


def test_t_interval_of_one_value_or_with_nan_is_nan() -> None:
    assert t_interval([2.0])[0] == 2.0 and math.isnan(t_interval([2.0])[1])
    assert all(math.isnan(v) for v in t_interval([1.0, math.nan, 2.0]))
    with pytest.raises(ValueError, match="level"):
        t_interval([1.0, 2.0], 1.5)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), n=st.integers(2, 10))
def test_paired_difference_is_scipys_paired_t_test(data: st.DataObject, n: int) -> None:
    floats = st.floats(-100, 100, allow_nan=False, allow_infinity=False)
    a = data.draw(st.lists(floats, min_size=n, max_size=n))
    b = data.draw(st.lists(floats, min_size=n, max_size=n))
    diffs = np.subtract(a, b)
    if np.std(diffs) < 1e-6 * (1 + np.abs(diffs).max()):
        return  # constant differences: scipy's t statistic is inf or nan
    result = paired_difference(a, b)
    test = scipy.stats.ttest_rel(a, b)
    assert result["p"] == pytest.approx(float(test.pvalue), rel=1e-7, abs=1e-12)
    assert result["mean"] == pytest.approx(diffs.mean(), abs=1e-9)
    assert result["ci95"] == pytest.approx(t_interval(list(diffs))[1], rel=1e-9)
    assert result["n"] == n and result["values"] == pytest.approx(list(diffs))


def test_paired_difference_edge_cases() -> None:
    assert paired_difference([1.0, 2.0], [1.0, 2.0])["p"] == 1.0  # no difference at all
    assert paired_difference([2.0, 3.0], [1.0, 2.0])["p"] == 0.0  # the same shift every seed
    assert math.isnan(paired_difference([2.0], [1.0])["p"])
    with pytest.raises(ValueError, match="baseline"):
        paired_difference([1.0, 2.0], [1.0])


def _record(heads: str, seed: int, loss: float, layers: list[float]) -> dict:
    return {"heads": heads, "seed": seed, "final": {"loss": loss}, "analysis": {"var": layers}}


def test_add_paired_pairs_by_seed_and_skips_seeds_the_baseline_lacks() -> None:
    records = [
        _record("attention:2", 0, 1.0, [1.0, 0.5]),
        _record("attention:2", 1, 1.2, [1.0, 0.7]),
        _record("laplacian:2", 1, 1.1, [0.9, 0.4]),
        _record("laplacian:2", 0, 0.8, [0.8, 0.3]),
        _record("laplacian:2", 7, 0.1, [0.1, 0.1]),  # no baseline run of seed 7
    ]
    summary = aggregate(records, ["attention:2", "laplacian:2"], ["loss"], ["var"])
    add_paired(summary, "attention:2", ["loss"], ["var"])
    assert "paired" not in summary[0]
    paired = summary[1]["paired"]
    assert paired["seeds"] == [0, 1] and paired["baseline"] == "attention:2"
    assert paired["final"]["loss"]["values"] == pytest.approx([-0.2, -0.1])
    assert paired["analysis"]["var"]["mean"] == pytest.approx([-0.15, -0.25])
    assert summary[1]["final"]["loss"]["ci95"] == pytest.approx(t_interval([0.8, 1.1, 0.1])[1])
    table = format_paired_table(summary, ["loss"])
    assert table.splitlines()[0].startswith("paired differences against attention:2")
    row = next(line for line in table.splitlines() if line.startswith("laplacian:2"))
    low, high = -0.15 - paired["final"]["loss"]["ci95"], -0.15 + paired["final"]["loss"]["ci95"]
    assert f"-0.1500 [{low:+.4f}, {high:+.4f}]" in row
    assert format_paired_table(summary[:1], ["loss"]) == ""


# ----------------------------------------------------------------------------- end to end


def test_a_sweep_comparison_reports_intervals_pairs_and_sweep_plots(
    tiny_spec: SpecFactory, tmp_path: Path
) -> None:
    heads = (*expand_sweep("laplacian=0..2", n_head=2, n_layer=2), "attention:1,mean:1")
    spec = tiny_spec(heads=heads, seeds=(0, 1), steps=3, eval_every=3, n_head=2)
    out = tmp_path / "out"
    run_compare(spec, out)
    results = json.loads((out / "results.json").read_text())
    assert results["baseline"] == "attention:2"
    (sweep,) = results["sweeps"]
    assert sweep["axis"] == "heads" and [p[0] for p in sweep["points"]] == [0, 1, 2]
    finals = {(r["heads"], r["seed"]): r["final"]["val_bpc"] for r in results["runs"]}
    for row in results["summary"]:
        values = [finals[(row["heads"], s)] for s in (0, 1)]
        assert row["final"]["val_bpc"]["ci95"] == pytest.approx(t_interval(values)[1])
        if row["heads"] == "attention:2":
            assert "paired" not in row
            continue
        base = [finals[("attention:2", s)] for s in (0, 1)]
        assert row["paired"]["final"]["val_bpc"]["values"] == pytest.approx(
            np.subtract(values, base).tolist()
        )
    names = {p.name for p in (out / "plots").iterdir()}
    assert {"sweep_laplacian-heads_val_bpc.png", "sweep_laplacian-heads_nc1.png"} <= names


def test_the_sweep_flag_adds_its_schedules_before_the_heads_flags(
    tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = [
        "compare", "--sweep", "laplacian=0..2", "--heads", "attention:1,mean:1",
        "--heads", "attention:2", "--n-head", "2", "--seeds", "2", "--text", str(corpus),
        "--steps", "2", "--batch-size", "4", "--seq-len", "16", "--layers", "2", "--embd", "16",
        "--eval-size", "4", "--analysis-size", "4", "--no-progress", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    spec = json.loads((out / "spec.json").read_text())["spec"]
    assert spec["heads"] == [
        "attention:2", "attention:1,laplacian:1", "laplacian:2", "attention:1,mean:1"
    ]  # fmt: skip
    assert "paired differences against attention:2" in printed
    assert main(["compare", "--resume", str(out), "--sweep", "laplacian=0..1"]) == 2
    assert "drop the flags" in capsys.readouterr().err


def test_a_bad_sweep_flag_names_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", "--sweep", "laplacian=0..9", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "--sweep" in err and "[0, 4]" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(format_operator(name, params), id=format_operator(name, params))
        for name, cls in OPERATORS.items()
        if name != "attention"
        for params in cls.examples
    ],
)
def test_every_registered_operator_sweeps_builds_and_is_found(op: str) -> None:
    for text in (f"{op}=0..2", f"{op}=1@each"):
        schedules = expand_sweep(text, n_head=2, n_layer=2)
        for heads in schedules:
            check_heads(heads, n_layer=2, n_head=2)
        (line,) = find_sweeps(schedules, n_layer=2, n_head=2)
        assert line.operator == op
        assert line.baseline == "attention:2"
        on_line = set(schedules) - ({line.baseline} if line.axis == "layer" else set())
        assert {h for _, h in line.points} == on_line  # a layer line draws the baseline apart
