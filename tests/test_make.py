"""``make test`` says what it skipped and why, and how to get the browser test run.

The Makefile's targets run here with ``make -n`` (print, do not run) or on the one notice
target; nothing is installed. The skip summary is the root conftest's hook, called here.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-s", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60
    )


def test_a_run_ends_with_its_skips_counted_by_reason() -> None:
    """``make test`` ended with "179 skipped" and no reason: the root conftest's summary."""
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    assert spec is not None and spec.loader is not None
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)

    def skipped(reason: str) -> SimpleNamespace:
        return SimpleNamespace(longrepr=("tests/x.py", 3, f"Skipped: {reason}"))

    lines: list[str] = []
    reporter = SimpleNamespace(
        stats={"skipped": [skipped("needs Chromium")] + [skipped("needs a CUDA device")] * 3},
        section=lambda title, sep: lines.append(f"{sep} {title}"),
        line=lines.append,
    )
    conftest.pytest_terminal_summary(reporter)
    assert lines == [
        "- skipped, by reason",
        "     3  needs a CUDA device",
        "     1  needs Chromium",
    ]
    lines.clear()
    conftest.pytest_terminal_summary(SimpleNamespace(stats={}, line=lines.append))
    assert lines == []


def test_without_chromium_make_test_says_how_to_get_the_browser_test() -> None:
    done = _make("browser-notice", "CHROMIUM=")
    assert done.returncode == 0 and done.stdout == ""
    assert done.stderr == (
        "make: no Chromium on PATH, so tests/viz/test_demo_browser.py skips (the interactive "
        "demo page is not rendered); 'make chromium' installs it (apt-get install chromium)\n"
    )
    quiet = _make("browser-notice", "CHROMIUM=/usr/bin/chromium")
    assert quiet.returncode == 0 and quiet.stdout == quiet.stderr == ""
    for target in ("pytest", "test-oldest"):  # both run the notice before the tests
        assert "make: no Chromium on PATH" in _make("-n", target, "CHROMIUM=").stdout


def test_the_docs_build_is_strict_and_shows_its_warnings() -> None:
    """``mkdocs build --strict --quiet`` passed a griffe warning that ``--strict`` alone aborts
    on: ``--quiet`` drops warnings below the level that strict mode counts."""
    line = next(x for x in _make("-n", "docs").stdout.splitlines() if "mkdocs build" in x)
    assert "--strict" in line.split() and "--quiet" not in line.split() and "-q" not in line
