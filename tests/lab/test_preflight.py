"""The memory preflight and ``--dry-run`` of ``heatformer compare`` / ``train``.

The estimate (:func:`heatformer.lab.preflight.estimate_memory`) is checked against the
measured peaks of real runs: each case runs in a fresh subprocess with one thread, which loads
the task's data and then trains the same whole run (steps, evaluations, analysis) twice. Before
each run it resets its peak resident size (``5 > /proc/self/clear_refs``) and reads its resident
size; after it, its peak (``VmHWM``). The second run's peak over its start is what the model
costs, which the estimate less ``R_0`` must predict within 30 %. The first run's peak is
higher by what a process loads once (kernels, lazily imported modules, the code pages it
touches): its anonymous part (less the growth of file-backed pages, which depend on the
machine's page cache) must fit in ``R_0``. The subprocess sets glibc's heap as the command
does (:func:`heatformer.lab.cli._heap.fix_mmap_threshold`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from heatformer.graph_ops import resolve_graph
from heatformer.lab import preflight
from heatformer.lab.cli import main
from heatformer.lab.compare import validate_spec
from heatformer.lab.preflight import (
    MemoryEstimate,
    StepTimes,
    check_memory,
    estimate_memory,
    evaluations_per_run,
    plan_time,
)
from heatformer.lab.spec import CompareSpec

ROOT = Path(__file__).resolve().parents[2]

_PROBE = r"""
import json, re, sys, tempfile
from pathlib import Path
import torch
torch.set_num_threads(1)
from heatformer.lab.cli import main
from heatformer.lab.spec import CompareSpec
from heatformer.lab import preflight
from heatformer.lab.compare import validate_spec
from heatformer.lab.cli._heap import fix_mmap_threshold
from heatformer.lab.trainer import train_run
assert fix_mmap_threshold(), "glibc's mmap threshold was not set"  # as the command does

def status(key):
    text = Path("/proc/self/status").read_text()
    return int(re.search(key + r":\s+(\d+)", text).group(1)) * 1024

spec = CompareSpec(**json.loads(sys.argv[1]))
task = validate_spec(spec)
runs = []
for _ in range(2):
    Path("/proc/self/clear_refs").write_text("5")  # the peak so far is not this run's
    start, files = status("VmRSS"), status("RssFile")
    with tempfile.TemporaryDirectory() as folder:
        train_run(task, spec.heads[0], spec.seeds[0], Path(folder) / "run")
    runs.append({"peak": status("VmHWM") - start, "files": status("RssFile") - files})
print(json.dumps({"first": runs[0], "second": runs[1]}))
"""

#: small whole runs (4 steps: the peak settles after a few), a few seconds each
CASES = {
    "chars softmax": {"task": "chars", "n_layer": 2, "options": {"eval_size": 64}},
    "recall window": {"task": "recall", "n_layer": 2, "graph": "window[w=32]",
                      "options": {"seq_len": 256, "eval_size": 32, "analysis_size": 32}},
    "digits": {"task": "digits", "n_layer": 2},
    "recall checkpointed": {"task": "recall", "n_layer": 3, "activation_checkpointing": True,
                            "options": {"seq_len": 512, "eval_size": 16, "analysis_size": 16}},
    "chars heat": {"task": "chars", "n_layer": 2, "heads": ["attention:2,heat:2"],
                   "options": {"eval_size": 64}},  # c_op
}  # fmt: skip
TOPK = {"task": "recall", "n_layer": 2, "graph": "topk[k=16]",
        "options": {"seq_len": 256, "eval_size": 32, "analysis_size": 32}}  # fmt: skip
STEPS = {"steps": 4, "eval_every": 4}


def _probe(values: dict[str, object]) -> subprocess.Popen[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
    env |= {"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", _PROBE, json.dumps(values)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


@dataclass(frozen=True)
class Measured:
    """One case's two runs in one process (see the module docstring), bytes."""

    first: int  #: the first run's peak over its start
    second: int  #: the second run's peak over its start
    files: int  #: the growth of file-backed pages during the first run

    @property
    def once(self) -> int:
        """The anonymous memory the first run's peak adds over the second's."""
        return self.first - self.files - self.second


def measure(cases: dict[str, dict[str, object]]) -> dict[str, Measured]:
    """Each case's runs, the cases side by side (one process and one thread each)."""
    probes = {name: _probe(values) for name, values in cases.items()}
    measured = {}
    for name, probe in probes.items():
        out, err = probe.communicate(timeout=300)
        assert probe.returncode == 0, err
        runs = json.loads(out.splitlines()[-1])
        measured[name] = Measured(runs["first"]["peak"], runs["second"]["peak"],
                                  runs["first"]["files"])  # fmt: skip
    return measured


def estimate(values: dict[str, object]) -> MemoryEstimate:
    spec = CompareSpec(**values)  # type: ignore[arg-type]
    return estimate_memory(validate_spec(spec), spec.heads[0])


def check_estimate(values: dict[str, object], measured: Measured) -> None:
    """The estimate less ``R_0`` within 30 % of the second run's peak; ``R_0`` covers the
    anonymous memory the first run adds."""
    guess = estimate(values)
    model = guess.total - guess.runtime
    assert 0.7 <= model / measured.second <= 1.3, (guess, measured)
    assert measured.once <= guess.runtime, (guess, measured)


needs_proc = pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="measures peaks through Linux's /proc"
)


@pytest.fixture(scope="module")
def peaks() -> dict[str, Measured]:
    return measure({name: {**values, **STEPS} for name, values in CASES.items()})


@needs_proc
@pytest.mark.parametrize("name", CASES)
def test_estimate_within_30_percent_of_measured_peak(name: str, peaks: dict[str, Measured]) -> None:
    check_estimate({**CASES[name], **STEPS}, peaks[name])


@needs_proc
@pytest.mark.slow
def test_topk_estimate_within_30_percent_of_measured_peak() -> None:
    values = {**TOPK, **STEPS}
    check_estimate(values, measure({"topk": values})["topk"])


def test_graph_kinds_declare_their_edges() -> None:
    assert resolve_graph("softmax").edges_per_row(100) == 100
    assert resolve_graph("softmax").saved_bytes_per_edge(4) == 0  # the fused SDPA path
    assert resolve_graph("topk[k=8]").edges_per_row(100) == 8
    assert resolve_graph("topk[k=8]").edges_per_row(5) == 5
    # two int32 indices, the weight, the softmax's output and the clamp's input, a mask byte
    assert resolve_graph("topk[k=8]").saved_bytes_per_edge(4) == 21
    window = resolve_graph("window[w=4,global=2]")
    assert window.edges_per_row(100, causal=True) == 6
    assert window.edges_per_row(100) == 11
    assert window.saved_bytes_per_edge(4) == 4


def test_estimate_grows_linearly_in_batch_and_edges() -> None:
    spec = CompareSpec(task="recall", options={"seq_len": 64, "eval_size": 8}, analysis=False)
    task = validate_spec(spec)
    one, two = (estimate_memory(task, "attention", batch_size=b).training for b in (8, 16))
    assert two == pytest.approx(2 * one, rel=1e-6)
    soft = estimate_memory(task, "attention").training
    topk = estimate_memory(validate_spec(CompareSpec(task="recall", graph="topk[k=16]", options={
        "seq_len": 64, "eval_size": 8}, analysis=False)), "attention").training  # fmt: skip
    # 4 layers x 4 heads x 16 edges x 21 bytes per token
    assert topk - soft == pytest.approx(32 * 64 * 4 * 4 * 16 * 21, rel=1e-3)


def test_checkpointed_estimate_keeps_the_inputs_and_one_layer() -> None:
    """With activation checkpointing the training term is ``2 s D`` per token and layer plus
    the largest residual branch (here the attention branch and its edges), not the sum over
    the layers."""
    options = {"seq_len": 64, "eval_size": 8}
    plain, ck = (
        estimate_memory(
            validate_spec(
                CompareSpec(
                    task="recall",
                    graph="topk[k=16]",
                    options=options,
                    analysis=False,
                    activation_checkpointing=on,
                )
            ),
            "attention",
        ).training
        for on in (False, True)
    )
    logits = 3 * 4 * 32 * 1 * 144  # (B, n = 1, V = 144) logits, their copy and gradient
    layer = 4 * 20 * 128 + 4 * 16 * 21  # per token: one layer's (12 + 2 r) D values, 4 heads' edges
    assert plain == pytest.approx((32 * 64 * 4 * layer + logits), rel=1e-3)
    branch = max(4 * 8 * 128 + 4 * 16 * 21, 4 * (2 + 8) * 128)  # attention vs MLP
    expected = 32 * 64 * (2 * 4 * 128 * 4 + branch) + logits
    assert ck == pytest.approx(expected, rel=1e-3)


def test_check_memory_refuses_naming_the_flags() -> None:
    estimate = MemoryEstimate(weights=10**9, training=4 * 10**9, evaluation=10**9)
    check_memory(estimate, (8 * 10**9, "MemAvailable"))  # fits: no error
    check_memory(estimate, None)  # unknown: no error
    with pytest.raises(ValueError, match=r"--batch-size or --seq-len \(now 4096\)") as info:
        check_memory(estimate, (2 * 10**9, "MemAvailable"), seq_len=4096)
    assert info.value.argument == "batch_size"  # type: ignore[attr-defined]
    assert "--force" in str(info.value) and "2.00 GB available" in str(info.value)


def test_plan_time_counts_steps_evaluations_and_analysis() -> None:
    spec = CompareSpec(heads=("attention", "attention:2,heat:2"), seeds=(0, 1), steps=10,
                       eval_every=4)  # fmt: skip
    assert evaluations_per_run(spec) == 3  # steps 4, 8 and the last
    times = {"attention": StepTimes(1.0, 2.0, 5.0), "attention:2,heat:2": StepTimes(2.0, 3.0, 5.0)}
    assert plan_time(spec, times) == 2 * ((10 + 6 + 5) + (20 + 9 + 5))


def test_dry_run_prints_the_plan_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code = main(["train", "--task", "digits", "--layers", "1", "--embd", "32", "--steps", "40",
                 "--out", str(tmp_path / "run"), "--dry-run"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "1 run(s) x 40 steps, 10 evaluation(s) per run" in out
    assert "estimated time:" in out and "estimated peak memory:" in out
    assert "one evaluation and one analysis per configuration" in out
    assert list(tmp_path.iterdir()) == []  # no run folder, no runs/


def test_memory_refusal_is_status_2_and_force_passes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["compare", "--task", "recall", "--seq-len", "16384", "--batch-size", "4096",
            "--steps", "1", "--no-analysis", "--dry-run"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("heatformer compare: error: --batch-size: the estimated peak")
    assert "--seq-len (now 16384)" in err and "--force" in err
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(preflight, "time_steps", lambda *a, **k: StepTimes(1.0, 1.0, 0.0))
    assert main([*args, "--force"]) == 0  # the check is skipped (nothing is timed here)
    out = capsys.readouterr().out
    assert "estimated time: 0.0 min for 1 run(s)" in out  # 1 step + 1 evaluation of 1 s
    assert "analysis" not in out  # --no-analysis: none timed, none counted, none named
    assert "dry run: nothing trained, nothing written" in out
