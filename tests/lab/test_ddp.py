"""Two-process CPU DDP (torchrun, gloo) optimizes like one process with the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch.distributed as dist

from heatformer.lab.compare import run_compare
from heatformer.lab.spec import CompareSpec

pytestmark = [
    pytest.mark.usefixtures("one_launch_at_a_time"),
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo"),
]


@pytest.mark.parametrize(
    "variant", ["plain", "topk-checkpointed", "grad-accum"], ids=lambda variant: variant
)
def test_two_process_ddp_matches_one_process(
    tiny_spec: Callable[..., CompareSpec], corpus: Path, tmp_path: Path, variant: str
) -> None:
    """``topk-checkpointed``: top-k graphs, and the two processes recompute every block in
    backward (``--activation-checkpointing``) while the one process keeps its activations;
    ``grad-accum``: each process runs its half of the batch as 2 micro-batches (gradients
    all-reduced once per step, after the second) while the one process takes it whole."""
    checkpointed = variant == "topk-checkpointed"
    graph = "topk[k=8]" if checkpointed else "softmax"
    spec = tiny_spec(heads=("attention:1,laplacian:1",), steps=4, eval_every=4, analysis=False,
                     graph=graph)  # fmt: skip
    out = tmp_path / "ddp"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "-m", "heatformer", "train", "--task", "chars", "--text", str(corpus),
        "--heads", spec.heads[0], "--steps", "4", "--batch-size", str(spec.batch_size),
        "--seq-len", str(spec.options.seq_len), "--layers", str(spec.n_layer),
        "--embd", str(spec.n_embd),
        "--lr", str(spec.lr), "--eval-every", "4", "--ckpt-every", str(spec.ckpt_every),
        "--eval-size", str(spec.options.eval_size), "--no-analysis", "--no-progress",
        "--device", "cpu", "--graph", graph,
        "--out", str(out),
    ]  # fmt: skip
    command += ["--activation-checkpointing"] if checkpointed else []
    command += ["--grad-accum", "2"] if variant == "grad-accum" else []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("report: ") == 1  # only rank 0 prints
    (ddp,) = json.loads((out / "results.json").read_text())["runs"]
    assert ddp["world_size"] == 2
    (run_dir,) = (out / "runs").iterdir()  # rank 0 alone appends: each step once
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["train_loss"] for r in lines if r["split"] == "train"] == ddp["train_loss"]

    (single,) = run_compare(spec, tmp_path / "single").results["runs"]
    assert single["world_size"] == 1
    assert len(ddp["train_loss"]) == len(single["train_loss"]) == 4
    for a, b in zip(ddp["train_loss"], single["train_loss"], strict=True):
        assert abs(a - b) < 1e-5
    assert abs(ddp["final"]["val_loss"] - single["final"]["val_loss"]) < 1e-5


def test_planned_stop_under_torchrun_is_a_clean_exit_and_one_process_resumes_it(
    tiny_spec: Callable[..., CompareSpec],
    corpus: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from heatformer.lab.cli import main

    spec = tiny_spec(heads=("attention:2",), steps=4, eval_every=2, ckpt_every=2, analysis=False)
    out = tmp_path / "ddp"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "-m", "heatformer", "train", "--task", "chars", "--text", str(corpus),
        "--heads", spec.heads[0], "--steps", "4", "--batch-size", str(spec.batch_size),
        "--seq-len", str(spec.options.seq_len), "--layers", str(spec.n_layer),
        "--embd", str(spec.n_embd),
        "--lr", str(spec.lr), "--eval-every", "2", "--ckpt-every", "2",
        "--eval-size", str(spec.options.eval_size), "--no-analysis", "--no-progress",
        "--device", "cpu",
        "--out", str(out), "--stop-at-step", "2",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FAILED" not in done.stderr and "Traceback" not in done.stderr
    message = (
        "heatformer train: stopped at step 2 as requested (--stop-at-step), checkpoint of run "
        f"c00-attention2-s0 saved; resume with: torchrun ... -m heatformer train --resume {out}"
    )
    assert done.stderr.count(message) == 1  # rank 0 only
    assert not (out / "results.json").exists()

    assert main(["train", "--resume", str(out), "--no-progress"]) == 0  # one process now
    err = capsys.readouterr().err
    assert (
        "heatformer train: note: run c00-attention2-s0: resuming at step 2 with 1 process(es); "
        "its checkpoint was written by 2 process(es)."
    ) in err
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    assert run["world_sizes"] == [
        {"world_size": 2, "from_step": 0},
        {"world_size": 1, "from_step": 2},
    ]
    (single,) = run_compare(spec, tmp_path / "single").results["runs"]  # never interrupted
    for a, b in zip(run["train_loss"], single["train_loss"], strict=True):
        assert abs(a - b) < 1e-5
    assert abs(run["final"]["val_loss"] - single["final"]["val_loss"]) < 1e-5
