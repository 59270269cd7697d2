"""The ``heatformer`` command: train / compare / analyze, errors and exit codes."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from heatformer.cli import build_parser, main
from heatformer.experiments import commands
from heatformer.experiments.spec import PRESETS


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(0)
    words = "heat kernel laplacian attention graph token layer head".split()
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_text(" ".join(rng.choice(words) for _ in range(4000)) + "\n")
    return path


def tiny(text: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--text", str(text), "--steps", "4", "--batch-size", "4", "--seq-len", "16",
        "--layers", "2", "--embd", "16", "--eval-every", "2", "--eval-size", "4",
        "--analysis-size", "4", "--device", "cpu", "--no-progress", "--out", str(out), *extra,
    ]  # fmt: skip


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["compare", "--task", "nope"],
            "task: expected one of ['chars', 'digits', 'recall'], got 'nope'",
        ),
        (["compare", "--heads", "laplacain:2"], "unknown operator 'laplacain'"),
        (["compare", "--heads", "attention:3,laplacian:2"], "n_embd: expected a multiple of the 5"),
        (["compare", "--heads", "attention:2", "--heads", "attention:2"], "distinct schedules"),
        (["compare", "--heads", "attention;laplacian"], "expected 4 layer specs"),
        (["train", "--text", "/no/such/file.txt"], "no such file or directory: /no/such/file.txt"),
        (["train", "--task", "digits", "--text", "x.txt"], "only the 'chars' task"),
        (["train", "--task", "digits", "--npz", "/no/such.npz"], "no such file: /no/such.npz"),
        (["compare", "--seeds", "two"], "seeds: expected a count"),
        (["train", "--steps", "0"], "steps: expected a positive int, got 0"),
        (["train", "--resume", "/no/such/run"], "expected a comparison folder"),
        (["train", "--resume"], "--resume: expected a folder"),
        (["train", "--device", "tpu"], "device: expected 'auto', 'cpu' or 'cuda[:N]'"),
    ],
)
def test_bad_input_gives_one_clear_line_and_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main(argv if "--resume" in argv else [*argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"heatformer {argv[0]}: error: ")
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()  # nothing written, so nothing can look finished


def test_cuda_request_without_cuda_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    code = main(["train", "--device", "cuda", "--out", str(tmp_path / "out")])
    assert code == 2 and "CUDA is not available" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_existing_output_folder_is_not_overwritten(
    text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["train", *tiny(text, out), "--no-analysis"]) == 0
    before = (out / "results.json").read_bytes()
    assert main(["train", *tiny(text, out)]) == 2
    assert "already holds a comparison; continue it with --resume" in capsys.readouterr().err
    assert (out / "results.json").read_bytes() == before


# ----------------------------------------------------------------------------- success


def test_compare_prints_the_table_and_writes_the_report(
    text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["compare", "--heads", "attention:2", "--heads", "attention:2;attention:1,laplacian:1"]
    code = main([*argv, "--seeds", "2", "--n-head", "2", *tiny(text, out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert "2 configuration(s) x 2 seed(s) = 4 run(s)" in printed
    lines = printed.splitlines()
    header = next(line for line in lines if line.startswith("heads"))
    assert "val_bpc" in header and "val_loss" in header and "nc1@L1" in header
    row = next(line for line in lines if line.startswith("attention:2;attention:1,laplacian:1"))
    assert row.count("±") == 5
    assert f"report: {out / 'results.json'}" in printed
    results = json.loads((out / "results.json").read_text())
    per_layer = next(r for r in results["runs"] if ";" in r["heads"])
    assert per_layer["model_config"]["heads"] == ["attention:2", "attention:1,laplacian:1"]
    assert len(list(out.glob("runs/*/result.json"))) == 4


def test_stop_then_resume_finishes_with_exit_codes_130_then_0(
    text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main(["compare", "--heads", "attention:2", *tiny(text, out), "--stop-at-step", "2"])
    err = capsys.readouterr().err
    assert code == 130
    assert "stopped at step 2/4, checkpoint saved" in err
    assert f"resume with: heatformer compare --resume {out}" in err
    assert not list(out.glob("runs/*/result.json")) and not (out / "results.json").exists()

    assert main(["compare", "--resume", str(out), "--steps", "9"]) == 2
    assert "drop the flags ['steps']" in capsys.readouterr().err

    assert main(["compare", "--resume", str(out), "--no-progress"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert len(results["runs"][0]["train_loss"]) == 4


def test_analyze_command_rebuilds_the_per_layer_report(
    text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["train", "--heads", "attention:1,heat:1", *tiny(text, out), "--no-analysis"]) == 0
    assert not (out / "plots" / "layers_effective_rank.png").exists()
    assert main(["analyze", str(out), "--no-progress"]) == 0
    assert "effective_rank@L1" in capsys.readouterr().out
    assert (out / "plots" / "layers_effective_rank.png").exists()
    assert main(["analyze", str(tmp_path / "nothing")]) == 2


def test_preset_demo_is_chars_attention_vs_laplacian_vs_heat_and_flags_override() -> None:
    args = build_parser().parse_args(["compare", "--preset", "demo", "--steps", "7"])
    spec = commands._build_spec(args, compare=True)
    assert spec.task == "chars"
    assert spec.heads == PRESETS["demo"]["heads"]
    assert [h.split(",")[-1].split(":")[0] for h in spec.heads] == [
        "attention",
        "laplacian",
        "heat",
    ]
    assert spec.steps == 7 and spec.seeds == PRESETS["demo"]["seeds"]
    assert build_parser().parse_args(["compare", "--heads-per-layer", "8"]).n_head == 8


def test_train_digits_from_a_user_npz(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(3), 20)
    images = rng.random((60, 4, 4)) + labels[:, None, None]  # separable 4x4 images
    np.savez(tmp_path / "small.npz", images=images, labels=labels)
    out = tmp_path / "out"
    argv = ["train", "--task", "digits", "--npz", str(tmp_path / "small.npz"), "--steps", "30",
            "--batch-size", "16", "--layers", "1", "--embd", "16", "--lr", "1e-2",
            "--heads", "attention:1,laplacian:1", "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "test_acc" in capsys.readouterr().out
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    assert run["model_config"]["image_size"] == 4 and run["model_config"]["num_classes"] == 3
    assert run["final"]["test_acc"] > 0.9
