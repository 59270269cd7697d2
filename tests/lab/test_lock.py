"""One writer per run folder: the lock of ``compare`` / ``train`` / ``--resume`` (issue 21).

Two real processes on one comparison folder: the second is refused with exit status 2 and a
line naming the first's pid and host, writes nothing, and the first finishes undisturbed; a
holder killed with ``kill -9`` leaves a lock that the next ``--resume`` takes. The lock file
protocol (``flock`` on ``OUT/.lock``, ``{"pid", "host", "started"}`` in it) is checked against
a holder written here with :mod:`fcntl` directly, not with the library's class.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from heatformer._atomic import LOCK_NAME, FolderInUse, FolderLock, holds_lock
from heatformer.lab.checkpoint import remove_stale_temporaries
from heatformer.lab.cli import main
from heatformer.lab.compare import INVOCATIONS_NAME, run_compare
from heatformer.lab.resume import CHECKPOINT_NAME
from heatformer.lab.spec import CompareSpec
from heatformer.lab.stop import TrainingInterrupted

fcntl = pytest.importorskip("fcntl")

SpecFactory = Callable[..., CompareSpec]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
HEATFORMER = [sys.executable, "-m", "heatformer"]
HEADS = ["--heads", "attention:2", "--heads", "attention:1,laplacian:1"]


def _argv(corpus: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--text", str(corpus), "--batch-size", "4", "--seq-len", "16", "--layers", "2",
        "--embd", "16", "--eval-size", "4", "--analysis-size", "4", "--device", "cpu",
        "--no-progress", "--threads", "1", "--out", str(out), *extra,
    ]  # fmt: skip


def _holder(out: Path) -> dict:
    """The JSON in the lock file (``{}`` while there is none)."""
    try:
        return json.loads((out / LOCK_NAME).read_text())
    except (OSError, ValueError):
        return {}


def _invocations(out: Path) -> list[dict]:
    try:
        return json.loads((out / INVOCATIONS_NAME).read_text())["invocations"]
    except (OSError, ValueError):
        return []


def _wait_for(condition: Callable[[], bool], process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert process.poll() is None, f"the process ended before {what}"
        assert time.monotonic() < deadline, f"no {what} after 60 s"
        time.sleep(0.005)


def test_a_second_process_exits_2_naming_the_holder_while_the_first_finishes(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The race of issue 21: two ``compare --resume`` on one folder. The first is paused
    (SIGSTOP) while it holds the folder, so the second comes for it at a known moment."""
    out = tmp_path / "out"
    setup = ["compare", *HEADS, *_argv(corpus, out, "--steps", "30", "--eval-every", "10")]
    assert main([*setup, "--stop-at-step", "2"]) == 0  # an interrupted comparison
    capsys.readouterr()
    before = _invocations(out)
    assert [entry["outcome"] for entry in before] == ["stopped"]

    resume = ["compare", "--resume", str(out), "--no-progress", "--threads", "1"]
    first = subprocess.Popen(
        [*HEATFORMER, *resume], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV
    )
    try:
        _wait_for(lambda: _holder(out).get("pid") == first.pid, first, "lock held by the first")
        _wait_for(lambda: len(_invocations(out)) == 2, first, "the first's record")
        first.send_signal(signal.SIGSTOP)  # holds the lock, training its runs
        assert first.poll() is None and _holder(out).get("pid") == first.pid
        second = subprocess.run(
            [*HEATFORMER, *resume], capture_output=True, text=True, timeout=120, env=ENV
        )
        first.send_signal(signal.SIGCONT)
        first_out, first_err = first.communicate(timeout=120)
    finally:
        first.send_signal(signal.SIGCONT)
        first.kill()
    assert second.returncode == 2
    line = second.stderr.strip().splitlines()[-1]
    assert line.startswith(
        f"heatformer compare: error: {out} is in use by pid {first.pid} on "
        f"{socket.gethostname()} since "
    )
    assert "Traceback" not in second.stderr and len(second.stderr.strip().splitlines()) == 1
    assert first.returncode == 0, first_err.decode()
    assert "report: " in first_out.decode()
    # every invocation that trained is recorded, the refused one is not: nothing was lost
    after = _invocations(out)
    assert after[0] == before[0]
    assert [entry["outcome"] for entry in after] == ["stopped", "finished"]
    results = json.loads((out / "results.json").read_text())
    assert [len(run["train_loss"]) for run in results["runs"]] == [30, 30]
    assert results["invocations"] == 2
    assert not list(out.rglob(".*.tmp-*"))  # no temporary of either process is left
    assert _holder(out) == {}  # released by the first when it finished


def test_a_holder_killed_with_sigkill_leaves_a_lock_that_resume_takes(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = _argv(corpus, out, "--steps", "100000", "--ckpt-every", "1", "--eval-every", "100000")
    process = subprocess.Popen(
        [*HEATFORMER, "train", *argv, "--no-analysis"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV,
    )  # fmt: skip
    run_dir = out / "runs" / "c00-attention-s0"
    try:
        _wait_for((run_dir / CHECKPOINT_NAME).is_file, process, "checkpoint")
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    finally:
        process.kill()
    assert process.returncode == -signal.SIGKILL
    assert _holder(out)["pid"] == process.pid  # the dead holder's name stays in the file
    in_flight = run_dir / f".{CHECKPOINT_NAME}.tmp-{process.pid}"
    in_flight.write_bytes(b"half a checkpoint")  # as if killed in the middle of a save

    step = torch.load(run_dir / CHECKPOINT_NAME, weights_only=True)["step"]
    resume = ["train", "--resume", str(out), "--no-progress", "--threads", "1"]
    assert main([*resume, "--stop-at-step", str(step + 2)]) == 0
    assert "is in use" not in capsys.readouterr().err
    assert torch.load(run_dir / CHECKPOINT_NAME, weights_only=True)["step"] == step + 2
    assert not in_flight.exists()  # stale: removed by the new holder
    assert _holder(out) == {}


def test_a_refused_process_writes_nothing_and_removes_no_temporary(
    tiny_spec: SpecFactory, tmp_path: Path
) -> None:
    """The lock held by another process through ``fcntl`` directly (the file protocol): the
    refused ``run_compare`` leaves the holder's in-flight temporary and the records alone."""
    spec = tiny_spec(analysis=False)
    out = tmp_path / "out"
    with pytest.raises(TrainingInterrupted):
        run_compare(spec, out, stop_at_step=2)
    in_flight = out / "runs" / "c01-attention1+laplacian1-s0" / f".{CHECKPOINT_NAME}.tmp-1"
    in_flight.parent.mkdir(parents=True)
    in_flight.write_bytes(b"the other process is writing this")
    records = (out / INVOCATIONS_NAME).read_bytes()
    code = (
        "import fcntl, json, sys\n"
        f"handle = open({str(out / LOCK_NAME)!r}, 'a+')\n"
        "fcntl.flock(handle, fcntl.LOCK_EX)\n"
        "handle.truncate(0)\n"
        "handle.write(json.dumps({'pid': 4242, 'host': 'elsewhere', 'started': 'noon'}))\n"
        "handle.flush()\n"
        "print('locked', flush=True)\n"
        "sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        with pytest.raises(FolderInUse) as err:
            run_compare(spec, out, resume=True)
    finally:
        holder.communicate("", timeout=60)
    assert str(err.value).startswith(f"{out} is in use by pid 4242 on elsewhere since noon")
    assert (err.value.pid, err.value.host) == (4242, "elsewhere")
    assert in_flight.read_bytes() == b"the other process is writing this"
    assert (out / INVOCATIONS_NAME).read_bytes() == records
    assert not list(out.glob("runs/*/result.json"))


@contextlib.contextmanager
def _held_by_another_thread(folder: Path) -> Iterator[None]:
    """The folder's lock, taken by another thread of this process (not this thread's)."""
    with ThreadPoolExecutor(1) as pool:
        lock = pool.submit(FolderLock(folder).acquire).result()
    try:
        yield
    finally:
        lock.release()


def test_in_use_is_exit_2_with_the_holders_pid_and_host(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["train", *_argv(corpus, out, "--steps", "4", "--stop-at-step", "2")]) == 0
    capsys.readouterr()
    with _held_by_another_thread(out):
        assert not holds_lock(out)
        assert main(["train", "--resume", str(out), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert main(["analyze", str(out), "--no-progress"]) == 2  # a writer too
        assert "is in use by" in capsys.readouterr().err
    assert err.startswith(
        f"heatformer train: error: {out} is in use by pid {os.getpid()} on {socket.gethostname()}"
    )
    assert f"(its lock {out / LOCK_NAME})" in err and len(err.strip().splitlines()) == 1
    assert main(["train", "--resume", str(out), "--no-progress"]) == 0  # free again


def test_only_the_holder_removes_temporaries(tmp_path: Path) -> None:
    stale = tmp_path / "runs" / "r" / f".{CHECKPOINT_NAME}.tmp-123"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"x")
    keep = tmp_path / "runs" / "r" / "notes.tmp-123"  # not named as a temporary
    keep.write_bytes(b"x")
    with pytest.raises(ValueError, match="folder: expected a folder whose lock this process"):
        remove_stale_temporaries(tmp_path)
    assert stale.exists()
    with FolderLock(tmp_path):  # the new holder tidies up
        assert not stale.exists() and keep.exists()
        assert holds_lock(stale.parent)
        stale.write_bytes(b"x")
        assert remove_stale_temporaries(stale.parent) == [stale]
    assert keep.exists() and not holds_lock(tmp_path)


def test_a_start_killed_before_spec_json_is_a_new_folder_and_resume_says_what_to_do(
    corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``kill -9`` between the lock and the rename of ``spec.json``: what it leaves."""
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text('{"pid": 99999, "host": "h", "started": "t"}\n')
    (out / ".spec.json.tmp-99999").write_text('{"spec": {"task": "ch')
    assert main(["train", "--resume", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"heatformer train: error: {out}: expected a comparison folder holding spec.json, found "
        f"only what a start killed before it wrote spec.json left (.lock, .spec.json.tmp-99999); "
        f"nothing was trained there, so there is nothing to resume: start the comparison again "
        f"with its flags and --out {out} (the leftovers are removed then), or delete {out}\n"
    )
    # what the message says: the same --out starts afresh
    assert main(["train", *_argv(corpus, out, "--steps", "2", "--no-analysis")]) == 0
    assert not (out / ".spec.json.tmp-99999").exists()
    assert json.loads((out / "spec.json").read_text())["spec"]["steps"] == 2
    # a folder with anything else in it is still refused
    other = tmp_path / "other"
    other.mkdir()
    (other / LOCK_NAME).write_text("")
    (other / "notes.txt").write_text("mine")
    assert main(["train", *_argv(corpus, other, "--steps", "2")]) == 2
    assert "expected a new or empty folder for --out" in capsys.readouterr().err
