"""Fixtures of the viz tests (skip without matplotlib); helpers in ``tests/viz_helpers.py``."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("matplotlib", reason="heatformer.viz needs the viz extra (matplotlib)")

from heatformer.lab.demo import DemoResult, build_demo


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[DemoResult, float]:
    """The default teaching demo, built once: ``(result, wall seconds)``."""
    start = time.perf_counter()
    result = build_demo(tmp_path_factory.mktemp("demo"))
    return result, time.perf_counter() - start
