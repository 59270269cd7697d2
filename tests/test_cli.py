"""The ``heatformer`` command: train / compare / analyze, errors and exit codes."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from heatformer import checks
from heatformer.checks import ArgumentFileNotFoundError
from heatformer.lab.cli import _build_parsers, _experiments, _name_the_option, build_parser, main
from heatformer.lab.presets import PRESETS


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


# ----------------------------------------------------------------------------- start-up

_NO_TORCH = """
import sys
from heatformer.lab.cli import main
for argv in {argvs!r}:
    try:
        main(argv)
    except SystemExit as exit:
        print("exit", exit.code, file=sys.stderr)
    print(argv, "torch" in sys.modules, "heatformer.models" in sys.modules, file=sys.stderr)
"""


def test_help_and_flag_errors_answer_without_importing_torch() -> None:
    argvs = [
        ["--help"],
        ["train", "--help"],
        ["compare", "--help"],
        ["demo", "--help"],
        ["analyze", "--help"],
        ["demo-ops", "--help"],
        ["train", "--steps", "x"],
        ["compare", "--no-such-flag"],
        [],
    ]
    code = _NO_TORCH.format(argvs=argvs)
    env = {**os.environ, "COLUMNS": "300"}  # no line wrapping in the help pages
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    report = [line for line in done.stderr.splitlines() if line.startswith("[")]
    assert report == [f"{argv} False False" for argv in argvs]
    exits = [line for line in done.stderr.splitlines() if line.startswith("exit")]
    assert exits == ["exit 0"] * 6 + ["exit 2"] * 2  # help pages, then the two flag errors
    assert "invalid int value: 'x'" in done.stderr
    # the help pages show the defaults of CompareSpec and the demo's sentence
    assert "optimizer steps per run (default 500)" in done.stdout
    assert "(default 'def add(a, b): return a + b')" in done.stdout


def test_under_torchrun_only_rank_0_prints_argument_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``torchrun --nproc_per_node 2 -m heatformer train --embd 30`` printed the error once per
    rank. Rank 1 now waits for torchrun to stop it (rank 0 fails alike and reports), and
    prints its error itself only if no stop comes; every rank exits 2."""
    import heatformer.lab.cli as cli

    def stopped_by_torchrun(seconds: float) -> None:
        assert seconds == cli.QUIET_RANK_WAIT_S
        raise cli.Terminated("terminated (SIGTERM)")

    line = "heatformer train: error: --embd: expected a multiple of the 4 heads per layer"
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, sleep, printed in (
        ("1", stopped_by_torchrun, False),
        ("1", lambda seconds: None, True),  # no stop came: an error of this rank's own
        ("0", stopped_by_torchrun, True),  # rank 0 does not wait
    ):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setattr(cli.time, "sleep", sleep)
        assert main(["train", "--embd", "30"]) == 2
        assert (line in capsys.readouterr().err) is printed
    for rank, printed in (("1", False), ("0", True)):
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(SystemExit) as exit:  # argparse's own errors, and its usage line
            main(["train", "--steps", "x"])
        assert exit.value.code == 2
        err = capsys.readouterr().err
        assert ("argument --steps: invalid int value: 'x'" in err) is printed
        assert ("usage: heatformer train" in err) is printed


def test_demo_default_text_is_the_library_default() -> None:
    from heatformer.lab.cli import _demo
    from heatformer.lab.demo import DEFAULT_TEXT

    assert _demo.DEFAULT_TEXT == DEFAULT_TEXT
    assert build_parser().parse_args(["demo"]).text == DEFAULT_TEXT


def test_python_m_heatformer_runs_the_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "heatformer", "--version"], capture_output=True, text=True
    )
    assert (done.returncode, done.stdout.strip()) == (0, "heatformer 0.1.0")


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["compare", "--task", "nope"],
            "task: expected one of ['chars', 'digits', 'induction', 'listops', 'masked', 'mqar', "
            "'parity', 'passkey', 'recall', 'selective_copy', 'stdlib'], got 'nope'",
        ),
        (["compare", "--heads", "laplacain:2"], "unknown operator 'laplacain'"),
        (["compare", "--heads", "attention:3,laplacian:2"], "--embd: expected a multiple of the 5"),
        (["compare", "--heads", "attention:2", "--heads", "attention:2"], "distinct schedules"),
        (["compare", "--heads", "attention;laplacian"], "expected 4 layer specs"),
        (["train", "--text", "/no/such/file.txt"], "no such file or directory: /no/such/file.txt"),
        (["train", "--task", "digits", "--text", "x.txt"], "only the 'chars' and 'masked' tasks"),
        (["train", "--task", "digits", "--npz", "/no/such.npz"], "no such file: /no/such.npz"),
        (["compare", "--seeds", "two"], "seeds: expected a count"),
        (["train", "--steps", "0"], "steps: expected a positive int, got 0"),
        (["train", "--resume", "/no/such/run"], "expected a comparison folder"),
        (["train", "--resume"], "--resume: expected a folder"),
        (["train", "--device", "tpu"], "--device: expected 'auto', 'cpu' or 'cuda[:N]'"),
        # NaN passes `< 0` checks; it used to train on and report nan silently
        (
            ["train", "--weight-decay", "nan"],
            "--weight-decay: expected a finite float >= 0, got nan",
        ),
        (["train", "--grad-clip", "nan"], "--grad-clip: expected a finite float >= 0, got nan"),
        (["train", "--lr", "inf"], "--lr: expected a positive float, got inf"),
        # used to end in a ZeroDivisionError / RuntimeError traceback
        (
            ["train", "--task", "digits", "--patch-size", "0"],
            "--patch-size: expected a positive int",
        ),
        # used to be ignored silently
        (["train", "--stop-at-step", "0"], "--stop-at-step: expected a positive int, got 0"),
        (["compare", "--stop-at-step", "-3"], "--stop-at-step: expected a positive int, got -3"),
        (["train", "--threads", "0"], "--threads: expected a positive int, got 0"),
        (
            ["train", "--task", "digits", "--seq-len", "8"],
            "--seq-len: only the 'chars', 'induction', 'listops', 'masked', 'mqar', 'parity', "
            "'passkey', 'recall', 'selective_copy' and 'stdlib' tasks use it, got task 'digits'",
        ),
        (
            ["train", "--task", "recall", "--max-bytes", "99"],
            "--max-bytes: only the 'chars' and 'masked' tasks",
        ),
        (["train", "--task", "chars", "--patch-size", "4"], "--patch-size: only the 'digits' task"),
        # library names (seeds, n_layer) become the option the user typed
        (["train", "--seed", "-1"], "--seed: expected distinct non-negative ints, got [-1]"),
        (["compare", "--seeds", "0"], "--seeds: expected a count >= 1, got 0"),
        (["compare", "--layers", "0"], "--layers: expected a positive int, got 0"),
        (["compare", "--heads", "attention:2", "--n-head", "4"], "--heads: expected head counts"),
        # used to be clamped to N silently (topk_graph refuses the same input); the graph
        # kind's own check, naming the option the user gave
        (
            ["train", "--topk", "1000", "--seq-len", "32"],
            "--topk: topk[k=1000]: expected k at most the 32 tokens a sequence can hold, got 1000",
        ),
        (
            ["compare", "--task", "recall", "--topk", "129"],
            "--topk: topk[k=129]: expected k at most the 128 tokens a sequence can hold, got 129",
        ),
        (  # the ViT's tokens: 16 patches + cls, known once the images are loaded
            ["train", "--task", "digits", "--topk", "18"],
            "--topk: topk[k=18]: expected k at most the 17 tokens a sequence can hold, got 18",
        ),
        (
            ["train", "--graph", "topk[k=40]", "--seq-len", "32"],
            "--graph: topk[k=40]: expected k at most the 32 tokens a sequence can hold, got 40",
        ),
        (
            ["train", "--task", "digits", "--graph", "topk[k=18]"],
            "--graph: topk[k=18]: expected k at most the 17 tokens a sequence can hold, got 18",
        ),
        (["train", "--graph", "dilated[d=2]"], "got 'dilated' in 'dilated[d=2]'"),
        (["train", "--graph", "topk[k=0]"], "--graph: in 'topk[k=0]': k: expected a positive"),
        (
            ["train", "--layers", "2", "--graph", "topk[k=8];topk[k=8];softmax"],
            "--graph: expected one spec per layer (2 layers)",
        ),
        (
            ["train", "--topk", "8", "--graph", "topk[k=8]"],
            "--topk: is shorthand for graph='topk[k=8]'; expected topk or graph, got both",
        ),
        (  # the README says both are refused; --graph softmax is the spec's default
            ["train", "--topk", "8", "--graph", "softmax"],
            "--topk: is shorthand for graph='topk[k=8]'; expected topk or graph, got both "
            "(topk=8, graph='softmax')",
        ),
        (["train", "--task", "digits", "--analysis-size", "0"], "--analysis-size: expected a "),
        (
            ["train", "--task", "recall", "--text", "x.txt"],
            "--text: only the 'chars' and 'masked' tasks use it, got task 'recall'",
        ),
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


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["train", "--seeds", "3"], "unrecognized arguments: --seeds 3 (did you mean --seed?)"),
        (["compare", "--stepps=4"], "unrecognized arguments: --stepps=4 (did you mean --steps?)"),
        (["demo", "--no-gifs"], "unrecognized arguments: --no-gifs (did you mean --no-gif?)"),
        (["analyze", "x", "--devices", "cpu"], "--devices cpu (did you mean --device?)"),
        (["train", "--zzz"], "unrecognized arguments: --zzz"),
    ],
)
def test_unknown_option_is_reported_by_its_subcommand_with_a_hint(
    argv: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit:
        main([*argv, "--out", str(out)] if argv[0] != "analyze" else argv)
    err = capsys.readouterr().err
    assert exit.value.code == 2
    assert err.startswith(f"usage: heatformer {argv[0]} ")  # the subcommand's usage
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"heatformer {argv[0]}: error: unrecognized arguments: ")
    assert last.endswith(expected)
    assert ("did you mean" in last) == (argv[1] != "--zzz")
    assert not out.exists()


@pytest.mark.parametrize(
    ("error", "command", "expected"),
    [
        (checks.bad_value("n_embd", "expected 8, got 6"), "train", "--embd: expected 8, got 6"),
        (ArgumentFileNotFoundError("text_path", "no file x"), "train", "--text: no file x"),
        (checks.bad_value("out_dir", "expected a folder"), "demo", "--out: expected a folder"),
        (checks.bad_value("seeds", "bad"), "train", "--seed: bad"),
        (checks.bad_value("seeds", "bad"), "compare", "--seeds: bad"),
        (checks.bad_value("seq_len", "bad"), "compare", "--seq-len: bad"),  # a task option
        (checks.bad_type("graph", "expected a str"), "train", "--graph: expected a str"),
        (checks.bad_value("operators", "refused"), "train", "--heads: refused"),
        (checks.bad_value("layer", "expected an index"), "train", "layer: expected an index"),
        (checks.bad_value("run_dir", "nothing"), "analyze", "run_dir: nothing"),  # a positional
        # the attribute decides, not the text
        (checks.bad_value("n_embd", "steps: nested"), "train", "--embd: steps: nested"),
        (checks.bad_value("nowhere", "steps: x"), "train", "nowhere: steps: x"),
        # without .argument the text is never parsed: it keeps its wording
        (ValueError("layer: expected an index"), "demo", "layer: expected an index"),
        (checks.bad_value("layer", "expected an index"), "demo", "--layer: expected an index"),
        (ValueError("corpus at /x: expected text"), "train", "corpus at /x: expected text"),
        (ValueError("no colon at all"), "train", "no colon at all"),
    ],
)  # fmt: skip
def test_errors_name_the_option_the_user_typed(
    error: Exception, command: str, expected: str
) -> None:
    _, subparsers = _build_parsers()
    assert _name_the_option(error, subparsers[command].option_of) == expected


@pytest.mark.parametrize("command", ["train", "compare", "analyze", "demo", "demo-ops"])
def test_option_table_is_kept_while_the_parser_is_built(command: str) -> None:
    _, subparsers = _build_parsers()
    parser = subparsers[command]
    # argparse's own view (private; read by this test only, as the reference)
    longs = [a for a in parser._actions if any(o.startswith("--") for o in a.option_strings)]
    assert set(parser.option_of) == {a.dest for a in longs}
    assert sorted(parser.long_options) == sorted(
        o for a in longs for o in a.option_strings if o.startswith("--")
    )
    if command in ("train", "compare"):
        assert parser.option_of["n_embd"] == "--embd"
        assert parser.option_of["n_head"] == "--n-head"  # the first of its two spellings
        assert {"--heads-per-layer", "--graph", "--seq-len", "--patch-size"} <= set(
            parser.long_options
        )


def test_unwritable_output_folder_is_refused_before_training(
    text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = blocker / "out"  # mkdir fails with NotADirectoryError, even as root
    code = main(["train", *tiny(text, out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("heatformer train: error: --out: expected a folder that can be created")
    assert f"got {out} (" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert blocker.read_text() == "not a folder"


def test_diverging_run_stops_with_a_clear_error_not_a_nan_report(
    text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main(["train", *tiny(text, out), "--lr", "1e30", "--grad-clip", "0", "--no-analysis"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("heatformer train: error: run c00-attention-s0: expected a finite ")
    assert re.search(r"got (nan|inf|-inf) at step [1-4]/4", err)
    assert f"kept in {out}" in err and len(err.strip().splitlines()) == 1
    # nothing looks finished and no NaN table was written
    assert not list(out.glob("runs/*/result.json")) and not (out / "results.json").exists()


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
    assert row.count("±") == 7  # 2 metrics, the within-sequence share and its 2 parts, 2 more
    assert header.index("within_seq_frac@L1") < header.index("within_seq_var@L1")
    assert header.index("within_seq_var@L1") < header.index("between_seq_var@L1")
    assert f"report: {out / 'results.json'}" in printed
    assert "mean ± sample std over seeds [0, 1]; analysis columns: last layer" in printed
    assert "\ngeometry on the test batch, before the final LayerNorm\n" in printed  # no cls
    results = json.loads((out / "results.json").read_text())
    per_layer = next(r for r in results["runs"] if ";" in r["heads"])
    assert per_layer["model_config"]["heads"] == ["attention:2", "attention:1,laplacian:1"]
    assert len(list(out.glob("runs/*/result.json"))) == 4


def test_no_analysis_prints_no_analysis_columns_note(
    text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["compare", "--heads", "attention:2", *tiny(text, out), "--no-analysis"]) == 0
    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if line.startswith("heads"))
    assert header.split() == ["heads", "seeds", "val_bpc", "val_loss"]
    assert "mean ± sample std over seeds [0]\n" in printed
    assert "analysis columns" not in printed


def test_progress_into_a_redirected_stderr_is_plain_lines(text: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = [a for a in tiny(text, out, "--steps", "20") if a != "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = tmp_path / "stderr.log"
    with log.open("w") as handle:  # a file, as in `make demo 2> log`
        done = subprocess.run(
            [sys.executable, "-m", "heatformer", "train", *argv],
            stdout=subprocess.PIPE, stderr=handle, text=True, timeout=120, env=env,
        )  # fmt: skip
    assert done.returncode == 0
    err = log.read_text()
    assert "\r" not in err
    lines = err.splitlines()
    steps = [line for line in lines if line.startswith("c00-attention-s0: step ")]
    assert [int(re.match(r"c00-attention-s0: step (\d+)/20 ", line)[1]) for line in steps] == [
        2, 4, 6, 8, 10, 12, 14, 16, 18, 20,
    ]  # fmt: skip
    for line in steps:
        assert re.fullmatch(r"c00-attention-s0: step \d+/20 \(\d+%\), loss \d\.\d+, \d+ s", line)
    assert lines[-1].startswith("out: run 1/1 (100%), ")
    assert len(lines) == 11

    again = subprocess.run(
        [sys.executable, "-m", "heatformer", "analyze", str(out)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert again.returncode == 0
    assert re.fullmatch(r"analyze out: run 1/1 \(100%\), \d+ s\n", again.stderr)


def test_planned_stop_exits_0_then_resume_finishes(
    text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main(["compare", "--heads", "attention:2", *tiny(text, out), "--stop-at-step", "2"])
    err = capsys.readouterr().err
    assert code == 0  # a planned stop is no failure (torchrun would report 130 as one)
    assert err == (
        "heatformer compare: stopped at step 2 as requested (--stop-at-step), checkpoint of "
        f"run c00-attention2-s0 saved; resume with: heatformer compare --resume {out}\n"
    )
    assert not list(out.glob("runs/*/result.json")) and not (out / "results.json").exists()

    assert main(["compare", "--resume", str(out), "--steps", "9"]) == 2
    assert "drop the flags ['steps']" in capsys.readouterr().err

    assert main(["compare", "--resume", str(out), "--no-progress"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert len(results["runs"][0]["train_loss"]) == 4


def test_sigterm_stops_with_a_checkpoint_and_exit_130(text: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = tiny(text, out, "--steps", "100000", "--ckpt-every", "1", "--eval-every", "100000")
    # training, the handler installed
    code, err = _sigterm_when(["train", *argv], lambda _: any(out.glob("runs/*/checkpoint.pt")))
    assert code == 130
    message = err.strip().splitlines()[-1]
    assert re.fullmatch(
        r"heatformer train: SIGTERM: run c00-attention-s0 stopped at step \d+/100000, checkpoint "
        rf"saved; resume with: heatformer train --resume {re.escape(str(out))}",
        message,
    )


_SLOW_ARGV = [
    "train", "--task", "slow-recall", "--seq-len", "40", "--eval-size", "16", "--layers", "1",
    "--embd", "16", "--steps", "4", "--batch-size", "4", "--eval-every", "2", "--ckpt-every",
    "100", "--no-analysis", "--device", "cpu", "--threads", "1", "--no-progress",
]  # fmt: skip


@pytest.fixture(scope="module")
def slow_reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The task ``slow-recall`` of ``tests/stop_helpers.py`` registered here (the stall is off
    in this process), and the record of its run by :data:`_SLOW_ARGV`, never interrupted."""
    from heatformer.lab.tasks import TASKS
    from stop_helpers import SlowRecall

    TASKS.register(SlowRecall)
    try:
        out = tmp_path_factory.mktemp("slow") / "ref"
        with contextlib.redirect_stdout(io.StringIO()):
            assert main([*_SLOW_ARGV, "--out", str(out)]) == 0
        (record,) = json.loads((out / "results.json").read_text())["runs"]
        yield record
    finally:
        TASKS.unregister(SlowRecall.name)


@pytest.mark.parametrize("stall", ["eval:1", "train:3"])
def test_sigterm_mid_evaluation_or_step_exits_130_within_seconds_and_resume_matches(
    stall: str, slow_reference: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGTERM while an evaluation (or a training step) of a slow task runs: it used to be
    honoured only after the evaluation (the step) ended, minutes later for a long one. The
    stall here lasts 60 s; the command must exit 130 in seconds, with the resume line, and the
    resumed run must equal an uninterrupted one."""
    from stop_helpers import STALL_S

    cut, marker = tmp_path / "cut", tmp_path / "stalled"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HEATFORMER_TEST_STALL": stall,
           "HEATFORMER_TEST_MARKER": str(marker)}  # fmt: skip
    helper = Path(__file__).parent / "stop_helpers.py"
    command = [sys.executable, str(helper), *_SLOW_ARGV, "--out", str(cut)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=STALL_S / 2)
        took = time.monotonic() - sent
    finally:
        process.kill()
    assert process.returncode == 130
    assert took < 10  # measured: about 1 s on a busy 2-core machine
    assert err.decode().strip().splitlines()[-1] == (
        "heatformer train: SIGTERM: run c00-attention-s0 stopped at step 2/4, checkpoint "
        f"saved; resume with: heatformer train --resume {cut} --threads 1"
    )  # the step after which it evaluated, or the one before the step that was cut
    assert not (cut / "results.json").exists()

    assert main(["train", "--resume", str(cut), "--no-progress"]) == 0
    capsys.readouterr()
    (resumed,) = json.loads((cut / "results.json").read_text())["runs"]
    for key in ("train_loss", "evals", "final"):
        assert resumed[key] == slow_reference[key], key


def _sigterm_when(argv: list[str], ready: Callable[[int], bool]) -> tuple[int, str]:
    """``(exit status, stderr)`` of ``heatformer ARGV`` sent SIGTERM once ``ready(pid)``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "heatformer", *argv]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 60
        while not ready(process.pid):
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.001)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    return process.returncode, err.decode()


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (``SigCgt`` of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_sigterm_before_training_exits_130_with_a_line(text: Path, tmp_path: Path) -> None:
    """SIGTERM as soon as the command can catch it, while torch is still loading: it used to
    kill the process silently (-15) for the first ~1.5 s."""
    out = tmp_path / "out"
    handled = lambda pid: _catches(pid, signal.SIGTERM)  # noqa: E731
    code, err = _sigterm_when(["train", *tiny(text, out)], handled)
    assert code == 130
    assert err.splitlines() == ["heatformer train: terminated (SIGTERM)"]
    assert not out.exists()  # stopped before anything was written


def test_sigterm_while_the_command_loads_exits_130_with_a_line(text: Path, tmp_path: Path) -> None:
    """A SIGTERM that comes while ``heatformer.lab.cli`` is imported (0.2-0.5 s after start) is
    kept by the console script's first module and reported as any other; it used to kill the
    process silently (-15). Sent from inside that import, so the timing is certain."""
    out = tmp_path / "out"
    code = (
        "import os, signal, sys\n"
        "import heatformer.lab.command as entry\n"
        "real = entry._import_cli\n"
        "def loading():\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return real()\n"
        "entry._import_cli = loading\n"
        f"sys.exit(entry.main({['train', *tiny(text, out)]!r}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr.splitlines() == ["heatformer train: terminated (SIGTERM)"]
    assert not out.exists()


@pytest.mark.parametrize("link", ["dangling", "loop"])
def test_a_broken_checkpoint_symlink_is_refused_not_restarted(
    link: str, text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint.pt that is a link to nothing (or to itself) used to restart its run from
    step 0 without a word."""
    out = tmp_path / "out"
    assert main(["train", *tiny(text, out), "--stop-at-step", "2", "--no-analysis"]) == 0
    run_dir = out / "runs" / "c00-attention-s0"
    path = run_dir / "checkpoint.pt"
    path.unlink()
    target = tmp_path / "moved-away.pt" if link == "dangling" else path
    path.symlink_to(target)
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"heatformer train: error: {path}: expected a heatformer checkpoint, got a symbolic link "
        f"to {str(target)!r}, which does not lead to a file (missing, or a loop); point it at "
        f"the checkpoint, or delete the run folder {run_dir} and continue the comparison with "
        "--resume: that run starts again from step 0, the finished runs are kept\n"
    )
    kept = sorted(p.name for p in run_dir.iterdir())  # what the stopped run wrote, no more
    assert path.is_symlink() and kept == ["checkpoint.pt", "metrics.jsonl"]


_LOOP_SCRIPT = """
import sys
from heatformer.lab.cli import main
for argv in {argvs!r}:
    print("status", main(argv), "torch" in sys.modules, file=sys.stderr)
"""


def test_a_loop_of_symbolic_links_as_out_or_resume_is_one_line_before_torch(
    tmp_path: Path,
) -> None:
    """``--out DIR`` or ``--resume DIR`` where DIR or DIR/runs is a loop of symbolic links
    (``ln -s loop loop``) used to end in a RuntimeError traceback (status 1)."""
    from heatformer.lab.spec import CompareSpec

    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    fresh, made = tmp_path / "fresh", tmp_path / "made"
    fresh.mkdir()
    made.mkdir()
    (made / "spec.json").write_text(json.dumps({"spec": CompareSpec(device="cpu").to_dict()}))
    for folder in (fresh, made):
        (folder / "runs").symlink_to(folder / "runs")
    cases = [
        (["compare", "--out", str(loop)], "--out", loop),
        (["train", "--out", str(fresh)], "--out", fresh / "runs"),
        (["compare", "--resume", str(loop)], "--resume", loop),
        (["train", "--resume", str(made)], "--resume", made / "runs"),
    ]
    code = _LOOP_SCRIPT.format(argvs=[argv for argv, *_ in cases])
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    expected = []
    for argv, option, path in cases:
        expected += [
            f"heatformer {argv[0]}: error: {option}: expected a folder, got {path}, whose path "
            "runs into a loop of symbolic links (links that lead back to themselves); remove or "
            "repoint the link",
            "status 2 False",  # refused before torch was imported
        ]
    assert done.stderr.splitlines() == expected
    assert sorted(p.name for p in made.iterdir()) == ["runs", "spec.json"]  # no lock file


def test_a_broken_run_folder_symlink_is_refused_before_training(
    text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run folder that is a loop of links used to look like a run not started yet, then end
    in a RuntimeError traceback when its lock was taken."""
    out = tmp_path / "out"
    assert main(["train", *tiny(text, out), "--stop-at-step", "2", "--no-analysis"]) == 0
    run_dir = out / "runs" / "c00-attention-s0"
    shutil.rmtree(run_dir)
    run_dir.symlink_to(run_dir)
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"heatformer train: error: {run_dir}: expected a run folder, got a symbolic link to "
        f"{str(run_dir)!r}, which does not lead to a folder (missing, or a loop); point it at "
        "the run folder, or delete it and continue the comparison with --resume: that run "
        "starts again from step 0, the finished runs are kept\n"
    )


def test_resume_with_another_world_size_is_noted_and_recorded(
    text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["train", *tiny(text, out), "--stop-at-step", "2", "--no-analysis"]) == 0
    path = out / "runs" / "c00-attention-s0" / "checkpoint.pt"
    state = torch.load(path, weights_only=True)
    assert state["world_sizes"] == [{"world_size": 1, "from_step": 0}]
    state["world_sizes"] = [{"world_size": 2, "from_step": 0}]  # as if torchrun had run it
    torch.save(state, path)
    capsys.readouterr()

    assert main(["train", "--resume", str(out), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert err.startswith(
        "heatformer train: note: run c00-attention-s0: resuming at step 2 with 1 process(es); "
        "its checkpoint was written by 2 process(es). Every process count trains on the same "
        "global batch (4), so the optimization is the same and the run continues"
    )
    assert len(err.strip().splitlines()) == 1
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    assert run["world_size"] == 1
    assert run["world_sizes"] == [
        {"world_size": 2, "from_step": 0},
        {"world_size": 1, "from_step": 2},
    ]


def test_junk_checkpoint_on_resume_names_the_file_and_how_to_restart_before_training(
    text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    heads = ["--heads", "attention:2", "--heads", "attention:1,laplacian:1"]
    assert main(["compare", *heads, *tiny(text, out), "--stop-at-step", "2"]) == 0
    first = out / "runs" / "c00-attention2-s0"
    junk = out / "runs" / "c01-attention1+laplacian1-s0" / "checkpoint.pt"
    junk.parent.mkdir()
    junk.write_bytes(b"not a checkpoint")
    capsys.readouterr()

    assert main(["compare", "--resume", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"heatformer compare: error: {junk}: expected a heatformer checkpoint")
    assert f"delete the run folder {junk.parent} and continue the comparison with --resume" in err
    assert "weights_only" not in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    # refused before any training: the interrupted first run did not move on
    assert torch.load(first / "checkpoint.pt", weights_only=True)["step"] == 2
    assert not (first / "result.json").exists()

    shutil.rmtree(junk.parent)  # what the message says to do
    assert main(["compare", "--resume", str(out), "--no-progress"]) == 0
    assert len(json.loads((out / "results.json").read_text())["runs"]) == 2


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
    spec = _experiments._build_spec(args, compare=True)
    assert spec.task == "chars"
    assert spec.heads == PRESETS["demo"]["heads"]
    assert [h.split(",")[-1].split(":")[0] for h in spec.heads] == [
        "attention",
        "laplacian",
        "heat",
    ]
    assert spec.steps == 7 and spec.seeds == PRESETS["demo"]["seeds"]
    assert build_parser().parse_args(["compare", "--heads-per-layer", "8"]).n_head == 8


def test_train_preset_mqar_reference_is_zoologys_setting_and_flags_override(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``train --preset`` takes the presets of one run; ``mqar-reference`` is Zoology's
    figure-2 setting (its 99 % run is measured in docs/tutorials/benchmarks.md, not here)."""
    args = build_parser().parse_args(["train", "--preset", "mqar-reference", "--steps", "7"])
    spec = _experiments._build_spec(args, compare=False)
    assert (spec.task, spec.heads, spec.seeds, spec.steps) == ("mqar", ("attention:1",), (0,), 7)
    assert (spec.n_layer, spec.n_embd, spec.mlp_ratio) == (2, 64, 0)
    o = spec.options
    assert (o.seq_len, o.vocab_size, o.num_kv_pairs, o.eval_size) == (64, 8192, 4, 3000)
    assert o.tie_embeddings and not o.random_non_queries
    with pytest.raises(SystemExit):  # a preset of several runs is compare's
        build_parser().parse_args(["train", "--preset", "demo"])
    assert "invalid choice: 'demo'" in capsys.readouterr().err
    out = tmp_path / "out"
    assert main(["train", "--preset", "mqar-reference", "--steps", "2", "--eval-size", "8",
                 "--analysis-size", "4", "--no-progress", "--out", str(out)]) == 0  # fmt: skip
    assert main(["train", "--resume", str(out), "--preset", "mqar-reference"]) == 2
    assert "drop the flags" in capsys.readouterr().err


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


_PEAK = """
import resource, sys
from heatformer.lab.cli import main
code = main({argv!r})
print("peak", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss in KiB is Linux's")
def test_a_window_wider_than_the_sequence_trains_in_the_memory_of_the_sequence(
    text: Path, tmp_path: Path
) -> None:
    """Issue 21: ``--graph 'window[w=1000000]' --seq-len 16`` sized its slabs by w (3-4 GB,
    a traceback after 37 s); it is the graph of w = N = 16."""
    out = tmp_path / "out"
    argv = ["train", *tiny(text, out, "--steps", "2"), "--graph", "window[w=1000000]"]
    code = _PEAK.format(argv=[*argv, "--no-analysis", "--threads", "1"])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    peak_mb = int(done.stderr.split("peak ")[-1]) / 1024  # ru_maxrss: KiB on Linux
    assert peak_mb < 1500, f"peak resident memory {peak_mb:.0f} MB"
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    assert len(run["train_loss"]) == 2 and all(np.isfinite(run["train_loss"]))


def test_graph_kinds_per_layer_from_the_command_line(
    text: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["train", *tiny(text, out), "--graph", "window[w=4];softmax", "--no-analysis"]
    assert main(argv) == 0
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    assert run["model_config"]["graph"] == "window[w=4];softmax"
    assert "topk" not in run["model_config"]
    assert all(np.isfinite(run["train_loss"])) and np.isfinite(run["final"]["val_loss"])
    spec = json.loads((out / "spec.json").read_text())["spec"]
    assert spec["graph"] == "window[w=4];softmax" and spec["options"]["seq_len"] == 16
    capsys.readouterr()
    shorthand = tmp_path / "topk"  # --topk K: the shorthand for --graph topk[k=K]
    assert main(["train", *tiny(text, shorthand), "--topk", "4", "--no-analysis"]) == 0
    (run,) = json.loads((shorthand / "results.json").read_text())["runs"]
    assert run["model_config"]["graph"] == "topk[k=4]" and "topk" not in run["model_config"]
