"""heatformer heads inside timm vision transformers (timm's own ViT and DeiT-3 code).

Where torchvision is not installed, timm is imported with a placeholder for it (see
tests/timm_helpers.py); the models and attention modules tested are timm's own.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch

from heatformer.checks import ArgumentError

SMALL = {"img_size": 32, "patch_size": 8, "num_classes": 5}


@pytest.fixture(scope="module")
def ht(timm: Any) -> Any:
    from heatformer.integrations import timm as adapter

    return adapter


def _model(timm: Any, name: str, seed: int = 0, **kwargs: Any) -> Any:
    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False, **SMALL, **kwargs).eval()
    for module in model.modules():  # random non-trivial norms, so that they matter
        if isinstance(module, torch.nn.LayerNorm):
            torch.nn.init.normal_(module.weight, 1.0, 0.2)
            torch.nn.init.normal_(module.bias, 0.0, 0.2)
    return model


MODELS = [
    ("deit3_small_patch16_224", {}),  # 6 heads, LayerScale
    ("vit_tiny_patch16_224", {"qk_norm": True}),  # 3 heads, QK-norm
    ("vit_tiny_patch16_224", {"global_pool": "avg", "class_token": False}),
]


@pytest.mark.parametrize(("name", "kwargs"), MODELS, ids=["deit3", "vit-qknorm", "vit-avg"])
def test_all_attention_equals_the_original_forward_and_gradients(
    timm: Any, ht: Any, name: str, kwargs: dict
) -> None:
    ref = _model(timm, name, **kwargs)
    model = ht.convert(copy.deepcopy(ref), "attention")
    assert (
        all(type(b.attn).__name__ == "TimmDiffusionAttention" for b in model.blocks)
        and len(model.blocks) == 12
    )
    assert list(model.state_dict()) == list(ref.state_dict())  # timm's keys, the same weights
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    out_ref, out = ref(x), model(x)
    torch.testing.assert_close(out, out_ref, atol=2e-5, rtol=1e-4)
    out_ref.square().sum().backward()
    out.square().sum().backward()
    expected = dict(ref.named_parameters())
    for key, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[key].grad, atol=1e-5, rtol=1e-3, msg=key)


def test_trailing_laplacian_heads_equal_v_minus_pv_from_the_blocks_qkv(timm: Any, ht: Any) -> None:
    model = ht.convert(_model(timm, "deit3_small_patch16_224"), "attention:3,laplacian:3")
    attn = model.blocks[4].attn
    assert attn.spec == "attention:3,laplacian:3"
    qkv = attn.qkv
    assert ht.convert(model, "heat:6").blocks[4].attn is attn and attn.spec == "heat:6"
    ht.convert(model, "attention:3,laplacian:3")  # again: new heads, the same layers
    assert attn.qkv is qkv and attn.spec == "attention:3,laplacian:3"
    seen: dict[str, torch.Tensor] = {}
    attn.register_forward_hook(lambda m, args, out: seen.update(x=args[0], out=out))
    with torch.no_grad():
        model(torch.randn(2, 3, 32, 32))
    x = seen["x"].double()
    b, n, d = x.shape
    qkv = x @ attn.qkv.weight.double().T + attn.qkv.bias.double()
    q, k, v = qkv.view(b, n, 3, 6, d // 6).permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, N, Dh)
    p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // 6), dim=-1)
    y = p @ v
    y[:, 3:] = v[:, 3:] - y[:, 3:]  # the "3L" heads: (I - P) v
    y = y.transpose(1, 2).reshape(b, n, d)
    expected = y @ attn.proj.weight.double().T + attn.proj.bias.double()
    torch.testing.assert_close(seen["out"].double(), expected, atol=1e-5, rtol=1e-4)


def test_masks_dropout_and_errors(timm: Any, ht: Any) -> None:
    ref = _model(timm, "vit_tiny_patch16_224", attn_drop_rate=0.2)
    model = ht.convert(copy.deepcopy(ref), "attention").train()
    ref.train()
    x = torch.randn(2, 3, 32, 32)
    torch.manual_seed(5)
    expected = ref(x)
    torch.manual_seed(5)
    torch.testing.assert_close(model(x), expected, atol=2e-5, rtol=1e-4)  # the same dropout
    attn, attn_ref = model.blocks[0].attn, ref.blocks[0].attn
    attn.eval(), attn_ref.eval()
    tokens = torch.randn(2, 17, 192)
    keys = torch.ones(2, 1, 1, 17, dtype=torch.bool)
    keys[1, ..., 12:] = False
    for mask in (keys, torch.zeros(2, 1, 1, 17).masked_fill(~keys, -math.inf)):
        torch.testing.assert_close(attn(tokens, attn_mask=mask), attn_ref(tokens, attn_mask=mask))
    torch.testing.assert_close(attn(tokens, is_causal=True), attn_ref(tokens, is_causal=True))
    with pytest.raises(ValueError, match="an attention bias") as err:
        attn(tokens, attn_mask=torch.full((17, 17), 0.5))
    assert err.value.argument == "attn_mask"  # type: ignore[attr-defined]
    heat = ht.convert(copy.deepcopy(ref), "heat:3").train()
    with pytest.raises(ValueError, match="no counterpart for 'heat' heads"):
        heat(x)
    for call, argument in (
        (lambda: ht.convert(torch.nn.Linear(2, 2), "attention"), "model"),
        (lambda: ht.convert(copy.deepcopy(ref), "attention:2"), "heads"),
    ):
        with pytest.raises(ValueError) as err:
            call()
        assert isinstance(err.value, ArgumentError) and err.value.argument == argument
