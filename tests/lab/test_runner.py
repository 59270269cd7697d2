"""Training, resuming, interrupting and reporting (heatformer.lab.compare/trainer)."""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from heatformer.lab.checkpoint import load_checkpoint, save_checkpoint
from heatformer.lab.compare import analyze, run_compare
from heatformer.lab.resume import CHECKPOINT_NAME
from heatformer.lab.spec import CompareSpec
from heatformer.lab.stop import StopRequested, StopSignal, TrainingInterrupted
from heatformer.lab.tasks import RecallTask, Task, resolve_task
from heatformer.lab.trainer import RESULT_NAME, TrainingDiverged

SpecFactory = Callable[..., CompareSpec]


def _records(out: Path) -> list[dict]:
    return json.loads((out / "results.json").read_text())["runs"]


# ----------------------------------------------------------------------------- learning


def test_short_chars_run_lowers_the_loss(tiny_spec: SpecFactory, tmp_path: Path) -> None:
    spec = tiny_spec(heads=("attention:1,laplacian:1",), steps=40, eval_every=40, analysis=False)
    report = run_compare(spec, tmp_path / "out")
    (record,) = report.results["runs"]
    first, last = np.mean(record["train_loss"][:3]), np.mean(record["train_loss"][-3:])
    assert first > math.log(256) - 0.3  # starts near a uniform guess over bytes
    assert last < first - 1.5
    assert record["final"]["val_loss"] < first - 1.5
    assert record["final"]["val_bpc"] == pytest.approx(record["final"]["val_loss"] / math.log(2))


def test_short_digits_run_lowers_the_loss_and_beats_chance(
    tiny_spec: SpecFactory, tmp_path: Path
) -> None:
    spec = tiny_spec(
        task="digits",
        heads=("attention:1,heat:1",),
        steps=120,
        batch_size=32,
        lr=1e-2,
        n_embd=32,
        eval_every=120,
        analysis_size=64,
    )
    report = run_compare(spec, tmp_path / "out")
    (record,) = report.results["runs"]
    assert np.mean(record["train_loss"][-5:]) < np.mean(record["train_loss"][:5]) - 0.5
    assert record["final"]["test_acc"] > 0.3  # chance is 0.1
    assert record["final"]["test_loss"] < math.log(10) - 0.5
    assert len(record["analysis"]["nc1"]) == spec.n_layer
    assert all(v > 0 for v in record["analysis"]["effective_rank"])


def test_recall_run_reports_accuracy_and_pooled_nc1(tiny_spec: SpecFactory, tmp_path: Path) -> None:
    spec = tiny_spec(task="recall", heads=("attention:2",), steps=3, seq_len=40, eval_size=32,
                     analysis_size=32)  # fmt: skip
    out = tmp_path / "out"
    report = run_compare(spec, out)
    (record,) = report.results["runs"]
    assert set(record["final"]) == {"val_acc", "val_loss"}
    # the reported metrics are those of the final weights on the fixed validation set,
    # recomputed here with a plain forward pass and F.cross_entropy
    resolved = spec.resolved()
    task = resolve_task(resolved.task)(resolved)
    model = task.build_model("attention:2")
    model.load_state_dict(load_checkpoint(out / "runs" / record["run"] / CHECKPOINT_NAME)["model"])
    model.eval()
    val = RecallTask(seq_len=resolved.options.seq_len, val_size=resolved.options.eval_size)
    inputs = torch.cat([x for x, _ in val.eval_batches(1000)])  # (32, 40)
    targets = torch.cat([t for _, t in val.eval_batches(1000)])  # (32,)
    assert inputs.shape == (32, 40)
    with torch.no_grad():
        logits = model(inputs)  # (32, num_classes)
    want_loss = torch.nn.functional.cross_entropy(logits, targets).item()
    want_acc = (logits.argmax(-1) == targets).double().mean().item()
    assert record["final"]["val_loss"] == pytest.approx(want_loss, rel=1e-5)
    assert record["final"]["val_acc"] == pytest.approx(want_acc, abs=1e-12)
    assert len(record["analysis"]["nc1"]) == 2
    assert all(math.isfinite(v) and v > 0 for v in record["analysis"]["nc1"])


# ----------------------------------------------------------------------------- resume


def test_resume_reproduces_the_uninterrupted_run_exactly(
    tiny_spec: SpecFactory, tmp_path: Path
) -> None:
    spec = tiny_spec(seeds=(3,), analysis=False, dropout=0.1)  # dropout: global RNG restored too
    full = run_compare(spec, tmp_path / "full").results["runs"]

    with pytest.raises(TrainingInterrupted) as info:
        run_compare(spec, tmp_path / "cut", stop_at_step=7)
    assert info.value.step == 7
    first_run = tmp_path / "cut" / "runs" / info.value.run_dir.name
    assert not (first_run / RESULT_NAME).exists()  # an interrupted run never looks finished
    assert not (tmp_path / "cut" / "results.json").exists()
    assert load_checkpoint(first_run / CHECKPOINT_NAME)["step"] == 7

    resumed = run_compare(spec, tmp_path / "cut", resume=True).results["runs"]
    for a, b in zip(full, resumed, strict=True):
        assert a["train_loss"] == b["train_loss"]  # bit for bit
        assert a["evals"] == b["evals"]
        assert a["final"] == b["final"]
    for name in (r["run"] for r in full):
        wa = load_checkpoint(tmp_path / "full" / "runs" / name / CHECKPOINT_NAME)["model"]
        wb = load_checkpoint(tmp_path / "cut" / "runs" / name / CHECKPOINT_NAME)["model"]
        assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_resume_skips_finished_runs(tiny_spec: SpecFactory, tmp_path: Path) -> None:
    spec = tiny_spec(steps=4, eval_every=2, analysis=False)
    out = tmp_path / "out"
    with pytest.raises(TrainingInterrupted):
        run_compare(spec, out, stop_at_step=3)  # the first run stops at step 3 of 4
    run_compare(spec, out, resume=True)
    finished = {p.parent.name: p.stat().st_mtime_ns for p in out.glob("runs/*/result.json")}
    assert len(finished) == 2
    built = []

    def factory(task: Task, heads: str) -> nn.Module:
        built.append(heads)
        return task.build_model(heads)

    run_compare(spec, out, resume=True, model_factory=factory)
    assert built == []  # nothing retrained
    assert {p.parent.name: p.stat().st_mtime_ns for p in out.glob("runs/*/result.json")} == finished


def _signal_then_stall(
    signum: int, *, training: bool, at_call: int, stalls: list[float]
) -> Callable[[Task, str], nn.Module]:
    """A model factory whose ``at_call``-th forward pass in training (or eval) mode sends
    ``signum`` to this process and then stalls for 30 s in small sleeps, as a long torch
    computation would; ``stalls`` gets the time each stall began."""
    calls = {"n": 0}

    def factory(task: Task, heads: str) -> nn.Module:
        model = task.build_model(heads)

        def hook(module: nn.Module, args: object) -> None:
            if module.training != training:
                return
            calls["n"] += 1
            if calls["n"] == at_call:
                stalls.append(time.monotonic())
                os.kill(os.getpid(), signum)
                for _ in range(3000):  # many short operations, 30 s in all
                    time.sleep(0.01)

        model.blocks[0].register_forward_pre_hook(hook)
        return model

    return factory


def _cut_in_eval_mode(
    spec: CompareSpec, out: Path, *, at_call: int
) -> tuple[StopSignal, TrainingInterrupted]:
    """Run ``spec`` with a SIGTERM at the ``at_call``-th eval-mode forward (then a stall);
    assert that the run stops within 5 s of the signal and return the stop and the error."""
    stalls: list[float] = []
    factory = _signal_then_stall(signal.SIGTERM, training=False, at_call=at_call, stalls=stalls)
    stop = StopSignal()
    with stop.installed(), pytest.raises(TrainingInterrupted) as info:
        run_compare(spec, out, stop=stop, model_factory=factory)
    assert time.monotonic() - stalls[0] < 5
    return stop, info.value


def _assert_same_runs(a: list[dict], b: list[dict], dir_a: Path, dir_b: Path) -> None:
    """The two comparisons' runs have the same curves, evaluations and final weights."""
    for ra, rb in zip(a, b, strict=True):
        assert ra["train_loss"] == rb["train_loss"]  # bit for bit
        assert ra["evals"] == rb["evals"]
        assert ra["final"] == rb["final"]
        wa = load_checkpoint(dir_a / "runs" / ra["run"] / CHECKPOINT_NAME)["model"]
        wb = load_checkpoint(dir_b / "runs" / rb["run"] / CHECKPOINT_NAME)["model"]
        assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_sigint_mid_step_discards_the_step_saves_the_last_and_resume_matches(
    tiny_spec: SpecFactory, tmp_path: Path
) -> None:
    """A signal during a long training step stops within seconds, not after the step; the
    step is discarded (batch order and dropout RNG put back), the checkpoint holds the step
    before it, and the resumed run equals an uninterrupted one bit for bit."""
    spec = tiny_spec(heads=("attention:2",), steps=10, ckpt_every=100, analysis=False,
                     dropout=0.1)  # fmt: skip
    reference = run_compare(spec, tmp_path / "ref").results["runs"]
    stalls: list[float] = []
    factory = _signal_then_stall(signal.SIGINT, training=True, at_call=4, stalls=stalls)

    stop = StopSignal()
    before = signal.getsignal(signal.SIGINT)
    with stop.installed(), pytest.raises(TrainingInterrupted) as info:
        run_compare(spec, tmp_path / "cut", stop=stop, model_factory=factory)
    took = time.monotonic() - stalls[0]
    assert took < 5  # the stall lasts 30 s; it used to be sat out
    assert signal.getsignal(signal.SIGINT) is before  # handler restored
    assert stop.reason == "SIGINT" and info.value.step == 3  # step 4 was cut: discarded
    saved = load_checkpoint(info.value.run_dir / CHECKPOINT_NAME)
    assert saved["step"] == 3 and len(saved["train_loss"]) == 3
    resumed = run_compare(spec, tmp_path / "cut", resume=True).results["runs"]
    _assert_same_runs(reference, resumed, tmp_path / "ref", tmp_path / "cut")


def test_sigterm_mid_evaluation_stops_at_once_and_resume_evaluates_first(
    tiny_spec: SpecFactory, tmp_path: Path
) -> None:
    """A signal during a long evaluation stops within seconds; the checkpoint holds the step
    just completed, and the resumed run does the cut evaluation first, so its record equals
    an uninterrupted run's."""
    spec = tiny_spec(heads=("attention:2",), steps=8, eval_every=4, ckpt_every=100,
                     analysis=False)  # fmt: skip
    reference = run_compare(spec, tmp_path / "ref").results["runs"]
    stop, info = _cut_in_eval_mode(spec, tmp_path / "cut", at_call=1)
    assert stop.reason == "SIGTERM" and info.step == 4  # the step after which it evaluated
    saved = load_checkpoint(info.run_dir / CHECKPOINT_NAME)
    assert saved["step"] == 4 and saved["evals"] == []  # the cut evaluation is not recorded
    resumed = run_compare(spec, tmp_path / "cut", resume=True).results["runs"]
    assert [e["step"] for e in resumed[0]["evals"]] == [4, 8]
    _assert_same_runs(reference, resumed, tmp_path / "ref", tmp_path / "cut")


def test_stop_requested_during_the_final_analysis_keeps_the_final_checkpoint(
    tiny_spec: SpecFactory, tmp_path: Path
) -> None:
    """The per-layer analysis after the last step is cut as well; the run is not finished,
    its final checkpoint is kept, and the resume only redoes the analysis."""
    spec = tiny_spec(heads=("attention:2",), steps=4, eval_every=4)
    reference = run_compare(spec, tmp_path / "ref").results["runs"]
    # eval mode: call 1 is the final evaluation, call 2 the analysis
    _, info = _cut_in_eval_mode(spec, tmp_path / "cut", at_call=2)
    assert info.step == 4 and not (info.run_dir / RESULT_NAME).exists()
    assert load_checkpoint(info.run_dir / CHECKPOINT_NAME)["step"] == 4
    resumed = run_compare(spec, tmp_path / "cut", resume=True).results["runs"]
    assert resumed[0]["analysis"] == reference[0]["analysis"]
    _assert_same_runs(reference, resumed, tmp_path / "ref", tmp_path / "cut")


def test_a_region_not_interruptible_only_sets_the_flag() -> None:
    """Under DDP the regions are plain blocks: a signal there must not leave a collective."""
    stop = StopSignal()
    with stop.installed():
        with stop.interruptible(enabled=False):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)  # the handler has run by now
        assert stop.requested and stop.reason == "SIGTERM"
        with pytest.raises(StopRequested):  # an interruptible region refuses to start
            with stop.interruptible():
                pass  # pragma: no cover


def test_checkpoint_of_another_configuration_is_refused(
    tiny_spec: SpecFactory, tmp_path: Path
) -> None:
    spec = tiny_spec(heads=("attention:2",), analysis=False)
    with pytest.raises(TrainingInterrupted) as info:
        run_compare(spec, tmp_path / "out", stop_at_step=2)
    run_dir = info.value.run_dir
    state = load_checkpoint(run_dir / CHECKPOINT_NAME)
    state["key"]["spec"]["lr"] = 123.0
    save_checkpoint(run_dir / CHECKPOINT_NAME, {k: v for k, v in state.items() if k != "format"})
    with pytest.raises(ValueError, match=r"lr: saved 123\.0"):
        run_compare(spec, tmp_path / "out", resume=True)


def test_resume_with_a_different_spec_is_refused(tiny_spec: SpecFactory, tmp_path: Path) -> None:
    spec = tiny_spec(heads=("attention:2",), steps=2, analysis=False)
    run_compare(spec, tmp_path / "out")
    with pytest.raises(ValueError, match="different"):
        run_compare(tiny_spec(heads=("attention:2",), steps=3), tmp_path / "out", resume=True)
    with pytest.raises(ValueError, match="already holds a comparison"):
        run_compare(spec, tmp_path / "out")


# ----------------------------------------------------------------------------- failures


def test_non_finite_loss_stops_the_run_and_keeps_finished_runs(
    tiny_spec: SpecFactory, tmp_path: Path
) -> None:
    spec = tiny_spec(analysis=False)  # ckpt_every=5; the second configuration breaks
    forwards = {"n": 0}

    def factory(task: Task, heads: str) -> nn.Module:
        model = task.build_model(heads)
        if heads == spec.heads[1]:

            def poison(module: nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
                if module.training:
                    forwards["n"] += 1
                    if forwards["n"] >= 7:  # from step 7 on: the weights "blew up"
                        return output * math.nan
                return output

            model.register_forward_hook(poison)
        return model

    out = tmp_path / "out"
    with pytest.raises(TrainingDiverged) as info:
        run_compare(spec, out, model_factory=factory)
    assert isinstance(info.value, ValueError)  # the CLI prints it as one line
    assert info.value.step == 7 and math.isnan(info.value.loss)
    assert "expected a finite training loss, got nan at step 7/12" in str(info.value)
    broken = out / "runs" / info.value.run_dir.name
    assert info.value.run_dir.name.startswith("c01-")
    assert not (broken / RESULT_NAME).exists()  # never looks finished
    assert load_checkpoint(broken / CHECKPOINT_NAME)["step"] == 5  # the last good one
    (finished,) = out.glob("runs/*/result.json")  # the first configuration is kept
    record = json.loads(finished.read_text())
    assert record["heads"] == spec.heads[0] and len(record["train_loss"]) == spec.steps
    assert all(math.isfinite(v) for v in record["train_loss"])


def test_unwritable_output_folder_is_a_value_error_before_training(
    tiny_spec: SpecFactory, tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    built: list[str] = []

    def factory(task: Task, heads: str) -> nn.Module:
        built.append(heads)
        return task.build_model(heads)

    with pytest.raises(ValueError, match=r"out_dir: expected a folder that can be created"):
        run_compare(tiny_spec(), blocker / "out", model_factory=factory)
    assert built == []  # refused before any model was trained


@pytest.mark.parametrize("resume", [False, True])
def test_a_loop_of_symbolic_links_as_the_folder_is_a_value_error_naming_out_dir(
    resume: bool, tiny_spec: SpecFactory, tmp_path: Path
) -> None:
    """It used to be a RuntimeError from ``Path.resolve`` when the folder's lock was taken."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(ValueError, match=r"^out_dir: expected a folder, got .*loop, whose path "
                       r"runs into a loop of symbolic links"):  # fmt: skip
        run_compare(tiny_spec(), loop, resume=resume)


# ----------------------------------------------------------------------------- atomicity


def test_leftover_temporary_checkpoint_is_ignored(tiny_spec: SpecFactory, tmp_path: Path) -> None:
    spec = tiny_spec(heads=("attention:2",), analysis=False)
    reference = run_compare(spec, tmp_path / "ref").results["runs"][0]
    with pytest.raises(TrainingInterrupted) as info:
        run_compare(spec, tmp_path / "out", stop_at_step=5)
    run_dir = info.value.run_dir
    stale = run_dir / f".{CHECKPOINT_NAME}.tmp-99999"
    stale.write_bytes(b"half a checkpoint")  # a crash in the middle of a save
    (run_dir / f".{RESULT_NAME}.tmp-99999").write_text('{"finished": tru')
    resumed = run_compare(spec, tmp_path / "out", resume=True).results["runs"][0]
    assert resumed["train_loss"] == reference["train_loss"]
    assert not stale.exists()  # tidied up


def test_failed_save_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / CHECKPOINT_NAME
    save_checkpoint(path, {"step": 1, "w": torch.ones(3)})

    def broken_save(obj: object, handle: object) -> None:
        handle.write(b"partial")  # type: ignore[attr-defined]
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, {"step": 2, "w": torch.zeros(3)})
    monkeypatch.undo()
    state = load_checkpoint(path)
    assert state["step"] == 1 and torch.equal(state["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_NAME]


# ----------------------------------------------------------------------------- report


def test_results_json_and_csv_hold_mean_and_sample_std(
    tiny_spec: SpecFactory, tmp_path: Path
) -> None:
    spec = tiny_spec(seeds=(0, 1, 2), steps=3, eval_every=3)
    out = tmp_path / "out"
    report = run_compare(spec, out)
    results = json.loads((out / "results.json").read_text())
    assert results["seeds"] == [0, 1, 2]
    assert results["environment"]["torch"] == torch.__version__
    assert results["spec"]["heads"] == list(spec.heads)
    assert results["analysis_on"] == "the test batch, before the final LayerNorm"  # a GPT
    runs = results["runs"]
    assert len(runs) == 6 and {(r["heads"], r["seed"]) for r in runs} == {
        (h, s) for h in spec.heads for s in (0, 1, 2)
    }
    for row in results["summary"]:
        mine = [r for r in runs if r["heads"] == row["heads"]]
        for metric in ("val_loss", "val_bpc"):
            values = np.array([r["final"][metric] for r in mine])
            assert row["final"][metric]["mean"] == pytest.approx(values.mean(), rel=1e-12)
            assert row["final"][metric]["std"] == pytest.approx(values.std(ddof=1), rel=1e-9)
        layers = np.array([r["analysis"]["effective_rank"] for r in mine])  # (seeds, layers)
        assert row["analysis"]["effective_rank"]["mean"] == pytest.approx(layers.mean(0).tolist())
        assert row["analysis"]["effective_rank"]["std"] == pytest.approx(
            layers.std(0, ddof=1).tolist()
        )
        assert len(mine[0]["train_loss"]) == 3 and [e["step"] for e in mine[0]["evals"]] == [3]
    with (out / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 6
    by_key = {(r["heads"], int(r["seed"])): r for r in rows}
    for run in runs:
        row = by_key[(run["heads"], run["seed"])]
        assert float(row["val_loss"]) == pytest.approx(run["final"]["val_loss"])
        assert float(row["nc1@L1"]) == pytest.approx(run["analysis"]["nc1"][1])
    names = {p.name for p in (out / "plots").iterdir()}
    assert {"loss_curves.png", "final_val_bpc.png", "layers_nc1.png"} <= names
    assert [str(p.relative_to(out)) for p in report.plots] == results["plots"]


def test_analyze_recomputes_the_analysis_from_checkpoints(
    tiny_spec: SpecFactory, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    first = run_compare(tiny_spec(steps=3, analysis=False), out)
    assert first.summary[0]["analysis"] == {}
    assert not (out / "plots" / "layers_nc1.png").exists()
    report = analyze(out)
    reference = run_compare(tiny_spec(steps=3), tmp_path / "ref")
    for got, want in zip(report.results["runs"], reference.results["runs"], strict=True):
        for name, values in want["analysis"].items():
            assert got["analysis"][name] == pytest.approx(values, rel=1e-9, nan_ok=True)
    assert (out / "plots" / "layers_nc1.png").exists()
    saved = json.loads((out / "runs" / report.results["runs"][0]["run"] / RESULT_NAME).read_text())
    assert saved["analysis"]["effective_rank"]


def test_same_seed_gives_every_configuration_the_same_batches(
    tiny_spec: SpecFactory, tmp_path: Path
) -> None:
    seen: dict[str, list[torch.Tensor]] = {}

    def factory(task: Task, heads: str) -> nn.Module:
        model = task.build_model(heads)
        batches = seen.setdefault(heads, [])
        model.register_forward_pre_hook(
            lambda m, args: batches.append(args[0].clone()) if m.training else None
        )
        return model

    run_compare(tiny_spec(steps=3, analysis=False), tmp_path / "out", model_factory=factory)
    a, b = seen.values()
    assert len(a) == 3 and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_repeated_signal_within_the_grace_period_is_one_request() -> None:
    stop = StopSignal()
    stop._handle(signal.SIGINT, None)
    stop._handle(signal.SIGINT, None)  # torchrun forwards the terminal's Ctrl-C: no abort
    assert stop.requested and stop.reason == "SIGINT"
    stop._first_signal -= 2 * stop.grace_s  # type: ignore[operator]
    with pytest.raises(KeyboardInterrupt):  # a deliberate second Ctrl-C stops at once
        stop._handle(signal.SIGINT, None)


def test_stop_requested_between_runs_starts_no_new_run(
    tiny_spec: SpecFactory, tmp_path: Path
) -> None:
    stop = StopSignal()
    stop.request("SIGINT")  # e.g. Ctrl-C while the previous run was being analyzed
    with pytest.raises(TrainingInterrupted) as info:
        run_compare(tiny_spec(), tmp_path / "out", stop=stop)
    assert info.value.step == 0
    assert not (tmp_path / "out" / "runs").exists()


def test_wall_time_adds_up_every_invocation_stopped_and_interrupted_ones_too(
    tiny_spec: SpecFactory, tmp_path: Path
) -> None:
    spec = tiny_spec(heads=("attention:2",), steps=6, eval_every=3, ckpt_every=2, analysis=False)
    out = tmp_path / "out"

    def slow(seconds: float, interrupt_at: int | None = None) -> Callable[..., nn.Module]:
        def factory(task: Task, heads: str) -> nn.Module:
            model = task.build_model(heads)
            calls = {"n": 0}

            def hook(module: nn.Module, args: object) -> None:
                if module.training:
                    calls["n"] += 1
                    time.sleep(seconds)
                    if calls["n"] == interrupt_at:
                        raise KeyboardInterrupt  # a hard second Ctrl-C

            model.register_forward_pre_hook(hook)
            return model

        return factory

    with pytest.raises(TrainingInterrupted):
        run_compare(spec, out, stop_at_step=2, model_factory=slow(0.4))  # >= 0.8 s
    with pytest.raises(KeyboardInterrupt):
        run_compare(spec, out, resume=True, model_factory=slow(0.4, interrupt_at=2))
    report = run_compare(spec, out, resume=True)

    entries = json.loads((out / "invocations.json").read_text())["invocations"]
    assert [e["outcome"] for e in entries] == ["stopped", "interrupted", "finished"]
    assert entries[0]["elapsed_s"] >= 0.8 and entries[1]["elapsed_s"] >= 0.8
    assert all(e["environment"]["world_size"] == 1 for e in entries)
    wall = report.results["wall_time_s"]
    assert json.loads((out / "results.json").read_text())["wall_time_s"] == wall
    assert wall == math.fsum(e["elapsed_s"] for e in entries)  # every invocation counts
    assert wall > entries[0]["elapsed_s"] + entries[1]["elapsed_s"]
    assert report.results["invocations"] == 3
    # the run continued from its step-2 checkpoint (the interrupted stretch had no new one)
    assert len(report.results["runs"][0]["train_loss"]) == 6


def test_analyze_keeps_the_training_environment_and_wall_time(
    tiny_spec: SpecFactory, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    trained = run_compare(tiny_spec(steps=3, analysis=False), out).results
    assert trained["environment"]["torch_threads"] == torch.get_num_threads() == 1
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        results = analyze(out).results
    finally:
        torch.set_num_threads(previous)
    assert results["environment"] == trained["environment"]  # torch threads 1, not 2
    assert results["analysis_environment"]["torch_threads"] == 2
    assert results["wall_time_s"] == trained["wall_time_s"] > 0  # analysis time is apart
    entries = json.loads((out / "invocations.json").read_text())["invocations"]
    assert results["wall_time_s"] == math.fsum(e["elapsed_s"] for e in entries)
    assert results["analysis_time_s"] > 0
    saved = json.loads((out / "results.json").read_text())
    assert saved["analysis_environment"] == results["analysis_environment"]


# ----------------------------------------------------------------------------- old folders


def test_a_spec_of_0_1_0_is_refused_with_the_fields_it_has() -> None:
    """0.1.0 (never published) kept the task options at the top level; no reader of that
    layout is kept, so its ``spec.json`` is refused naming the fields, not half-read."""
    legacy = {"task": "chars", "heads": ["attention:2"], "seq_len": 16, "topk": None}
    with pytest.raises(ValueError, match=r"^spec: unknown fields \['seq_len'\]"):
        CompareSpec.from_dict(legacy)
    with pytest.raises(ValueError, match=r"^topk: expected graph='topk\[k=5\]' instead"):
        CompareSpec.from_dict({"task": "chars", "topk": 5})
    assert CompareSpec.from_dict({"task": "chars", "topk": None}) == CompareSpec(task="chars")


def test_default_eval_every_is_the_specs(tiny_spec: SpecFactory, tmp_path: Path) -> None:
    spec = tiny_spec(heads=("attention:2",), steps=20, eval_every=None, ckpt_every=None,
                     analysis=False)  # fmt: skip
    assert spec.resolved().eval_every == 2  # max(1, steps // 10)
    (record,) = run_compare(spec, tmp_path / "out").results["runs"]
    assert [e["step"] for e in record["evals"]] == list(range(2, 21, 2))
    task = resolve_task("chars")(spec)
    task.spec = spec  # an unresolved spec given to the trainer directly: the same defaults
    from heatformer.lab.trainer import train_run

    again = train_run(task, "attention:2", 0, tmp_path / "direct")
    assert [e["step"] for e in again["evals"]] == list(range(2, 21, 2))
    assert again["train_loss"] == record["train_loss"]


def test_task_must_be_a_task(tmp_path: Path) -> None:
    """``task=`` takes a :class:`Task` (the data go in ``data=``); anything else is refused
    before a folder is written."""
    data = RecallTask(seq_len=40)
    with pytest.raises(
        TypeError, match=r"^task: expected a heatformer.lab.tasks.Task or None, got RecallTask"
    ):
        run_compare(CompareSpec(task="recall", device="cpu"), tmp_path / "out", task=data)  # type: ignore[arg-type]
    assert not (tmp_path / "out").exists()
    with pytest.raises(TypeError, match=r"^task: expected"):
        analyze(tmp_path / "out", task=data)  # type: ignore[arg-type]
