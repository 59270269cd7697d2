"""The device plumbing of the tests, proven on a machine without a GPU.

``pytest -m cuda`` is the whole CUDA test run: the combination matrix and the layer, model,
integration and analysis tests take a ``device`` (tests/device_helpers.py), whose CUDA case
is marked ``cuda``. Without CUDA those cases are collected and skipped at setup, naming
the reason; here a ``pytest -m cuda`` run in a subprocess checks that they are many, that they
span those folders, and that every one of them is such a skip (none passes on the CPU by
mistake, none is skipped for another reason).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from device_helpers import DEVICES, SKIP_REASON, TOL, close, tolerance

ROOT = Path(__file__).resolve().parent.parent

#: the files and folders whose tests take a device, and the fewest CUDA cases each must hold
#: (today: the matrix 3216, the models 162, the integrations 45, analysis 21, the graph tests
#: 36 and the operator tests 104, 3584 in all)
CUDA_CASES = {
    "tests/test_matrix.py": 3000,
    "tests/models": 150,
    "tests/integrations": 40 if importlib.util.find_spec("transformers") else 0,
    "tests/analysis": 20,
    "tests/graph_ops/test_graphs.py": 30,
    "tests/graph_ops/test_operators.py": 90,
}


def test_the_devices_are_the_cpu_and_cuda_marked_cuda() -> None:
    """Two real devices (no ``meta`` stand-in): the CPU unmarked, CUDA marked and skipped where
    there is none."""
    assert [p.values[0] for p in DEVICES] == [torch.device("cpu"), torch.device("cuda")]
    assert [p.id for p in DEVICES] == ["cpu", "cuda"]
    cpu, cuda = DEVICES
    assert not cpu.marks
    names = sorted(mark.name for mark in cuda.marks)
    assert names == ["cuda", "skipif"]
    (skip,) = (mark for mark in cuda.marks if mark.name == "skipif")
    assert skip.kwargs["reason"] == SKIP_REASON
    assert skip.args == (not torch.cuda.is_available(),)


def test_tolerances_are_the_cpus_on_the_cpu_and_looser_on_cuda() -> None:
    assert TOL["cpu"] == {
        torch.float64: 1e-9,
        torch.float32: 1e-4,
        torch.float16: 2e-2,
        torch.bfloat16: 8e-2,
    }  # the combination matrix's tolerances before it took a device
    assert tolerance("cuda:0", torch.float64) == tolerance("cpu", torch.float64)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        assert tolerance(torch.device("cuda"), dtype) > tolerance("cpu", dtype)
    assert close("cpu", torch.float32, atol=2e-6, rtol=1e-5) == {"atol": 2e-6, "rtol": 1e-5}
    assert close("cuda", torch.float64, atol=1e-12, rtol=1e-10) == {"atol": 1e-12, "rtol": 1e-10}
    with pytest.raises(ValueError, match=r"^device: expected one of \['cpu', 'cuda'\], got 'meta'"):
        tolerance("meta", torch.float32)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="with CUDA, `pytest -m cuda` runs these cases for real"
)
def test_pytest_m_cuda_selects_the_cuda_cases_and_skips_each_without_cuda() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    src = str(ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-rs", "-p", "no:randomly",
         *CUDA_CASES],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = run.stdout
    assert run.returncode == 0, out[-3000:] + run.stderr[-3000:]
    summary = out.strip().splitlines()[-1]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", summary)}
    ran = set(counts) - {"skipped", "deselected", "warning", "warnings"}
    assert not ran and counts["skipped"] > 0, summary  # nothing passed, failed or erred
    # -rs: one "SKIPPED [count] path:line: reason" per test function
    found = re.findall(r"^SKIPPED \[(\d+)\] (\S+?):\d+: (.*)$", out, flags=re.MULTILINE)
    assert sum(int(count) for count, _, _ in found) == counts["skipped"], summary
    # a module whose library is not installed (transformers) is skipped whole, at collection
    skips = [skip for skip in found if not skip[2].startswith("could not import")]
    reasons = Counter(reason for _, _, reason in skips)
    assert set(reasons) == {SKIP_REASON}, reasons
    per_path: Counter[str] = Counter()
    for count, path, _ in skips:
        per_path[next(p for p in CUDA_CASES if path.startswith(p))] += int(count)
    assert sum(per_path.values()) > 3000
    for path, least in CUDA_CASES.items():
        assert per_path[path] >= least, (path, per_path)
