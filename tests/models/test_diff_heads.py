"""Differential heads in a layer: against transformers' DiffLlama attention with copied weights
(float64), beside other heads on every graph kind, from the KV cache, through a model's depth,
saved and loaded."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from heatformer.checks import ArgumentError
from heatformer.graph_ops import DenseGraph, Differential, split_maps
from heatformer.graph_ops.operators.diff import lambda_init_at
from heatformer.models import GPT, DiffusionAttention, GPTConfig, KVCache
from heatformer.models.files import load_model, save_model

F64 = torch.float64
KINDS = ["softmax", "topk[k=3]", "window[w=3]", "window[w=2,global=2]"]


# ---- transformers' DiffLlama attention, weights copied -----------------------------------------


def _diffllama_attention(layer_idx: int, num_key_value_heads: int) -> torch.nn.Module:
    """A tiny DiffLlamaAttention in float64 with drawn lambda vectors, on transformers' sdpa
    attention (its eager attention forms the softmax in float32)."""
    from hf_helpers import diffllama_config

    pytest.importorskip("transformers")
    from transformers.models.diffllama import modeling_diffllama

    config = diffllama_config(num_key_value_heads=num_key_value_heads)
    config._attn_implementation = "sdpa"
    # transformers before the attention interface (5.4, the floor) has a class per
    # implementation; later ones read config._attn_implementation
    cls = getattr(
        modeling_diffllama, "DiffLlamaSdpaAttention", modeling_diffllama.DiffLlamaAttention
    )
    torch.manual_seed(0)
    attn = cls(config, layer_idx=layer_idx).to(F64).eval()
    with torch.no_grad():  # lambda ~ lambda_init +- 0.5: the second map matters
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            getattr(attn, name).normal_(0.0, 0.5)
    return attn


def _from_diffllama(attn: torch.nn.Module, depth: int) -> DiffusionAttention:
    """The heatformer layer with DiffLlama's weights: its differential head ``j`` is a head whose
    maps are DiffLlama's query heads ``j`` and ``j + H/2`` (their key heads under GQA) and whose
    values are DiffLlama's two value halves, ``[v_(j//g); v_(Hkv/2 + j//g)]``."""
    config = attn.config
    h, d = config.num_attention_heads, attn.head_dim
    g = attn.num_key_value_groups
    hkv = h // g
    dim = config.hidden_size
    layer = DiffusionAttention(dim, h // 2, "diff", causal=True, bias=False, dtype=F64)

    def rows(weight: torch.Tensor, head: int) -> torch.Tensor:
        return weight[head * d : (head + 1) * d]

    q_w, k_w, v_w = attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight
    q = [rows(q_w, j if m == 0 else j + h // 2) for j in range(h // 2) for m in range(2)]
    k = [rows(k_w, (j if m == 0 else j + h // 2) // g) for j in range(h // 2) for m in range(2)]
    v = [
        rows(v_w, j // g if m == 0 else hkv // 2 + j // g) for j in range(h // 2) for m in range(2)
    ]
    op = layer.head_operators[0]
    assert isinstance(op, Differential)
    with torch.no_grad():
        layer.in_proj.weight.copy_(torch.cat([*q, *k, *v]))
        layer.out_proj.weight.copy_(attn.o_proj.weight)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            getattr(op, name).copy_(getattr(attn, name))
    op.set_depth(depth)
    op.eps = float(config.rms_norm_eps)
    return layer


@pytest.mark.parametrize("num_key_value_heads", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("layer_idx", [0, 3])
def test_equals_transformers_diffllama_attention(layer_idx: int, num_key_value_heads: int) -> None:
    """Float64, causal, left padding: every row with a key equals DiffLlamaAttention's output
    (no rotary embedding: ``cos = 1, sin = 0``), lambda_init from the depth ``layer_idx + 1``.
    DiffLlama sums the lambda dot products in float32, so its lambda differs from the exact one
    by a float32 rounding; its output within ``1e-7`` (measured: at most ``6.4e-8``), and within
    float64 round-off (``1e-13``; measured ``4e-16``) given DiffLlama's float32 lambda."""
    attn = _diffllama_attention(layer_idx, num_key_value_heads)
    layer = _from_diffllama(attn, depth=layer_idx + 1)
    op = layer.head_operators[0]
    assert isinstance(op, Differential)
    assert op.lambda_init == attn.lambda_init == lambda_init_at(layer_idx + 1)
    b, n, d = 2, 9, attn.head_dim
    x = torch.randn(
        b, n, attn.config.hidden_size, dtype=F64, generator=torch.Generator().manual_seed(1)
    )
    key_mask = torch.ones(b, n, dtype=torch.bool)
    key_mask[1, :2] = False  # left padding: rows 0 and 1 of element 1 have no key
    allowed = torch.ones(n, n, dtype=torch.bool).tril() & key_mask[:, None, None, :]  # (B,1,N,N)
    additive = torch.zeros(b, 1, n, n, dtype=F64).masked_fill(~allowed, float("-inf"))
    rotary = (torch.ones(b, n, d, dtype=F64), torch.zeros(b, n, d, dtype=F64))
    with torch.no_grad():
        expected, _ = attn(x, rotary, attention_mask=additive)
        got = layer(x, key_mask)
    rows = allowed.any(-1).squeeze(1)  # (B, N): rows with a key
    assert not bool(got[~rows].any())  # a row without keys is 0
    diff = float((got - expected)[rows].abs().max())
    assert diff <= 1e-7, diff
    # the float32 lambda of DiffLlama is the whole difference: with it, float64 round-off
    lam32 = sum(
        sign * torch.exp(torch.sum(getattr(attn, f"lambda_q{i}") * getattr(attn, f"lambda_k{i}"),
                                   dtype=torch.float32)).double()
        for i, sign in ((1, 1.0), (2, -1.0))
    ) + attn.lambda_init  # fmt: skip
    op.lambda_full = lambda dtype=None, device=None: lam32.to(dtype)  # type: ignore[method-assign]
    with torch.no_grad():
        got32 = layer(x, key_mask)
    assert float((got32 - expected)[rows].abs().max()) <= 1e-13


# ---- beside other heads, on every graph kind, from the KV cache --------------------------------


def _per_head(
    layer: DiffusionAttention, x: torch.Tensor, key_mask: torch.Tensor | None
) -> torch.Tensor:
    """Every head on its explicit graph(s): a diff head's maps from the halves of its query and
    key channels, each the layer's graph kind, made dense."""
    q, k, v = layer.project_qkv(x)
    heads = []
    for h, op in enumerate(layer.head_operators):
        qh, kh = q[:, h : h + 1], k[:, h : h + 1]
        if op.maps > 1:
            qh, kh = split_maps(qh, op.maps), split_maps(kh, op.maps)
        graph = layer.graph_kind.build(qh, kh, key_mask=key_mask, causal=layer.causal)
        heads.append(op(DenseGraph(graph.to_dense()), v[:, h : h + 1]))
    return layer.merge_heads(torch.cat(heads, dim=1))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "spec", ["attention:2,diff:2", "laplacian:2,diff:2", "diff:1,heat:1,diff:2"]
)
def test_mixed_heads_equal_their_definition_and_decode_from_the_cache(spec: str, kind: str) -> None:
    """Each head equals its operator on its explicit graph(s) (padded and causal); a causal
    layer decodes from the KV cache what it computes on the whole sequence (where every head
    is served by one propagation per map)."""
    torch.manual_seed(0)
    layer = DiffusionAttention(16, 4, spec, graph=kind, causal=True, dtype=F64).eval()
    x = torch.randn(2, 9, 16, dtype=F64)
    key_mask = torch.ones(2, 9, dtype=torch.bool)
    key_mask[1, :3] = False
    with torch.no_grad():
        torch.testing.assert_close(
            layer(x, key_mask), _per_head(layer, x, key_mask), atol=1e-12, rtol=0
        )
        full = layer(x)
        assert layer.supports_cache == ("heat" not in spec)
        if layer.supports_cache:
            cache = KVCache()
            steps = [layer(x[:, :4], cache=cache)] + [
                layer(x[:, i : i + 1], cache=cache) for i in range(4, 9)
            ]
            torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-12, rtol=0)


def test_gradients_reach_the_lambda_vectors_and_the_projections() -> None:
    torch.manual_seed(0)
    layer = DiffusionAttention(
        16, 2, "attention:1,diff:1", graph="topk[k=4]", causal=True, dtype=F64
    )
    x = torch.randn(2, 9, 16, dtype=F64)
    layer(x).square().sum().backward()
    grads = [p.grad for p in layer.parameters()]
    assert all(g is not None and bool(g.any()) for g in grads)
    names = sorted(n for n, _ in layer.named_parameters() if "lambda" in n)
    assert names == [f"operators.1.lambda_{w}{i}" for w in "kq" for i in (1, 2)]
    assert all(p.shape == (4,) for n, p in layer.named_parameters() if "lambda" in n)  # Dh / 2


def test_a_model_tells_each_layer_its_depth_and_loads_as_saved(tmp_path) -> None:
    """GPT's layer ``l`` (1-based) has ``lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1))``; an explicit
    ``lambda_init`` or ``depth`` wins; a saved model loads with the same lambdas and output."""
    config = GPTConfig(
        vocab_size=16, block_size=16, n_layer=3, n_head=2, n_embd=8,
        heads="attention:1,diff:1;diff[lambda_init=0.5]:2;diff[depth=7]:2",
    )  # fmt: skip
    torch.manual_seed(0)
    model = GPT(config).eval()
    inits = [block.attn.head_operators[-1].lambda_init for block in model.blocks]
    assert inits == [lambda_init_at(1), 0.5, lambda_init_at(7)]
    assert math.isclose(inits[0], 0.2, rel_tol=1e-15)
    assert model.supports_cache
    path = tmp_path / "model"
    save_model(model, path)
    loaded = load_model(path).eval()
    ids = torch.randint(0, 16, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model(ids), atol=0, rtol=0)
    assert [b.attn.head_operators[-1].lambda_init for b in loaded.blocks] == inits


def test_one_instance_in_two_layers_of_different_depths_is_refused() -> None:
    op = Differential()
    op.set_depth(2)
    op.set_depth(2)  # the same depth again: nothing
    with pytest.raises(ValueError, match=r"^depth: expected one depth per differential") as err:
        op.set_depth(3)
    assert isinstance(err.value, ArgumentError)
    Differential(lambda_init=0.3).set_depth(5)  # an explicit lambda_init wins: no depth needed


def test_bad_layer_shapes_are_refused_naming_the_argument() -> None:
    with pytest.raises(
        ValueError, match=r"^heads: expected a head width divisible into the 2 maps"
    ):
        DiffusionAttention(6, 2, "diff")  # Dh = 3
    with pytest.raises(ValueError, match=r"^dropout: attention dropout"):
        layer = DiffusionAttention(8, 2, "attention:1,diff:1").train()
        layer.router.diffuse(*layer.project_qkv(torch.randn(1, 3, 8))[:3], _mask(), dropout=0.1)
    shared = Differential()
    DiffusionAttention(8, 2, [shared, "attention"])  # Dh = 4: vectors of 2
    with pytest.raises(ValueError, match=r"^heads: expected heads of width 4"):
        DiffusionAttention(16, 2, [shared, "attention"])


def _mask():  # type: ignore[no-untyped-def]
    from heatformer.models.masks import AttentionMask

    return AttentionMask(causal=True)


def test_a_converted_huggingface_model_takes_diff_heads_from_its_cache() -> None:
    """Differential heads inside a converted Llama (the host's head width split into two maps):
    generation with the host's KV cache equals generation without it."""
    pytest.importorskip("transformers")
    from heatformer.integrations import hf
    from hf_helpers import configs

    cls, config = configs()["llama"]
    torch.manual_seed(0)
    model = cls._from_config(
        copy.deepcopy(config), attn_implementation="sdpa", dtype=torch.float32
    ).eval()
    hf.convert(model, "attention:2,diff:2")
    ids = torch.randint(3, 61, (1, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cached = model.generate(ids, max_new_tokens=4, do_sample=False, use_cache=True)
        plain = model.generate(ids, max_new_tokens=4, do_sample=False, use_cache=False)
    assert torch.equal(cached, plain)
