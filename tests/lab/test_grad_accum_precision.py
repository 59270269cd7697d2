"""Gradient accumulation (``--grad-accum``) and the training precision (``--precision``), issue 40.

Accumulation: one optimizer step over ``grad_accum`` micro-batches is one step over the whole
batch -- in float64 the gradients and the weights agree to round-off, also when the
micro-batches score different numbers of targets (:data:`IGNORE_INDEX`), and through the
command line the losses of ``--grad-accum 2`` are the big batch's (float32); the preflight
estimates one micro-batch's memory.

Precision: ``fp32``, ``bf16``, ``fp16`` (float16 autocast with a gradient scaler, CUDA only);
``--bf16`` is a deprecated synonym of ``--precision bf16``; a ``spec.json`` written before
``precision`` (its ``"bf16"`` flag) loads, with the fingerprint its checkpoints were saved
under. The scaler's logic (unscaling, a step skipped on inf gradients, divergence only once
its scale is spent, its state in the checkpoint) runs on the CPU with ``GradScaler("cpu")``;
a float16 run trains where CUDA is.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import heatformer.lab.resume as resume_module
from heatformer.lab.cli import main
from heatformer.lab.distributed import DistContext
from heatformer.lab.resume import resume_run, setup_run
from heatformer.lab.spec import CompareSpec
from heatformer.lab.step import backward_pass, build_optimizer, make_scaler, optimizer_step
from heatformer.lab.tasks import Chars, CharsTask, MaskedChars, load_chars
from heatformer.lab.tasks.base import IGNORE_INDEX, Task
from heatformer.lab.trainer import MIN_GRAD_SCALE, TrainingDiverged, train_run

ROOT = Path(__file__).resolve().parents[2]
HEADS = "attention:1,laplacian:1"


@pytest.fixture(scope="module")
def data(corpus: Path) -> CharsTask:
    return load_chars(corpus, max_bytes=6000)


def _task(data: CharsTask, name: str = "chars", **fields: Any) -> Task:
    values: dict[str, Any] = {"n_layer": 2, "n_embd": 16, "batch_size": 8, **fields}
    options = {"seq_len": 16, "eval_size": 8, "analysis_size": 4}
    spec = CompareSpec(task=name, heads=(HEADS,), options=options, **values)
    return {"chars": Chars, "masked": MaskedChars}[name](spec, data)


def _max_diff(a: nn.Module, b: nn.Module, grad: bool = False) -> float:
    """The largest difference between the weights (or gradients) of two models."""
    diffs = []
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        x, y = (p.grad, q.grad) if grad else (p, q)
        assert x is not None and y is not None
        diffs.append(float((x.detach() - y.detach()).abs().max()))
    return max(diffs)


def _ragged(targets: torch.Tensor) -> torch.Tensor:
    """``targets`` with all but the first ``r % 5`` of row ``r``'s positions ignored: micro-batches
    of 2 rows score 1, 5, 4 and 3 targets (micro-batch 0: row 0 scores none)."""
    out = targets.clone()
    for r in range(out.shape[0]):
        out[r, r % 5 :] = IGNORE_INDEX
    return out


# ---- accumulation: the numbers of the big batch ------------------------------------------------


@pytest.mark.parametrize("case", ["chars", "masked", "ragged"])
def test_an_accumulated_step_equals_one_step_of_the_whole_batch_in_float64(
    data: CharsTask, case: str
) -> None:
    name = "masked" if case == "masked" else "chars"
    tasks = {micro: _task(data, name, grad_accum=micro) for micro in (1, 4)}
    torch.manual_seed(0)
    first = tasks[1].build_model(HEADS).double()
    models = {micro: copy.deepcopy(first) for micro in tasks}
    optimizers = {micro: build_optimizer(models[micro], 1e-2, 0.01) for micro in tasks}
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        inputs, targets = tasks[1].train_batch(8, generator)
        if case == "ragged":
            targets = _ragged(targets)
            scored = (targets != IGNORE_INDEX).reshape(4, -1).sum(1)
            assert scored.tolist() == [1, 5, 4, 3]
            # the weighting matters: the plain mean of the micro-batches' means is another loss
            with torch.no_grad():
                logits = models[1](inputs)
            means = [tasks[1].loss(logits[i : i + 2], targets[i : i + 2]) for i in (0, 2, 4, 6)]
            assert abs(float(sum(means)) / 4 - float(tasks[1].loss(logits, targets))) > 1e-3
        losses = {
            micro: backward_pass(tasks[micro], models[micro], optimizers[micro], inputs, targets)
            for micro in tasks
        }
        torch.testing.assert_close(losses[4], losses[1], atol=1e-12, rtol=0)
        assert _max_diff(models[1], models[4], grad=True) < 1e-12
        for micro in tasks:
            assert optimizer_step(tasks[micro], models[micro], optimizers[micro]) is True
        # AdamW divides by the gradients' root mean square: round-off in a gradient near 0
        # moves its weight by up to ~1e-13 in a step
        assert _max_diff(models[1], models[4]) < 1e-11
    assert _max_diff(first, models[1]) > 1e-3  # the steps moved the weights


class _Replica(nn.Module):
    """A stand-in for DDP: records, at each forward, whether it runs inside ``no_sync()``."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.quiet = False
        self.forwards: list[bool] = []

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        self.quiet = True
        try:
            yield
        finally:
            self.quiet = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.forwards.append(self.quiet)
        out: torch.Tensor = self.module(x)
        return out


def test_every_micro_batch_but_the_last_runs_without_gradient_sync(data: CharsTask) -> None:
    task = _task(data, grad_accum=4)
    model = task.build_model(HEADS)
    replica = _Replica(model)
    inputs, targets = task.train_batch(8, torch.Generator().manual_seed(0))
    backward_pass(task, model, build_optimizer(model, 1e-3, 0.0), inputs, targets, replica)
    assert replica.forwards == [True, True, True, False]  # DDP all-reduces in the last backward


def test_a_batch_that_does_not_split_into_micro_batches_is_refused(
    data: CharsTask, corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main(_argv(corpus, out, "--grad-accum", "3")) == 2
    assert _one_line_error(capsys.readouterr().err) == (
        "heatformer train: error: --grad-accum: expected a divisor of batch_size 4 "
        "(micro-batches of batch_size / grad_accum examples), got 3"
    )
    assert not out.exists()
    with pytest.raises(
        ValueError, match=r"^grad_accum: expected a divisor of batch_size 8 .*got 3$"
    ):
        _task(data, grad_accum=3)
    with pytest.raises(ValueError, match=r"^grad_accum: expected a positive int, got 0$"):
        _task(data, grad_accum=0)
    task = _task(data, grad_accum=4)
    model = task.build_model(HEADS)
    inputs, targets = task.train_batch(6, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"^grad_accum: expected a divisor of the batch of 6 "):
        backward_pass(task, model, build_optimizer(model, 1e-3, 0.0), inputs, targets)


def _argv(corpus: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train", "--text", str(corpus), "--steps", "6", "--batch-size", "4", "--seq-len", "16",
        "--layers", "1", "--embd", "16", "--eval-every", "3", "--eval-size", "4",
        "--no-analysis", "--device", "cpu", "--no-progress", "--threads", "1", "--out", str(out),
        *extra,
    ]  # fmt: skip


def _run(out: Path) -> dict[str, Any]:
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    return dict(run)


@pytest.mark.usefixtures("restore_threads")
def test_grad_accum_through_the_cli_trains_as_the_big_batch_and_resumes_with_it(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big, accum, cut = tmp_path / "big", tmp_path / "accum", tmp_path / "cut"
    assert main(_argv(corpus, big)) == 0
    assert main(_argv(corpus, accum, "--grad-accum", "2")) == 0
    assert main(_argv(corpus, cut, "--grad-accum", "2", "--stop-at-step", "3")) == 0
    assert main(["train", "--resume", str(cut)]) == 0  # grad_accum from spec.json
    capsys.readouterr()

    spec = json.loads((accum / "spec.json").read_text())["spec"]
    assert (spec["grad_accum"], spec["precision"], "bf16" in spec) == (2, "fp32", False)
    reference, accumulated = _run(big), _run(accum)
    assert len(accumulated["train_loss"]) == 6
    for ours, theirs in zip(accumulated["train_loss"], reference["train_loss"], strict=True):
        assert ours == pytest.approx(theirs, rel=1e-6, abs=1e-6)
    for key, value in reference["final"].items():
        assert accumulated["final"][key] == pytest.approx(value, rel=1e-5)
    assert _run(cut)["train_loss"] == accumulated["train_loss"]  # bit for bit, resumed

    # the same checkpoint key: a run may resume with another grad_accum
    keys = [torch.load(next(out.glob("runs/*/checkpoint.pt")), weights_only=False)["key"]
            for out in (big, accum)]  # fmt: skip
    assert keys[0] == keys[1]


@pytest.fixture
def restore_threads() -> Iterator[None]:
    """Put torch's thread count back after a command that sets it (``--threads 1``)."""
    previous = torch.get_num_threads()
    yield
    torch.set_num_threads(previous)


def _peaks(err_and_out: str) -> dict[str, float]:
    line = next(s for s in err_and_out.splitlines() if s.startswith("estimated peak memory:"))
    match = re.search(r"training ([\d.]+), evaluation", line)
    assert match, line
    return {"training": float(match.group(1))}


@pytest.mark.usefixtures("restore_threads")
def test_dry_run_estimates_the_memory_of_one_micro_batch(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "train", "--text", str(corpus), "--batch-size", "32", "--seq-len", "256",
        "--layers", "1", "--embd", "16", "--heads", "attention:2", "--eval-size", "4",
        "--no-analysis", "--device", "cpu", "--threads", "1", "--dry-run",
        "--out", str(tmp_path / "out"),
    ]  # fmt: skip
    assert main(argv) == 0
    whole = capsys.readouterr().out
    assert main([*argv, "--grad-accum", "4"]) == 0
    micro = capsys.readouterr().out
    assert "x 500 steps of 4 micro-batches of 8, " in micro and "micro-batches" not in whole
    big, small = _peaks(whole)["training"], _peaks(micro)["training"]
    assert big >= 0.04 and small == pytest.approx(big / 4, abs=0.01)
    assert not (tmp_path / "out").exists()


# ---- precision ---------------------------------------------------------------------------------


def _one_line_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_fp16_on_the_cpu_is_refused_before_anything_is_written(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main(_argv(corpus, out, "--precision", "fp16")) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert line == (
        "heatformer train: error: --precision: expected 'fp32' or 'bf16' on cpu (float16 "
        "autocast with a gradient scaler needs CUDA), got 'fp16'"
    )
    assert not out.exists()
    with pytest.raises(ValueError, match=r"^precision: .*needs CUDA\), got 'fp16'$"):
        make_scaler("fp16", torch.device("cpu"))
    assert make_scaler("bf16", torch.device("cpu")) is None


def test_bf16_is_a_synonym_of_precision_bf16_and_contradicting_it_is_refused(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main(_argv(corpus, out, "--bf16", "--steps", "1", "--eval-every", "1")) == 0
    err = capsys.readouterr().err
    assert "note: --bf16 is deprecated: it is --precision bf16" in err
    spec = json.loads((out / "spec.json").read_text())["spec"]
    assert (spec["precision"], "bf16" in spec) == ("bf16", False)

    assert main(_argv(corpus, tmp_path / "both", "--bf16", "--precision", "fp32")) == 2
    line = _one_line_error(capsys.readouterr().err)
    assert line.startswith("heatformer train: error: --precision: ") and "--bf16" in line
    assert main(_argv(corpus, tmp_path / "same", "--bf16", "--precision", "bf16", "--dry-run",
                      "--steps", "1")) == 0  # fmt: skip
    capsys.readouterr()


#: What the fingerprint left out before ``precision`` and ``grad_accum`` (heatformer 0.x).
_OLD_UNFINGERPRINTED = (
    "name", "heads", "seeds", "device", "compile", "analysis", "analysis_split", "analysis_cls",
    "analysis_point", "activation_checkpointing", "tune", "primary",
)  # fmt: skip


@pytest.mark.parametrize("bf16", [True, False])
def test_an_old_spec_with_bf16_loads_with_the_fingerprint_its_checkpoints_have(
    corpus: Path, bf16: bool
) -> None:
    spec = CompareSpec(task="chars", heads=(HEADS,), steps=6, batch_size=4,
                       options={"text": str(corpus), "seq_len": 16}).resolved()  # fmt: skip
    old = spec.to_dict()  # as heatformer wrote it before precision, grad_accum and mlp_ratio
    del old["precision"], old["grad_accum"], old["mlp_ratio"]
    del old["zero_init_proj"], old["contrast"], old["bracket"], old["plan"]  # and before those
    old["bf16"], old["topk"] = bf16, None
    loaded = CompareSpec.from_dict(json.loads(json.dumps(old)))
    assert loaded.precision == ("bf16" if bf16 else "fp32") and loaded.grad_accum == 1
    by_hand = {k: v for k, v in old.items() if k not in (*_OLD_UNFINGERPRINTED, "topk")}
    del by_hand["select_by"]  # None
    by_hand["options"] = spec.options.fingerprint()
    assert loaded.fingerprint() == by_hand
    # another number of micro-batches resumes the same checkpoints; fp16 does not
    assert dataclasses.replace(loaded, batch_size=4, grad_accum=2).fingerprint() == by_hand
    assert dataclasses.replace(loaded, precision="fp16").fingerprint() != by_hand


def test_a_spec_file_of_the_shipped_studies_loads(tmp_path: Path) -> None:
    saved = json.loads((ROOT / "docs/study/chars/spec.json").read_text())["spec"]
    assert saved["bf16"] is False  # written before precision
    spec = CompareSpec.from_dict(saved)
    assert spec.precision == "fp32" and spec.fingerprint()["bf16"] is False
    assert "bf16" not in spec.to_dict() and spec.to_dict()["precision"] == "fp32"


def test_a_bf16_entry_that_contradicts_precision_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"^precision: expected 'bf16' \(as the spec's bf16=True\), got 'fp32'$"
    ):
        CompareSpec.from_dict({"task": "chars", "bf16": True, "precision": "fp32"})
    assert (
        CompareSpec.from_dict({"task": "chars", "bf16": True, "precision": "bf16"}).precision
        == "bf16"
    )
    with pytest.raises(ValueError, match=r"^precision: expected one of \['fp32', 'bf16', 'fp16'\]"):
        CompareSpec(precision="fp8")


# ---- the gradient scaler (fp16's), on the CPU ---------------------------------------------------


def _scaled_pair(data: CharsTask) -> tuple[Task, list[nn.Module], list[torch.optim.Optimizer]]:
    task = _task(data)
    torch.manual_seed(0)
    model = task.build_model(HEADS)
    models = [model, copy.deepcopy(model)]
    return task, models, [build_optimizer(m, 1e-2, 0.01) for m in models]


def test_a_scaled_step_is_the_unscaled_one_and_an_inf_gradient_skips_it(data: CharsTask) -> None:
    task, (plain, scaled), (plain_opt, scaled_opt) = _scaled_pair(data)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    generator = torch.Generator().manual_seed(0)
    inputs, targets = task.train_batch(8, generator)
    loss = backward_pass(task, plain, plain_opt, inputs, targets)
    scaled_loss = backward_pass(task, scaled, scaled_opt, inputs, targets, scaler=scaler)
    assert torch.equal(scaled_loss, loss)  # the loss returned is unscaled
    grad = next(scaled.parameters()).grad
    plain_grad = next(plain.parameters()).grad
    assert grad is not None and plain_grad is not None
    assert torch.equal(grad, plain_grad * 2.0**10)  # scaled by a power of 2: exactly
    assert optimizer_step(task, plain, plain_opt) is True
    assert optimizer_step(task, scaled, scaled_opt, scaler) is True
    assert _max_diff(plain, scaled) == 0.0  # a power of 2: unscaled exactly
    assert scaler.get_scale() == 2.0**10

    before = copy.deepcopy(scaled.state_dict())
    backward_pass(task, scaled, scaled_opt, *task.train_batch(8, generator), scaler=scaler)
    weight = next(scaled.parameters())
    assert weight.grad is not None
    weight.grad.view(-1)[0] = float("inf")
    assert optimizer_step(task, scaled, scaled_opt, scaler) is False  # skipped
    assert scaler.get_scale() == 2.0**9  # halved
    after = scaled.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())


def _cpu_scaler(monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> None:
    """Runs get a CPU gradient scaler (fp16's, which the CPU does not train with) under fp32."""

    def make(precision: str, device: torch.device) -> torch.amp.GradScaler:
        return torch.amp.GradScaler("cpu", **kwargs)

    monkeypatch.setattr(resume_module, "make_scaler", make)


def test_steps_the_scaler_skips_are_divergence_only_once_its_scale_is_spent(
    data: CharsTask, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = _task(data, steps=6, eval_every=6, analysis=False, device="cpu")

    def poisoned(task: Task, heads: str) -> nn.Module:  # NaN logits, NaN gradients
        model = task.build_model(heads)
        norm = model.get_submodule("ln_f")
        assert isinstance(norm, nn.LayerNorm)
        with torch.no_grad():
            norm.weight[0] = float("nan")
        return model

    with pytest.raises(TrainingDiverged) as plain:  # no scaler: the first NaN
        train_run(task, HEADS, 0, tmp_path / "plain", model_factory=poisoned)
    assert plain.value.step == 1
    _cpu_scaler(monkeypatch, init_scale=4.0)
    with pytest.raises(TrainingDiverged) as scaled:  # 4 -> 2 -> 1 -> 0.5 < MIN_GRAD_SCALE
        train_run(task, HEADS, 0, tmp_path / "scaled", model_factory=poisoned)
    assert MIN_GRAD_SCALE == 1.0 and scaled.value.step == 3


def test_the_scaler_state_is_checkpointed_and_resumed(
    data: CharsTask, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _cpu_scaler(monkeypatch, init_scale=2.0**8, growth_interval=2)
    task = _task(data, steps=6, eval_every=6, analysis=False, device="cpu")
    full = train_run(task, HEADS, 0, tmp_path / "full")
    cut = tmp_path / "cut"
    with pytest.raises(Exception, match="stopped"):  # TrainingInterrupted
        train_run(task, HEADS, 0, cut, stop_at_step=3)
    saved = torch.load(cut / "checkpoint.pt", weights_only=False)["grad_scaler"]
    assert (saved["scale"], saved["_growth_tracker"]) == (2.0**9, 1)  # doubled after step 2
    run = setup_run(task, HEADS, 0, cut, task.spec, DistContext(device=torch.device("cpu")), None)
    assert run.scaler is not None and run.scaler.get_scale() == 2.0**8
    resume_run(run)
    assert run.scaler.state_dict() == saved
    assert train_run(task, HEADS, 0, cut)["train_loss"] == full["train_loss"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="float16 training needs CUDA")
def test_an_fp16_run_trains_on_cuda_with_its_scaler(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    argv = [*_argv(corpus, out, "--precision", "fp16", "--grad-accum", "2")]
    argv[argv.index("cpu")] = "cuda"
    assert main(argv) == 0, capsys.readouterr().err
    run = _run(out)
    assert len(run["train_loss"]) == 6 and all(map(_finite, run["train_loss"]))
    assert json.loads((out / "spec.json").read_text())["spec"]["precision"] == "fp16"
    saved = torch.load(next(out.glob("runs/*/checkpoint.pt")), weights_only=False)
    assert saved["grad_scaler"]["scale"] > 0


def _finite(value: float) -> bool:
    return value == value and abs(value) != float("inf")
