"""``heatformer train --sequence-parallel P`` under ``torchrun`` (gloo, loopback) trains like one
process; a process that dies mid-step makes the others exit with a clear error, and the run
resumes from its last checkpoint to the same numbers (a plain ``--resume`` keeping
``--sequence-parallel`` and ``--dist-timeout``); one that stops answering is given up after
``--dist-timeout``; the refusals name the flag."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

import sequence_parallel_helpers as sp
from heatformer.lab.cli import main
from heatformer.lab.compare import run_compare, validate_spec
from heatformer.lab.distributed import DistContext
from heatformer.lab.spec import CompareSpec
from heatformer.lab.trainer import train_run

needs_gloo = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="torch.distributed with the gloo backend is not available",
)

#: a window GPT with attention, Laplacian and heat heads, 13 tokens (uneven over 2 ranks)
FIELDS: dict[str, Any] = {
    "heads": "attention:1,laplacian:1,heat:1", "n_head": 3, "graph": "window[w=4,global=1]",
    "steps": 4, "batch_size": 4, "lr": 3e-3, "n_layer": 2, "n_embd": 12, "eval_every": 2,
    "ckpt_every": 2, "analysis": False, "device": "cpu",
}  # fmt: skip
OPTIONS = {"seq_len": 13, "eval_size": 4}


def _flags(corpus: Path, out: Path) -> list[str]:
    f = FIELDS
    return [
        "train", "--task", "chars", "--text", str(corpus), "--heads", f["heads"],
        "--n-head", str(f["n_head"]), "--graph", f["graph"], "--steps", str(f["steps"]),
        "--batch-size", str(f["batch_size"]), "--lr", str(f["lr"]),
        "--layers", str(f["n_layer"]), "--embd", str(f["n_embd"]),
        "--eval-every", str(f["eval_every"]), "--ckpt-every", str(f["ckpt_every"]),
        "--seq-len", str(OPTIONS["seq_len"]), "--eval-size", str(OPTIONS["eval_size"]),
        "--no-analysis", "--no-progress", "--device", "cpu", "--out", str(out),
    ]  # fmt: skip


def _spec(corpus: Path, **changes: Any) -> CompareSpec:
    fields = {**FIELDS, **changes}
    heads = fields.pop("heads")
    return CompareSpec(
        task="chars", heads=(heads,), seeds=(0,),
        options={**OPTIONS, "text": str(corpus)}, **fields,
    )  # fmt: skip


@pytest.fixture(scope="module")
def single(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The one-process run (uninterrupted)."""
    (run,) = run_compare(_spec(corpus), tmp_path_factory.mktemp("single")).results["runs"]
    assert run["world_size"] == 1
    return dict(run)


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _assert_same_numbers(run: dict[str, Any], single: dict[str, Any]) -> None:
    assert len(run["train_loss"]) == len(single["train_loss"]) == FIELDS["steps"]
    for a, b in zip(run["train_loss"], single["train_loss"], strict=True):
        assert abs(a - b) < 1e-6
    assert [e["step"] for e in run["evals"]] == [e["step"] for e in single["evals"]] == [2, 4]
    for e, f in zip(run["evals"], single["evals"], strict=True):
        assert abs(e["val_loss"] - f["val_loss"]) < 1e-6


@needs_gloo
@pytest.mark.usefixtures("one_launch_at_a_time")
@pytest.mark.parametrize("nproc", [2, 4], ids=["sequence2", "sequence2x-data2"])
def test_sequence_parallel_training_equals_one_process(
    nproc: int, corpus: Path, tmp_path: Path, single: dict[str, Any]
) -> None:
    """2 processes split every sequence; 4 are 2 data-parallel replicas of 2."""
    out = tmp_path / "sp"
    command = sp.torchrun(nproc, *_flags(corpus, out), "--sequence-parallel", "2")
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("report: ") == 1  # only rank 0 prints and writes
    assert f"(cpu, {nproc} process(es), every sequence split over 2)" in done.stdout
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    assert (run["world_size"], run["sequence_parallel"]) == (nproc, 2)
    _assert_same_numbers(run, single)


@needs_gloo
@pytest.mark.usefixtures("one_launch_at_a_time")
def test_a_process_that_dies_mid_step_stops_the_others_and_the_run_resumes(
    corpus: Path, tmp_path: Path, single: dict[str, Any]
) -> None:
    out = tmp_path / "sp"
    flags = [*_flags(corpus, out), "--sequence-parallel", "2", "--dist-timeout", "20"]
    env = {**_env(), "HEATFORMER_TEST_DIE_RANK": "1", "HEATFORMER_TEST_DIE_STEP": "2"}
    started = time.monotonic()
    script = Path(sp.__file__)
    done = subprocess.run(
        sp.torchrun(2, *flags, script=script), capture_output=True, text=True, timeout=120,
        env=env,
    )  # fmt: skip
    assert time.monotonic() - started < 90  # no hang: launch, 2 steps, the failure
    assert done.returncode != 0
    assert (
        "heatformer train: error: process 0 of 2: a collective operation failed, so another "
        "process died or stopped answering (within --dist-timeout)"
    ) in done.stderr, done.stderr[-3000:]
    kept = "--sequence-parallel 2 --dist-timeout 20"  # spelled out: the command alone resumes
    assert f"resume with: torchrun ... -m heatformer train --resume {out} {kept}\n" in done.stderr
    assert not (out / "results.json").exists()

    # a plain --resume takes them from the last invocation's record (it used to drop them)
    resume = sp.torchrun(2, "train", "--resume", str(out), "--no-progress")
    done = subprocess.run(resume, capture_output=True, text=True, timeout=240, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count(f"heatformer train: note: {kept} as in the last invocation") == 1
    entries = json.loads((out / "invocations.json").read_text())["invocations"]
    assert [(e["flags"]["sequence_parallel"], e["flags"]["dist_timeout"]) for e in entries] == [
        (2, 20.0), (2, 20.0),
    ]  # fmt: skip
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    assert (run["world_size"], run["sequence_parallel"]) == (2, 2)
    _assert_same_numbers(run, single)


@needs_gloo
@pytest.mark.usefixtures("one_launch_at_a_time")
def test_a_process_that_stops_answering_is_given_up_after_the_timeout(
    corpus: Path, tmp_path: Path
) -> None:
    flags = [*_flags(corpus, tmp_path / "sp"), "--sequence-parallel", "2", "--dist-timeout", "5"]
    env = {
        **_env(), "HEATFORMER_TEST_DIE_RANK": "1", "HEATFORMER_TEST_DIE_STEP": "1",
        "HEATFORMER_TEST_HANG": "1",
    }  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(
        sp.torchrun(2, *flags, script=Path(sp.__file__)), capture_output=True, text=True,
        timeout=120, env=env,
    )  # fmt: skip
    assert time.monotonic() - started < 90  # launch, 1 step, 5 s of waiting, the stop
    assert done.returncode != 0
    assert "process 0 of 2: a collective operation failed" in done.stderr, done.stderr[-3000:]
    assert "Timed out" in done.stderr


def test_sequence_parallel_without_torchrun_is_refused(
    corpus: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main([*_flags(corpus, tmp_path / "out"), "--sequence-parallel", "2"]) == 2
    assert capsys.readouterr().err.strip() == (
        "heatformer train: error: --sequence-parallel: expected a divisor of the number of "
        "torchrun processes (run it under torchrun), got --sequence-parallel 2 with 1 process(es)"
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"graph": "window[w=4];softmax"}, r"expected graph kinds that shard a sequence .* got "
         r"\['softmax'\]: dense softmax and exact top-k need every key"),
        ({"graph": "topk[k=3]"}, r".* got \[.topk\[k=3\].\]"),
        ({"compile": True}, r"expected no --compile with a sequence split over processes"),
    ],
)  # fmt: skip
def test_sequence_parallel_refuses_graph_kinds_that_do_not_shard_and_compile(
    corpus: Path, tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    spec = _spec(corpus, **changes)
    task = validate_spec(spec)
    with pytest.raises(ValueError, match="^sequence_parallel: " + message):
        train_run(task, spec.heads[0], 0, tmp_path / "run", ctx=DistContext(sequence_parallel=2))


def test_sequence_parallel_refuses_tasks_whose_model_does_not_shard(tmp_path: Path) -> None:
    spec = CompareSpec(
        task="recall", heads=("attention:2",), steps=1, batch_size=2, n_layer=1, n_embd=8,
        graph="window[w=2]", analysis=False, device="cpu", options={"seq_len": 40},
    )  # fmt: skip
    task = validate_spec(spec)
    with pytest.raises(ValueError, match=r"^sequence_parallel: expected a task whose model takes "
                       r"a sharded sequence \(a GPT: --task chars\), got --task recall with a "
                       r"SequenceClassifier"):  # fmt: skip
        train_run(task, spec.heads[0], 0, tmp_path / "run", ctx=DistContext(sequence_parallel=2))
