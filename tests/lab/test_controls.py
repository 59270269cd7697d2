"""Controls that can answer (issue 43, item 5): the zero-initialised output projection as a
spec field (``--zero-init-proj``) that reaches every task's model, direct contrasts ``A - B``
between two compared configurations (``--contrast``), and how far untied skip heads' ``W_S``
moved from their start, in each run's record and the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from heatformer.checks import ArgumentError
from heatformer.lab.cli import _experiments, build_parser, main
from heatformer.lab.report import (
    add_paired,
    aggregate,
    check_contrasts,
    format_contrast_table,
    format_drift_table,
    holm,
    mean_drift,
    paired_contrasts,
    parse_contrast,
)
from heatformer.lab.report.stats import one_sample_t
from heatformer.lab.spec import CompareSpec
from heatformer.lab.tasks import resolve_task
from heatformer.lab.tasks.chars import CharsTask

SKIP, CENTER, LAP = "attention:1,skip[init=-1]:1", "attention:1,center:1", "attention:1,laplacian:1"
CONTRAST = f"{SKIP} - {CENTER}"


def _chars_data() -> CharsTask:
    data = torch.tensor(
        list(b"the heat kernel spreads values along edges. " * 30), dtype=torch.uint8
    )
    return CharsTask(train=data[:1000], val=data[1000:], train_files=("a",), val_files=("b",),
                     source="<bytes>")  # fmt: skip


#: a task of each model kind: causal GPT, bidirectional GPT, ViT, sequence classifier
TASK_SPECS: dict[str, dict[str, Any]] = {
    "chars": {"options": {"seq_len": 12}},
    "mqar": {"options": {"seq_len": 16, "vocab_size": 32, "num_kv_pairs": 2}},
    "masked": {"options": {"seq_len": 12}},
    "digits": {},
    "recall": {"options": {"seq_len": 40}},
}


@pytest.mark.parametrize("name", list(TASK_SPECS))
@pytest.mark.parametrize("zero", [True, False])
def test_zero_init_proj_reaches_every_tasks_model(name: str, zero: bool) -> None:
    spec = CompareSpec(task=name, heads=(LAP,), n_layer=2, n_embd=16, zero_init_proj=zero,
                       **TASK_SPECS[name])  # fmt: skip
    data = _chars_data() if name in ("chars", "masked") else None
    task = resolve_task(name)(spec, data)
    assert task.model_config(LAP).zero_init is zero
    torch.manual_seed(0)
    model = task.build_model(LAP)
    projections = [block.attn.out_proj.weight for block in model.blocks]
    assert len(projections) == 2
    assert all(bool((w == 0).all()) is zero for w in projections)
    assert all(bool(block.attn.in_proj.weight.detach().any()) for block in model.blocks)


def test_zero_init_proj_keeps_old_fingerprints_and_is_checked() -> None:
    old = CompareSpec(task="parity", options={"seq_len": 8})
    assert "zero_init_proj" not in old.fingerprint()  # checkpoints of before the field resume
    data = old.to_dict()
    del data["zero_init_proj"], data["contrast"]  # a spec.json of before the fields
    assert CompareSpec.from_dict(data).fingerprint() == old.fingerprint()
    zero = CompareSpec(task="parity", options={"seq_len": 8}, zero_init_proj=True)
    assert zero.fingerprint()["zero_init_proj"] is True  # another model: not resumed
    assert CompareSpec.from_dict(zero.to_dict()) == zero
    with pytest.raises(ArgumentError) as err:
        CompareSpec(task="parity", zero_init_proj="yes")
    assert err.value.argument == "zero_init_proj"


def _spec_of(argv: list[str]) -> CompareSpec:
    return _experiments._build_spec(build_parser().parse_args(argv), compare=True)


def test_the_flags_parse_into_the_spec(tmp_path: Path) -> None:
    base = ["compare", "--task", "parity", "--heads", SKIP, "--heads", CENTER, "--heads", LAP]
    spec = _spec_of([*base, "--zero-init-proj", "yes", "--contrast", f"{SKIP}-{CENTER}",
                     "--contrast", f"  {LAP} -  {CENTER}"])  # fmt: skip
    assert spec.zero_init_proj is True
    assert spec.contrast == (CONTRAST, f"{LAP} - {CENTER}")  # canonical: one " - "
    assert _spec_of([*base, "--zero-init-proj", "no"]).zero_init_proj is False
    assert _spec_of(base).zero_init_proj is False and _spec_of(base).contrast == ()
    with pytest.raises(SystemExit):
        build_parser().parse_args([*base, "--zero-init-proj", "maybe"])
    study = tmp_path / "study.toml"
    study.write_text(
        f'task = "parity"\nheads = ["{SKIP}", "{CENTER}"]\nzero_init_proj = true\n'
        f'contrast = ["{CONTRAST}"]\n'
    )
    spec = _spec_of(["compare", "--config", str(study)])
    assert spec.zero_init_proj is True and spec.contrast == (CONTRAST,)
    from heatformer.lab.cli import _build_parsers

    parsers = _build_parsers()[1]
    assert parsers["compare"].option_of["contrast"] == "--contrast"
    assert parsers["compare"].option_of["zero_init_proj"] == "--zero-init-proj"
    assert parsers["train"].option_of["zero_init_proj"] == "--zero-init-proj"
    assert "contrast" not in parsers["train"].option_of  # one run: nothing to contrast


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (f"{SKIP} - attention:2", "expected 'A - B' with A and B two of the compared"),
        (f"{SKIP} + {CENTER}", "expected 'A - B'"),
        (f"{SKIP} - {SKIP}", f"expected two different schedules, got '{SKIP}' twice"),
    ],
)
def test_a_contrast_names_two_compared_schedules(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match.replace("[", r"\[").replace("]", r"\]")) as err:
        CompareSpec(task="parity", heads=(SKIP, CENTER), contrast=(text,))
    assert err.value.argument == "contrast"


def test_contrasts_are_canonical_distinct_and_not_in_the_fingerprint() -> None:
    heads = ("a:2", "a:2,skip[init=-1]:2", "a:2,skip[init=-1]:2 - x")  # '-' inside schedules
    assert parse_contrast("a:2,skip[init=-1]:2-a:2", heads) == ("a:2,skip[init=-1]:2", "a:2")
    assert parse_contrast("a:2,skip[init=-1]:2 - x - a:2", heads)[0] == heads[2]
    with pytest.raises(ValueError, match="distinct contrasts"):
        check_contrasts([f"{SKIP}-{CENTER}", CONTRAST], (SKIP, CENTER))
    with pytest.raises(TypeError, match="list of 'A - B' strings, got str"):
        check_contrasts(CONTRAST, (SKIP, CENTER))
    spec = CompareSpec(task="parity", heads=(SKIP, CENTER), contrast=[CONTRAST])
    assert spec.contrast == (CONTRAST,) and "contrast" not in spec.fingerprint()
    assert spec.fingerprint() == CompareSpec(task="parity", heads=(SKIP, CENTER)).fingerprint()
    assert CompareSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def _records() -> list[dict[str, Any]]:
    """Three configurations x four seeds of made-up final metrics and per-layer analysis."""
    values = {SKIP: [1.0, 1.3, 0.9, 1.2], CENTER: [1.1, 1.2, 1.2, 1.4], LAP: [2.0, 2.1, 1.9, 2.2]}
    return [
        {"heads": heads, "seed": seed, "final": {"loss": v, "acc": -v},
         "analysis": {"nc1": [v, 2 * v]}}
        for heads, per_seed in values.items() for seed, v in enumerate(per_seed)
    ]  # fmt: skip


def test_contrasts_are_the_baseline_statistics_with_b_as_baseline_and_holm_over_them() -> None:
    summary = aggregate(_records(), [SKIP, CENTER, LAP], ["loss", "acc"], ["nc1"])
    texts = [CONTRAST, f"{LAP} - {CENTER}", f"{SKIP} - {LAP}"]
    out = paired_contrasts(summary, texts, ["loss", "acc"])
    assert [(c["a"], c["b"], c["seeds"]) for c in out] == [
        (SKIP, CENTER, [0, 1, 2, 3]), (LAP, CENTER, [0, 1, 2, 3]), (SKIP, LAP, [0, 1, 2, 3])
    ]  # fmt: skip
    for c in out:  # what add_paired gives against B as the baseline
        rows = [dict(row) for row in summary if row["heads"] in (c["a"], c["b"])]
        add_paired(rows, c["b"], ["loss", "acc"], ["nc1"])
        paired = next(row["paired"] for row in rows if row["heads"] == c["a"])
        for name in ("loss", "acc"):
            mine = {k: v for k, v in c["final"][name].items() if k in paired["final"][name]}
            assert mine == paired["final"][name]
        assert c["analysis"] == paired["analysis"]
    diffs = [a - b for a, b in zip([1.0, 1.3, 0.9, 1.2], [1.1, 1.2, 1.2, 1.4])]
    assert out[0]["final"]["loss"]["values"] == pytest.approx(diffs)
    for name in ("loss", "acc"):
        p = [c["final"][name]["p"] for c in out]
        assert [c["final"][name]["p_adjusted"] for c in out] == holm(p)
        level = 1 - 0.05 / 3  # Bonferroni over the three contrasts
        half = one_sample_t(out[1]["final"][name]["values"], level)["ci95"]
        assert out[1]["final"][name]["ci_simultaneous"] == pytest.approx(half)
    assert all("paired" not in row for row in summary)  # the summary is left as it was
    missing = paired_contrasts(summary[:2], [f"{LAP} - {CENTER}"], ["loss"])
    assert missing == [{"contrast": f"{LAP} - {CENTER}", "a": LAP, "b": CENTER, "seeds": []}]
    lines = format_contrast_table(out, ["loss"]).splitlines()
    assert lines[0].startswith("contrasts A - B (same seeds; paired t-test; p_holm: Holm over")
    assert lines[0].endswith(" the 3 contrasts):")
    assert lines[1].split()[:3] == ["contrast", "A", "-"] and len(lines) == 6
    assert lines[3].startswith(CONTRAST) and " 4 " in lines[3]
    assert f"{out[0]['final']['loss']['mean']:+.4f}" in lines[3]
    assert f"{out[0]['final']['loss']['p_adjusted']:.3f}" in lines[3]
    assert format_contrast_table([], ["loss"]) == ""
    no_pairs = format_contrast_table(missing, ["loss"]).splitlines()[-1].split()
    assert no_pairs[-4:] == ["0", "-", "-", "-"]


def test_drift_is_averaged_over_seeds_and_tabled() -> None:
    def entry(layer: int, distance: float, identity: float) -> dict[str, Any]:
        return {"layer": layer, "module": f"blocks.{layer}.attn", "heads": [1], "start": -1.0,
                "operator": "skip", "distance": distance, "identity": identity}  # fmt: skip

    runs = [
        {
            "heads": SKIP,
            "seed": 0,
            "final": {},
            "drift": [entry(0, 0.1, -0.9), entry(1, 0.4, -0.5)],
        },
        {
            "heads": SKIP,
            "seed": 1,
            "final": {},
            "drift": [entry(0, 0.3, -0.7), entry(1, 0.4, -0.5)],
        },
        {"heads": CENTER, "seed": 0, "final": {}, "drift": []},
        {"heads": CENTER, "seed": 1, "final": {}},  # a record from before drift
    ]
    summary = aggregate(runs, [SKIP, CENTER], [], [])
    assert "drift" not in summary[1] and summary[0]["drift"] == mean_drift(runs[:2])
    first, second = summary[0]["drift"]
    assert first["distance"]["mean"] == pytest.approx(0.2)
    assert first["distance"]["std"] == pytest.approx(0.2 / 2**0.5)
    assert first["identity"]["mean"] == pytest.approx(-0.8) and first["seeds"] == 2
    assert (second["distance"]["std"], second["start"], second["heads"]) == (0.0, -1.0, [1])
    lines = format_drift_table(summary).splitlines()
    assert lines[0].startswith("learned per-head weights (untied skip heads' W_S)")
    rows = [line.split() for line in lines[4:]]
    assert [row[1:5] for row in rows] == [["L0", "1", "skip", "-1"], ["L1", "1", "skip", "-1"]]
    assert " 0.2000 ± 0.1414" in lines[4] and "-0.8000 ± 0.1414" in lines[4]
    assert format_drift_table(summary[1:]) == ""


def test_compare_records_and_reports_drift_and_contrasts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main([
        "compare", "--task", "parity", "--seq-len", "8", "--steps", "6", "--batch-size", "4",
        "--lr", "1e-2", "--layers", "2", "--embd", "16", "--heads", "attention:2",
        "--heads", SKIP, "--heads", CENTER, "--contrast", CONTRAST, "--zero-init-proj", "yes",
        "--seeds", "2", "--eval-every", "6", "--eval-size", "4", "--analysis-size", "4",
        "--device", "cpu", "--threads", "1", "--no-progress", "--out", str(out),
    ])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["spec"]["zero_init_proj"] is True and results["spec"]["contrast"] == [CONTRAST]
    runs = [r for r in results["runs"] if r["heads"] == SKIP]
    for run in runs:
        assert [(d["layer"], d["heads"], d["start"]) for d in run["drift"]] == [
            (0, [1], -1.0),
            (1, [1], -1.0),
        ]
        assert all(0 < d["distance"] < 1 for d in run["drift"])  # trained, still near -I
    assert all(r["drift"] == [] for r in results["runs"] if r["heads"] != SKIP)
    plain, skip, center = results["summary"]
    assert "drift" not in plain and "drift" not in center
    assert [row["seeds"] for row in skip["drift"]] == [2, 2]
    (contrast,) = results["contrasts"]
    (expected,) = paired_contrasts(results["summary"], [CONTRAST], results["metrics"])
    assert contrast["final"] == expected["final"]  # the summary's numbers, paired
    assert set(contrast["analysis"]) == set(results["analysis_metrics"])
    assert contrast["seeds"] == [0, 1] and set(contrast["final"]) == set(results["metrics"])
    assert format_drift_table(results["summary"]) in printed
    assert format_contrast_table(results["contrasts"], results["metrics"]) in printed
    for path in (out / "runs").glob("*/result.json"):  # analyze writes the drift back
        record = json.loads(path.read_text())
        record.pop("drift")
        path.write_text(json.dumps(record))
    assert main(["analyze", str(out), "--no-progress"]) == 0
    again = json.loads((out / "results.json").read_text())
    assert [r["drift"] for r in again["runs"]] == [r["drift"] for r in results["runs"]]
    assert again["contrasts"] == results["contrasts"]
