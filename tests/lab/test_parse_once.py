"""A run's spec is validated once and its head schedules parsed once (issue 39).

``CompareSpec.resolved()`` used to be ``dataclasses.replace``, so a one-run ``compare``
validated the whole spec five times and more (once per checkpoint save too), and split each
head string about fifteen times before the model existed. Here the validations
(``CompareSpec.__post_init__``) and the schedule parses (``HeadSchedule.parse``) are counted
over what a user runs: ``compare --dry-run`` with two schedules, a ``train`` that saves a
checkpoint every step and finishes, and its ``--resume``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from heatformer.lab import preflight
from heatformer.lab.cli import main
from heatformer.lab.spec import CompareSpec
from heatformer.models.heads import HeadSchedule


@pytest.fixture()
def counts(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    seen: Counter[str] = Counter()
    validate, parse = CompareSpec.__post_init__, HeadSchedule.parse.__func__  # type: ignore[attr-defined]

    def counted_validate(self: CompareSpec) -> None:
        seen["validations"] += 1
        validate(self)

    def counted_parse(cls: type[HeadSchedule], heads: str, **kwargs: object) -> HeadSchedule:
        seen[f"parse {heads}"] += 1
        return parse(cls, heads, **kwargs)

    monkeypatch.setattr(CompareSpec, "__post_init__", counted_validate)
    monkeypatch.setattr(HeadSchedule, "parse", classmethod(counted_parse))
    yield seen


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    rng = random.Random(0)
    words = "heat kernel laplacian attention graph token layer head".split()
    path = tmp_path / "corpus.txt"
    path.write_text(" ".join(rng.choice(words) for _ in range(3000)) + "\n")
    return path


def _tiny(corpus: Path, *extra: str) -> list[str]:
    return [
        "--text", str(corpus), "--batch-size", "4", "--seq-len", "16", "--layers", "2",
        "--embd", "16", "--eval-size", "4", "--analysis-size", "4", "--device", "cpu",
        "--no-progress", "--threads", "1", *extra,
    ]  # fmt: skip


def test_a_dry_run_validates_its_spec_once_and_parses_each_schedule_once(
    counts: Counter[str],
    corpus: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(preflight, "time_steps", lambda *a, **k: preflight.StepTimes(0, 0, 0))
    argv = ["compare", *_tiny(corpus), "--heads", "attention:4", "--heads",
            "attention:2,laplacian:2", "--steps", "4", "--dry-run"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    assert counts == Counter(
        {"validations": 1, "parse attention:4": 1, "parse attention:2,laplacian:2": 1}
    )


def test_training_saving_and_resuming_validate_once_per_invocation(
    counts: Counter[str], corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    argv = ["train", *_tiny(corpus), "--heads", "attention:2,laplacian:2", "--steps", "3",
            "--eval-every", "3", "--ckpt-every", "1", "--no-analysis",
            "--out", str(out)]  # fmt: skip
    assert main([*argv, "--stop-at-step", "2"]) == 0, capsys.readouterr().err
    assert (out / "runs").is_dir()
    # a planned stop at step 2 after checkpoints at steps 1 and 2: one spec, parsed once
    assert counts == Counter({"validations": 1, "parse attention:2,laplacian:2": 1})
    counts.clear()
    resume = ["train", "--resume", str(out), "--no-progress"]
    assert main(resume) == 0, capsys.readouterr().err  # reads spec.json, finishes, reports
    assert counts == Counter({"validations": 1, "parse attention:2,laplacian:2": 1})
