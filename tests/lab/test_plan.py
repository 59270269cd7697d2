"""A study's plan (issue 43, item 2): the file, what ``compare --plan`` records and refuses,
whether the plan was committed before the runs, and the verdicts of ``heatformer plan``
(Holm over superiority and TOST together, power at the corrected alpha) against scipy."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

from heatformer.lab import plan as plan_module
from heatformer.lab.cli import main
from heatformer.lab.plan import CommitState, commit_state, read_plan
from heatformer.lab.report.plan import evaluate_plan, format_plan
from heatformer.lab.spec import CompareSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "docs" / "study" / "suite-plan.toml"
SEEDS = [0, 1, 2]


def _write_results(
    folder: Path,
    name: str,
    values: dict[str, dict[str, list[float]]],
    *,
    started: str | None = "2026-12-08T00:00:00+00:00",
    primary: tuple[str, ...] = ("val_acc", "val_acc_far"),
    plan: dict[str, Any] | None = None,
    seeds: list[int] = SEEDS,
) -> Path:
    """A synthetic ``results.json`` of an MQAR comparison: per configuration, each endpoint's
    per-seed values."""
    folder.mkdir(parents=True)
    summary = [
        {"heads": heads, "seeds": seeds, "analysis": {},
         "final": {metric: {"values": v} for metric, v in metrics.items()}}
        for heads, metrics in values.items()
    ]  # fmt: skip
    spec = {"name": name, "task": "mqar", "n_layer": 2, "analysis": True, "seeds": seeds,
            "primary": list(primary), "plan": plan}  # fmt: skip
    results = {"spec": spec, "task": "mqar", "seeds": seeds, "summary": summary}
    if started is not None:
        results["started"] = started
    (folder / "results.json").write_text(json.dumps(results))
    return folder


def _config(base: float, deltas: dict[str, list[float]]) -> dict[str, dict[str, list[float]]]:
    """The baseline at ``base + 0.01 * seed`` on both endpoints, each configuration at the
    baseline plus its per-seed differences (the same on both endpoints, far one halved)."""
    baseline = [base + 0.01 * s for s in SEEDS]
    out = {"attention:2": {"val_acc": baseline, "val_acc_far": baseline}}
    for heads, d in deltas.items():
        out[heads] = {
            "val_acc": [b + x for b, x in zip(baseline, d)],
            "val_acc_far": [b + x / 2 for b, x in zip(baseline, d)],
        }
    return out


BETTER, SAME, WORSE, UNSURE = [0.30, 0.31, 0.29], [0.001, -0.001, 0.0], [-0.3, -0.31, -0.29], [
    0.1, -0.1, 0.05]  # fmt: skip


def _suite(tmp_path: Path) -> tuple[Path, Path]:
    ops = _write_results(tmp_path / "mqar-ops", "mqar-ops", _config(0.5, {
        "attention:1,laplacian:1": BETTER, "attention:1,heat:1": SAME,
        "attention:1,diff:1": UNSURE}))  # fmt: skip
    window = _write_results(tmp_path / "mqar-window", "mqar-window", _config(0.3, {
        "attention:1,laplacian:1": WORSE, "attention:1,heat:1": BETTER}))  # fmt: skip
    return ops, window


def _holm(p: list[float]) -> list[float]:
    """Holm's step-down adjustment, written out: sorted, (K - i) p_(i), running maximum."""
    order = np.argsort(p, kind="stable")
    out, running = [0.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        out[i] = running
    return out


# ----------------------------------------------------------------------------- the file


def test_the_suite_plan_encodes_its_markdown_and_its_study_files() -> None:
    """docs/study/suite-plan.toml says what docs/study/suite-plan.md decided: per study one
    family, val_acc and val_acc_far against attention:2, margin 0.05, alpha 0.05, the seeds and
    configurations of studies/<study>.toml."""
    plan = read_plan(SUITE)
    assert plan.alpha == 0.05 and plan.sha256 == hashlib.sha256(SUITE.read_bytes()).hexdigest()
    assert [claim.studies for claim in plan.claims] == [("mqar-ops",), ("mqar-window",)]
    for claim in plan.claims:
        (study,) = claim.studies
        file = tomllib.loads((ROOT / "studies" / f"{study}.toml").read_text())
        assert claim.endpoints == ("val_acc", "val_acc_far") == tuple(file["primary"])
        assert claim.baseline == "attention:2" == file["heads"][0]
        assert claim.configurations == tuple(file["heads"][1:])
        assert claim.margins == (0.05, 0.05) and claim.sides == ("higher", "higher")
        assert plan.seeds[study] == tuple(file["seeds"]) == (0, 1, 2)
    text = (ROOT / "docs" / "study" / "suite-plan.md").read_text()
    assert "X = 0.05" in text and "α = 0.05" in text and "6 in\n  `mqar-ops`, 2 × 2 = 4" in text


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("alpha = 0.05", "alpah = 0.05"), "alpah: unknown key (did you mean 'alpha'?)"),
        (("margin = 0.05", "margin = -0.05"), "claim 'mqar-ops'.margin: expected a number > 0"),
        (('side = "higher"', 'side = "up"'), "side: expected one of ['higher', 'lower']"),
        (('studies = ["mqar-ops"]', 'studies = ["mqar-opz"]'), "'mqar-opz' has no [study"),
        (
            ("[study.mqar-ops]", "[study.other]\nseeds = [0]\n[study.mqar-ops]"),
            "study.other: named",
        ),
        (("endpoints = [", 'endpoint = "val_acc"\nendpoints = ['), "one of them"),
        (("seeds = [0, 1, 2]", "seeds = [0, 0]"), "seeds: expected distinct ints >= 0"),
    ],
)
def test_a_plan_the_schema_refuses_is_one_error_naming_plan_the_file_and_the_key(
    tmp_path: Path, edit: tuple[str, str], message: str
) -> None:
    path = tmp_path / "plan.toml"
    path.write_text(SUITE.read_text().replace(*edit, 1))
    with pytest.raises(ValueError, match=r"^plan: ") as err:
        read_plan(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_a_margin_and_a_side_per_endpoint_and_a_single_endpoint(tmp_path: Path) -> None:
    text = (
        SUITE.read_text()
        .replace("margin = 0.05\nside", "margin = {val_acc = 0.05, val_acc_far = 0.1}\nside", 1)
        .replace('endpoints = ["val_acc", "val_acc_far"]', 'endpoint = "val_acc"', 2)
    )
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(ValueError, match=r"margin: expected a value for each of \['val_acc'\]"):
        read_plan(bad)
    good = tmp_path / "good.toml"
    good.write_text(text.replace(", val_acc_far = 0.1", ""))
    assert [(c.endpoints, c.margins) for c in read_plan(good).claims] == [
        (("val_acc",), (0.05,))
    ] * 2


# ----------------------------------------------------------------------------- the spec


def test_the_spec_keeps_the_plan_as_its_record_checks_primary_and_not_in_its_fingerprint() -> None:
    heads = ("attention:2", "attention:1,laplacian:1", "attention:1,heat:1", "attention:1,diff:1")
    values: dict[str, Any] = {
        "task": "mqar", "name": "mqar-ops", "seeds": (0, 1, 2), "n_layer": 2, "heads": heads
    }  # fmt: skip
    spec = CompareSpec(**values, plan=str(SUITE))
    assert spec.primary == ("val_acc", "val_acc_far")  # no --primary: the plan's endpoints
    data = json.loads(json.dumps(spec.to_dict()))
    record = {"path": str(SUITE), "sha256": read_plan(SUITE).sha256, "study": "mqar-ops",
              "endpoints": ["val_acc", "val_acc_far"]}  # fmt: skip
    assert data["plan"] == record
    again = CompareSpec.from_dict(data)
    assert again.plan == spec.plan and again.fingerprint() == CompareSpec(**values).fingerprint()
    with pytest.raises(ValueError, match=r"^primary: expected endpoints of the plan .* 'val_loss'"):
        CompareSpec.from_dict({**data, "primary": ["val_loss"]})
    with pytest.raises(ValueError, match=r"^heads: .*none of \['attention:1,diff:1'\]"):
        CompareSpec(**{**values, "heads": values["heads"][:3]}, plan=str(SUITE))


def test_compare_with_a_plan_records_its_hash_and_refuses_an_endpoint_it_lacks(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tiny comparison with ``--plan``: the plan's sha256 in spec.json and results.json, the
    runs' start in results.json; ``--primary`` beyond the plan and ``--resume --plan`` refused;
    ``heatformer plan`` reads the folder back."""
    plan = tmp_path / "plan.toml"
    plan.write_text(
        'alpha = 0.05\n[study.tiny]\nseeds = [0, 1]\n[[claim]]\nname = "bpc"\nstudies = ["tiny"]\n'
        'endpoint = "bpc"\nbaseline = "attention:2"\nconfigurations = ["attention:1,laplacian:1"]\n'
        'margin = 0.5\nside = "lower"\n'
    )
    out = tmp_path / "out"
    argv = [
        "compare", "--task", "chars", "--heads", "attention:2", "--heads",
        "attention:1,laplacian:1", "--seeds", "2", "--text", str(corpus), "--steps", "2",
        "--batch-size", "4", "--seq-len", "16", "--layers", "1", "--embd", "16", "--eval-size",
        "4", "--no-analysis", "--device", "cpu", "--no-progress", "--name", "tiny", "--plan",
        str(plan),
    ]  # fmt: skip
    assert main([*argv, "--primary", "val_loss", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--primary: expected endpoints of the plan" in err
    assert "'val_loss', which the plan lacks" in err and not out.exists()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main([*argv, "--out", str(out)]) == 0, capsys.readouterr().err
    finally:
        torch.set_num_threads(threads)
    sha = hashlib.sha256(plan.read_bytes()).hexdigest()
    results = json.loads((out / "results.json").read_text())
    saved = json.loads((out / "spec.json").read_text())["spec"]
    assert results["spec"]["plan"]["sha256"] == saved["plan"]["sha256"] == sha
    assert (
        results["spec"]["primary"]
        == ["val_bpc"]
        == [item["endpoint"] for item in results["primary"]]
    )
    first = json.loads((out / "invocations.json").read_text())["invocations"][0]["started"]
    started = datetime.fromisoformat(results["started"])
    assert started.tzinfo is not None and started == datetime.fromisoformat(first).astimezone()
    assert f"study tiny): its verdicts: heatformer plan {plan} {out}" in capsys.readouterr().out
    assert main(["compare", "--resume", str(out), "--plan", str(plan)]) == 2
    assert "drop the flags ['plan']" in capsys.readouterr().err
    assert main(["plan", str(plan), str(out), "--json", str(tmp_path / "e.json")]) == 0
    printed = capsys.readouterr().out
    assert "the plan: unknown (not in a git repository" in printed
    assert "recorded by the comparison: this plan" in printed
    assert "tiny val_bpc attention:1,laplacian:1:" in printed
    evaluation = json.loads((tmp_path / "e.json").read_text())
    assert evaluation["plan"]["sha256"] == sha and evaluation["claims"][0]["tests"] == 2


# ----------------------------------------------------------------------------- the verdicts


def test_holm_over_tost_and_superiority_together_and_power_at_the_corrected_alpha(
    tmp_path: Path,
) -> None:
    """The suite plan on synthetic results: per claim, the 2m p-values (paired t-tests, TOST at
    0.05 by two one-sided scipy tests) Holm-adjusted together as written out here; the power
    of the paired t-test at alpha / 2m against the margin by scipy's noncentral t; the
    simultaneous interval at 1 - alpha/m; the verdicts."""
    ops, window = _suite(tmp_path)
    evaluation = evaluate_plan(read_plan(SUITE), [ops, window])
    verdicts = {}
    for claim, folder in zip(evaluation["claims"], (ops, window)):
        results = json.loads((folder / "results.json").read_text())
        rows = {row["heads"]: row["final"] for row in results["summary"]}
        m = len(claim["comparisons"])
        assert m == {"mqar-ops": 6, "mqar-window": 4}[claim["name"]] and claim["tests"] == 2 * m
        sup, eq = [], []
        for row in claim["comparisons"]:
            mine = np.array(rows[row["heads"]][row["endpoint"]]["values"])
            base = np.array(rows["attention:2"][row["endpoint"]]["values"])
            d = mine - base
            sup.append(stats.ttest_rel(mine, base).pvalue)
            eq.append(max(stats.ttest_1samp(d, -0.05, alternative="greater").pvalue,
                          stats.ttest_1samp(d, 0.05, alternative="less").pvalue))  # fmt: skip
            half = stats.t.ppf(1 - 0.05 / m / 2, 2) * d.std(ddof=1) / math.sqrt(3)
            assert row["ci_simultaneous"] == pytest.approx(half, rel=1e-9)
            crit = stats.t.ppf(1 - 0.05 / (2 * m) / 2, 2)
            nc = 0.05 / d.std(ddof=1) * math.sqrt(3)
            far = stats.nct.cdf(-crit, 2, nc)  # scipy: NaN for a tail below ~1e-15
            power = stats.nct.sf(crit, 2, nc) + (0.0 if math.isnan(far) else far)
            assert row["power"] == pytest.approx(power, rel=1e-7, abs=1e-12)
            verdicts[(claim["name"], row["endpoint"], row["heads"])] = row["verdict"]
        adjusted = _holm(sup + eq)
        assert [r["p_adjusted"] for r in claim["comparisons"]] == pytest.approx(adjusted[:m])
        assert [r["p_tost_adjusted"] for r in claim["comparisons"]] == pytest.approx(adjusted[m:])
        assert claim["corrected_alpha"] == pytest.approx(0.05 / (2 * m))
    assert verdicts[("mqar-ops", "val_acc", "attention:1,laplacian:1")] == "better"
    assert (
        verdicts[("mqar-ops", "val_acc_far", "attention:1,heat:1")] == "no effect larger than 0.05"
    )
    assert verdicts[("mqar-ops", "val_acc", "attention:1,diff:1")] == "undetermined"
    assert verdicts[("mqar-window", "val_acc", "attention:1,laplacian:1")] == "the other way"
    text = format_plan(evaluation)
    assert "claim mqar-ops: config - attention:2 paired by seed; Holm over 12 tests" in text
    assert "mqar-window val_acc attention:1,heat:1: +0.3000 ±" in text


TREND_PLAN = """alpha = 0.05
[study.mqar-ops]
seeds = [0, 1, 2, 3]
[[claim]]
name = "dose"
studies = ["mqar-ops"]
endpoints = ["val_acc", "val_acc_far"]
baseline = "attention:2"
configurations = ["attention:1,laplacian:1", "laplacian:2"]
trend = [0, 1, 2]
margin = {val_acc = 0.05, val_acc_far = 0.5}
side = "higher"
"""


def test_a_trend_claim_tests_the_per_seed_slope_against_scipy(tmp_path: Path) -> None:
    """A claim with ``trend``: per endpoint one test, the least-squares slope of each seed
    (scipy's linregress) tested against 0 (ttest_1samp) and within the margin per unit of dose
    (two one-sided tests), the 2 x 2 p-values Holm-adjusted together; the verdicts."""
    path = tmp_path / "plan.toml"
    path.write_text(TREND_PLAN)
    plan = read_plan(path)
    assert plan.claims[0].trend == (0.0, 1.0, 2.0)
    rng = np.random.default_rng(0)
    seeds = [0, 1, 2, 3]
    values = {"attention:2": {}, "attention:1,laplacian:1": {}, "laplacian:2": {}}
    for endpoint, slope in (("val_acc", 0.1), ("val_acc_far", 0.0)):
        base = 0.5 + rng.normal(0, 0.05, 4)
        for k, heads in enumerate(values):
            values[heads][endpoint] = list(base + slope * k + rng.normal(0, 0.01, 4))
    folder = _write_results(tmp_path / "mqar-ops", "mqar-ops", values, seeds=seeds)
    evaluation = evaluate_plan(plan, [folder])
    (claim,) = evaluation["claims"]
    assert claim["trend"] == [0.0, 1.0, 2.0] and claim["tests"] == 4
    sup, eq = [], []
    for row, margin in zip(claim["comparisons"], (0.05, 0.5)):
        ys = np.array([values[h][row["endpoint"]] for h in values])  # (k, seed)
        slopes = [stats.linregress([0, 1, 2], ys[:, s]).slope for s in range(4)]
        assert row["values"] == pytest.approx(slopes, rel=1e-9)
        assert row["mean"] == pytest.approx(np.mean(slopes), rel=1e-9)
        assert row["heads"] == "slope over (0, 1, 2)" and row["n"] == 4
        sup.append(stats.ttest_1samp(slopes, 0.0).pvalue)
        eq.append(max(stats.ttest_1samp(slopes, -margin, alternative="greater").pvalue,
                      stats.ttest_1samp(slopes, margin, alternative="less").pvalue))  # fmt: skip
    adjusted = _holm(sup + eq)
    assert [r["p_adjusted"] for r in claim["comparisons"]] == pytest.approx(adjusted[:2])
    assert [r["p_tost_adjusted"] for r in claim["comparisons"]] == pytest.approx(adjusted[2:])
    assert [r["verdict"] for r in claim["comparisons"]] == [
        "better", "no effect larger than 0.5"]  # fmt: skip
    text = format_plan(evaluation)
    assert "claim dose: the slope per unit of dose, per seed (attention:2 at 0, " in text
    first = claim["comparisons"][0]["mean"]
    assert f"mqar-ops val_acc slope over (0, 1, 2): {first:+.4f} ±" in text and first > 0.09


@pytest.mark.parametrize(
    "trend", ["[0, 1]", "[1, 1, 1]", '[0, 1, "2"]', "[0, 1, nan]", "[0, true, 2]", "3"]
)
def test_a_trend_that_is_not_one_dose_per_configuration_is_refused(
    tmp_path: Path, trend: str
) -> None:
    path = tmp_path / "plan.toml"
    path.write_text(TREND_PLAN.replace("trend = [0, 1, 2]", f"trend = {trend}"))
    with pytest.raises(ValueError, match=r"^plan: .*claim 'dose'.trend: expected 3 finite"):
        read_plan(path)


def test_the_report_refuses_an_endpoint_the_plan_lacks_and_other_seeds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ops = _write_results(tmp_path / "ops", "mqar-ops", _config(0.5, {"attention:1,heat:1": SAME}),
                         primary=("val_acc", "val_loss"))  # fmt: skip
    assert main(["plan", str(SUITE), str(ops)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "primary:" in err and "'val_loss', which the plan lacks" in err
    assert f"the plan {SUITE}" in err
    other = _write_results(tmp_path / "other", "mqar-ops", _config(0.5, {}), seeds=[0, 1])
    with pytest.raises(ValueError, match=r"^seeds: .*fixes for study 'mqar-ops', \[0, 1, 2\]"):
        evaluate_plan(read_plan(SUITE), [other])


def test_a_claim_without_its_study_is_not_evaluated_and_a_missing_configuration_is_refused(
    tmp_path: Path,
) -> None:
    ops, _ = _suite(tmp_path)
    evaluation = evaluate_plan(read_plan(SUITE), [ops])
    claims = {claim["name"]: claim for claim in evaluation["claims"]}
    assert claims["mqar-window"]["missing"] == ["mqar-window"]
    assert not claims["mqar-window"]["comparisons"] and len(claims["mqar-ops"]["comparisons"]) == 6
    assert "claim mqar-window: not evaluated, no folder for study mqar-window" in format_plan(
        evaluation
    )
    short = _write_results(
        tmp_path / "short", "mqar-window", _config(0.3, {"attention:1,heat:1": SAME})
    )
    with pytest.raises(ValueError, match=r"^heads: .*'attention:1,laplacian:1' for 'val_acc'"):
        evaluate_plan(read_plan(SUITE), [short])


# ----------------------------------------------------------------------------- committed before


def _git(repo: Path, *args: str, date: str | None = None) -> None:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    if date:
        env |= {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                   check=True, capture_output=True, env=env)  # fmt: skip


def test_whether_the_plan_was_committed_before_the_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a repository made here: a plan committed before one study's start and after
    another's, then modified; a plan never committed; no repository; no git."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    plan = repo / "plan.toml"
    plan.write_text(SUITE.read_text())
    _git(repo, "add", "plan.toml")
    _git(repo, "commit", "-q", "-m", "plan", date="2026-12-07T12:00:00+00:00")
    ops, _ = _suite(tmp_path / "runs")
    # started at 12:00 UTC, the commit's own time (in another offset): not before it
    late = _write_results(tmp_path / "late" / "mqar-window", "mqar-window", _config(0.3, {
        "attention:1,laplacian:1": SAME, "attention:1,heat:1": SAME}),
        started="2026-12-07T13:00:00+01:00")  # fmt: skip
    evaluation = evaluate_plan(read_plan(plan), [ops, late])
    committed = {study["study"]: study["committed"] for study in evaluation["studies"]}
    assert committed["mqar-ops"].startswith("committed before the runs began (commit ")
    assert committed["mqar-window"].startswith("committed after the runs began (commit ")
    assert evaluation["plan"]["commit"]["time"] == "2026-12-07T12:00:00+00:00"
    plan.write_text(plan.read_text() + "\n")
    assert commit_state(plan).state == "modified since its commit"
    assert commit_state(plan).time == datetime(2026, 12, 7, 12, tzinfo=timezone.utc)
    new = repo / "new.toml"
    new.write_text(SUITE.read_text())
    assert commit_state(new) == CommitState("not committed")
    outside = tmp_path / "outside.toml"
    outside.write_text(SUITE.read_text())
    assert commit_state(outside).state == "unknown"
    assert "not in a git repository" in commit_state(outside).reason
    monkeypatch.setattr(plan_module.shutil, "which", lambda name: None)
    evaluation = evaluate_plan(read_plan(outside), [ops])
    assert evaluation["studies"][0]["committed"] == "unknown (git is not installed)"


def test_the_runs_start_of_an_older_results_json_is_the_first_invocations(
    tmp_path: Path,
) -> None:
    ops, _ = _suite(tmp_path)
    data = json.loads((ops / "results.json").read_text())
    del data["started"]
    (ops / "results.json").write_text(json.dumps(data))
    (ops / "invocations.json").write_text(json.dumps({"invocations": [
        {"started": "2026-12-07T21:33:08"}, {"started": "2026-12-08T09:00:00"}]}))  # fmt: skip
    (study,) = evaluate_plan(read_plan(SUITE), [ops])["studies"]
    assert study["started"] == datetime(2026, 12, 7, 21, 33, 8).astimezone().isoformat()
    assert study["started_from"].startswith("invocations.json")


def test_the_docs_show_the_suite_plan_and_the_help_needs_no_torch() -> None:
    """docs/reproducing.md's plan is docs/study/suite-plan.toml; ``heatformer plan --help``
    answers before torch is imported."""
    page = (ROOT / "docs" / "reproducing.md").read_text()
    section = page[page.index("## A study's plan") :]
    shown = section[
        section.index("```toml\n") + 8 : section.index("```\n", section.index("```toml"))
    ]
    assert tomllib.loads(shown) == tomllib.loads(SUITE.read_text())
    code = (
        "import sys\nfrom heatformer.lab.cli import main\ntry:\n    main(['plan', '--help'])\n"
        "except SystemExit as exit:\n    print('exit', exit.code, 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().endswith("exit 0 False"), done.stderr
    assert "heatformer plan [-h] [--json OUT] FILE DIR [DIR ...]" in done.stdout
