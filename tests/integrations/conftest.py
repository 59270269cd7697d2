"""The ``make_model`` fixture: tiny transformers models saved and reloaded from a temporary
folder (offline)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from hf_helpers import configs


@pytest.fixture()
def make_model(tmp_path: Path) -> Callable[..., Any]:
    """``make_model(family, **config_changes)``: a random tiny model, saved with
    ``save_pretrained`` and reloaded (sdpa attention, eval mode, float32)."""

    def make(family: str, seed: int = 0, **changes: Any) -> Any:
        cls, config = configs()[family]
        for key, value in changes.items():
            setattr(config, key, value)
        torch.manual_seed(seed)
        folder = tmp_path / f"{family}-{seed}"
        cls(config).save_pretrained(folder)
        model = cls.from_pretrained(folder, attn_implementation="sdpa", dtype=torch.float32)
        return model.eval()

    return make
