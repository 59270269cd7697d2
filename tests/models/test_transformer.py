"""Blocks and reference models: GPT (KV cache, generation), ViT, SequenceClassifier, configs,
save/load, torch.compile and a short training run.

GPT forward with and without the KV cache, generation and the ViT forward take ``device``
(CPU; CUDA where available, marked ``cuda``), in float64 with the same tolerances on both.
"""

from __future__ import annotations

import dataclasses
import re
import time

import pytest
import torch
import torch.nn.functional as F

import model_helpers as mh
from device_helpers import TIGHT
from heatformer.models import (
    GPT,
    DiffusionAttention,
    GPTConfig,
    KVCache,
    SequenceClassifier,
    SequenceClassifierConfig,
    TransformerBlock,
    ViT,
    ViTConfig,
    load_model,
    save_model,
)

F64 = torch.float64


def tiny_gpt(
    heads="attention:2,laplacian:2", *, dtype=F64, seed: int = 0, device="cpu", **kwargs
) -> GPT:
    """Drawn on the CPU, then moved to ``device``: the same weights on every device."""
    torch.manual_seed(seed)
    fields = {"vocab_size": 13, "block_size": 16, "n_layer": 2, "n_head": 4, "n_embd": 16}
    fields.update(kwargs)
    return GPT(GPTConfig(heads=heads, **fields)).to(device, dtype).eval()


def tokens(seed: int, b: int, n: int, vocab: int = 13, device="cpu") -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (b, n), generator=gen).to(device)


# ---- blocks ------------------------------------------------------------------------------------


def test_block_is_pre_ln_residual() -> None:
    torch.manual_seed(0)
    block = TransformerBlock(16, 4, "attention:2,laplacian:2", causal=True).to(F64)
    x = mh.random_input(1)
    key_mask = mh.padding_mask(2, 6, [6, 4])
    h = x + block.attn(block.ln1(x), key_mask)
    torch.testing.assert_close(block(x, key_mask), h + block.mlp(block.ln2(h)), atol=0, rtol=0)


def test_zero_init_block_leaves_x_plus_mlp() -> None:
    model = tiny_gpt("attention:2,laplacian:1,heat:1", zero_init=True)
    x = mh.random_input(2)
    for block in model.blocks:
        assert torch.equal(block.attn.out_proj.weight, torch.zeros_like(block.attn.out_proj.weight))
        assert torch.equal(block(x), x + block.mlp(block.ln2(x)))
    plain = tiny_gpt("attention:2,laplacian:1,heat:1", zero_init=False)
    assert plain.blocks[0].attn.out_proj.weight.abs().sum() > 0


def test_gpt2_initialization() -> None:
    """GPT-2 init: N(0, 0.02) weights, zero biases, and the residual projections (attention
    ``out_proj``, MLP ``proj``) at std ``0.02 / sqrt(2 n_layer)``."""
    torch.manual_seed(0)
    n_layer = 8
    model = GPT(GPTConfig(vocab_size=64, block_size=32, n_layer=n_layer, n_head=4, n_embd=64))
    residual = 0.02 / (2 * n_layer) ** 0.5
    n_residual = 0
    for name, p in model.state_dict().items():
        if name.endswith("attn.out_proj.weight") or name.endswith("mlp.proj.weight"):
            assert float(p.std()) == pytest.approx(residual, rel=0.1), name
            n_residual += 1
        elif name.endswith(("in_proj.weight", "mlp.fc.weight", "tok_emb.weight", "head.weight")):
            assert float(p.std()) == pytest.approx(0.02, rel=0.1), name
        elif name.endswith("proj.bias") or name.endswith("fc.bias"):
            assert not p.any(), name
    assert n_residual == 2 * n_layer


@pytest.mark.parametrize(
    "heads",
    [
        "attention",
        "laplacian",
        "attention:2,laplacian:2",
        "heat[t=2.0]:1,ppr:1,polynomial:1,laplacian[normalization=combinatorial]:1",
        "attention:4|heat:2,laplacian:2",
    ],
)
def test_model_parameter_count_is_independent_of_the_operator_mix(heads) -> None:
    reference = tiny_gpt("attention").num_parameters()
    assert tiny_gpt(heads).num_parameters() == reference
    vit = ViTConfig(image_size=4, patch_size=2, n_layer=2, n_head=4, n_embd=16)
    assert ViT(dataclasses.replace(vit, heads=heads)).num_parameters() == ViT(vit).num_parameters()


def test_compiled_block_matches_eager() -> None:
    torch.manual_seed(0)
    block = TransformerBlock(8, 2, "attention:1,laplacian:1", causal=True).eval()
    x = mh.random_input(3, 2, 5, 8, dtype=torch.float32)
    start = time.perf_counter()
    compiled = torch.compile(block)
    out = compiled(x)
    elapsed = time.perf_counter() - start
    torch.testing.assert_close(out, block(x), atol=1e-5, rtol=1e-5)
    x2 = mh.random_input(4, 2, 5, 8, dtype=torch.float32)
    torch.testing.assert_close(compiled(x2), block(x2), atol=1e-5, rtol=1e-5)
    assert elapsed < 120, f"compile took {elapsed:.0f} s"


@pytest.mark.slow  # ~20 s cold: graph breaks (float(t), the series order) mean several graphs
def test_compiled_block_with_heat_heads_matches_eager() -> None:
    torch.manual_seed(0)
    block = TransformerBlock(8, 2, "attention:1,heat[t=0.5]:1").eval()
    x = mh.random_input(5, 2, 5, 8, dtype=torch.float32)
    torch.testing.assert_close(torch.compile(block)(x), block(x), atol=1e-5, rtol=1e-5)


# ---- GPT: KV cache and generation --------------------------------------------------------------


@pytest.mark.parametrize(
    ("heads", "kwargs"),
    [
        ("attention", {}),
        ("laplacian:1,attention:2,laplacian:1", {}),
        ("attention:4|laplacian:4", {}),
        ("attention:2,laplacian:2", {"graph": "topk[k=3]"}),  # top-k decodes from the cache
        ("attention:4", {"graph": "topk[k=2];softmax"}),  # a per-layer graph schedule
    ],
)
def test_cached_incremental_logits_equal_full_logits(heads, kwargs, device) -> None:
    model = tiny_gpt(heads, device=device, **kwargs)
    assert model.supports_cache
    idx = tokens(0, 2, 11, device=device)
    full = model(idx)
    caches = [KVCache() for _ in model.blocks]
    steps = [model(idx[:, :4], caches)]  # the prompt in one chunk, then one token at a time
    for i in range(4, 11):
        steps.append(model(idx[:, i : i + 1], caches))
    assert [c.length for c in caches] == [11, 11]
    assert full.device.type == device.type
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **TIGHT)


def test_caches_are_one_per_layer() -> None:
    """One cache for every layer was accepted (each layer then attended to the other's keys);
    a list of the wrong length raised IndexError or was cut short without a word."""
    model = tiny_gpt()
    idx = tokens(1, 2, 3)
    shared = KVCache()
    with pytest.raises(ValueError, match=r"^cache: expected a KVCache of this layer's own"):
        model(idx, [shared] * model.config.n_layer)
    for count in (1, 3):
        with pytest.raises(ValueError, match=r"^caches: expected one KVCache per layer \(2\), "):
            model(idx, [KVCache() for _ in range(count)])


@pytest.mark.parametrize("heads", ["attention", "attention:2,laplacian:2", "laplacian"])
def test_generate_with_cache_equals_without(heads, monkeypatch, device) -> None:
    model = tiny_gpt(heads, device=device)
    calls = []
    cached = DiffusionAttention._forward_cached

    def spy(self, *args, **kwargs):
        calls.append(1)
        return cached(self, *args, **kwargs)

    monkeypatch.setattr(DiffusionAttention, "_forward_cached", spy)
    prompt = tokens(1, 3, 4, device=device)
    out = {}
    for use_cache in (True, False):
        gen = torch.Generator(device).manual_seed(7)  # sampling draws on the model's device
        out[use_cache] = model.generate(prompt, 9, use_cache=use_cache, generator=gen)
    assert len(calls) == 9 * model.config.n_layer  # one cached call per step and layer
    assert out[True].shape == (3, 13) and torch.equal(out[True][:, :4], prompt)
    assert torch.equal(out[True], out[False])
    # same seed, same tokens; another seed differs (the sampling really is random)
    again = model.generate(prompt, 9, generator=torch.Generator(device).manual_seed(7))
    other = model.generate(prompt, 9, generator=torch.Generator(device).manual_seed(8))
    assert torch.equal(again, out[True]) and not torch.equal(other, out[True])


@pytest.mark.parametrize(
    ("heads", "kwargs"),
    [
        ("attention:2,heat[t=0.5]:2", {}),
        ("attention:4|ppr:4", {}),
        ("laplacian[normalization=combinatorial]:4", {}),
    ],
)
def test_generate_falls_back_to_recompute(heads, kwargs, monkeypatch) -> None:
    model = tiny_gpt(heads, **kwargs)
    assert not model.supports_cache

    def refuse(self, *args, **kwargs):
        raise AssertionError("the KV-cache path must not be used")

    monkeypatch.setattr(DiffusionAttention, "_forward_cached", refuse)
    prompt = tokens(2, 2, 3)
    out = model.generate(prompt, 6, use_cache=True, generator=torch.Generator().manual_seed(3))
    ref = model.generate(prompt, 6, use_cache=False, generator=torch.Generator().manual_seed(3))
    assert out.shape == (2, 9) and torch.equal(out, ref)
    # the fallback is exact: every new token was sampled from the full forward's last logits
    greedy = model.generate(prompt, 6, top_k=1)
    idx = prompt
    for _ in range(6):
        idx = torch.cat([idx, model(idx)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(greedy, idx)


def test_generate_past_block_size_crops_the_context() -> None:
    model = tiny_gpt("attention:2,laplacian:2", block_size=8)
    prompt = tokens(3, 2, 5)
    out = model.generate(prompt, 10, generator=torch.Generator().manual_seed(1))
    ref = model.generate(prompt, 10, use_cache=False, generator=torch.Generator().manual_seed(1))
    assert out.shape == (2, 15) and torch.equal(out, ref)
    greedy = model.generate(prompt, 10, top_k=1)
    idx = prompt
    for _ in range(10):
        nxt = model(idx[:, -8:])[:, -1].argmax(-1, keepdim=True)
        idx = torch.cat([idx, nxt], dim=1)
    assert torch.equal(greedy, idx)


def test_top_k_and_temperature() -> None:
    model = tiny_gpt()
    prompt = tokens(4, 4, 3)
    greedy = model.generate(prompt, 5, top_k=1)
    cold = model.generate(prompt, 5, temperature=1e-4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(greedy, cold)
    with pytest.raises(ValueError, match="temperature: expected > 0, got 0"):
        model.generate(prompt, 2, temperature=0.0)
    with pytest.raises(ValueError, match=r"top_k: expected 1..13, got 14"):
        model.generate(prompt, 2, top_k=14)


def test_gpt_input_errors() -> None:
    model = tiny_gpt()
    with pytest.raises(TypeError, match=r"idx: expected a \(B, N\) LongTensor"):
        model(torch.zeros(2, 4))
    with pytest.raises(TypeError, match=r"idx: expected a \(B, N\) LongTensor"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="at most block_size = 16 tokens, got a sequence of 17"):
        model(torch.zeros(1, 17, dtype=torch.long))
    caches = [KVCache() for _ in model.blocks]
    model(torch.zeros(1, 12, dtype=torch.long), caches)
    with pytest.raises(ValueError, match="at most block_size = 16 tokens, got a sequence of 17"):
        model(torch.zeros(1, 5, dtype=torch.long), caches)
    with pytest.raises(TypeError, match="config: expected GPTConfig"):
        GPT(ViTConfig())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"n_embd: expected a multiple of n_head \(4\), got 18"):
        GPT(GPTConfig(n_head=4, n_embd=18))
    with pytest.raises(ValueError, match="n_layer: expected a positive int, got 0"):
        GPT(GPTConfig(n_layer=0))
    with pytest.raises(TypeError, match=r"^n_embd: expected a positive int, got float$"):
        GPT(GPTConfig(n_embd=64.0))  # type: ignore[arg-type]


#: the graph kind's check of k against the longest sequence: "graph: topk[k=33]: expected k
#: at most the 32 tokens a sequence can hold, got 33"
K, MOST = r"graph: topk\[k=", "expected k at most"


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: GPTConfig(vocab_size=0), r"^vocab_size: expected a positive int, got 0$"),
        (lambda: GPTConfig(block_size=0), r"^block_size: expected a positive int, got 0$"),
        (lambda: ViTConfig(num_classes=0), r"^num_classes: expected a positive int, got 0$"),
        (lambda: ViTConfig(in_channels=0), r"^in_channels: expected a positive int, got 0$"),
        (lambda: SequenceClassifierConfig(num_classes=0), r"^num_classes: expected a positive"),
        (lambda: GPTConfig(mlp_ratio=-1), r"^mlp_ratio: expected an int >= 0, got -1$"),
        (lambda: GPTConfig(dropout=1.0), r"^dropout: expected a probability in \[0, 1\)"),
        (lambda: GPTConfig(block_size=32, graph="topk[k=33]"), rf"^{K}33\]: {MOST} the 32 tokens"),
        # 8x8 images in 2x2 patches: 16 patches and a cls token
        (lambda: ViTConfig(graph="topk[k=18]"), rf"^{K}18\]: {MOST} the 17 tokens"),
        (lambda: ViTConfig(graph="topk[k=17]", pool="mean"), rf"^{K}17\]: {MOST} the 16 tokens"),
        (
            lambda: SequenceClassifierConfig(block_size=8, graph="topk[k=9]"),
            rf"^{K}9\]: {MOST} the 8 tokens",
        ),
    ],
)
def test_configs_refuse_impossible_sizes_when_made(make, match) -> None:
    """A config a model cannot use is refused at once, not at the first forward."""
    with pytest.raises(ValueError, match=match):
        make()


def test_configs_accept_topk_up_to_the_longest_sequence() -> None:
    assert ViTConfig(graph="topk[k=17]").max_tokens() == 17
    clf = SequenceClassifierConfig(block_size=8, graph="topk[k=9]", pool="cls")
    assert clf.max_tokens() == 9
    assert GPTConfig(block_size=32, graph="topk[k=32]").max_tokens() == 32


def test_the_blocks_get_the_graph_kinds_the_config_parsed() -> None:
    """A config parses its graph specs once, one builder per distinct spec; the blocks get them."""
    config = GPTConfig(
        n_layer=3, n_head=2, n_embd=8, block_size=8, graph="topk[k=4];topk[k=4];softmax"
    )
    kinds = config.graph_kinds
    assert [kind.spec for kind in kinds] == config.layer_graphs() == ["topk[k=4]"] * 2 + ["softmax"]
    assert kinds[0] is kinds[1] and config.graph_kinds is kinds
    model = GPT(config)
    assert all(
        block.attn.graph_kind is kind for block, kind in zip(model.blocks, kinds, strict=True)
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: DiffusionAttention(8, 2, topk=2),
        lambda: TransformerBlock(8, 2, topk=2),
        lambda: GPTConfig(block_size=8, topk=2),
        lambda: ViTConfig(topk=2),
        lambda: SequenceClassifierConfig(block_size=8, topk=2),
    ],
)
def test_layers_and_configs_take_no_topk_keyword(make) -> None:
    """``graph="topk[k=2]"`` is the one way to ask for a top-k graph (the ``topk=`` shorthand
    of 0.1.0 is gone; the command line's ``--topk K`` stays, resolved to the graph spec)."""
    with pytest.raises(TypeError, match="unexpected keyword argument 'topk'"):
        make()


def test_token_ids_outside_the_vocabulary_are_named() -> None:
    model = tiny_gpt()
    vocab = model.config.vocab_size
    for bad, shown in ((vocab, f"[0, {vocab}]"), (-1, "[-1, 0]")):
        idx = torch.zeros(1, 4, dtype=torch.long)
        idx[0, 2] = bad
        pattern = rf"^idx: expected token ids in \[0, vocab_size={vocab}\), got ids in "
        with pytest.raises(ValueError, match=pattern + re.escape(shown)):
            model(idx)
    clf = tiny_classifier("last", True)
    with pytest.raises(ValueError, match=r"^idx: expected token ids in \[0, vocab_size=13\)"):
        clf(torch.full((1, 4), 13, dtype=torch.long))


def test_gpt_is_causal(device) -> None:
    model = tiny_gpt("attention:1,laplacian:1,heat:1,ppr:1", device=device)
    idx = tokens(5, 2, 10, device=device)
    moved = idx.clone()
    moved[:, 6:] = (moved[:, 6:] + 1) % 13
    torch.testing.assert_close(model(moved)[:, :6], model(idx)[:, :6], atol=1e-12, rtol=0)


# ---- ViT ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_vit_shapes_and_patch_permutation_invariance(pool, device) -> None:
    torch.manual_seed(0)
    cfg = ViTConfig(
        image_size=8, patch_size=2, in_channels=3, num_classes=5, n_layer=2, n_head=4,
        n_embd=16, heads="attention:2,laplacian:1,heat:1", pool=pool,
    )  # fmt: skip
    model = ViT(cfg).to(device, F64).eval()
    images = torch.randn(3, 3, 8, 8, dtype=F64).to(device)
    logits = model(images)
    assert logits.shape == (3, 5) and torch.isfinite(logits).all()
    assert model.pos.shape == (1, 16 + (pool == "cls"), 16)
    # without position embeddings a ViT sees a set of patches: shuffling them changes nothing
    with torch.no_grad():
        model.pos.zero_()
    patches = images.reshape(3, 3, 4, 2, 4, 2)  # (B, C, rows, 2, cols, 2)
    shuffled = patches.flip(2).transpose(2, 4).reshape(3, 3, 8, 8)  # a permutation of patches
    assert not torch.equal(shuffled, images)
    torch.testing.assert_close(model(shuffled), model(images), atol=1e-12, rtol=1e-10)


def test_vit_errors() -> None:
    with pytest.raises(ValueError, match=r"patch_size: expected a divisor of image_size \(8\)"):
        ViT(ViTConfig(image_size=8, patch_size=3))
    with pytest.raises(ValueError, match="pool: expected 'cls', 'mean' or 'avg', got 'max'"):
        ViT(ViTConfig(pool="max"))
    model = ViT(ViTConfig(n_layer=1, n_head=2, n_embd=8))
    with pytest.raises(
        ValueError, match=r"images: expected shape \(B, 1, 8, 8\), got \(2, 3, 8, 8\)"
    ):
        model(torch.zeros(2, 3, 8, 8))


# ---- SequenceClassifier ------------------------------------------------------------------------


def tiny_classifier(pool: str, causal: bool, heads="attention:2,laplacian:1,heat:1"):
    torch.manual_seed(0)
    cfg = SequenceClassifierConfig(
        vocab_size=13, num_classes=3, block_size=10, n_layer=2, n_head=4, n_embd=16,
        heads=heads, pool=pool, causal=causal,
    )  # fmt: skip
    return SequenceClassifier(cfg).to(F64).eval()


@pytest.mark.parametrize(
    ("pool", "causal"), [("mean", False), ("mean", True), ("last", True), ("cls", False)]
)
def test_classifier_pooling_ignores_padded_tokens(pool, causal) -> None:
    model = tiny_classifier(pool, causal)
    idx = tokens(6, 3, 8)
    key_mask = mh.padding_mask(3, 8, [8, 5, 2])
    logits = model(idx, key_mask)
    assert logits.shape == (3, 3)
    moved = idx.clone()
    moved[~key_mask] = (moved[~key_mask] + 5) % 13
    torch.testing.assert_close(model(moved, key_mask), logits, atol=1e-12, rtol=1e-10)
    # the padded sequence classifies like the same tokens without padding
    for i, n_real in enumerate([8, 5, 2]):
        alone = model(idx[i : i + 1, :n_real])
        torch.testing.assert_close(alone, logits[i : i + 1], atol=1e-12, rtol=1e-10)
    # an all-True mask is no mask
    torch.testing.assert_close(
        model(idx, torch.ones(3, 8, dtype=torch.bool)), model(idx), atol=1e-12, rtol=0
    )


def test_classifier_pooling_reads_the_right_token() -> None:
    idx = tokens(7, 2, 6)
    for pool, pick in [("last", lambda x: x[:, -1]), ("mean", lambda x: x.mean(1))]:
        model = tiny_classifier(pool, causal=True)
        x = model.tok_emb(idx) + model.pos_emb(torch.arange(6))
        for block in model.blocks:
            x = block(x)
        expected = model.head(pick(model.ln_f(x)))
        torch.testing.assert_close(model(idx), expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("pool", ["last", "mean"])
def test_classifier_pooling_with_padding_reads_the_real_tokens(pool) -> None:
    """With a key mask: "last" reads the last *real* token (not position ``#real - 1``, which
    differs under left padding or holes) and "mean" averages the real tokens only."""
    idx = tokens(10, 3, 6)
    key_mask = torch.tensor(
        [
            [False, False, True, True, True, True],  # left padding: last real token at 5
            [True, True, True, True, False, False],  # right padding: at 3
            [True, False, True, True, False, True],  # holes: at 5, four real tokens
        ]
    )
    model = tiny_classifier(pool, causal=True)
    x = model.tok_emb(idx) + model.pos_emb(torch.arange(6))
    for block in model.blocks:
        x = block(x, key_mask)
    x = model.ln_f(x)
    if pool == "last":
        pooled = x[torch.arange(3), torch.tensor([5, 3, 5])]
    else:
        pooled = torch.stack([x[b, key_mask[b]].mean(0) for b in range(3)])
    torch.testing.assert_close(model(idx, key_mask), model.head(pooled), atol=1e-12, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pool", ["cls", "mean", "last"])
def test_classifier_logits_depend_on_the_tokens(pool, causal) -> None:
    model = tiny_classifier(pool, causal)
    logits = model(tokens(9, 4, 8))  # four different sequences
    assert (logits[1:] - logits[:1]).abs().amax() > 1e-6


def test_classifier_errors() -> None:
    with pytest.raises(ValueError, match="pool: expected 'last', 'mean' or 'cls', got 'max'"):
        SequenceClassifier(SequenceClassifierConfig(pool="max"))
    model = tiny_classifier("last", True)
    with pytest.raises(TypeError, match=r"idx: expected a \(B, N\) LongTensor"):
        model(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="at most block_size = 10 tokens, got a sequence of 11"):
        model(torch.zeros(1, 11, dtype=torch.long))


# ---- configs and save/load ---------------------------------------------------------------------


@pytest.mark.parametrize("config", [GPTConfig(), ViTConfig(), SequenceClassifierConfig()])
def test_configs_are_frozen(config) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.n_layer = 7  # type: ignore[misc]
    assert hash(config) == hash(dataclasses.replace(config))


def _models():
    heads = ("attention:2,laplacian:2", "heat[t=0.5;learnable=true]:2,ppr:2")
    gpt = GPT(GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=4, n_embd=16, heads=heads))
    vit = ViT(ViTConfig(image_size=4, patch_size=2, n_layer=2, n_head=4, n_embd=16, heads=heads))
    clf = SequenceClassifier(
        SequenceClassifierConfig(
            vocab_size=13, block_size=8, n_layer=2, n_head=4, n_embd=16, heads=heads, pool="cls"
        )
    )
    idx = tokens(8, 2, 6)
    images = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    return [
        ("gpt", gpt, lambda m: m(idx)),
        ("vit", vit, lambda m: m(images)),
        ("clf", clf, lambda m: m(idx, torch.tensor([[True] * 6, [True] * 3 + [False] * 3]))),
    ]


@pytest.mark.parametrize("index", [0, 1, 2], ids=["gpt", "vit", "clf"])
def test_save_load_round_trip(tmp_path, index) -> None:
    torch.manual_seed(0)
    _, model, run = _models()[index]
    heat = model.blocks[1].attn.head_operators[0]
    with torch.no_grad():  # trained-looking values, not the initialization
        heat.log_t.fill_(0.3)
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    model.eval()
    path = tmp_path / "sub" / "model.pt"
    save_model(model, path)
    assert path.exists() and [p.name for p in path.parent.iterdir()] == ["model.pt"]
    loaded = load_model(path).eval()
    assert type(loaded) is type(model)
    assert loaded.config == model.config
    assert isinstance(loaded.config.heads, tuple) and loaded.config.heads == model.config.heads
    assert float(loaded.blocks[1].attn.head_operators[0].t.detach()) == pytest.approx(
        float(heat.t.detach())
    )
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)
    torch.testing.assert_close(run(loaded), run(model), atol=0, rtol=0)


def test_a_saved_config_with_topk_null_loads_and_a_topk_value_is_refused(tmp_path) -> None:
    """A model saved while configs had a ``topk`` field (``"topk": None`` in its config) loads
    as saved; a ``topk`` value is refused, naming the graph spec to write instead."""
    torch.manual_seed(0)
    model = tiny_gpt("attention:2,laplacian:2", dtype=torch.float32)
    path = tmp_path / "model.pt"
    save_model(model, path)
    payload = torch.load(path, weights_only=True)
    assert "topk" not in payload["config"]
    payload["config"]["topk"] = None
    torch.save(payload, path)
    loaded = load_model(path).eval()
    assert loaded.config == model.config
    idx = tokens(0, 2, 6)
    torch.testing.assert_close(loaded(idx), model(idx), atol=0, rtol=0)
    payload["config"]["topk"] = 4
    torch.save(payload, path)
    with pytest.raises(ValueError, match=r"^path: .* holds a config with topk=4, the removed "
                       r"shorthand for graph='topk\[k=4\]': expected graph='topk\[k=4\]' in its "
                       r"config instead \(it has graph='softmax'\)$") as err:  # fmt: skip
        load_model(path)
    assert err.value.argument == "path"  # type: ignore[attr-defined]


def test_save_load_errors(tmp_path) -> None:
    with pytest.raises(TypeError, match="model: expected one of"):
        save_model(TransformerBlock(8, 2), tmp_path / "block.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="is not a heatformer model file"):
        load_model(tmp_path / "other.pt")


# ---- training ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "heads", ["attention:1,laplacian:1", "heat[t=0.5;learnable=true]:1,attention:1"]
)
def test_training_on_a_repeated_pattern_lowers_the_loss(heads) -> None:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=8, block_size=16, n_layer=1, n_head=2, n_embd=16, heads=heads)
    model = GPT(cfg)
    pattern = torch.tensor([0, 3, 1, 4, 1, 5])
    stream = pattern.repeat(8)  # 48 tokens
    starts = torch.arange(0, 30, 3)
    batch = torch.stack([stream[s : s + 13] for s in starts])  # (10, 13)
    x, y = batch[:, :-1], batch[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(60):
        loss = F.cross_entropy(model(x).reshape(-1, 8), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(2.08, abs=0.15)  # ~log(8) at initialization
    assert losses[-1] < 0.35 * losses[0]
    assert min(losses[-5:]) < 0.7


def test_block_dropout_on_the_residual_branches() -> None:
    """Train mode: ``x + drop(attn(ln1 x))``, then ``+ mlp(ln2 .)`` (the MLP drops its own
    output); the same random stream replayed by hand gives the same numbers. Eval: no-op."""
    block = TransformerBlock(16, 4, "attention:2,laplacian:2", dropout=0.5).to(F64)
    x = torch.randn(2, 5, 16, dtype=F64)
    block.train()
    torch.manual_seed(3)
    y = block(x)
    torch.manual_seed(3)
    a = block.attn(block.ln1(x))  # the layer drops its head outputs first
    h = x + F.dropout(a, 0.5, training=True)
    torch.testing.assert_close(y, h + block.mlp(block.ln2(h)))
    assert not torch.allclose(y, x + a + block.mlp(block.ln2(x + a)))
    block.eval()
    a = block.attn(block.ln1(x))
    torch.testing.assert_close(block(x), x + a + block.mlp(block.ln2(x + a)))
