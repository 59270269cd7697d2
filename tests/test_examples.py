"""Every script in examples/ runs with small settings and prints sensible numbers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name: str, *args: str, timeout: float = 180) -> str:
    """Run ``examples/name`` with ``args``; assert exit code 0 and return its stdout.

    One torch thread: these models are tiny, and on a busy machine more threads only wait.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True, text=True, timeout=timeout, cwd=EXAMPLES.parent, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def number(pattern: str, text: str) -> float:
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in output:\n{text}"
    return float(match.group(1))


def test_every_example_is_tested() -> None:
    tested = {
        "operators_on_a_toy_graph.py",
        "custom_operator.py",
        "custom_graph.py",
        "train_tiny_gpt.py",
    }
    assert {p.name for p in EXAMPLES.glob("*.py")} == tested


def test_operators_on_a_toy_graph() -> None:
    out = run_example("operators_on_a_toy_graph.py", "--nodes", "12", "--t", "2.0")
    ratio = {
        name: number(rf"{name}\b[^\n]*?\s([\d.]+)\n", out)
        for name in ("attention", "laplacian", "heat", "ppr", "polynomial")
    }
    assert ratio["laplacian"] > 1.2  # high-pass: rougher
    for name in ("attention", "heat", "ppr", "polynomial"):
        assert 0.0 < ratio[name] < 1.0, name  # low-pass: smoother
    assert number(r"max error ([\d.e+-]+)", out) < 1e-6


def test_custom_operator() -> None:
    out = run_example("custom_operator.py", "--steps", "40", "--tokens", "8")
    assert "heads='twohop:2,attention:1,laplacian:1'" in out
    assert number(r"TwoHop heads vs dense reference: max error ([\d.e+-]+)", out) < 1e-5
    mix = re.search(r"mix a: ([\d.]+) -> ([\d.]+)", out)
    assert mix and float(mix.group(1)) == 0.5 and float(mix.group(2)) != 0.5  # it learned
    loss = re.search(r"loss: ([\d.]+) -> ([\d.]+)", out)
    assert loss and float(loss.group(2)) < 0.5 * float(loss.group(1))
    # the fusable LazyWalk: every head on the fused path, right, and served by the KV cache
    assert "TwoHop is fused: False" in out and "fused heads: 4 of 4" in out
    assert number(r"LazyWalk heads vs dense reference: max error ([\d.e+-]+)", out) < 1e-5
    assert "supports_cache=True, cached generation equals recomputation: True" in out


def test_custom_graph() -> None:
    out = run_example("custom_graph.py", "--tokens", "16")
    assert "graph='dilated[d=2,w=3]'" in out
    assert number(r"dense masked softmax: max error ([\d.e+-]+)", out) < 1e-5
    assert number(r"edges per graph: (\d+)", out) == 52  # |i-j| in {0, 2, 4, 6}, j <= i
    assert "GPT graphs: ['dilated[d=2,w=3]', 'softmax']" in out
    assert "cached generation equals recomputation: True" in out
    assert number(r"vs full forward: max error ([\d.e+-]+)", out) < 1e-5
    assert "keys kept per layer after 26 tokens: [7, 26]" in out  # the band needs 7


@pytest.mark.parametrize("heads", ["attention:2,laplacian:2"])
def test_train_tiny_gpt(heads: str) -> None:
    out = run_example(
        "train_tiny_gpt.py", "--heads", heads, "--steps", "40", "--batch-size", "8",
        "--seq-len", "32", "--n-embd", "32", "--max-bytes", "100000",
    )  # fmt: skip
    start = number(r"step 0: val ([\d.]+) bits/char", out)
    final = number(r"final val ([\d.]+) bits/char", out)
    assert 7.0 < start < 9.0  # about log2(256) = 8 before training
    assert 0.0 < final < start - 1.5
