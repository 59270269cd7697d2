"""A resume runs as the invocation it continues (issue 38).

The spec's cost- and result-changing fields (``--precision``, ``--compile``,
``--activation-checkpointing``) come from ``DIR/spec.json``; the running flags that the spec
does not hold (``--threads``, ``--sequence-parallel``, ``--dist-timeout``, a ``--device``
override) from the last invocation's record in ``DIR/invocations.json``, unless given again;
and the printed resume command spells them out. A resume used to drop ``--threads`` and run at
torch's default thread count. (``--sequence-parallel`` and ``--dist-timeout`` are stopped and
resumed under ``torchrun`` in ``test_sequence_parallel.py``.)

The commands run in this process; a fresh process's default thread count is played by
setting torch's to 2 before each resume.
"""

from __future__ import annotations

import json
import shlex
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import heatformer.lab.step as step_module
import heatformer.models.blocks as blocks_module
from heatformer.lab.cli import main


def _argv(corpus: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train", "--text", str(corpus), "--steps", "6", "--batch-size", "4", "--seq-len", "16",
        "--layers", "2", "--embd", "16", "--eval-every", "2", "--eval-size", "4",
        "--no-analysis", "--device", "cpu", "--no-progress", "--out", str(out), *extra,
    ]  # fmt: skip


def _invocations(out: Path) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads((out / "invocations.json").read_text())[
        "invocations"
    ]
    return entries


def _hint(err: str) -> str:
    """The resume command printed on the last line of ``err``."""
    return err.strip().splitlines()[-1].split("; resume with: ")[1]


@pytest.fixture
def threads() -> Iterator[None]:
    """Put torch's thread count back after a test whose commands change it."""
    previous = torch.get_num_threads()
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """What the training steps ran with, counted: ``compile`` (the model handed to
    ``torch.compile``, here returned as it is: a real compilation would take most of a minute
    on a CPU), ``checkpointed`` (a block branch recomputed in backward), ``bf16`` and ``fp32``
    (a training forward under bfloat16 autocast or without)."""
    counts: Counter[str] = Counter()

    def compile(model: Any, *args: Any, **kwargs: Any) -> Any:
        counts["compile"] += 1
        return model

    real_checkpoint, real_autocast = blocks_module.checkpoint, step_module.autocast

    def checkpoint(*args: Any, **kwargs: Any) -> Any:
        counts["checkpointed"] += 1
        return real_checkpoint(*args, **kwargs)

    def autocast(device: torch.device, precision: str) -> Any:
        counts[precision] += 1
        return real_autocast(device, precision)

    monkeypatch.setattr(torch, "compile", compile)
    monkeypatch.setattr(blocks_module, "checkpoint", checkpoint)
    monkeypatch.setattr(step_module, "autocast", autocast)
    return counts


@pytest.mark.usefixtures("threads")
def test_a_resume_keeps_threads_bf16_compile_and_checkpointing_and_matches_the_full_run(
    corpus: Path, tmp_path: Path, seen: Counter[str], capsys: pytest.CaptureFixture[str]
) -> None:
    costly = ["--threads", "1", "--precision", "bf16", "--compile", "--activation-checkpointing"]
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main(_argv(corpus, full, *costly)) == 0
    assert main(_argv(corpus, cut, *costly, "--stop-at-step", "2")) == 0
    hint = _hint(capsys.readouterr().err)
    assert hint == f"heatformer train --resume {cut} --threads 1"

    # the printed command, as it is (stopped again), then a plain --resume
    resumes = [[*shlex.split(hint)[1:], "--stop-at-step", "4"], ["train", "--resume", str(cut)]]
    for argv in resumes:
        seen.clear()
        torch.set_num_threads(2)
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert seen["compile"] == 1 and seen["checkpointed"] > 0
        assert seen["bf16"] == 2 and seen["fp32"] == 0  # 2 training steps
        if "--threads" in argv:
            assert _hint(err) == hint  # the resumed run says the same
        else:
            assert err.splitlines()[0] == (
                f"heatformer train: note: --threads 1 as in the last invocation in {cut} "
                "(a flag given here overrides it)"
            )

    entries = _invocations(cut)
    assert [e["outcome"] for e in entries] == ["stopped", "stopped", "finished"]
    assert [e["environment"]["torch_threads"] for e in entries] == [1, 1, 1]
    assert [e["flags"] for e in entries] == [
        {
            "threads": 1,
            "sequence_parallel": None,
            "dist_timeout": None,
            "device": "cpu",
            "log": None,
        }
    ] * 3
    (resumed,) = json.loads((cut / "results.json").read_text())["runs"]
    (reference,) = json.loads((full / "results.json").read_text())["runs"]
    for key in ("train_loss", "evals", "final"):
        assert resumed[key] == reference[key], key


@pytest.mark.usefixtures("threads")
def test_flags_given_on_a_resume_override_the_record_and_are_kept_after(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(_argv(corpus, out, "--threads", "1", "--stop-at-step", "2")) == 0
    torch.set_num_threads(1)
    argv = ["train", "--resume", str(out), "--threads", "2", "--device", "auto"]
    assert main([*argv, "--stop-at-step", "4"]) == 0
    err = capsys.readouterr().err
    assert _hint(err) == f"heatformer train --resume {out} --threads 2 --device auto"
    torch.set_num_threads(1)
    assert main(["train", "--resume", str(out)]) == 0
    assert capsys.readouterr().err.splitlines()[0] == (
        f"heatformer train: note: --threads 2 --device auto as in the last invocation in {out} "
        "(a flag given here overrides it)"
    )
    entries = _invocations(out)
    assert [(e["flags"]["threads"], e["flags"]["device"]) for e in entries] == [
        (1, "cpu"), (2, "auto"), (2, "auto"),
    ]  # fmt: skip
    assert [e["environment"]["torch_threads"] for e in entries] == [1, 2, 2]
    assert json.loads((out / "spec.json").read_text())["spec"]["device"] == "cpu"  # as saved
