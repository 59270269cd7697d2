"""``make test`` says what it skipped and why, and how to get the browser test run.

The Makefile's targets run here with ``make -n`` (print, do not run) or on the one notice
target; nothing is installed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-s", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("target", ["pytest", "test-oldest"])
def test_the_test_targets_print_the_skip_reasons(target: str) -> None:
    done = _make("-n", target)
    assert done.returncode == 0, done.stderr
    assert '-m pytest -q -rs -m "not slow"' in done.stdout


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
