"""Shared helpers for the benchmark scripts: machine info, timing, memory, tables, targets.

Benchmarks measure and print; they never assert a timing. Conventions used by every script:

- Timings are wall-clock (:func:`time.perf_counter`), after warm-up, reported as the median of
  a few repeats. Competing implementations are timed *round-robin* (one call of each per
  round) by :func:`compare`, so a load spike on a shared machine hits all of them alike and
  the ratios stay meaningful even when absolute times drift.
- Peak memory is the growth of the resident set (RSS) of a fresh child process over its level
  just before the measured call (:func:`run_child` + :class:`PeakRSS`); the child warms the same
  code path at a tiny size first, so one-time costs (code pages, thread pools) are excluded.
- Targets are printed as ``PASS``/``FAIL`` lines with the measured ratio (:func:`target`).
"""

from __future__ import annotations

import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "PeakRSS",
    "Timing",
    "compare",
    "cpu_busy_fraction",
    "fmt_bytes",
    "fmt_ratio",
    "fmt_time",
    "machine_info",
    "matmul_rate",
    "print_machine",
    "print_table",
    "rss_bytes",
    "run_child",
    "target",
    "time_call",
    "wait_for_quiet",
]


# ---- machine --------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    m = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return m.group(1).strip() if m else platform.machine()


def machine_info() -> dict[str, Any]:
    """CPU model, core counts, load, memory and library versions (a JSON-able dict)."""
    import torch

    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "cpu_busy_now": None,
    }
    busy = cpu_busy_fraction(1.0)
    info["cpu_busy_now"] = None if busy is None else f"{busy:.0%}"
    try:
        mem = re.search(r"MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text())
        info["memory"] = fmt_bytes(int(mem.group(1)) * 1024) if mem else None
    except OSError:
        info["memory"] = None
    for mod in ("numpy", "scipy", "torch_geometric"):
        try:
            info[mod] = __import__(mod).__version__
        except ImportError:
            info[mod] = "not installed"
    return info


def print_machine(info: dict[str, Any] | None = None) -> dict[str, Any]:
    """Print :func:`machine_info` (or ``info``) as one block and return it."""
    info = info or machine_info()
    print("## machine")
    for key, value in info.items():
        print(f"  {key:15s} {value}")
    busy = info.get("cpu_busy_now")
    if busy is not None and float(busy.rstrip("%")) >= 20:
        print(
            f"  WARNING: the CPUs are {busy} busy before the benchmark starts: other processes "
            "are running, times will be noisy (use --wait-quiet on a shared machine)"
        )
    print()
    return info


# ---- formatting -----------------------------------------------------------------------------


def fmt_time(seconds: float | None) -> str:
    """``1.23 s`` / ``45.6 ms`` / ``789 us``; ``-`` for None."""
    if seconds is None:
        return "-"
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} us"


def fmt_bytes(n: float | None) -> str:
    """Bytes in decimal units (``1.50 GB`` = 1.5e9 bytes); ``-`` for None."""
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_ratio(r: float | None) -> str:
    """``12.3x``; ``-`` for None."""
    if r is None:
        return "-"
    return f"{r:.1f}x" if r >= 10 else f"{r:.2f}x"


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "") -> None:
    """Print a Markdown pipe table (readable in a terminal, pasteable into docs)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"

    if title:
        print(title)
        print()
    print(line(cells[0]))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells[1:]:
        print(line(row))
    print()


def target(
    name: str, ratio: float | None, threshold: float, *, higher_is_better: bool = True
) -> str:
    """One ``PASS``/``FAIL`` line comparing a measured ratio or size with a target (printed)."""
    if ratio is None:
        line = f"SKIP  {name}: not measured"
    else:
        ok = ratio >= threshold if higher_is_better else ratio < threshold
        sign = ">=" if higher_is_better else "<"
        verdict = "PASS" if ok else "FAIL"
        line = f"{verdict}  {name}: measured {ratio:.3g} (target {sign} {threshold:g})"
    print(line)
    return line


# ---- timing ---------------------------------------------------------------------------------


@dataclass
class Timing:
    """Repeated wall-clock times of one callable (seconds)."""

    times: list[float] = field(default_factory=list)
    warmup: float | None = None

    @property
    def median(self) -> float | None:
        return statistics.median(self.times) if self.times else None

    @property
    def n(self) -> int:
        return len(self.times)

    def as_dict(self) -> dict[str, Any]:
        return {"median_s": self.median, "runs": self.n, "times_s": self.times}


def time_call(fn: Callable[[], Any]) -> float:
    """Wall-clock seconds of one call."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def compare(
    fns: dict[str, Callable[[], Any]],
    *,
    repeats: int = 5,
    warmup: int = 1,
    budget_s: float = 20.0,
    min_repeats: int = 1,
) -> dict[str, Timing]:
    """Time several callables side by side, round-robin, and return one :class:`Timing` each.

    Each callable is called ``warmup`` times first (the last warm-up time is kept). A callable
    then takes part in ``min(repeats, budget_s / warmup_time)`` rounds (at least
    ``min_repeats``), so a slow competitor is timed fewer times instead of stretching the run.
    """
    result: dict[str, Timing] = {}
    for name, fn in fns.items():
        t = Timing()
        for _ in range(max(warmup, 0)):
            t.warmup = time_call(fn)
        result[name] = t
    planned = {}
    for name, t in result.items():
        est = t.warmup or 0.0
        n = repeats if est <= 0 else int(budget_s / est)
        planned[name] = max(min_repeats, min(repeats, n))
    for r in range(max(planned.values(), default=0)):
        for name, fn in fns.items():
            if r < planned[name]:
                result[name].times.append(time_call(fn))
    return result


def matmul_rate(n: int = 1024, calls: int = 7, device: str = "cpu") -> float:
    """Best float32 rate (flop/s) of a square ``n x n`` matrix product on this machine.

    Large square products are what the BLAS does best, so this is the practical peak against
    which the flop count of an algorithm gives a floor on its time (a *ceiling* on a speed-up).
    Uses torch's current intra-op thread count; the fastest of ``calls`` calls is kept.
    """
    import torch

    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    best = float("inf")
    for _ in range(calls + 1):  # the first call warms up
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ b
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def cpu_busy_fraction(interval: float = 1.0) -> float | None:
    """Fraction of all CPUs' time spent busy (any process) over ``interval`` s (``/proc/stat``)."""

    def snap() -> tuple[int, int] | None:
        try:
            fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        except (OSError, IndexError):
            return None
        vals = [int(v) for v in fields]
        idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
        return sum(vals), idle

    a = snap()
    time.sleep(interval)
    b = snap()
    if a is None or b is None or b[0] == a[0]:
        return None
    return 1.0 - (b[1] - a[1]) / (b[0] - a[0])


def wait_for_quiet(max_wait_s: float, threshold: float = 0.2) -> tuple[float, float | None]:
    """Wait until other processes leave the CPUs idle (busy fraction < ``threshold``).

    On a shared machine, a second process on a 2-core box makes every multi-threaded op wait
    for a scheduler time slice (ms), which swamps sub-millisecond kernels. Returns
    ``(seconds waited, busy fraction seen last)``; gives up after ``max_wait_s``.
    """
    t0 = time.perf_counter()
    busy = cpu_busy_fraction()
    while busy is not None and busy >= threshold and time.perf_counter() - t0 < max_wait_s:
        busy = cpu_busy_fraction(2.0)
    return time.perf_counter() - t0, busy


# ---- memory ---------------------------------------------------------------------------------


def rss_bytes() -> int | None:
    """Current resident set size of this process (Linux ``/proc``), or None."""
    try:
        m = re.search(r"VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text())
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


class PeakRSS:
    """Peak RSS growth over a block: ``with PeakRSS() as p: ...; p.extra`` (bytes).

    On Linux the kernel's high-water mark (``VmHWM``) is reset on entry by writing ``5`` to
    ``/proc/self/clear_refs``, so ``extra = VmHWM_after - VmRSS_before`` is the block's own
    peak. Where that reset is not possible it falls back to
    ``ru_maxrss_after - ru_maxrss_before`` (only a lower bound if the process peaked higher
    earlier) and says so in :attr:`method`. Run it in a fresh child process (:func:`run_child`)
    so earlier work does not leave memory behind.
    """

    def __init__(self) -> None:
        self.before: int | None = None
        self.peak: int | None = None
        self.method = ""
        self._ru_before = 0

    @staticmethod
    def _hwm() -> int | None:
        try:
            m = re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())
        except OSError:
            return None
        return int(m.group(1)) * 1024 if m else None

    def __enter__(self) -> PeakRSS:
        self.before = rss_bytes()
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.method = "VmHWM reset via /proc/self/clear_refs"
        except OSError:
            self.method = "ru_maxrss delta (lower bound)"
        self._ru_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return self

    def __exit__(self, *exc: object) -> None:
        if self.method.startswith("VmHWM"):
            self.peak = self._hwm()
        else:
            self.peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            self.before = self._ru_before

    @property
    def extra(self) -> int | None:
        if self.peak is None or self.before is None:
            return None
        return max(0, self.peak - self.before)


def run_child(
    script: str | Path,
    args: Sequence[str],
    *,
    timeout: float = 900.0,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``python script *args`` in a fresh process; it must print one JSON object last.

    Args:
        script: the script to run with this interpreter.
        args: its command-line arguments.
        timeout: seconds before the child is killed.
        env: extra environment variables for the child (added to this process's).

    Returns the parsed object, or ``{"error": ...}`` if the child failed or timed out.
    """
    cmd = [sys.executable, str(script), *args]
    full_env = {**os.environ, **(env or {})}
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, check=False, env=full_env
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
    return json.loads(lines[-1])
