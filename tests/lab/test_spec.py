"""Comparison specs, head schedules, seeds, the LR schedule and the report helpers."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from heatformer.lab.folder import run_name
from heatformer.lab.presets import PRESETS
from heatformer.lab.report import aggregate, format_table, mean_std
from heatformer.lab.spec import CompareSpec, parse_seeds
from heatformer.lab.tasks import resolve_task


def test_run_names_are_unique_and_filesystem_safe() -> None:
    heads = ["attention:4", "attention:2,laplacian:2", "attention:2;heat[t=0.5]:2/x"]
    names = {run_name(i, h, s) for i, h in enumerate(heads) for s in range(3)}
    assert len(names) == 9
    assert all(set(n) <= set("abcdefghijklmnopqrstuvwxyz0123456789_+.=-") for n in names)
    assert run_name(1, "attention:2,laplacian:2", 0) == "c01-attention2+laplacian2-s0"


# ----------------------------------------------------------------------------- seeds


def test_parse_seeds() -> None:
    assert parse_seeds("3") == (0, 1, 2)
    assert parse_seeds("4, 7") == (4, 7)
    for bad in ("0", "-1", "a", "1,-2", ","):
        with pytest.raises(ValueError, match="seeds"):
            parse_seeds(bad)


# ----------------------------------------------------------------------------- spec


def test_spec_validation_and_round_trip() -> None:
    spec = CompareSpec(heads=("attention:2,laplacian:2", "attention:4"), seeds=(0, 3), n_embd=64)
    assert CompareSpec.from_dict(spec.to_dict()) == spec
    resolved = spec.resolved()
    assert (resolved.eval_every, resolved.ckpt_every, resolved.warmup_steps) == (50, 50, 50)
    assert resolved.options.seq_len == 128
    assert not hasattr(CompareSpec(task="digits").options, "seq_len")  # no sequences
    with pytest.raises(ValueError, match="unknown fields"):
        CompareSpec.from_dict({"task": "chars", "stepz": 3})
    with pytest.raises(ValueError, match="distinct non-negative"):
        CompareSpec(seeds=(1, 1))
    with pytest.raises(ValueError, match="lr: expected a positive float"):
        CompareSpec(lr=math.nan)
    with pytest.raises(ValueError, match="npz: only the 'digits' task uses it, got task 'chars'"):
        CompareSpec(task="chars", options={"npz": "x.npz"})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("weight_decay", math.nan, "weight_decay: expected a finite float >= 0, got nan"),
        ("weight_decay", math.inf, "weight_decay: expected a finite float >= 0, got inf"),
        ("weight_decay", -0.1, "weight_decay: expected a finite float >= 0, got -0.1"),
        ("grad_clip", math.nan, "grad_clip: expected a finite float >= 0, got nan"),
        ("patch_size", 0, "patch_size: expected a positive int, got 0"),
        ("patch_size", -2, "patch_size: expected a positive int, got -2"),
    ],
)
def test_spec_refuses_nan_and_non_positive_values(field: str, value: float, message: str) -> None:
    def spec(value: float) -> CompareSpec:
        if field == "patch_size":  # a task option
            return CompareSpec(task="digits", options={field: value})
        return CompareSpec(**{field: value})

    with pytest.raises(ValueError, match=re.escape(message)):
        spec(value)
    edge = 1 if field == "patch_size" else 0.0  # the smallest valid value is accepted
    made = spec(edge)
    assert getattr(made.options if field == "patch_size" else made, field) == edge


@pytest.mark.parametrize(
    ("task", "seq_len", "limit"), [("chars", 32, 32), ("chars", None, 128), ("recall", 16, 16)]
)
def test_a_topk_graph_is_at_most_the_sequence_length(
    task: str, seq_len: int | None, limit: int
) -> None:
    """The graph kind's own check (the command line names ``--topk`` when the user wrote the
    shorthand: tests/test_cli.py)."""
    options = {} if seq_len is None else {"seq_len": seq_len}
    assert CompareSpec(task=task, options=options, graph=f"topk[k={limit}]").graph == (
        f"topk[k={limit}]"
    )  # k = N: dense
    message = (
        f"graph: topk[k={limit + 1}]: expected k at most the {limit} tokens a sequence can "
        f"hold, got {limit + 1}"
    )
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        CompareSpec(task=task, options=options, graph=f"topk[k={limit + 1}]")
    assert info.value.argument == "graph"  # type: ignore[attr-defined]


def test_a_topk_graph_of_a_vit_is_at_most_its_tokens() -> None:
    spec = CompareSpec(task="digits", options={"patch_size": 4}, graph="topk[k=5]")
    task = resolve_task("digits")(spec)
    model = task.build_model("attention")  # 4 patches + cls
    assert model.blocks[0].attn.graph_kind.spec == "topk[k=5]"
    assert model(task.data.test_images[:3]).shape == (3, 10)  # k = N tokens runs
    message = "graph: topk[k=6]: expected k at most the 5 tokens a sequence can hold"
    with pytest.raises(ValueError, match=re.escape(message)):  # refused when the task loads
        resolve_task("digits")(CompareSpec(task="digits", options={"patch_size": 4},
                                           graph="topk[k=6]"))  # fmt: skip


def test_fingerprint_ignores_runtime_fields_only() -> None:
    base = CompareSpec()
    assert base.fingerprint() == CompareSpec(device="cpu", name="x", analysis=False).fingerprint()
    assert base.fingerprint() != CompareSpec(lr=2e-3).fingerprint()
    assert base.fingerprint() == CompareSpec(eval_every=50).fingerprint()  # resolved default


@given(st.integers(1, 400), st.integers(0, 50), st.floats(0.0, 1.0))
def test_lr_schedule_warms_up_then_decays_to_the_floor(
    steps: int, warmup: int, ratio: float
) -> None:
    spec = CompareSpec(steps=steps, warmup_steps=min(warmup, steps), lr=1.0, min_lr_ratio=ratio)
    lrs = np.array([spec.lr_at(s) for s in range(steps)])
    assert np.all(lrs > 0) or ratio == 0.0
    assert np.all(lrs <= 1.0 + 1e-12)
    w = min(warmup, steps)
    if w:
        assert lrs[0] == pytest.approx(1.0 / w)
        assert np.all(np.diff(lrs[:w]) > 0)
    assert np.all(np.diff(lrs[w:]) <= 1e-12)  # non-increasing after warm-up
    if steps - w >= 2:
        assert lrs[-1] == pytest.approx(ratio)


def test_demo_preset_is_a_valid_spec() -> None:
    spec = CompareSpec(**PRESETS["demo"])
    assert spec.task == "chars" and len(spec.heads) == 3
    assert {spec.heads_per_layer(h) for h in spec.heads} == {4}


# ----------------------------------------------------------------------------- report


def test_mean_std_is_the_sample_std() -> None:
    values = [0.3, 1.7, 2.2, 5.0]
    mean, std = mean_std(values)
    assert mean == pytest.approx(np.mean(values))
    assert std == pytest.approx(np.std(values, ddof=1))
    assert mean_std([2.5]) == (2.5, 0.0)
    assert all(math.isnan(v) for v in mean_std([1.0, None]))  # type: ignore[list-item]


def _record(heads: str, seed: int, loss: float, layers: list[float]) -> dict:
    return {"heads": heads, "seed": seed, "final": {"val_loss": loss},
            "analysis": {"nc1": layers}}  # fmt: skip


def test_aggregate_and_table() -> None:
    records = [
        _record("b", 1, 2.0, [1.0, 2.0]),
        _record("a", 0, 1.0, [3.0, 4.0]),
        _record("a", 1, 3.0, [5.0, 8.0]),
        _record("b", 0, 4.0, [1.0, 2.0]),
        _record("c", 0, math.nan, [1.0, 1.0]),
    ]
    summary = aggregate(records, ["a", "b", "c", "unused"], ["val_loss"], ["nc1", "missing"])
    assert [row["heads"] for row in summary] == ["a", "b", "c"]
    a = summary[0]
    assert a["seeds"] == [0, 1]
    assert a["final"]["val_loss"]["mean"] == 2.0
    assert a["final"]["val_loss"]["std"] == pytest.approx(math.sqrt(2.0))
    assert a["analysis"]["nc1"]["mean"] == [4.0, 6.0]
    assert a["analysis"]["nc1"]["std"] == pytest.approx([math.sqrt(2), math.sqrt(8)])
    assert "missing" not in a["analysis"]
    table = format_table(summary, ["val_loss"], ["nc1"]).splitlines()
    assert table[0].split() == ["heads", "seeds", "val_loss", "nc1@L1"]
    assert table[2].split() == ["a", "2", "2.0000", "±", "1.4142", "6.0000", "±", "2.8284"]
    assert table[4].split() == ["c", "1", "nan", "1.0000"]  # one seed: no ± column
