"""Fixtures shared by every test folder: one torch thread, the device, the floating dtype and
timm (skipped where it is not installed)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

# shared test helpers (tests/references.py) importable from every test folder
sys.path.insert(0, str(Path(__file__).resolve().parent))

from device_helpers import DEVICES


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> Iterator[None]:
    """Run the whole suite on one intra-op thread.

    The tensors in tests are tiny: there is nothing to parallelize, and on a busy 2-core
    machine OpenMP's spinning threads made tiny ops 10-100x slower (e.g. test_heat.py took
    82 s with the default two threads and 10 s with one). Subprocesses (CLI, DDP) set their own.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> torch.device:
    """Every test that takes ``device`` runs on the CPU and, when one is present, on CUDA
    (marked ``cuda``; tolerances per device and dtype in ``tests/device_helpers.py``)."""
    return request.param


@pytest.fixture(params=[torch.float32, torch.float64], ids=["float32", "float64"])
def dtype(request: pytest.FixtureRequest) -> torch.dtype:
    """Both floating dtypes the library promises to support everywhere."""
    return request.param


@pytest.fixture(scope="module")
def timm() -> Any:
    """The ``timm`` module, as :func:`heatformer.integrations.timm.import_timm` imports it
    (with its placeholder for torchvision where torchvision is missing), or a skip."""
    if importlib.util.find_spec("timm") is None:
        pytest.skip("timm is not installed")
    from heatformer.integrations.timm import import_timm

    return import_timm()


@pytest.fixture(scope="module")
def gloo_groups(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``get(world)``: a pooled gloo group of ``world`` CPU processes on the loopback interface
    (``sequence_parallel_helpers.GroupPool``), started at a module's first call, kept for its
    tests, and stopped after them; the functions it calls live in this folder."""
    import sequence_parallel_helpers as sp

    paths = [str(Path(__file__).resolve().parent)]
    with sp.group_pools(tmp_path_factory.mktemp("groups"), paths) as get:
        yield get
