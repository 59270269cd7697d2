"""The DeiT-3 options of :class:`ViTConfig`: LayerScale, norm and QK-norm eps, no position
embedding on the cls token, stochastic depth, timm's pooling order; against a ViT written out
here from the recipe and against timm's own VisionTransformer."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from heatformer.models import ViT, ViTConfig, load_model, save_model

F64 = torch.float64
DEIT3 = {
    "layer_scale_init": 1e-6, "norm_eps": 1e-6, "qk_norm": True, "qk_norm_eps": 1e-6,
    "pos_embed_cls": False,
}  # fmt: skip
SMALL = {"n_layer": 2, "n_head": 4, "n_embd": 32, "image_size": 8, "patch_size": 2}


def _randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter random and O(1) (LayerScale too), so that each option matters."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen, dtype=F64).to(p.dtype))
            if p.dim() == 1 and p.shape[0] in (8, 32):  # norm weights and gammas around 1
                p.add_(1.0)
    return model


def _reference_forward(model: ViT, images: Tensor) -> Tensor:
    """The recipe written out by hand from the model's weights (float64)."""
    cfg = model.config
    p = dict(model.named_parameters())
    h, d = cfg.n_head, cfg.n_embd
    dh = d // h

    def ln(x: Tensor, name: str, eps: float) -> Tensor:
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + eps) * p[f"{name}.weight"] + p[f"{name}.bias"]

    def linear(x: Tensor, name: str) -> Tensor:
        return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]

    s = cfg.patch_size
    patches = images.unfold(2, s, s).unfold(3, s, s)  # (B, C, G, G, s, s)
    b, c, g = patches.shape[:3]
    patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(b, g * g, c * s * s)
    x = patches @ p["patch.weight"].reshape(d, -1).T + p["patch.bias"]  # (B, P, D)
    if cfg.pool == "cls":
        cls = p["cls"].expand(b, 1, d)
        if cfg.pos_embed_cls:
            x = torch.cat([cls, x], 1) + p["pos"]
        else:
            x = torch.cat([cls, x + p["pos"]], 1)
    else:
        x = x + p["pos"]
    n = x.shape[1]
    for i in range(cfg.n_layer):
        pre = f"blocks.{i}"
        y = ln(x, f"{pre}.ln1", cfg.norm_eps)
        qkv = linear(y, f"{pre}.attn.in_proj").reshape(b, n, 3, h, dh)
        q, k, v = (qkv[:, :, j].transpose(1, 2) for j in range(3))  # (B, H, N, Dh)
        if cfg.qk_norm:
            q = ln(q, f"{pre}.attn.q_norm", cfg.qk_norm_eps)
            k = ln(k, f"{pre}.attn.k_norm", cfg.qk_norm_eps)
        attn = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(dh), -1)
        a = linear((attn @ v).transpose(1, 2).reshape(b, n, d), f"{pre}.attn.out_proj")
        if cfg.layer_scale_init is not None:
            a = a * p[f"{pre}.ls1.gamma"]
        x = x + a
        y = ln(x, f"{pre}.ln2", cfg.norm_eps)
        m = linear(F.gelu(linear(y, f"{pre}.mlp.fc")), f"{pre}.mlp.proj")
        if cfg.layer_scale_init is not None:
            m = m * p[f"{pre}.ls2.gamma"]
        x = x + m
    if cfg.pool != "cls" and cfg.pool_norm == "after":
        pooled = ln(x.mean(1), "ln_f", cfg.norm_eps)
    else:
        x = ln(x, "ln_f", cfg.norm_eps)
        pooled = x[:, 0] if cfg.pool == "cls" else x.mean(1)
    return linear(pooled, "head")


OPTION_SETS = {
    "deit3": DEIT3,
    "deit3-avg": {**DEIT3, "pool": "avg"},
    "deit3-mean": {**DEIT3, "pool": "mean"},
    "deit3-mean-norm-before": {**DEIT3, "pool": "mean", "pool_norm": "before"},
    "layer-scale-only": {"layer_scale_init": 0.1},
    "eps-only": {"norm_eps": 1e-2, "qk_norm": True, "qk_norm_eps": 0.5},
    "no-cls-pos": {"pos_embed_cls": False},
    "defaults": {},
}


@pytest.mark.parametrize("options", list(OPTION_SETS.values()), ids=list(OPTION_SETS))
def test_vit_equals_the_recipe_written_out(options: dict[str, Any], device: torch.device) -> None:
    model = _randomize(ViT(ViTConfig(**SMALL, **options)).double()).to(device).eval()
    images = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(1), dtype=F64)
    images = images.to(device)
    torch.testing.assert_close(
        model(images), _reference_forward(model, images), atol=1e-12, rtol=1e-10
    )


def test_each_option_changes_the_logits() -> None:
    """Each option is read: flipping it alone changes the output of the same weights."""
    images = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(2), dtype=F64)
    base = {**DEIT3, "layer_scale_init": 0.5}
    model = _randomize(ViT(ViTConfig(**SMALL, **base)).double()).eval()
    out = model(images)
    changes = ({"norm_eps": 1.0}, {"qk_norm_eps": 1.0}, {"pool": "avg", "pos_embed_cls": True})
    for change in changes:
        other = ViT(ViTConfig(**SMALL, **{**base, **change})).double().eval()
        state = model.state_dict()
        if "pool" in change:  # no cls token, one position per patch: keep the patch positions
            state = {k: v for k, v in state.items() if k != "cls"}
        other.load_state_dict(state)
        assert not torch.allclose(other(images), out, atol=1e-6), change
    mean = _randomize(ViT(ViTConfig(**SMALL, **base, pool="mean")).double()).eval()
    before = ViT(ViTConfig(**SMALL, **base, pool="mean", pool_norm="before")).double().eval()
    before.load_state_dict(mean.state_dict())
    assert not torch.allclose(before(images), mean(images), atol=1e-6)  # the order is read


def test_defaults_are_unchanged() -> None:
    cfg = ViTConfig()
    assert (cfg.layer_scale_init, cfg.norm_eps, cfg.qk_norm_eps) == (None, 1e-5, 1e-5)
    assert cfg.pos_embed_cls is True and cfg.drop_path == 0.0 and cfg.pool == "cls"
    assert cfg.pool_norm == "after"  # timm's order for the mean pooling of a new model
    model = ViT(ViTConfig(**SMALL, qk_norm=True))
    assert not any(".ls" in k for k in model.state_dict())
    assert model.pos.shape == (1, 17, 32) and model.ln_f.eps == 1e-5
    assert model.blocks[0].attn.q_norm.eps == 1e-5
    deit = ViT(ViTConfig(**SMALL, **DEIT3))
    assert deit.pos.shape == (1, 16, 32)  # the patches only
    assert deit.blocks[1].ls2.gamma.detach().eq(1e-6).all()
    assert deit.blocks[0].attn.k_norm.eps == 1e-6 and deit.blocks[1].ln2.eps == 1e-6


def test_drop_path_is_stochastic_depth_linear_in_depth_and_identity_in_eval() -> None:
    cfg = ViTConfig(**{**SMALL, "n_layer": 3}, drop_path=0.4)
    model = _randomize(ViT(cfg).double())
    assert [b.drop_path.p if hasattr(b.drop_path, "p") else 0.0 for b in model.blocks] == [
        pytest.approx(r) for r in (0.0, 0.2, 0.4)
    ]
    images = torch.randn(64, 1, 8, 8, generator=torch.Generator().manual_seed(3), dtype=F64)
    plain = ViT(dataclasses.replace(cfg, drop_path=0.0)).double()
    plain.load_state_dict(model.state_dict())
    model.eval()
    plain.eval()
    torch.testing.assert_close(model(images), plain(images), atol=0, rtol=0)
    # training: per sample, each branch of the last block is dropped with probability 0.4 or
    # kept and scaled by 1 / 0.6
    block = model.blocks[2].train()
    x = torch.randn(4000, 3, 32, dtype=F64)
    torch.manual_seed(0)
    branch = block.drop_path(torch.ones_like(x))
    kept = branch[:, 0, 0]
    assert kept.unique().tolist() == [0.0, pytest.approx(1 / 0.6)]
    assert torch.all(branch == kept[:, None, None])  # one draw per sample
    assert abs(float((kept == 0).double().mean()) - 0.4) < 0.03


def test_config_save_load_round_trip_keeps_the_options(tmp_path) -> None:
    cfg = ViTConfig(**SMALL, **DEIT3, drop_path=0.1, pool="avg")
    model = _randomize(ViT(cfg)).eval()
    save_model(model, tmp_path / "vit.pt")
    loaded = load_model(tmp_path / "vit.pt").eval()
    assert loaded.config == cfg
    images = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(loaded(images), model(images), atol=0, rtol=0)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"layer_scale_init": "1e-6"}, TypeError, r"^layer_scale_init: expected a finite float"),
        ({"layer_scale_init": True}, TypeError, r"^layer_scale_init: "),
        ({"layer_scale_init": math.inf}, ValueError, r"^layer_scale_init: "),
        ({"norm_eps": 0.0}, ValueError, r"^norm_eps: expected a float > 0, got 0.0"),
        ({"norm_eps": -1e-6}, ValueError, r"^norm_eps: "),
        ({"norm_eps": None}, TypeError, r"^norm_eps: "),
        ({"qk_norm_eps": math.nan}, ValueError, r"^qk_norm_eps: "),
        ({"qk_norm_eps": "1e-6"}, TypeError, r"^qk_norm_eps: "),
        ({"pos_embed_cls": 0}, TypeError, r"^pos_embed_cls: "),
        ({"drop_path": 1.0}, ValueError, r"^drop_path: expected a probability in \[0, 1\)"),
        ({"drop_path": -0.1}, ValueError, r"^drop_path: "),
        ({"drop_path": "0.1"}, TypeError, r"^drop_path: "),
        ({"pool": "max"}, ValueError, r"^pool: expected 'cls', 'mean' or 'avg', got 'max'"),
        (
            {"pool_norm": "between"},
            ValueError,
            r"^pool_norm: expected one of \['after', 'before'\]",
        ),
    ],
)
def test_bad_options_are_refused_when_the_config_is_made(
    kwargs: dict[str, Any], error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        ViTConfig(**kwargs)


@pytest.mark.parametrize(
    ("pool", "saved_order"), [("mean", "before"), ("avg", "after"), ("cls", "after")]
)
def test_a_config_saved_before_pool_norm_loads_in_the_order_it_computed(
    tmp_path, pool: str, saved_order: str
) -> None:
    """A model file whose config has no ``pool_norm`` (saved before the field) computes what it
    did: ``pool="mean"`` normalized every token and then averaged; ``"avg"`` was timm's order
    already; the cls token's norm does not depend on the order."""
    cfg = ViTConfig(**SMALL, pool=pool, pool_norm=saved_order)
    model = _randomize(ViT(cfg)).eval()
    save_model(model, tmp_path / "vit.pt")
    payload = torch.load(tmp_path / "vit.pt", weights_only=True)
    del payload["config"]["pool_norm"]  # as a heatformer before the field wrote it
    torch.save(payload, tmp_path / "old.pt")
    loaded = load_model(tmp_path / "old.pt")
    assert loaded.config == cfg and loaded.config.pool_norm == saved_order
    images = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(loaded(images), model(images), atol=0, rtol=0)
    exact = loaded.double()  # and in float64, the recipe written out in that order
    torch.testing.assert_close(exact(images.double()), _reference_forward(exact, images.double()))
    assert ViTConfig(pool=pool).pool_norm == "after"  # a new model: timm's order


# ---- timm -------------------------------------------------------------------------------------


def _timm_state(ref: nn.Module) -> dict[str, Tensor]:
    """timm's weights under heatformer's names (its final norm is ``norm`` or, after the
    pooling, ``fc_norm``: the other is an Identity)."""
    renames = {
        "patch_embed.proj.": "patch.", "cls_token": "cls", "pos_embed": "pos",
        ".norm1.": ".ln1.", ".norm2.": ".ln2.", ".attn.qkv.": ".attn.in_proj.",
        ".attn.proj.": ".attn.out_proj.", ".mlp.fc1.": ".mlp.fc.", ".mlp.fc2.": ".mlp.proj.",
    }  # fmt: skip
    state = {}
    for key, value in ref.state_dict().items():
        new = key
        for old, rep in renames.items():
            new = new.replace(old, rep)
        for final in ("fc_norm.", "norm."):
            if new.startswith(final):
                new = "ln_f." + new.removeprefix(final)
        state[new] = value
    return state


#: heatformer's pooling -> timm's VisionTransformer arguments that compute it
TIMM_POOLS: dict[tuple[str, str], dict[str, Any]] = {
    ("cls", "after"): {"class_token": True, "global_pool": "token"},
    ("avg", "after"): {"class_token": False, "global_pool": "avg"},
    ("mean", "after"): {"class_token": False, "global_pool": "avg"},  # fc_norm: None -> True
    ("mean", "before"): {"class_token": False, "global_pool": "avg", "fc_norm": False},
}


@pytest.mark.parametrize(
    ("pool", "pool_norm"), list(TIMM_POOLS), ids=[f"{p}-{n}" for p, n in TIMM_POOLS]
)
def test_vit_equals_timm_deit3_with_the_same_weights(
    timm: Any, pool: str, pool_norm: str, device: torch.device
) -> None:
    """timm's VisionTransformer in the DeiT-3 setting (no_embed_class, init_values=1e-6,
    QK-norm, LayerNorm eps 1e-6), built with pretrained=False: the same logits to float64
    round-off after copying its weights (LayerScale randomized so that it matters). Mean
    pooling is timm's ``global_pool="avg"`` without a class token: the mean, then ``fc_norm``
    (a new model's default), or with ``fc_norm=False`` the norm of every token, then the mean
    (``pool_norm="before"``)."""
    from timm.models.vision_transformer import VisionTransformer

    ref = VisionTransformer(
        img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=32, depth=2,
        num_heads=4, mlp_ratio=4.0, qkv_bias=True, qk_norm=True, init_values=1e-6,
        no_embed_class=True, norm_layer=functools.partial(nn.LayerNorm, eps=1e-6),
        drop_path_rate=0.1, **TIMM_POOLS[pool, pool_norm],
    )  # fmt: skip
    ref = _randomize(ref.double()).to(device).eval()
    assert isinstance(ref.fc_norm, nn.Identity) == (pool_norm == "before" or pool == "cls")
    cfg = ViTConfig(**SMALL, **DEIT3, pool=pool, pool_norm=pool_norm, drop_path=0.1)
    model = ViT(cfg).double().to(device).eval()
    state = _timm_state(ref)
    assert sorted(state) == sorted(model.state_dict())
    model.load_state_dict(state)
    images = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(4), dtype=F64)
    images = images.to(device)
    expected = ref(images)
    assert float(expected.detach().abs().max()) > 0.1
    torch.testing.assert_close(model(images), expected, atol=1e-12, rtol=1e-10)
    for ours, theirs in zip(model.blocks, ref.blocks, strict=True):  # the same depth schedule
        rate = getattr(ours.drop_path, "p", 0.0)
        assert rate == pytest.approx(getattr(theirs.drop_path1, "drop_prob", 0.0), abs=1e-7)
