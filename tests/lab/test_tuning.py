"""Fair tuning in ``compare``: optimiser sweeps, selection on the validation half, the primary
endpoints' statistics (against scipy), and the command line end to end."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from heatformer.checks import ArgumentValueError
from heatformer.lab.cli import main
from heatformer.lab.compare import validate_spec
from heatformer.lab.report import many_to_one, primary_endpoints
from heatformer.lab.resume import load_run_checkpoint
from heatformer.lab.spec import CompareSpec
from heatformer.lab.sweep import expand_sweep, find_sweeps
from heatformer.lab.tuning import (
    VALIDATION,
    format_selection,
    parse_tune,
    select,
    setting_label,
)
from heatformer.lab.tuning import settings as grid

# ----------------------------------------------------------------------------- parsing


def test_a_tune_sweep_parses_to_its_field_and_values_and_crosses_as_a_grid() -> None:
    assert parse_tune(" lr = 1e-3, 2e-3 ,4e-3") == ("lr", (1e-3, 2e-3, 4e-3))
    assert parse_tune("warmup_steps=0,10") == ("warmup_steps", (0, 10))
    cells = grid(("lr=1e-3,2e-3", "weight_decay=0,0.1"))
    assert cells == [
        {"lr": 1e-3, "weight_decay": 0.0}, {"lr": 1e-3, "weight_decay": 0.1},
        {"lr": 2e-3, "weight_decay": 0.0}, {"lr": 2e-3, "weight_decay": 0.1},
    ]  # fmt: skip
    assert grid(()) == [{}] and setting_label({}) == ""


@pytest.mark.parametrize(
    ("text", "part"),
    [
        ("lr=", "float values"),
        ("lr=1e-3,abc", "'abc'"),
        ("lr=0,1e-3", "> 0"),
        ("lr=nan", "> 0"),
        ("lr=1e-3,1e-3", "distinct"),
        ("momentum=0.9", "FIELD one of"),
        ("dropout=1.0", "in [0, 1)"),
        ("warmup_steps=1.5", "int values"),
    ],
)
def test_a_bad_tune_sweep_is_one_error_naming_sweep(text: str, part: str) -> None:
    with pytest.raises(ArgumentValueError, match="sweep") as info:
        parse_tune(text)
    assert info.value.argument == "sweep" and part in str(info.value)


@pytest.mark.parametrize(
    ("values", "argument", "part"),
    [
        ({"select_by": "val_loss"}, "select_by", "sweep of an optimiser field"),
        ({"tune": ("lr=1e-3,2e-3",)}, "select_by", "--select-by val_loss"),
        ({"tune": ("lr=1e-3,2e-3",), "select_by": "loss2"}, "select_by", "'loss2'"),
        ({"tune": ("lr=1e-3", "lr=2e-3"), "select_by": "val_loss"}, "sweep", "once"),
        ({"primary": ("accuracy",)}, "primary", "'accuracy'"),
        ({"primary": ("nc1@9",)}, "primary", "[-2, 2)"),
        ({"primary": ("val_bpc@0",)}, "primary", "per-layer metrics"),
        ({"primary": ("nc1@last",), "analysis": False}, "primary", "analysis"),
        ({"primary": ("val_bpc", "bpc")}, "primary", "distinct"),
    ],
)
def test_bad_study_settings_name_their_argument(
    values: dict[str, Any], argument: str, part: str
) -> None:
    with pytest.raises(ArgumentValueError) as info:
        CompareSpec(task="chars", n_layer=2, **values)
    assert info.value.argument == argument and part in str(info.value)


def test_the_spec_keeps_canonical_names_and_the_run_key_holds_lr_not_the_grid() -> None:
    spec = CompareSpec(
        n_layer=2, tune=["lr=1e-3,2e-3"], select_by="loss", primary=["bpc", "nc1@last"]
    )
    assert spec.tune == ("lr=1e-3,2e-3",) and spec.select_by == "val_loss"
    assert spec.primary == ("val_bpc", "nc1@last")
    assert CompareSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    key = spec.fingerprint()
    assert key["lr"] == spec.lr and key["select_by"] == "val_loss"
    assert "tune" not in key and "primary" not in key
    plain = CompareSpec(n_layer=2).fingerprint()  # as before selection existed: old keys match
    assert not {"tune", "primary", "select_by"} & set(plain)


# ----------------------------------------------------------------------------- selection


def _record(heads: str, seed: int, lr: float, val: float, test: float) -> dict[str, Any]:
    final = {"val_loss": test, VALIDATION + "val_loss": val}
    return {"heads": heads, "seed": seed, "setting": {"lr": lr}, "final": final}


def test_selection_takes_the_best_validation_mean_and_keeps_its_runs() -> None:
    records = [
        _record("a", s, lr, val, test)
        for s in (0, 1)
        for lr, val, test in ((1e-3, 2.0 + s, 9.0), (2e-3, 1.0 + 3 * s, 8.0), (4e-3, 1.9, 7.0))
    ] + [_record("b", s, lr, v, 0.0) for s in (0, 1) for lr, v in ((1e-3, 1.0), (2e-3, 1.0))]
    kept, selection = select(records, ["a", "b", "missing"], "val_loss", higher_is_better=False)
    a, b = selection
    # a: means 2.5, 2.5 and 1.9 -> 4e-3, though lr=2e-3 had the best single seed
    assert a["chosen"] == {"lr": 4e-3} and a["chosen_label"] == "lr=0.004"
    assert [c["mean"] for c in a["candidates"]] == [2.5, 2.5, 1.9]
    assert a["candidates"][1]["values"] == [1.0, 4.0] and a["candidates"][1]["seeds"] == [0, 1]
    assert b["chosen"] == {"lr": 1e-3}  # a tie goes to the first setting listed
    assert [(r["heads"], r["seed"], r["setting"]["lr"]) for r in kept] == [
        ("a", 0, 4e-3), ("a", 1, 4e-3), ("b", 0, 1e-3), ("b", 1, 1e-3)
    ]  # fmt: skip
    _, best_high = select(records, ["a"], "val_loss", higher_is_better=True)
    assert best_high[0]["chosen"] == {"lr": 1e-3}  # the first of the two 2.5s
    text = format_selection(selection)
    assert "*lr=0.004: 1.9000" in text and " lr=0.002: 2.5000" in text


def test_a_setting_with_a_nan_run_is_chosen_only_when_every_one_has() -> None:
    records = [_record("a", 0, 1e-3, math.nan, 0.0), _record("a", 0, 2e-3, 5.0, 0.0)]
    assert select(records, ["a"], "val_loss", False)[1][0]["chosen"] == {"lr": 2e-3}
    records[1]["final"][VALIDATION + "val_loss"] = math.nan
    assert select(records, ["a"], "val_loss", False)[1][0]["chosen"] == {"lr": 1e-3}


def test_the_evaluation_splits_by_example_parity_into_test_and_validation(
    tiny_spec: Any,
) -> None:
    spec = tiny_spec(tune=("lr=1e-3,2e-3",), select_by="val_loss", eval_size=7)
    task = validate_spec(spec)
    torch.manual_seed(0)
    model = task.build_model(spec.heads[0])
    inputs = torch.cat([x for x, _ in task.eval_batches()])  # (7, N)
    targets = torch.cat([y for _, y in task.eval_batches()])
    with torch.no_grad():
        logits = model.eval()(inputs).double()  # (7, N, K)
    out = task.evaluate(model, torch.device("cpu"))
    halves = (("val_loss", slice(1, None, 2)), (VALIDATION + "val_loss", slice(0, None, 2)))
    for name, rows in halves:
        chosen = logits[rows].reshape(-1, logits.shape[-1])
        expected = F.cross_entropy(chosen, targets[rows].reshape(-1)).item()
        assert out[name] == pytest.approx(expected, rel=1e-5)
    assert out[VALIDATION + "val_bpc"] == pytest.approx(out[VALIDATION + "val_loss"] / math.log(2))


# ----------------------------------------------------------------------------- endpoints


def _summary(values: dict[str, np.ndarray], layers: bool = False) -> list[dict[str, Any]]:
    rows = []
    for heads, v in values.items():
        seeds = list(range(len(v)))
        analysis = {"nc1": {"values": [[0.0, float(x)] for x in v]}} if layers else {}
        rows.append({"heads": heads, "seeds": seeds, "final": {"val_bpc": {"values": list(v)}},
                     "analysis": analysis})  # fmt: skip
    return rows


def _holm(p: list[float]) -> list[float]:
    """Holm's step-down adjustment, written from its definition."""
    m, order = len(p), np.argsort(p, kind="stable")
    out, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(*[st.floats(-3, 3, allow_nan=False) for _ in range(4)]), min_size=3, max_size=8
    )
)
def test_primary_endpoints_match_scipy_paired_tests_holm_and_bonferroni_intervals(
    rows: list[tuple[float, ...]],
) -> None:
    data = np.array(rows)  # (seeds, 4): baseline and three configurations
    if np.ptp(data[:, 1:] - data[:, :1], axis=0).min() < 1e-6:
        return  # differences that do not vary: t is infinite (tested in test_inference)
    names = ["base", "k1", "k2", "k3"]
    summary = _summary({name: data[:, i] for i, name in enumerate(names)}, layers=True)
    out = primary_endpoints(summary, "base", ["val_bpc", "nc1@last"])
    family = [row for item in out for row in item["comparisons"].values()]
    n, m = len(data), 6
    p = [float(stats.ttest_rel(data[:, i], data[:, 0]).pvalue) for i in (1, 2, 3)] * 2
    assert [row["p"] for row in family] == pytest.approx(p, rel=1e-9, abs=1e-12)
    assert [row["p_adjusted"] for row in family] == pytest.approx(_holm(p), rel=1e-9, abs=1e-12)
    for row, i in zip(family, (1, 2, 3, 1, 2, 3)):
        d = data[:, i] - data[:, 0]
        half = stats.t.ppf(1 - 0.05 / (2 * m), n - 1) * d.std(ddof=1) / math.sqrt(n)
        assert row["mean"] == pytest.approx(d.mean(), abs=1e-12)
        assert row["ci_simultaneous"] == pytest.approx(half, rel=1e-9)
        assert row["effect"]["d"] == pytest.approx(d.mean() / d.std(ddof=1), rel=1e-9)
        assert row["significant"] == (row["p_adjusted"] < 0.05)
        if row["significant"]:
            assert row["equivalence"] is None and math.isnan(row["detectable"])
    single = primary_endpoints(summary, "base", ["val_bpc"])[0]["comparisons"]
    columns = data.T.tolist()
    reference = many_to_one({k: columns[i] for i, k in enumerate(names) if i}, columns[0])
    for name, row in single.items():
        assert row["p_adjusted"] == pytest.approx(reference[name]["p_adjusted"], rel=1e-12)
        assert row["ci_simultaneous"] == pytest.approx(reference[name]["ci_simultaneous"])


def test_a_null_result_says_what_could_be_detected_and_the_trend_is_per_seed_slopes() -> None:
    rng = np.random.default_rng(0)
    base = rng.normal(1.0, 0.1, 8)
    values = {  # k = 0, 1, 2: k = 1 equal to the baseline within noise, k = 2 far above
        "attention:4": base,
        "attention:3,laplacian:1": base + np.array([1, -1, 2, -2, 3, -3, 1, -1]) * 1e-3,
        "attention:2,laplacian:2": base + 0.5 + rng.normal(0, 0.01, 8),
    }
    heads = expand_sweep("laplacian=0..2", n_head=4, n_layer=2)
    sweeps = find_sweeps(heads, n_layer=2, n_head=4)
    (item,) = primary_endpoints(_summary(values), "attention:4", ["val_bpc"], sweeps)
    near, far = item["comparisons"].values()
    assert far["significant"] and far["equivalence"] is None
    d = values["attention:3,laplacian:1"] - base
    assert not near["significant"]
    assert near["detectable"] == pytest.approx(near["detectable_sd"] * d.std(ddof=1))
    assert power_at(near["detectable_sd"], 8) == pytest.approx(0.8, abs=1e-6)
    assert near["equivalence"] == f"no effect larger than {near['detectable']:.3g}"
    assert tost_p(d, near["detectable"]) < 0.05
    (trend,) = item["trends"]
    slopes = [np.polyfit([0, 1, 2], [v[s] for v in values.values()], 1)[0] for s in range(8)]
    assert trend["slopes"] == pytest.approx(slopes, rel=1e-9)
    assert trend["p"] == pytest.approx(stats.ttest_1samp(slopes, 0).pvalue, rel=1e-9)
    assert trend["p_adjusted"] == trend["p"] and trend["ks"] == [0, 1, 2]


def power_at(delta: float, n: int) -> float:
    """Power of the two-sided paired t-test at 0.05 for an effect of ``delta`` seed-SDs."""
    crit, nc = stats.t.ppf(0.975, n - 1), delta * math.sqrt(n)
    return float(stats.nct.sf(crit, n - 1, nc) + stats.nct.cdf(-crit, n - 1, nc))


def tost_p(d: np.ndarray, margin: float) -> float:
    lower = stats.ttest_1samp(d, -margin, alternative="greater").pvalue
    upper = stats.ttest_1samp(d, margin, alternative="less").pvalue
    return float(max(lower, upper))


# ----------------------------------------------------------------------------- end to end


def test_compare_tunes_lr_per_configuration_resumes_and_reports(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path / "out"
    argv = [
        "compare", "--task", "chars", "--sweep", "laplacian=0..1", "--sweep", "lr=1e-3,4e-3",
        "--select-by", "val_loss", "--bracket", "0", "--seeds", "2", "--primary", "bpc",
        "--primary", "nc1@last",
        "--n-head", "2", "--text", str(corpus), "--steps", "4", "--batch-size", "4",
        "--seq-len", "16", "--layers", "2", "--embd", "16", "--eval-size", "8",
        "--analysis-size", "4", "--device", "cpu", "--no-progress", "--out", str(out),
    ]  # fmt: skip
    started = time.perf_counter()
    try:
        assert main([*argv, "--stop-at-step", "2"]) == 0  # the first run stops, then resumes
        capsys.readouterr()
        assert main(["compare", "--resume", str(out), "--no-progress"]) == 0
    finally:
        torch.set_num_threads(threads)
    elapsed = time.perf_counter() - started
    printed = capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    runs = results["runs"]
    assert len(runs) == 8 and {r["setting"]["lr"] for r in runs} == {1e-3, 4e-3}
    assert sorted(p.name for p in (out / "runs").iterdir())[:2] == [
        "c00-attention2-lr0.001-s0", "c00-attention2-lr0.001-s1"
    ]  # fmt: skip
    spec = CompareSpec.from_dict(json.loads((out / "spec.json").read_text())["spec"])
    task = validate_spec(spec)
    key = torch.load(out / "runs" / runs[1]["run"] / "checkpoint.pt", weights_only=False)["key"]
    assert key["spec"]["lr"] == runs[1]["setting"]["lr"] and key["seed"] == runs[1]["seed"]
    with pytest.raises(ValueError, match="lr: saved"):  # the default lr is another run's
        load_run_checkpoint(task, runs[1]["heads"], runs[1]["seed"], out / "runs" / runs[1]["run"])
    selection = results["selection"]["configurations"]
    assert [row["heads"] for row in selection] == ["attention:2", "attention:1,laplacian:1"]
    for row in selection:
        means = {c["label"]: c["mean"] for c in row["candidates"]}
        assert row["chosen_label"] == min(means, key=means.__getitem__)
        mine = [r for r in runs if r["heads"] == row["heads"]]
        for candidate in row["candidates"]:
            vals = [r["final"][VALIDATION + "val_loss"] for r in mine
                    if r["setting"] == candidate["setting"]]  # fmt: skip
            assert candidate["values"] == vals
        summary = next(s for s in results["summary"] if s["heads"] == row["heads"])
        chosen = [r["final"]["val_bpc"] for r in mine if r["setting"] == row["chosen"]]
        assert summary["final"]["val_bpc"]["values"] == chosen  # the test half of the chosen
    assert [item["endpoint"] for item in results["primary"]] == ["val_bpc", "nc1@last"]
    assert results["primary"][0]["family_size"] == 2
    assert "selection by validation val_loss" in printed
    assert "primary endpoint val_bpc" in printed and "p_holm" in printed
    assert elapsed < 60  # about 10 s on one idle thread


def test_a_diverging_candidate_is_recorded_and_passed_over_not_fatal(
    tiny_spec: Any, tmp_path: Path
) -> None:
    from heatformer.lab.compare import analyze, run_compare

    spec = tiny_spec(
        heads=("attention:2",), steps=4, eval_every=2, tune=("lr=3e-3,1e4",),
        select_by="val_loss", bracket=0, grad_clip=0.0, analysis=False,
    )  # fmt: skip
    report = run_compare(spec, tmp_path / "out")
    (row,) = report.results["selection"]["configurations"]
    assert row["chosen"] == {"lr": 3e-3}
    (diverged,) = [r for r in report.results["runs"] if "diverged" in r]
    assert diverged["setting"] == {"lr": 1e4} and math.isnan(diverged["final"]["val_loss"])
    assert math.isnan(row["candidates"][1]["mean"])
    again = analyze(tmp_path / "out")  # the diverged run has no final weights: left alone
    assert again.results["selection"]["configurations"][0]["chosen"] == {"lr": 3e-3}


def test_results_json_holds_the_selection_the_chosen_test_metrics_and_every_run(
    tiny_spec: Any, tmp_path: Path
) -> None:
    from heatformer.lab.compare import _finish
    from heatformer.lab.distributed import DistContext

    spec = tiny_spec(
        heads=("attention:2", "attention:1,laplacian:1"), seeds=(0, 1, 2),
        tune=("lr=1e-3,2e-3",), select_by="val_loss", primary=("bpc",), analysis=False,
    )  # fmt: skip
    task = validate_spec(spec)
    records = []
    for heads, best in (("attention:2", 1e-3), ("attention:1,laplacian:1", 2e-3)):
        for lr in (1e-3, 2e-3):
            for seed in spec.seeds:
                test = 1.0 + seed + (0.5 if heads == "attention:2" else 0.0) + lr
                val = (lr != best) + 0.1 * seed  # the best lr is 1 lower on validation
                final = {"val_bpc": test / math.log(2), "val_loss": test}
                final |= {VALIDATION + "val_bpc": 0.0, VALIDATION + "val_loss": val}
                records.append(
                    {"heads": heads, "seed": seed, "setting": {"lr": lr}, "run": f"r{len(records)}",
                     "steps": 1, "num_params": 1, "train_loss": [test],
                     "evals": [{"step": 1, **final}], "final": final, "analysis": {},
                     "train_time_s": 0.0}
                )  # fmt: skip
    out = tmp_path / "out"
    out.mkdir()
    _finish(spec, task, out, records, DistContext(device=torch.device("cpu")),
            wall_time_s=lambda: 0.0, environment=None)  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    assert results["selection"]["metric"] == "val_loss"
    chosen = [row["chosen"]["lr"] for row in results["selection"]["configurations"]]
    assert chosen == [1e-3, 2e-3]
    means = [
        [c["mean"] for c in row["candidates"]] for row in results["selection"]["configurations"]
    ]
    assert means == [pytest.approx([0.1, 1.1]), pytest.approx([1.1, 0.1])]
    base, other = results["summary"]
    assert base["final"]["val_loss"]["values"] == pytest.approx([1.501, 2.501, 3.501])
    assert other["final"]["val_loss"]["values"] == pytest.approx([1.002, 2.002, 3.002])
    assert len(results["runs"]) == 12
    (endpoint,) = results["primary"]
    row = endpoint["comparisons"]["attention:1,laplacian:1"]
    assert endpoint["endpoint"] == "val_bpc" and endpoint["baseline"] == "attention:2"
    assert row["mean"] == pytest.approx(-0.499 / math.log(2)) and row["p_adjusted"] < 1e-12
    assert row["significant"] and row["equivalence"] is None
    csv_header = (out / "results.csv").read_text().splitlines()[0]
    assert csv_header.startswith("heads,setting,seed,")
