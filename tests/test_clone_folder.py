"""The suite passes wherever the checkout lives, in a folder named ``heatformer`` too.

``git clone <repo> heatformer`` puts ``/heatformer/`` in every path under the checkout: the
tests', and torch's when the venv is ``heatformer/.venv``. The sync spy of
``tests/test_syncs.py`` once kept the first stack frame whose *path* contained ``/heatformer/``,
so in such a clone it blamed its own frame and ``make test`` failed there, while CI (another
folder name) stayed green. Here the path-sensitive tests run in a copy of the checkout named
``heatformer``, with the venv reached as ``heatformer/.venv`` (a link to this one), as a user's
clone has it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The tests whose outcome once depended on the checkout's path, and one that reads the
#: source tree by path (it must find the same tree there).
PATH_SENSITIVE = (
    "tests/test_syncs.py::test_the_cpu_topk_read_is_the_only_one",
    "tests/test_layout.py",
)


def _copy_checkout(target: Path) -> None:
    """The files a test run reads: the package, the tests and their configuration."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    for name in ("src", "tests", "docs"):
        shutil.copytree(ROOT / name, target / name, ignore=ignore)
    for name in ("conftest.py", "pyproject.toml", "setup.cfg", "README.md"):
        shutil.copy2(ROOT / name, target / name)


@pytest.mark.skipif(
    not (Path(sys.prefix) / "bin" / "python").exists(), reason="needs a POSIX venv layout"
)
def test_the_path_sensitive_tests_pass_in_a_clone_named_heatformer(tmp_path: Path) -> None:
    clone = tmp_path / "heatformer"
    _copy_checkout(clone)
    (clone / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    python = clone / ".venv" / "bin" / "python"
    env = {**os.environ, "PYTHONPATH": str(clone / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    where = subprocess.run(
        [str(python), "-c", "import heatformer, torch; print(heatformer.__file__, torch.__file__)"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert where.returncode == 0, where.stderr
    package, torch_file = where.stdout.split()
    # the conditions of the bug: both the package and torch under a folder named heatformer
    assert package.startswith(f"{clone}/src/heatformer/"), package
    assert "/heatformer/.venv/" in torch_file, torch_file
    done = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:xdist", *PATH_SENSITIVE],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout, done.stdout[-2000:]
