"""Fixtures shared by every test folder: the device and the floating dtype."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(
    params=[
        "cpu",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.cuda,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
            ],
        ),
    ]
)
def device(request: pytest.FixtureRequest) -> torch.device:
    """Every test that takes ``device`` runs on the CPU and, when one is present, on CUDA."""
    return torch.device(request.param)


@pytest.fixture(params=[torch.float32, torch.float64], ids=["float32", "float64"])
def dtype(request: pytest.FixtureRequest) -> torch.dtype:
    """Both floating dtypes the library promises to support everywhere."""
    return request.param
