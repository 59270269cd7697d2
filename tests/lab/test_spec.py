"""Comparison specs, head schedules, seeds, the LR schedule and the report helpers."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from heatformer.lab.folder import run_name
from heatformer.lab.report import aggregate, format_table, mean_std
from heatformer.lab.spec import (
    PRESETS,
    CompareSpec,
    check_heads,
    infer_num_heads,
    parse_seeds,
    split_layers,
)
from heatformer.lab.tasks import resolve_task

# ----------------------------------------------------------------------------- schedules


def test_split_layers_keeps_brackets_and_accepts_both_separators() -> None:
    assert split_layers(" attention:6,laplacian:2 ") == "attention:6,laplacian:2"
    assert split_layers("attention:4;attention:2,laplacian:2") == (
        "attention:4",
        "attention:2,laplacian:2",
    )
    assert split_layers("attention:4|heat[t=0.5;normalization=sym]:4") == (
        "attention:4",
        "heat[t=0.5;normalization=sym]:4",
    )
    with pytest.raises(ValueError, match="non-empty spec between every ';'"):
        split_layers("attention:4;;attention:4")


@pytest.mark.parametrize(
    ("heads", "expected"),
    [("attention:6,heat:2", 8), ("attention", 4), ("laplacian[normalization=sym]:3", 3),
     ("attention;attention:2,laplacian:2", 4)],
)  # fmt: skip
def test_infer_num_heads(heads: str, expected: int) -> None:
    assert infer_num_heads(heads) == expected


@pytest.mark.parametrize(
    ("heads", "kwargs", "message"),
    [
        ("laplacain:2", {}, "unknown operator 'laplacain'.*'attention', 'center', 'heat'"),
        ("attention:two", {}, "positive head count"),
        ("attention:0", {}, "positive head count"),
        ("attention:4;attention:4", {"n_layer": 3}, "expected 3 layer specs"),
        ("attention:4;attention:2", {"n_layer": 2}, "same number of heads in every layer"),
        ("attention:6,laplacian:2", {"n_head": 4}, "summing to n_head=4, got 8"),
        ("heat[t=-1]:4", {}, "t: expected a finite value >= 0"),
        ("attention:2 laplacian:2", {}, "expected entries like"),
        ("", {}, "non-empty schedule"),
    ],
)
def test_check_heads_refuses_bad_schedules(heads: str, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_heads(heads, n_layer=kwargs.get("n_layer", 4), n_head=kwargs.get("n_head"))


def test_check_heads_accepts_good_schedules() -> None:
    check_heads("attention:6,laplacian:2", n_layer=4)
    check_heads("attention:4;attention:2,laplacian:2", n_layer=2, n_head=4)
    check_heads("attention:2,heat[t=0.5]:1,ppr:1", n_layer=1)
    check_heads("pagerank:4", n_layer=1)  # alias


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
def test_topk_is_at_most_the_sequence_length(task: str, seq_len: int | None, limit: int) -> None:
    options = {} if seq_len is None else {"seq_len": seq_len}
    assert CompareSpec(task=task, options=options, topk=limit).topk == limit  # k = N: dense
    message = (
        f"topk: topk[k={limit + 1}]: expected k at most the {limit} tokens a sequence can "
        f"hold, got {limit + 1}"
    )  # the graph kind's own check, naming the option the user gave
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        CompareSpec(task=task, options=options, topk=limit + 1)
    assert info.value.argument == "topk"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=re.escape(f"graph: topk[k={limit + 1}]: expected k")):
        CompareSpec(task=task, options=options, graph=f"topk[k={limit + 1}]")


def test_topk_of_a_vit_is_at_most_its_tokens() -> None:
    task = resolve_task("digits")(CompareSpec(task="digits", options={"patch_size": 4}, topk=5))
    model = task.build_model("attention")  # 4 patches + cls
    assert model.blocks[0].attn.topk == 5
    assert model(task.data.test_images[:3]).shape == (3, 10)  # k = N tokens runs
    message = "topk: expected at most the 5 tokens a sequence can hold"  # the ViT config's
    with pytest.raises(ValueError, match=re.escape(message)):  # refused when the task loads
        resolve_task("digits")(CompareSpec(task="digits", options={"patch_size": 4}, topk=6))


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
