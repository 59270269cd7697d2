"""heatformer.lab.progress: a bar on a terminal, plain periodic lines anywhere else."""

from __future__ import annotations

import io
import re

import pytest

from heatformer.lab import progress as _progress
from heatformer.lab.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_redirected_stream_gets_one_line_per_tenth_and_no_carriage_return() -> None:
    stream = io.StringIO()
    with Progress(300, "c00-attention4-s0", stream=stream) as bar:
        for step in range(300):
            bar.update(1, loss=2.0 + 1 / (step + 1))
    text = stream.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert [int(re.search(r"step (\d+)/300", line)[1]) for line in lines] == list(
        range(30, 301, 30)
    )
    assert re.fullmatch(r"c00-attention4-s0: step 150/300 \(50%\), loss 2\.007, \d+ s", lines[4])


def test_a_slow_job_gets_a_line_every_30_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = {"now": 1000.0}
    monkeypatch.setattr(_progress.time, "monotonic", lambda: clock["now"])
    stream = io.StringIO()
    bar = Progress(1000, "slow", stream=stream)
    for _ in range(5):  # 0.5 % of the work, 31 s apart
        clock["now"] += 31.0
        bar.update(1)
    bar.update(1)  # 1 ms later: no new line
    assert stream.getvalue().splitlines() == [
        f"slow: step {n}/1000 (0%), {31 * n} s" for n in range(1, 6)
    ]


def test_resumed_count_starts_at_initial() -> None:
    stream = io.StringIO()
    bar = Progress(10, "run", initial=4, unit="run", stream=stream)
    bar.update(1)  # 50 %: a new tenth
    bar.update(1)
    assert [line.split(",")[0] for line in stream.getvalue().splitlines()] == [
        "run: run 5/10 (50%)",
        "run: run 6/10 (60%)",
    ]


def test_disabled_report_writes_nothing() -> None:
    stream, terminal = io.StringIO(), Terminal()
    for target in (stream, terminal):
        with Progress(3, "quiet", enabled=False, stream=target) as bar:
            bar.update(3, loss=1.0)
    assert stream.getvalue() == terminal.getvalue() == ""


def test_terminal_gets_a_redrawn_bar() -> None:
    terminal = Terminal()
    with Progress(4, "bar", stream=terminal) as bar:
        for _ in range(4):
            bar.update(1, loss=0.5)
    text = terminal.getvalue()
    assert "\r" in text and "4/4" in text and "loss=0.5" in text
    assert "bar: step" not in text  # no plain lines as well


def test_a_total_raised_midway_counts_the_work_found() -> None:
    stream, terminal = io.StringIO(), Terminal()
    bar = Progress(4, "cmp", unit="run", stream=stream, every_fraction=0.25)
    bar.update(4)
    bar.raise_total(8)  # a tuned grid extended: 4 more runs
    bar.raise_total(6)  # a smaller total changes nothing
    bar.update(2)
    assert [line.split(",")[0] for line in stream.getvalue().splitlines()] == [
        "cmp: run 4/4 (100%)",
        "cmp: run 6/8 (75%)",
    ]
    with Progress(2, "bar", unit="run", stream=terminal) as shown:
        shown.update(2)
        shown.raise_total(3)
        shown.update(1)
    assert "3/3" in terminal.getvalue()
