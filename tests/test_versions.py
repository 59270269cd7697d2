"""The declared versions are the tested ones.

``make test-oldest`` runs the suite on the versions pinned by ``.ci/oldest.txt``: each pin must
be exactly the floor ``setup.cfg`` declares (a floor raised or lowered without the pins would
be a declared version nobody runs), every runtime requirement must have a floor and a pin, and
the documentation must state the same floors.
"""

from __future__ import annotations

import configparser
import importlib.metadata
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from heatformer.integrations.timm import MIN_TIMM

ROOT = Path(__file__).resolve().parents[1]
#: the extras whose requirements the oldest cell installs, and the dev tools that run it
EXTRAS = ("networkx", "scipy", "pyg", "viz", "lab", "hf", "tensorboard")
DEV_TOOLS = ("pytest", "pytest-xdist", "hypothesis")
#: the install line of timm, which comes without its dependencies (its torchvision would
#: replace the CPU torch); its floor is heatformer.integrations.timm.MIN_TIMM
TIMM_INSTALL = f"pip install --no-deps 'timm>={MIN_TIMM}'"


def _setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return cfg


def _requirements() -> dict[str, Requirement]:
    cfg = _setup_cfg()
    extras = cfg["options.extras_require"]
    values = [cfg["options"]["install_requires"], *(extras[extra] for extra in EXTRAS)]
    reqs = [Requirement(line) for value in values for line in value.split() if line]
    reqs.append(Requirement(f"timm>={MIN_TIMM}"))
    dev = [Requirement(line) for line in extras["dev"].split()]
    return {r.name: r for r in reqs + [r for r in dev if r.name in DEV_TOOLS]}


def test_the_timm_extra_is_timms_dependencies_but_torch_and_torchvision() -> None:
    """``pip install 'heatformer[timm]'`` must not pull torchvision (for a CPU torch, a CUDA
    build that replaces it): the extra lists what timm needs besides torch and torchvision,
    plus pillow, which ``timm.data`` imports and torchvision would bring; timm itself is
    installed with ``--no-deps``."""
    try:
        declared = importlib.metadata.requires("timm") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("timm is not installed")
    needed = {_name(r) for r in declared} - {"torch", "torchvision"} | {"pillow"}
    assert {_name(r) for r in _setup_cfg()["options.extras_require"]["timm"].split()} == needed


def _name(requirement: str) -> str:
    """The normalized name of a requirement (``huggingface_hub`` -> ``huggingface-hub``)."""
    return re.sub(r"[-_.]+", "-", Requirement(requirement).name).lower()


@pytest.mark.parametrize("path", ["docs/integrations/timm.md", "Makefile"])
def test_timm_is_installed_without_dependencies_at_its_floor(path: str) -> None:
    text = (ROOT / path).read_text().replace('"', "'").replace("$(PY) -m pip", "pip")
    assert TIMM_INSTALL in text.replace("-q ", "")


def _floor(req: Requirement) -> Version:
    floors = [Version(s.version) for s in req.specifier if s.operator == ">="]
    assert len(floors) == 1, f"{req}: expected one '>=' floor"
    return floors[0]


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / ".ci" / "oldest.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"{line}: expected an exact pin"
            pins[req.name] = Version(spec.version)
    return pins


def test_every_oldest_pin_is_the_declared_floor() -> None:
    reqs, pins = _requirements(), _pins()
    assert sorted(pins) == sorted(reqs), "pins and requirements name different packages"
    for name, req in reqs.items():
        assert pins[name] == _floor(req), f"{name}: pinned {pins[name]}, declared {req}"


@pytest.mark.parametrize("page", ["README.md", "docs/quickstart.md"])
def test_the_docs_state_the_declared_floors(page: str) -> None:
    flat = (ROOT / page).read_text().replace(" ", "")
    reqs = _requirements()
    for name in ("torch", "transformers", "timm"):
        stated = f"{name}>={_floor(reqs[name])}" in flat
        assert stated, f"{page} does not say {name}>={_floor(reqs[name])}"


def test_the_oldest_cell_runs_on_the_oldest_declared_python() -> None:
    (spec,) = SpecifierSet(_setup_cfg()["options"]["python_requires"])
    major, minor = Version(spec.version).release[:2]
    makefile = (ROOT / "Makefile").read_text()
    for needle in (
        f"python{major}.{minor} -c",
        f"pyenv latest {major}.{minor}",
        f"({major}, {minor})",
    ):
        assert needle in makefile, f"Makefile: the oldest cell does not ask for {needle!r}"


def test_the_hf_module_refuses_a_transformers_below_the_floor() -> None:
    """transformers 5.0-5.3 import fine and fail at the first forward with an unrelated
    TypeError (``q_length``); the module refuses them at import, naming the floor."""
    hf = pytest.importorskip("heatformer.integrations.hf")
    from heatformer.integrations import _hf_attention  # where the check and the floor live

    assert Version(hf.MIN_TRANSFORMERS) == _floor(_requirements()["transformers"])
    with pytest.raises(ImportError, match=r"needs transformers >= 5\.4, found 5\.3\.0"):
        _hf_attention.check_transformers_version("5.3.0")
    _hf_attention.check_transformers_version(hf.MIN_TRANSFORMERS)
    _hf_attention.check_transformers_version("5.24.0")
