"""Fixtures shared by every test folder: one torch thread, the device, the floating dtype and
timm (skipped where it is not installed)."""

from __future__ import annotations

import importlib.util
import os
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


@pytest.fixture
def one_launch_at_a_time(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Hold a lock shared by the workers of this pytest run while the test launches a group of
    2-4 processes or calls a pooled one (``gloo_groups``: DDP, sequence parallelism, sharded
    graphs and GPT): one group at work at a time, so that a 4-process group never runs beside
    another one on a 2-core machine, which their time bounds and ``--dist-timeout`` values
    assume. Without pytest-xdist the lock is this run's own and never waits; without ``fcntl``
    (Windows) nothing is locked.

    (xdist's ``--dist loadgroup`` would keep them on one worker, but with pytest 9.2 it
    silently stops grouping: pytest-xdist issue 1386.)
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    base = tmp_path_factory.getbasetemp()  # under xdist: this run's folder / popen-gwN
    folder = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    with open(folder / "process-launches.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


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
