"""The head router and its mask: one parser of boolean / additive masks, per-head masks."""

from __future__ import annotations

import math

import pytest
import torch

from heatformer.checks import ArgumentError
from heatformer.models.routing import AttentionMask, HeadRouter, allowed_from

F64 = torch.float64


def test_an_additive_mask_is_zero_and_blocked_values() -> None:
    mask = torch.tensor([[0.0, -math.inf, torch.finfo(torch.float32).min]])
    assert allowed_from(mask, "attn_mask").tolist() == [[True, False, False]]
    boolean = torch.tensor([True, False])
    assert allowed_from(boolean, "attn_mask") is boolean  # SDPA's polarity, as it is


@pytest.mark.parametrize(
    ("mask", "error", "message"),
    [
        (torch.tensor([0.0, 0.5]), ValueError, "an attention bias"),
        (torch.tensor([0, 1]), TypeError, "a bool or float mask"),
        ([0.0, 0.0], TypeError, "expected a tensor"),
    ],
)
def test_a_mask_that_is_not_one_is_refused_naming_the_argument(
    mask: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message) as err:
        allowed_from(mask, "attention_mask")
    assert isinstance(err.value, ArgumentError) and err.value.argument == "attention_mask"


def test_from_additive_keeps_a_key_mask_compact_and_folds_the_causal_order() -> None:
    keys = torch.zeros(2, 1, 1, 4)
    keys[1, ..., 3] = -math.inf
    mask = AttentionMask.from_additive(keys, True, shape=(2, 3, 4, 4))
    assert mask.dense is None and mask.causal
    assert mask.key_mask is not None and mask.key_mask.tolist() == [
        [True] * 4,
        [True] * 3 + [False],
    ]
    band = torch.ones(4, 4, dtype=torch.bool).triu(-1)  # (N, N): any other pattern
    dense = AttentionMask.from_additive(band, True, shape=(2, 3, 4, 4)).dense
    assert dense is not None and tuple(dense.shape) == (1, 1, 4, 4)  # not expanded
    torch.testing.assert_close(dense[0, 0], band.tril())
    with pytest.raises(ValueError, match=r"broadcastable to \(2, 3, 4, 4\), got \(4, 4, 4\)"):
        AttentionMask.from_additive(torch.ones(4, 4, 4, dtype=torch.bool), shape=(2, 3, 4, 4))


def test_a_per_head_dense_mask_follows_the_heads_of_each_group() -> None:
    """Fused heads and heads with their own graph each take their heads' patterns: the router
    equals one router per head."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 3, generator=gen, dtype=F64) for _ in range(3))
    allowed = torch.rand(2, 4, 5, 5, generator=gen) > 0.4
    allowed |= torch.eye(5, dtype=torch.bool)  # every row has an edge
    spec = ["attention", "heat", "laplacian", "heat"]  # fused heads 0 and 2, heat heads 1, 3
    router = HeadRouter(spec, 4, dtype=F64)
    got = router.diffuse(q, k, v, AttentionMask(dense=allowed))
    for h, name in enumerate(spec):
        one = HeadRouter([name], 1, dtype=F64)
        head = slice(h, h + 1)
        expected = one.diffuse(
            q[:, head], k[:, head], v[:, head], AttentionMask(dense=allowed[:, head])
        )
        torch.testing.assert_close(got[:, head], expected)
