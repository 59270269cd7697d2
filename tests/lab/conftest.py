"""Helpers for the experiment-runner tests: a tiny corpus and tiny specs."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from heatformer.lab.spec import CompareSpec
from heatformer.lab.tasks import resolve_task

WORDS = (
    "the graph heat kernel spreads values along attention edges while a laplacian head "
    "keeps what differs from the neighbours and tokens collapse towards their mean"
).split()


def make_text(num_words: int = 6000, seed: int = 0) -> str:
    """Deterministic pseudo-sentences over a small vocabulary (easy to learn fast)."""
    rng = random.Random(seed)
    lines, line = [], []
    for _ in range(num_words):
        line.append(rng.choice(WORDS))
        if len(line) == 10:
            lines.append(" ".join(line) + ".")
            line = []
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~40 KB UTF-8 text file."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(make_text(), encoding="utf-8")
    return path


def spec_of(**values: Any) -> CompareSpec:
    """A spec from spec fields and task options side by side (as the command line gives
    them): the names the chosen task declares go into ``options``."""
    task = resolve_task(values.get("task", "chars"))
    names = {f.name for f in dataclasses.fields(task.Options)}
    options = {name: values.pop(name) for name in list(values) if name in names}
    return CompareSpec(**values, options=options)


def _tiny_spec(**overrides: Any) -> CompareSpec:
    values: dict[str, Any] = {
        "task": "chars",
        "heads": ("attention:2", "attention:1,laplacian:1"),
        "seeds": (0,),
        "steps": 12,
        "batch_size": 8,
        "lr": 3e-3,
        "seq_len": 16,
        "n_layer": 2,
        "n_embd": 16,
        "eval_every": 4,
        "ckpt_every": 5,
        "eval_size": 8,
        "analysis_size": 4,
        "device": "cpu",
    }
    values.update(overrides)
    if values["task"] == "digits":  # the image task has no sequences
        for name in ("seq_len", "eval_size"):
            values.pop(name)
    return spec_of(**values)


@pytest.fixture()
def tiny_spec(corpus: Path) -> Callable[..., CompareSpec]:
    """``tiny_spec(**overrides)``: a spec on :func:`corpus` small enough for fast tests."""

    def build(**overrides: Any) -> CompareSpec:
        values: dict[str, Any] = (
            {"text": str(corpus)} if overrides.get("task", "chars") == "chars" else {}
        )
        values.update(overrides)
        return _tiny_spec(**values)

    return build
