"""Every script in examples/ runs with small settings and prints sensible numbers."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

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
        "custom_task.py",
        "train_tiny_gpt.py",
        "hf_head_surgery.py",
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


def test_custom_task_compares_on_a_task_the_library_does_not_have(tmp_path: Path) -> None:
    out = tmp_path / "report"
    printed = run_example("custom_task.py", "--steps", "30", "--seeds", "2", "--out", str(out))
    header = next(line for line in printed.splitlines() if line.startswith("heads"))
    assert header.split()[:4] == ["heads", "seeds", "val_acc", "val_loss"]
    assert "2 configuration(s) x 2 seed(s) = 4 run(s) of 30 steps on 'majority'" in printed
    results = json.loads((out / "results.json").read_text())
    assert results["task"] == "majority" and results["metrics"] == ["val_acc", "val_loss"]
    assert results["spec"]["options"] == {
        "seq_len": 15, "p_one": 0.5, "eval_size": 256, "analysis_size": 64,
    }  # fmt: skip
    assert [row["heads"] for row in results["summary"]] == [
        "attention:2",
        "attention:1,laplacian:1",
    ]
    for run in results["runs"]:
        assert len(run["train_loss"]) == 30
        assert all(math.isfinite(v) for v in run["train_loss"])
        assert all(math.isfinite(v) for v in run["final"].values())
        assert run["model_config"]["block_size"] == 15 and run["model_config"]["pool"] == "mean"
        assert all(math.isfinite(v) for values in run["analysis"].values() for v in values)
    for row in results["summary"]:  # a majority vote is easy for a mean-pooled classifier
        assert row["final"]["val_acc"]["mean"] > 0.75, row
        assert f"{row['heads']}: val_acc" in printed


@pytest.fixture()
def custom_task_module() -> Iterator[ModuleType]:
    """examples/custom_task.py imported here (it registers its task; removed afterwards)."""
    from heatformer.lab.tasks import TASKS

    before = list(TASKS)
    spec = importlib.util.spec_from_file_location("custom_task", EXAMPLES / "custom_task.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it runs
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]
        for name in [name for name in TASKS if name not in before]:
            TASKS.unregister(name)


def test_custom_task_data_are_what_the_example_defines(custom_task_module: ModuleType) -> None:
    import torch

    from heatformer.lab.spec import CompareSpec
    from heatformer.lab.tasks import resolve_task

    assert resolve_task("majority") is custom_task_module.Majority
    spec = CompareSpec(task="majority", heads=("attention:2",), n_layer=1, n_embd=16,
                       options={"seq_len": 9, "p_one": 0.7})  # fmt: skip
    task = resolve_task("majority")(spec)
    bits, labels = task.train_batch(4096, torch.Generator().manual_seed(0))
    assert bits.shape == (4096, 9) and set(bits.unique().tolist()) == {0, 1}
    assert torch.equal(labels, (bits.sum(1) >= 5).long())  # more ones than zeros
    assert abs(bits.float().mean().item() - 0.7) < 0.02  # p_one
    again, _ = task.train_batch(4096, torch.Generator().manual_seed(0))
    assert torch.equal(bits, again)  # the caller's generator decides
    first = torch.cat([x for x, _ in task.eval_batches()])
    assert first.shape == (256, 9)  # eval_size, fixed
    assert torch.equal(first, torch.cat([x for x, _ in task.eval_batches()]))
    x, y = task.analysis_batch()
    assert torch.equal(x, first[:64]) and y.shape == (64,)
    with pytest.raises(ValueError, match="seq_len: expected an odd number of bits, got 8"):
        CompareSpec(task="majority", options={"seq_len": 8})


def test_a_registered_task_gets_its_flags_and_refuses_the_others(
    custom_task_module: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from heatformer.lab.cli import build_parser, main

    assert build_parser().parse_args(["compare", "--p-one", "0.25"]).p_one == 0.25
    out = tmp_path / "out"
    assert main(["train", "--task", "majority", "--text", "x.txt", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (
        "heatformer train: error: --text: only the 'chars' and 'masked' tasks use it, "
        "got task 'majority'\n"
    )
    assert main(["train", "--task", "chars", "--p-one", "0.3", "--out", str(out)]) == 2
    assert "--p-one: only the 'majority' task uses it, got task 'chars'" in capsys.readouterr().err
    assert not out.exists()


def test_hf_head_surgery() -> None:
    pytest.importorskip("transformers")
    out = run_example(
        "hf_head_surgery.py", "--layers", "2", "--width", "32", "--seq-len", "32",
        "--batch-size", "16", "--pretrain-steps", "400", "--finetune-steps", "80",
        "--eval-windows", "32",
    )  # fmt: skip
    base = number(r"base model [^\n]*: val ([\d.]+) bits/byte", out)
    converted = number(r"converted \(attention:2,laplacian:2 in every layer\): val ([\d.]+)", out)
    kl = number(r"in every layer\): [^\n]*KL\(base \|\| converted\) ([\d.]+)", out)
    tuned = number(r"fine-tuning steps: val ([\d.]+) bits/byte, KL", out)
    recovered = number(r"recovered ([\d.-]+)% of the loss increase", out)
    control = number(r"control: base \+ 80 fine-tuning steps: val ([\d.]+)", out)
    assert 2.0 < base < 5.0  # trained below log2(256) = 8 bits
    assert converted > base + 0.1 and kl > 0.1  # the surgery changes the function
    assert tuned < converted - 0.1  # fine-tuning recovers...
    assert abs(tuned - control) < 0.15  # ...about as far as the original fine-tuned alike
    assert recovered == pytest.approx(100 * (converted - tuned) / (converted - base), abs=0.5)
    assert "cached generation equals recomputation: True" in out
