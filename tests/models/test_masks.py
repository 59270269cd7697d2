"""Attention masks: one parser of boolean / additive masks, the compact key mask."""

from __future__ import annotations

import math

import pytest
import torch

from heatformer.checks import ArgumentError
from heatformer.models.masks import AttentionMask, allowed_from


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
