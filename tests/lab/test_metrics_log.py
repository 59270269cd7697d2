"""A run's metrics as it trains (issue 40): ``metrics.jsonl`` and ``--log tensorboard``.

Every step and evaluation is on disk the moment it is known (read back while the run trains),
a torn last line is skipped, a resume drops what came after its checkpoint, so the finished
file holds every step once and the evaluations of ``result.json``; TensorBoard's own reader
sees the same numbers at the same steps, each once after a resume.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import heatformer.lab.trainer as trainer_module
from heatformer.lab.cli import main
from heatformer.lab.folder import load_spec
from heatformer.lab.metrics import METRICS_NAME, MetricsLog, read_metrics


def _argv(corpus: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train", "--text", str(corpus), "--steps", "6", "--batch-size", "4", "--seq-len", "16",
        "--layers", "1", "--embd", "16", "--eval-every", "2", "--eval-size", "4", "--lr", "3e-3",
        "--no-analysis", "--device", "cpu", "--no-progress", "--threads", "1", "--out", str(out),
        *extra,
    ]  # fmt: skip


def _run_dir(out: Path) -> Path:
    (run_dir,) = (out / "runs").iterdir()
    return run_dir


def _split(records: list[dict[str, Any]], split: str) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "split"} for r in records if r["split"] == split]


def _check_finished(out: Path) -> list[dict[str, Any]]:
    """The finished run's metrics.jsonl against its result.json: steps 1..6 once each, with the
    record's losses and the spec's learning rates, in training order; the record's evaluations
    exactly. Returns the records."""
    run_dir = _run_dir(out)
    record = json.loads((run_dir / "result.json").read_text())
    spec = load_spec(out).resolved()
    records = read_metrics(run_dir)
    train = _split(records, "train")
    assert [r["step"] for r in train] == list(range(1, 7))
    assert [r["train_loss"] for r in train] == record["train_loss"]
    assert [r["lr"] for r in train] == [spec.lr_at(s) for s in range(6)]
    assert all(b["time_s"] >= a["time_s"] > 0 for a, b in itertools.pairwise(train))
    assert _split(records, "eval") == record["evals"]
    assert [r["step"] for r in records if r["split"] == "eval"] == [2, 4, 6]
    order = [(r["step"], r["split"]) for r in records]  # each evaluation after its step
    assert order == sorted(order, key=lambda key: (key[0], key[1] == "eval"))
    return records


def test_metrics_jsonl_grows_as_the_run_trains_and_a_resume_keeps_each_step_once(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    seen: list[list[tuple[int, str]]] = []  # the file on disk at each evaluation
    real_evaluate = trainer_module._evaluate

    def evaluate(run: Any, *args: Any) -> None:
        seen.append([(r["step"], r["split"]) for r in read_metrics(run.run_dir)])
        real_evaluate(run, *args)

    monkeypatch.setattr(trainer_module, "_evaluate", evaluate)
    assert main(_argv(corpus, out, "--stop-at-step", "4")) == 0
    run_dir = _run_dir(out)
    assert seen == [[(1, "train"), (2, "train")]]  # on disk while the process trains
    stopped = read_metrics(run_dir)  # the evaluation after step 4 waits for the resume
    assert [(r["step"], r["split"]) for r in stopped] == [
        (1, "train"), (2, "train"), (2, "eval"), (3, "train"), (4, "train"),
    ]  # fmt: skip

    with (run_dir / METRICS_NAME).open("a") as handle:  # a power loss in the middle of a line
        handle.write('{"step": 5, "split": "train", "train_lo')
    assert read_metrics(run_dir) == stopped

    assert main(["train", "--resume", str(out)]) == 0
    assert seen[1] == [(r["step"], r["split"]) for r in stopped]  # the torn line dropped first
    records = _check_finished(out)
    assert records[: len(stopped)] == stopped  # kept as they were


def test_a_bad_line_before_the_last_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / METRICS_NAME
    path.write_text('{"step": 1, "split": "train"}\n{"step": 2, "sp\n{"step": 3}\n')
    with pytest.raises(ValueError, match=rf"{METRICS_NAME}:2: expected one JSON object"):
        read_metrics(path)


def test_a_resume_drops_the_lines_its_checkpoint_does_not_hold(tmp_path: Path) -> None:
    lines = [
        {"step": 1, "split": "train", "train_loss": 2.0},
        {"step": 2, "split": "train", "train_loss": float("nan")},
        {"step": 2, "split": "eval", "val_loss": 1.5},  # not in the checkpoint's evals
        {"step": 3, "split": "train", "train_loss": 1.0},
    ]
    MetricsLog(tmp_path, step=0, evals=[]).close()
    with MetricsLog(tmp_path, step=0, evals=[]) as log:
        for line in lines:
            if line["split"] == "train":
                log.step(line["step"], line["train_loss"], 0.1, 0.5)
            else:
                log.evaluation({k: v for k, v in line.items() if k != "split"})
    assert read_metrics(tmp_path)[1]["train_loss"] is None  # standard JSON, as result.json
    MetricsLog(tmp_path, step=2, evals=[{"step": 0}]).close()
    assert [(r["step"], r["split"]) for r in read_metrics(tmp_path)] == [(1, "train"), (2, "train")]


def test_log_tensorboard_writes_what_tensorboards_reader_sees_once_after_a_crash(
    corpus: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    reader = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

    out = tmp_path / "out"
    real_step = MetricsLog.step

    def crash(self: MetricsLog, step: int, *args: Any) -> None:  # killed after step 3's line
        real_step(self, step, *args)
        if step == 3:
            raise RuntimeError("power cut")

    with monkeypatch.context() as patch:
        patch.setattr(MetricsLog, "step", crash)
        with pytest.raises(RuntimeError, match="power cut"):
            main(_argv(corpus, out, "--log", "tensorboard", "--ckpt-every", "2"))
    run_dir = _run_dir(out)
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 2, 3]  # checkpoint: step 2
    capsys.readouterr()

    assert main(["train", "--resume", str(out)]) == 0  # --log kept from the last invocation
    assert "--log tensorboard as in the last invocation" in capsys.readouterr().err.splitlines()[0]
    flags = [e["flags"]["log"] for e in json.loads((out / "invocations.json").read_text())[
        "invocations"
    ]]  # fmt: skip
    assert flags == ["tensorboard", "tensorboard"]
    records = _check_finished(out)

    events = reader.EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    train, evals = _split(records, "train"), _split(records, "eval")
    expected = {
        "train/loss": [(r["step"], r["train_loss"]) for r in train],
        "train/lr": [(r["step"], r["lr"]) for r in train],
    }
    for name in evals[0]:
        if name != "step":
            expected[f"eval/{name}"] = [(r["step"], r[name]) for r in evals]
    assert sorted(events.Tags()["scalars"]) == sorted(expected)
    for tag, want in expected.items():
        got = [(e.step, e.value) for e in events.Scalars(tag)]
        assert got == [(s, float(np.float32(v))) for s, v in want], tag  # float32, each once


def test_log_tensorboard_without_the_package_says_how_to_get_it(
    corpus: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # not installed
    out = tmp_path / "out"
    assert main(_argv(corpus, out, "--log", "tensorboard")) == 2
    assert capsys.readouterr().err.strip() == (
        "heatformer train: error: --log tensorboard needs tensorboard: pip install "
        "'heatformer[tensorboard]' (or leave --log out: metrics.jsonl only)"
    )
    assert main(_argv(corpus, out, "--log", "tensorbord")) == 2
    assert "--log: expected one of ['jsonl', 'tensorboard'], got 'tensorbord'" in (
        capsys.readouterr().err
    )
    assert not out.exists()  # nothing written
