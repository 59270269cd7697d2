"""The prepared GPU check (``benchmarks/gpu_check.py``) runs end to end without a GPU.

``--dry-run`` runs every section -- the pytest subprocess, the five benchmarks, each in its own
process -- on the CPU at tiny sizes and must write a report with every section ``ok`` and a
number in every measurement, so that the first run on a GPU is not a debugging run. Without
``--dry-run`` and without CUDA it refuses in one line with exit status 2.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from heatformer.graph_ops.window.flex import flex_available

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    path = [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT, check=False,
    )  # fmt: skip


def positive(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_dry_run_reports_every_section_with_numbers(tmp_path: Path) -> None:
    script = load_script()
    proc = run("--dry-run", "--out", str(tmp_path), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    sections = report["sections"]
    assert list(sections) == list(script.SECTIONS)
    for name, sec in sections.items():
        assert sec["status"] == "ok", (name, sec.get("error"), sec.get("traceback"))
    assert report["meta"]["dry_run"] is True
    assert report["meta"]["wall_s"] < script.DEADLINE

    pytest_run = sections["pytest"]
    assert pytest_run["rc"] == 0 and "skipped" in pytest_run["summary"]

    heads = sections["laplacian_heads"]["results"]
    assert len(heads) == 4 and all(positive(r["median_s"]) for r in heads.values())

    heat = sections["heat_series"]["results"]
    assert len(heat) == 2
    for r in heat.values():
        assert r["K"] >= 2 and positive(r["ratio_per_term"]), r

    window = sections["window_long"]["results"]
    assert window
    if not flex_available():  # an older torch: the section says so
        assert list(window) == ["all"] and "unavailable" in window["all"]["skipped"]
        window = {}
    for record in window.values():
        assert record["auto_backend"] == "kernels"  # the CPU's default
        for name in ("heatformer auto", "heatformer kernels", "heatformer flex",
                     "flex sliding window (peer)"):  # fmt: skip
            assert positive(record[name]["median_s"]) and positive(record[name]["ratio_to_peer"])

    gpt2 = sections["hf_gpt2"]["results"]
    assert gpt2["max_abs_logit_diff_all_attention"] < 1e-4
    assert all(positive(r["ratio"]) for k, r in gpt2.items() if isinstance(r, dict))

    moon = sections["moonshot"]
    assert moon["largest_N"] in script.SIZES["dry"]["moon"]["Ns"]
    assert positive(moon["results"][f"N={moon['largest_N']}"]["time_s"])

    targets = [t for sec in sections.values() for t in sec.get("targets", [])]
    # one target per window size only where FlexAttention (the peer) exists
    assert len(targets) == (7 if flex_available() else 6)
    assert all(positive(t["measured"]) for t in targets)
    table = (tmp_path / "gpu_check.md").read_text()
    assert "## Targets" in table and "dry run" in table
    for name in script.SECTIONS:
        assert f"| {name} | ok |" in table


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_refuses_without_cuda_in_one_line(tmp_path: Path) -> None:
    proc = run("--out", str(tmp_path), timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: no CUDA device")
    assert "--dry-run" in lines[0] and "TORCH_SPEC=torch" in lines[0]
    assert not (tmp_path / "gpu_check.json").exists()
