"""Tuning that brackets: a tuned grid extended past the edge where a configuration's best value
lies, the limit and the "at the grid edge" flag, on synthetic validation means and end to end
(with a resume that takes the same decisions from the recorded results)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from heatformer.checks import ArgumentValueError
from heatformer.lab.bracket import (
    BOUNDS,
    bracketed,
    decide,
    folder_plan,
    grid_kind,
    new_settings,
    next_value,
    select_bracketed,
)
from heatformer.lab.checkpoint import atomic_write_json
from heatformer.lab.cli import main
from heatformer.lab.compare import analyze, run_compare
from heatformer.lab.folder import check_output
from heatformer.lab.spec import CompareSpec
from heatformer.lab.stop import StopSignal, TrainingInterrupted
from heatformer.lab.tasks import Task
from heatformer.lab.trainer import RESULT_NAME
from heatformer.lab.tuning import (
    TUNABLE,
    VALIDATION,
    format_selection,
    parse_tune,
    select,
    setting_label,
    settings,
)

# ----------------------------------------------------------------------------- the next value


@pytest.mark.parametrize(
    ("name", "grid", "edge", "side", "expected"),
    [
        ("lr", (1e-3, 2e-3, 4e-3), 4e-3, "high", 8e-3),  # geometric: the ratio at that edge
        ("lr", (1e-3, 2e-3, 4e-3), 1e-3, "low", 5e-4),
        ("lr", (1e-3, 2e-3, 4e-3), 5e-4, "low", 2.5e-4),  # from the current edge, same ratio
        ("lr", (1e-3, 3e-3, 1e-2), 1e-2, "high", 0.0333333),  # irregular: its own edge's ratio
        ("lr", (1e-3, 3e-3, 1e-2), 1e-3, "low", 0.000333333),  # 6 significant digits
        ("lr", (1e-3, 2e-3, 3e-3), 3e-3, "high", 4e-3),  # arithmetic: the difference
        ("lr", (1e-3, 2e-3, 3e-3), 1e-3, "low", 5e-4),  # 0 is excluded: half way to it
        ("dropout", (0.1, 0.2), 0.2, "high", 0.3),  # two values of a non-scale: arithmetic
        ("dropout", (0.1, 0.3), 0.1, "low", 0.0),  # 0 is included: lands on it
        ("dropout", (0.8, 0.9), 0.9, "high", 0.95),  # 1 is excluded: half way
        ("dropout", (0.0, 0.1), 0.0, "low", None),  # on its bound
        ("min_lr_ratio", (0.5, 0.9), 0.9, "high", 1.0),
        ("min_lr_ratio", (0.5, 1.0), 1.0, "high", None),
        ("weight_decay", (0.0, 0.1), 0.1, "high", 0.2),  # a 0 in the grid: arithmetic
        ("weight_decay", (0.01, 0.1), 0.01, "low", 0.001),  # a scale: geometric
        ("grad_clip", (0.5, 1.0), 1.0, "high", 2.0),
        ("warmup_steps", (0, 10), 10, "high", 20),  # an int field stays int
        ("warmup_steps", (0, 10), 0, "low", None),
        ("warmup_steps", (5, 10, 20), 5, "low", 2),  # geometric, rounded
        ("warmup_steps", (10, 11), 10, "low", 9),
        ("warmup_steps", (2, 3), 2, "low", 1),
        ("warmup_steps", (1, 2, 4), 1, "low", 0),  # 0.5 rounds to 0: on the bound
    ],
)
def test_the_next_value_steps_by_the_grids_ratio_or_difference_within_bounds(
    name: str, grid: tuple[float, ...], edge: float, side: str, expected: float | None
) -> None:
    got = next_value(name, grid, edge, side)
    if expected is None:
        assert got is None
        return
    assert got == pytest.approx(expected, rel=1e-12)
    assert type(got) is TUNABLE[name]
    parse_tune(f"{name}={got}")  # the sweep's own check accepts it


def test_the_kinds_of_grid_and_the_bounds_agree_with_the_sweeps_ranges() -> None:
    assert grid_kind("lr", (1e-3, 2e-3)) == "geometric"
    assert grid_kind("lr", (3e-3, 1e-3, 2e-3)) == "arithmetic"  # equal steps, in any order
    assert grid_kind("dropout", (0.1, 0.2, 0.4)) == "geometric"
    assert grid_kind("dropout", (0.1, 0.2)) == "arithmetic"
    assert grid_kind("weight_decay", (0.0, 0.1, 0.2)) == "arithmetic"
    assert set(BOUNDS) == set(TUNABLE)
    for name, (low, low_in, high, high_in) in BOUNDS.items():
        for value, inside in ((low, low_in), (high, high_in)):
            if math.isfinite(value):
                text = f"{name}={int(value) if TUNABLE[name] is int else value}"
                if inside:
                    parse_tune(text)
                else:
                    with pytest.raises(ArgumentValueError):
                        parse_tune(text)


# ----------------------------------------------------------------------------- the decision


def _records(means: dict[Any, float], field: str = "lr", heads: str = "a") -> list[dict[str, Any]]:
    """Records of configuration ``heads`` whose validation loss has the given mean over two
    seeds (0.1 below and above it); a key of ``means`` is a value of ``field`` or a tuple of
    ``(field, value)`` pairs."""
    out = []
    for value, mean in means.items():
        setting = dict(value) if isinstance(value, tuple) else {field: value}
        for seed, val in enumerate((mean - 0.1, mean + 0.1)):
            out.append({"heads": heads, "seed": seed, "setting": setting,
                        "final": {VALIDATION + "val_loss": val, "val_loss": 9.0}})  # fmt: skip
    return out


def _row(records: list[dict[str, Any]], higher: bool = False, heads: str = "a") -> dict[str, Any]:
    return select(records, [heads], "val_loss", higher)[1][0]


def test_a_best_at_the_low_edge_extends_down_by_the_grids_ratio() -> None:
    row = _row(_records({1e-3: 1.0, 2e-3: 2.0, 4e-3: 3.0}))
    (entry,) = decide(row, {"lr": (1e-3, 2e-3, 4e-3)}, limit=2).values()
    assert entry["status"] == "extend" and entry["side"] == "low"
    assert entry["next"] == pytest.approx(5e-4) and entry["extensions"] == {"low": 0, "high": 0}
    assert new_settings(row, {"lr": entry}) == [{"lr": 5e-4}]


def test_an_interior_best_stops_and_the_limit_flags_the_grid_edge() -> None:
    grid = {"lr": (1e-3, 2e-3, 4e-3)}
    row = _row(_records({1e-3: 2.0, 2e-3: 1.0, 4e-3: 3.0, 5e-4: 4.0}))
    (entry,) = decide(row, grid, limit=2).values()
    assert entry["status"] == "interior" and entry["side"] is None
    assert entry["values"] == [5e-4, 1e-3, 2e-3, 4e-3] and entry["extensions"]["low"] == 1
    assert new_settings(row, {"lr": entry}) == []
    falling = {2.5e-4: 0.5, 5e-4: 1.0, 1e-3: 2.0, 2e-3: 3.0, 4e-3: 4.0}  # best still lowest
    row = _row(_records(falling))
    (entry,) = decide(row, grid, limit=2).values()
    assert entry["status"] == "edge" and entry["side"] == "low"
    assert entry["extensions"] == {"low": 2, "high": 0} and "next" not in entry
    assert decide(row, grid, limit=3)["lr"]["next"] == pytest.approx(1.25e-4)
    (entry,) = decide(_row(_records({1e-3: 2.0, 2e-3: 1.0})), {"lr": (1e-3, 2e-3)}, 0).values()
    assert entry["status"] == "edge"  # bracket = 0: no extension, still flagged
    kept, rows = select_bracketed(_records(falling), _Spec(("lr=1e-3,2e-3,4e-3",), bracket=2))
    assert rows[0]["bracket"]["lr"]["status"] == "edge" and rows[0]["tuned"] is False
    assert {r["setting"]["lr"] for r in kept} == {2.5e-4}


def test_a_tie_with_another_value_is_bracketed_and_higher_is_better_extends_up() -> None:
    grid = {"lr": (1e-3, 2e-3, 4e-3)}
    row = _row(_records({1e-3: 1.0, 2e-3: 1.0, 4e-3: 3.0}))
    assert row["chosen"] == {"lr": 1e-3}  # a tie goes to the first listed...
    assert decide(row, grid, 2)["lr"]["status"] == "interior"  # ...but its neighbour ties it
    row = _row(_records({1e-3: 1.0, 2e-3: 2.0, 4e-3: 3.0}), higher=True)
    entry = decide(row, grid, 2)["lr"]
    assert row["chosen"] == {"lr": 4e-3} and entry["side"] == "high"
    assert entry["next"] == pytest.approx(8e-3)


def test_an_integer_field_a_bound_and_a_grid_of_two_fields() -> None:
    row = _row(_records({0: 3.0, 50: 2.0, 100: 1.0}, field="warmup_steps"))
    entry = decide(row, {"warmup_steps": (0, 50, 100)}, 2)["warmup_steps"]
    assert entry["next"] == 150 and isinstance(entry["next"], int)
    row = _row(_records({0.0: 1.0, 0.1: 2.0}, field="weight_decay"))
    entry = decide(row, {"weight_decay": (0.0, 0.1)}, 2)["weight_decay"]
    assert entry["status"] == "bound" and entry["side"] == "low"  # the best of the whole range
    two = {(("lr", lr), ("weight_decay", wd)): -lr * 1e3 * (1 + wd) for lr in (1e-3, 2e-3)
           for wd in (0.0, 0.1)}  # fmt: skip
    row = _row(_records(two))  # best: lr=2e-3, weight_decay=0.1, both at their high edge
    decision = decide(row, {"lr": (1e-3, 2e-3), "weight_decay": (0.0, 0.1)}, 2)
    assert [decision[f]["status"] for f in ("lr", "weight_decay")] == ["extend", "extend"]
    cells = new_settings(row, decision)
    assert [setting_label(c) for c in cells] == [
        "lr=0.001 weight_decay=0.2", "lr=0.002 weight_decay=0.2",
        "lr=0.004 weight_decay=0", "lr=0.004 weight_decay=0.1", "lr=0.004 weight_decay=0.2",
    ]  # fmt: skip  # the grid stays a full product
    row = _row(_records({1e-3: math.nan, 2e-3: math.nan}))
    assert decide(row, {"lr": (1e-3, 2e-3)}, 2)["lr"]["status"] == "diverged"


# ----------------------------------------------------------------------------- the rounds


class _Spec:
    """The fields of a spec that bracketing reads."""

    def __init__(self, tune: Sequence[str], bracket: int = 2, heads: Sequence[str] = ("a",),
                 seeds: Sequence[int] = (0, 1)) -> None:  # fmt: skip
        self.tune, self.bracket, self.heads, self.seeds = tuple(tune), bracket, tuple(heads), seeds
        self.task, self.select_by = "chars", "val_loss"


def _grid_runs(spec: _Spec) -> list[tuple[str, dict[str, Any], int, str]]:
    from heatformer.lab.folder import run_name

    return [(h, s, seed, run_name(i, h, seed, setting_label(s))) for seed in spec.seeds
            for i, h in enumerate(spec.heads) for s in settings(spec.tune)]  # fmt: skip


def _play(spec: _Spec, loss: Callable[[str, float], float]) -> list[tuple[str, Any, int, str]]:
    """Every run ``bracketed`` gives, each recorded with validation loss ``loss(heads, lr)``."""
    records: list[dict[str, Any]] = []
    given: list[tuple[str, Any, int, str]] = []
    totals: list[int] = []
    for heads, setting, seed, name in bracketed(spec, _grid_runs(spec), records, totals.append):
        given.append((heads, setting["lr"], seed, name))
        final = {VALIDATION + "val_loss": loss(heads, setting["lr"]) + 0.01 * seed}
        records.append({"heads": heads, "seed": seed, "setting": setting, "final": final})
    assert not totals or totals[-1] == len(given)  # each round announced with the new total
    return given


def test_rounds_extend_each_configuration_until_its_best_is_inside_seed_major() -> None:
    spec = _Spec(("lr=1e-3,2e-3,4e-3",), heads=("a", "b"))
    best = {"a": 1e-2, "b": 2e-3}  # a: 8e-3 best once 1.6e-2 brackets it; b: inside at once
    given = _play(spec, lambda heads, lr: math.log(lr / best[heads]) ** 2)
    extra = given[12:]
    assert [(h, lr, seed) for h, lr, seed, _ in extra] == [
        ("a", 8e-3, 0), ("a", 8e-3, 1), ("a", 1.6e-2, 0), ("a", 1.6e-2, 1)
    ]  # fmt: skip
    assert extra[0][3] == "c00-a-lr0.008-s0" and extra[3][3] == "c00-a-lr0.016-s1"
    far = _play(spec, lambda heads, lr: -lr)  # the largest always best: flagged after 2
    assert [lr for h, lr, seed, _ in far[12:] if seed == 0] == [8e-3, 8e-3, 1.6e-2, 1.6e-2]
    assert len(_play(_Spec(spec.tune, bracket=0, heads=spec.heads), lambda h, lr: -lr)) == 12


def test_the_folder_plan_takes_the_same_decisions_from_the_recorded_results(
    tmp_path: Path,
) -> None:
    spec = _Spec(("lr=1e-3,2e-3",), heads=("a",))
    given = _play(spec, lambda heads, lr: -lr)  # 4 grid runs... then 4e-3, 8e-3: 4 more
    assert len(given) == 8
    for index, (heads, lr, seed, name) in enumerate(given):
        if index == 6:  # the last round's first run is not finished
            continue
        final = {VALIDATION + "val_loss": -lr + 0.01 * seed, "val_loss": float(index)}
        (tmp_path / "runs" / name).mkdir(parents=True)
        atomic_write_json(tmp_path / "runs" / name / RESULT_NAME,
                          {"heads": heads, "seed": seed, "run": name, "final": final})  # fmt: skip
    plan = folder_plan(spec, _grid_runs(spec), tmp_path)
    assert [item[3] for item in plan] == [item[3] for item in given]
    finished = folder_plan(spec, _grid_runs(spec), tmp_path, finished=True)
    assert [item[3] for item in finished] == [g[3] for i, g in enumerate(given) if i != 6]
    (tmp_path / "runs" / given[4][3] / RESULT_NAME).unlink()  # round 1 unfinished: no round 2
    assert [item[3] for item in folder_plan(spec, _grid_runs(spec), tmp_path)] == [
        g[3] for g in given[:6]
    ]


def test_the_printed_selection_marks_the_grid_edge_only_where_it_is() -> None:
    spec = _Spec(("lr=1e-3,2e-3",), heads=("a", "b"))
    records = _records({1e-3: 2.0, 2e-3: 1.0}) + _records(
        {1e-3: 2.0, 2e-3: 1.0, 4e-3: 3.0}, heads="b"
    )
    _, rows = select_bracketed(records, spec)
    assert [row["tuned"] for row in rows] == [False, True]
    assert rows[0]["bracket"]["lr"]["side"] == "high"
    text = format_selection(rows)
    a, b, last = text.splitlines()[1:]
    assert a.endswith("*lr=0.002: 1.0000   [at the grid edge: lr high; not tuned]")
    assert "grid edge" not in b and "2 extension(s)" in last
    plain = format_selection(select(records, ["a", "b"], "val_loss", False)[1])
    assert "grid edge" not in plain and len(plain.splitlines()) == 3


# ----------------------------------------------------------------------------- the spec


def test_the_spec_field_its_checks_old_specs_and_the_resume_check(
    tiny_spec: Any, tmp_path: Path
) -> None:
    with pytest.raises(ArgumentValueError) as info:
        CompareSpec(n_layer=2, bracket=-1)
    assert info.value.argument == "bracket"
    spec = CompareSpec(n_layer=2, tune=("lr=1e-3,2e-3",), select_by="val_loss", bracket=3)
    assert CompareSpec.from_dict(json.loads(json.dumps(spec.to_dict()))).bracket == 3
    assert "bracket" not in spec.fingerprint()  # a run's numbers do not depend on it
    old = spec.to_dict()
    del old["bracket"]  # a spec.json written before bracketing: its runs, none extended
    assert CompareSpec.from_dict(old).bracket == 0
    assert CompareSpec.from_dict({**old, "tune": [], "select_by": None}).bracket == 2
    made = tiny_spec(heads=("attention:2",), tune=("lr=1e-3,2e-3",), select_by="val_loss")
    out = tmp_path / "out"
    out.mkdir()
    (out / "spec.json").write_text(json.dumps({"spec": made.to_dict()}))
    check_output(made, out, resume=True)
    with pytest.raises(ValueError, match="expected the spec saved"):
        check_output(CompareSpec.from_dict({**made.to_dict(), "bracket": 1}), out, resume=True)


def test_a_study_file_sets_bracket(tmp_path: Path) -> None:
    from heatformer.lab.cli._config import read_study

    path = tmp_path / "study.toml"
    path.write_text('tune = ["lr=1e-3,2e-3"]\nselect_by = "val_loss"\nbracket = 1\n')
    assert read_study(path).values["bracket"] == 1


# ----------------------------------------------------------------------------- end to end


def test_compare_brackets_an_edge_best_flags_the_limit_and_resumes_to_the_same_report(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An absurdly small grid: the larger learning rate always wins, so each of 2 extensions
    goes up, and the best is still the largest: at the grid edge, not tuned."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path / "out"
    argv = [
        "compare", "--task", "chars", "--heads", "attention:2", "--sweep", "lr=1e-5,2e-5",
        "--select-by", "val_loss", "--bracket", "2", "--text", str(corpus), "--steps", "4",
        "--batch-size", "4", "--seq-len", "16", "--layers", "1", "--embd", "16",
        "--eval-size", "8", "--no-analysis", "--device", "cpu", "--no-progress",
        "--out", str(out),
    ]  # fmt: skip
    try:
        assert main(argv) == 0
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    assert [r["setting"]["lr"] for r in results["runs"]] == [1e-5, 2e-5, 4e-5, 8e-5]
    assert sorted(p.name for p in (out / "runs").iterdir())[-1] == "c00-attention2-lr8e-05-s0"
    (row,) = results["selection"]["configurations"]
    assert row["chosen"] == {"lr": 8e-5} and row["tuned"] is False
    assert row["bracket"]["lr"] == {
        "status": "edge", "side": "high", "values": [1e-5, 2e-5, 4e-5, 8e-5],
        "extensions": {"low": 0, "high": 2}, "limit": 2,
    }  # fmt: skip
    means = [c["mean"] for c in row["candidates"]]
    assert means == sorted(means, reverse=True)  # each larger lr better on validation
    assert "[at the grid edge: lr high; not tuned]" in printed
    assert "(+ up to 2 value(s) per side" in printed  # the plan line says it may grow
    assert main(["compare", "--resume", str(out), "--no-progress"]) == 0  # nothing left to run
    again = json.loads((out / "results.json").read_text())
    assert again["runs"] == results["runs"] and again["selection"] == results["selection"]
    assert again["invocations"] == 2


def test_an_interrupted_extension_run_resumes_with_the_same_decisions(
    tiny_spec: Any, tmp_path: Path
) -> None:
    spec = tiny_spec(
        heads=("attention:2",), steps=4, eval_every=2, ckpt_every=1, analysis=False,
        tune=("lr=1e-5,2e-5",), select_by="val_loss", bracket=1,
    )  # fmt: skip
    full = run_compare(spec, tmp_path / "full").results
    stop = StopSignal()

    def factory(task: Task, heads: str) -> nn.Module:
        if task.spec.lr == 4e-5:  # the first extension run: stopped after its first step
            stop.request("test")
        return task.build_model(heads)

    with pytest.raises(TrainingInterrupted) as info:
        run_compare(spec, tmp_path / "cut", stop=stop, model_factory=factory)
    assert info.value.run_dir.name == "c00-attention2-lr4e-05-s0"
    resumed = run_compare(spec, tmp_path / "cut", resume=True).results
    assert [r["run"] for r in resumed["runs"]] == [r["run"] for r in full["runs"]]
    for a, b in zip(full["runs"], resumed["runs"], strict=True):
        assert a["final"] == b["final"] and a["train_loss"] == b["train_loss"]  # bit for bit
    assert resumed["selection"] == full["selection"]
    assert full["selection"]["configurations"][0]["bracket"]["lr"]["status"] == "edge"
    again = run_compare(spec, tmp_path / "full", resume=True).results  # all finished: no run
    assert [r["run"] for r in again["runs"]] == [r["run"] for r in full["runs"]]
    assert again["selection"] == full["selection"]
    analyzed = analyze(tmp_path / "full").results  # the extension runs are the folder's too
    assert analyzed["selection"] == full["selection"] and len(analyzed["runs"]) == 3
