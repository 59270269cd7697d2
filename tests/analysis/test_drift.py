"""How far learned per-head matrices moved from their start (:func:`weight_drift`), asked of
operators through ``learned_weight`` (an untied skip head's ``W_S``)."""

from __future__ import annotations

import pytest
import torch

from heatformer.analysis import WeightDrift, weight_drift
from heatformer.graph_ops import OPERATORS
from heatformer.graph_ops.operators.skip import UntiedSkip
from heatformer.models import GPT, DiffusionAttention, GPTConfig

HEADS = "attention:1,skip[init=-1]:2,skip:1"


def _gpt(heads: str = HEADS) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=8, block_size=6, n_layer=2, n_head=4, n_embd=16, heads=heads)
    return GPT(config)


def test_at_initialization_every_skip_head_is_at_its_start() -> None:
    drift = weight_drift(_gpt())
    assert [(d.layer, d.module, d.heads, d.operator) for d in drift] == [
        (0, "blocks.0.attn", (1, 2), "skip"),
        (0, "blocks.0.attn", (3,), "skip"),
        (1, "blocks.1.attn", (1, 2), "skip"),
        (1, "blocks.1.attn", (3,), "skip"),
    ]
    assert [(d.distance, d.identity, d.start) for d in drift] == [
        (0.0, -1.0, -1.0),
        (0.0, 0.0, 0.0),
    ] * 2


def test_the_distance_is_relative_to_the_start_or_to_the_identity_from_zero() -> None:
    model = _gpt()
    ops = model.blocks[1].attn.head_operators
    minus, zero = ops[1], ops[3]
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        minus.skip_weight.add_(0.1 * torch.randn(minus.skip_weight.shape, generator=gen))
        zero.skip_weight.add_(0.2 * torch.randn(zero.skip_weight.shape, generator=gen))
    w = minus.skip_weight.detach().double()  # (2, 4, 4)
    eye = torch.eye(4, dtype=torch.float64)
    start = -eye.expand(2, 4, 4)
    expected = float(torch.linalg.norm(w - start) / torch.linalg.norm(start))
    z = zero.skip_weight.detach().double()  # (1, 4, 4), started at 0: against ||I|| = 2
    by_heads = {d.heads: d for d in weight_drift(model) if d.layer == 1}
    assert by_heads[(1, 2)].distance == pytest.approx(expected, rel=1e-12)
    assert by_heads[(3,)].distance == pytest.approx(float(torch.linalg.norm(z)) / 2, rel=1e-12)
    trace = torch.diagonal(w, dim1=-2, dim2=-1).sum(-1) / 4
    assert by_heads[(1, 2)].identity == pytest.approx(float(trace.mean()), rel=1e-12)
    assert by_heads[(1, 2)].start == -1.0
    assert all(d.distance == 0.0 for d in weight_drift(model) if d.layer == 0)


def test_learned_weight_is_the_parameter_and_a_detached_copy_of_its_start() -> None:
    op = UntiedSkip(init=-1.0, heads=2, dim=3)
    weight, start = op.learned_weight()
    assert weight is op.skip_weight and not start.requires_grad
    with torch.no_grad():
        op.skip_weight.mul_(2.0)
    assert torch.equal(start, -torch.eye(3).expand(2, 3, 3))  # not a view of the weight
    assert UntiedSkip(init=-1.0).learned_weight() is None  # no shape yet: nothing learned


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_only_operators_that_learn_a_matrix_answer(name: str) -> None:
    layer = DiffusionAttention(16, 2, f"{name}:2")
    answers = [op.learned_weight() for op in layer.head_operators]
    assert all((a is not None) == (name == "skip") for a in answers), name
    assert (weight_drift(layer) != []) == (name == "skip")


def test_a_model_without_such_heads_and_a_bad_argument() -> None:
    assert weight_drift(_gpt("attention:2,laplacian:2")) == []
    with pytest.raises(TypeError, match=r"^model: expected a torch\.nn\.Module, got str"):
        weight_drift("gpt")  # type: ignore[arg-type]


def test_as_dict_is_json_ready() -> None:
    d = WeightDrift(layer=1, module="m", heads=(0, 2), operator="skip", distance=0.5,
                    identity=-0.75, start=-1.0)  # fmt: skip
    assert d.as_dict() == {"layer": 1, "module": "m", "heads": [0, 2], "operator": "skip",
                           "distance": 0.5, "identity": -0.75, "start": -1.0}  # fmt: skip
