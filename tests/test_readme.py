"""The README's Python examples run as written (so they never rot)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 1


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int) -> None:
    namespace: dict[str, object] = {"__name__": "__readme__"}
    exec(compile(BLOCKS[index], f"README.md[{index}]", "exec"), namespace)


# ---------------------------------------------------------------- the `heatformer` commands
# Every `compare`/`train` line runs as written: no `...`, a cost comment above it (runs x
# steps, minutes, GB), `--threads`, and a `--dry-run` that parses, fits this machine's memory
# and writes nothing. The lines that name the reader's own folder (`--resume runs/NAME`) are
# skipped, and a `torchrun` line runs as one process.

#: the pages whose commands a new user pastes first: the README and the quickstart
_PAGES = (README, README.parent / "docs" / "quickstart.md")
_BASH = [
    b for page in _PAGES for b in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S)
]
#: words that stand for the reader's own folder: such a line cannot run as written
_PLACEHOLDERS = {"runs/NAME", "DIR", "demo/"}


def _commands() -> list[list[str]]:
    """Every ``heatformer`` or ``torchrun`` command of the README's bash blocks, as argv
    (continuation lines joined, comments dropped)."""
    import shlex

    out = []
    for block in _BASH:
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv and argv[0] in ("heatformer", "torchrun"):
                out.append(argv)
    return out


def _cli_args(argv: list[str]) -> list[str]:
    """The arguments of ``heatformer``: a ``torchrun ... -m heatformer`` line runs as one
    process here (the DDP launch itself is tested in tests/lab/test_ddp.py); a ``--config``
    file is the clone's (``studies/...``), read from the clone's root, as a reader there does."""
    args = argv[argv.index("heatformer") + 1 :]
    return [
        str(README.parent / arg) if before == "--config" else arg
        for before, arg in zip(["", *args], args, strict=False)
    ]


COMMANDS = _commands()
TRAINING = [argv for argv in COMMANDS if _cli_args(argv)[0] in ("compare", "train")]


def test_readme_commands_end_in_no_ellipsis() -> None:
    assert len(TRAINING) >= 8
    for argv in COMMANDS:
        assert "..." not in argv, argv


def test_readme_training_commands_say_their_cost() -> None:
    for block in _BASH:
        lines = block.replace("\\\n", " ").splitlines()
        for before, line in zip(["", *lines], lines, strict=False):
            args = line.split("#")[0].split()
            if (
                args[:2] in (["heatformer", "compare"], ["heatformer", "train"])
                or "torchrun" in args
            ):
                if "--dry-run" in args or "--resume" in args:
                    continue
                assert re.search(r"\d+ runs? x \d+ steps", before), line
                assert "--threads" in args, line


@pytest.mark.parametrize("argv", TRAINING, ids=[" ".join(a[:4]) for a in TRAINING])
def test_readme_command_plans_and_fits(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each training command parses, builds, fits this machine's memory and plans: its
    ``--dry-run`` (with the timed steps stubbed: their real time is the slow test below)."""
    from heatformer.lab import preflight
    from heatformer.lab.cli import main

    args = _cli_args(argv)
    if any(word in _PLACEHOLDERS for word in args):
        pytest.skip("names the reader's own run folder")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(preflight, "time_steps", lambda *a, **k: preflight.StepTimes(0, 0, 0))
    code = main([*(a for a in args if a != "--dry-run"), "--dry-run"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "estimated peak memory" in captured.out
    assert list(tmp_path.iterdir()) == []  # writes nothing


@pytest.mark.slow
@pytest.mark.parametrize("argv", TRAINING, ids=[" ".join(a[:4]) for a in TRAINING])
def test_readme_command_dry_run_as_a_user_would(argv: list[str], tmp_path: Path) -> None:
    """The real ``--dry-run`` of each command (3 real steps per configuration: minutes in
    all), in a subprocess as a user runs it."""
    import os
    import subprocess
    import sys

    args = [a for a in _cli_args(argv) if a != "--dry-run"]
    if any(word in _PLACEHOLDERS for word in args):
        pytest.skip("names the reader's own run folder")
    env = {**os.environ, "PYTHONPATH": str(README.parent / "src")}
    out = subprocess.run(
        [sys.executable, "-m", "heatformer", *args, "--dry-run"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "estimated time:" in out.stdout
    assert list(tmp_path.iterdir()) == []
