"""The package a maintainer would publish: built from the tracked files, installed in a fresh venv.

The sdist and the wheel are built (``python -m build``: the wheel from the sdist, as PyPI's
users get it) from a copy of ``git ls-files``, i.e. what a clean clone holds; the sdist holds
the package and its metadata files and no tests (``MANIFEST.in``); the wheel installs into a
fresh venv, imports from there, carries ``LICENSE``, ``py.typed`` and complete metadata, and a
user's mypy types calls into it (``py.typed``: without it mypy treats heatformer as untyped and
the deliberate error below goes unseen).

The fresh venv gets torch and numpy, heatformer's requirements, through a ``.pth`` line to this
venv's site-packages instead of a 700 MB install: ``.pth`` files are not read in a folder that
a ``.pth`` line adds, so this venv's editable heatformer stays out of sight.
"""

from __future__ import annotations

import email
import email.message
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.skipif(shutil.which("git") is None, reason="needs git"),
    pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs a git checkout"),
]

#: What the sdist may hold at its top level, and under src/ (its egg-info is setuptools')
SDIST_TOP = {"LICENSE", "CHANGELOG.md", "README.md", "PKG-INFO", "pyproject.toml", "setup.cfg"}


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel built from the tracked files."""
    pytest.importorskip("build", reason="needs the build package (the dev extra)")
    tree = tmp_path_factory.mktemp("clean-clone")
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, tracked):
        source = ROOT / os.fsdecode(name)
        if source.is_file():  # a file deleted in the work tree but still tracked is skipped
            target = tree / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    out = tree / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(tree)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _only(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    assert len(found) == 1, found
    return found[0]


def test_the_sdist_holds_the_package_and_no_tests(dist: Path) -> None:
    with tarfile.open(_only(dist, "*.tar.gz")) as sdist:
        names = [m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name]
    top = {n.split("/")[0] for n in names if n}
    assert top == SDIST_TOP | {"src"}, top
    under_src = {n.split("/")[1] for n in names if n.startswith("src/") and n.count("/") >= 1}
    assert under_src - {""} == {"heatformer", "heatformer.egg-info"}, under_src
    assert "src/heatformer/py.typed" in names
    assert "src/heatformer/lab/demo/explore.js" in names
    assert not [n for n in names if "/tests/" in n or n.startswith("tests") or "conftest" in n]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_the_wheel_carries_license_types_and_metadata(dist: Path) -> None:
    with zipfile.ZipFile(_only(dist, "*.whl")) as wheel:
        names = wheel.namelist()
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = email.message_from_bytes(wheel.read(f"{info}/METADATA"))
    assert "heatformer/py.typed" in names
    assert f"{info}/licenses/LICENSE" in names
    assert not [n for n in names if n.startswith("tests/")]
    assert metadata["License-Expression"] == "MIT"
    assert metadata["Author"], "no author"
    assert metadata["Home-page"] or metadata.get_all("Project-URL"), "no home page"
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL") or [])
    assert {"Source", "Documentation", "Changelog", "Issues"} <= set(urls), urls
    assert metadata["Requires-Python"] == ">=3.10"
    assert "Typing :: Typed" in (metadata.get_all("Classifier") or [])
    assert metadata["Version"] == _version()
    requires = metadata.get_all("Requires-Dist") or []
    always = {r.split(">")[0].split("=")[0].strip() for r in requires if "extra ==" not in r}
    assert always == {"torch", "numpy"}, requires  # the library; everything else an extra
    lab = {r.split(">")[0].strip() for r in requires if 'extra == "lab"' in r}
    assert {"scipy", "scikit-learn", "tqdm", "matplotlib", "networkx"} <= lab, requires
    entry = [n for n in names if n.endswith("entry_points.txt")]
    assert entry, "no console script"


def _version() -> str:
    init = (ROOT / "src" / "heatformer" / "__init__.py").read_text()
    line = next(x for x in init.splitlines() if x.startswith("__version__"))
    return line.split("=", 1)[1].strip().strip("\"'")


@pytest.fixture(scope="module")
def fresh_venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with the wheel installed (no dependencies from the index)."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
         str(_only(dist, "*.whl"))],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # torch and numpy (the requirements) from this venv, its editable heatformer out of sight
    (Path(site) / "_requirements_from_test_venv.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
    )
    return venv


def test_the_wheel_installs_and_runs_in_a_fresh_venv(fresh_venv: Path) -> None:
    script = textwrap.dedent(
        """
        import json, importlib.metadata as md, torch, heatformer
        from heatformer.graph_ops import SoftmaxGraph, Laplacian
        q = k = v = torch.randn(1, 2, 5, 4)
        out = Laplacian()(SoftmaxGraph(q, k), v)
        print(json.dumps({"file": heatformer.__file__, "version": md.version("heatformer"),
                          "shape": list(out.shape),
                          "requires": md.requires("heatformer")}))
        """
    )
    done = subprocess.run(
        [str(fresh_venv / "bin" / "python"), "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=fresh_venv,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["file"].startswith(str(fresh_venv)), found["file"]
    assert found["version"] == _version() and found["shape"] == [1, 2, 5, 4]
    assert any(r.startswith("torch") for r in found["requires"])


def test_a_users_mypy_types_calls_into_the_installed_wheel(fresh_venv: Path) -> None:
    """``py.typed`` makes mypy read heatformer's hints: a wrong type is an error."""
    pytest.importorskip("mypy", reason="needs mypy (the dev extra)")
    user = fresh_venv.parent / "user"
    user.mkdir()
    (user / "use_it.py").write_text(
        textwrap.dedent(
            """
            from heatformer.graph_ops import Laplacian

            op = Laplacian(normalization="sym")
            good: str = op.normalization
            wrong: int = op.normalization
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--python-executable", str(fresh_venv / "bin" / "python"),
         "--cache-dir", str(user / ".mypy_cache"), "--no-error-summary", "use_it.py"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=user,
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 1, done.stdout + done.stderr
    assert len(lines) == 1, lines
    assert lines[0].startswith("use_it.py:6: error: Incompatible types in assignment"), lines
