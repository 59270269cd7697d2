"""Head specs: parsing, per-layer schedules, and the errors for bad specs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import model_helpers as mh
from heatformer.graph_ops import (
    OPERATORS,
    DenseGraph,
    HeatKernel,
    Laplacian,
    PersonalizedPageRank,
    resolve_operator,
)
from heatformer.models import (
    GPT,
    DiffusionAttention,
    GPTConfig,
    ViT,
    ViTConfig,
    format_heads,
    parse_heads,
    parse_layer_heads,
)
from heatformer.models.heads import HeadSchedule, check_heads, infer_num_heads, split_schedule


def names(ops) -> list[str]:
    return [op.name for op in ops]


def test_entries_assign_heads_in_order_and_share_one_instance_per_entry() -> None:
    ops = parse_heads("laplacian:1,attention:2,laplacian:1", 4)
    assert names(ops) == ["laplacian", "attention", "attention", "laplacian"]
    assert ops[1] is ops[2]  # one entry, one instance
    assert ops[0] is not ops[3]  # a repeated name in another entry is a separate operator
    assert format_heads(ops) == "laplacian:1,attention:2,laplacian:1"


def test_bare_name_fills_every_head_and_params_are_parsed() -> None:
    ops = parse_heads("heat[t=0.25;normalization=sym;tol=1e-9]", 3)
    assert len(ops) == 3 and all(op is ops[0] for op in ops)
    op = ops[0]
    assert isinstance(op, HeatKernel)
    assert float(op.t) == 0.25 and op.normalization == "sym" and op.tol == 1e-9
    ppr = parse_heads("attention:1, ppr[alpha=0.3] : 1", 2)[1]
    assert isinstance(ppr, PersonalizedPageRank) and ppr.alpha == 0.3
    per_head_t = parse_heads("heat[t=(0.5 2.0)]:2", 2)[0]
    assert per_head_t.t.tolist() == [0.5, 2.0]


def test_sequence_of_names_shares_instances_by_name() -> None:
    ops = parse_heads(["attention", "laplacian", "attention", "laplacian"], 4)
    assert names(ops) == ["attention", "laplacian", "attention", "laplacian"]
    assert ops[0] is ops[2] and ops[1] is ops[3] and ops[0] is not ops[1]
    lap = Laplacian(step=0.5)
    mixed = parse_heads([lap, "attention"], 2)
    assert mixed[0] is lap and names(mixed) == ["laplacian", "attention"]


@pytest.mark.parametrize(
    ("spec", "num_heads", "match"),
    [
        ("laplacain:2,attention:2", 4, r"laplacain"),
        ("attention:3", 4, r"expected counts adding up to num_heads = 4, got 3 heads"),
        ("attention:3,laplacian:2", 4, r"got 5 heads"),
        ("heat[t=-1]:4", 4, r"t: expected a finite value >= 0, got -1"),
        ("heat[tt=1]:4", 4, r"tt"),
        ("attention:0,laplacian:4", 4, r"positive head count"),
        ("attention:x", 4, r"positive head count"),
        ("attention:2,laplacian", 4, r"no ':count'"),
        ("heat[t]:4", 4, r"key=value"),
        ("", 4, r"empty head spec"),
        ("attention:2;laplacian:2", 4, r"positive head count.*2;laplacian:2"),
        ("attention-2:4", 4, r"cannot parse"),
        ("heat[t=1;t=2]:4", 4, r"^heads: expected each key once in .*, got 't' twice"),
    ],
)
def test_bad_specs_raise_value_error(spec, num_heads, match) -> None:
    with pytest.raises(ValueError, match=match):
        parse_heads(spec, num_heads)
    with pytest.raises(ValueError, match=match):
        DiffusionAttention(8 * num_heads, num_heads, spec)


def test_unknown_name_lists_the_valid_names() -> None:
    with pytest.raises(ValueError) as info:
        DiffusionAttention(16, 4, "laplacain:2,attention:2")
    message = str(info.value)
    assert "'laplacain'" in message
    for name in OPERATORS:
        assert name in message


def test_per_head_list_of_wrong_length_or_type() -> None:
    with pytest.raises(ValueError, match=r"one operator per head \(4\), got 3"):
        parse_heads(["attention"] * 3, 4)
    with pytest.raises(TypeError, match="DiffusionOperator"):
        parse_heads(["attention", 3], 2)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="spec string"):
        parse_heads(7, 2)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("heads", "n_layer", "expected"),
    [
        ("attention:4|attention:2,laplacian:2", 2, ["attention:4", "attention:2,laplacian:2"]),
        ("attention:4;laplacian:4", 2, ["attention:4", "laplacian:4"]),
        (("attention:4", "heat:2,ppr:2"), 2, ["attention:4", "heat:2,ppr:2"]),
        ("attention:2,laplacian:2", 3, ["attention:2,laplacian:2"] * 3),
        # ';' inside brackets separates parameters, not layers
        ("heat[t=0.5;tol=1e-8]:4", 2, ["heat[t=0.5;tol=1e-8]:4"] * 2),
        ("heat[t=0.5;tol=1e-8]:4|attention:4", 2, ["heat[t=0.5;tol=1e-8]:4", "attention:4"]),
    ],
)
def test_parse_layer_heads(heads, n_layer, expected) -> None:
    assert parse_layer_heads(heads, n_layer) == expected


@pytest.mark.parametrize(
    "heads", ["attention:4|attention:4|attention:4", ("attention:4",) * 3, "a:4|b:4|c:4"]
)
def test_schedule_with_wrong_number_of_layers(heads) -> None:
    with pytest.raises(ValueError, match=r"one spec per layer \(2 layers\), got 3"):
        parse_layer_heads(heads, 2)
    with pytest.raises(ValueError, match=r"one spec per layer \(2 layers\), got 3"):
        GPT(GPTConfig(n_layer=2, n_head=4, n_embd=16, heads=heads))


@pytest.mark.parametrize(
    "heads",
    [
        "attention:4|attention:2,laplacian:2|heat[t=0.5]:1,ppr:3",
        ("attention:4", "attention:2,laplacian:2", "heat[t=0.5]:1,ppr:3"),
    ],
)
def test_models_get_the_right_operators_per_layer(heads) -> None:
    expected = [
        ["attention"] * 4,
        ["attention", "attention", "laplacian", "laplacian"],
        ["heat", "ppr", "ppr", "ppr"],
    ]
    gpt = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=3, n_head=4, n_embd=16, heads=heads))
    vit = ViT(ViTConfig(image_size=4, patch_size=2, n_layer=3, n_head=4, n_embd=16, heads=heads))
    for model in (gpt, vit):
        got = [names(block.attn.head_operators) for block in model.blocks]
        assert got == expected
    assert [b.attn.causal for b in gpt.blocks] == [True] * 3
    assert [b.attn.causal for b in vit.blocks] == [False] * 3
    heat = gpt.blocks[2].attn.head_operators[0]
    assert isinstance(heat, HeatKernel) and float(heat.t) == 0.5


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_every_registered_operator_has_a_reference(name) -> None:
    """The layer tests look references up by registry name; the numpy one must agree with the
    generic spectral one (from ``frequency_response``) where both apply, for every example."""
    assert name in mh.REFERENCES
    gen = np.random.default_rng(0)
    w = gen.uniform(0.1, 1.0, (6, 6))
    p = w / w.sum(1, keepdims=True)  # every node has out-edges: I' = I
    v = gen.standard_normal((6, 3))
    for params in OPERATORS[name].examples:
        op = resolve_operator(name, **params).double()
        if op.maps > 1:  # maps p and p^T, and a per-row norm: no spectral form; the operator
            maps = np.stack([p, p.T / p.T.sum(1, keepdims=True)])
            graph = DenseGraph(torch.as_tensor(maps))  # batch shape (maps,)
            expected = op(graph, torch.as_tensor(v)).numpy()
            np.testing.assert_allclose(mh.operator_ref(op, maps, v, 0), expected, atol=1e-12)
            continue
        # rows of p sum to 1: the combinatorial scale (largest out-degree) is 1 as well
        # mean pooling's and centring's responses are on the Laplacian of their own (uniform)
        # graph, not of P
        graph = mh.uniform_reference(p) if name in ("mean", "center") else p
        np.testing.assert_allclose(
            mh.operator_ref(op, p, v, 0), mh.spectral_ref(op, graph, v), atol=1e-8
        )


# ------------------------------------------------ schedules, parsed once (from the lab's spec)


def test_split_layers_keeps_brackets_and_accepts_both_separators() -> None:
    assert split_schedule(" attention:6,laplacian:2 ") == "attention:6,laplacian:2"
    assert split_schedule("attention:4;attention:2,laplacian:2") == (
        "attention:4",
        "attention:2,laplacian:2",
    )
    assert split_schedule("attention:4|heat[t=0.5;normalization=sym]:4") == (
        "attention:4",
        "heat[t=0.5;normalization=sym]:4",
    )
    with pytest.raises(ValueError, match="non-empty spec between every ';'"):
        split_schedule("attention:4;;attention:4")


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
        ("laplacain:2", {}, "unknown operator 'laplacain'.*'attention', 'center', 'diff', 'heat'"),
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


def test_a_schedule_is_parsed_once_into_what_a_config_takes() -> None:
    per_layer = HeadSchedule.parse("attention:4;attention:2,laplacian:2", n_layer=2)
    assert (per_layer.config_heads, per_layer.num_heads) == (
        ("attention:4", "attention:2,laplacian:2"),
        4,
    )
    every = check_heads(" attention:6,heat:2 ", n_layer=3)
    assert (every.config_heads, every.num_heads, every.n_layer, str(every)) == (
        "attention:6,heat:2",
        8,
        3,
        " attention:6,heat:2 ",
    )
    assert check_heads("attention", n_layer=1, n_head=2).num_heads == 2
