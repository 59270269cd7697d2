"""Fixtures of the graph_ops tests; the helpers themselves live in ``tests/graph_helpers.py``."""

from __future__ import annotations

import pytest

from graph_helpers import GRAPH_KINDS, NORMALIZATIONS, OPERATOR_SPECS, OperatorSpec


@pytest.fixture(params=GRAPH_KINDS)
def graph_kind(request: pytest.FixtureRequest) -> str:
    """``"dense"``, ``"softmax"``, ``"sparse"``: the same weights held three ways."""
    return request.param


@pytest.fixture(params=NORMALIZATIONS)
def normalization(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=sorted(OPERATOR_SPECS))
def operator_spec(request: pytest.FixtureRequest) -> tuple[str, OperatorSpec]:
    """Every operator configuration, with its numpy reference."""
    return request.param, OPERATOR_SPECS[request.param]
