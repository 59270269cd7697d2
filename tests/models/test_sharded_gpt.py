"""A GPT on a sequence split over processes (``shard=``) equals the one-process model.

Pooled gloo groups of 2 and 4 processes on the loopback interface (bounded in time) run window
graphs with attention, Laplacian and heat heads, global tokens, uneven ``N / P`` and shards
shorter than the window, an empty block (3 tokens on 4 processes), one with activation
checkpointing; the gathered logits and the parameter gradients summed over the group equal the
single-process ones in float64. The refusals (KV cache, graphs, dense kinds, attention
dropout) need no process group.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import sequence_parallel_helpers as sp
from heatformer.graph_ops import SequenceShard, resolve_graph
from heatformer.models import GPT, DiffusionAttention, GPTConfig, KVCache
from heatformer.models.masks import AttentionMask
from heatformer.models.routing import HeadRouter

needs_gloo = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="torch.distributed with the gloo backend is not available",
)


@needs_gloo
@pytest.mark.usefixtures("one_launch_at_a_time")
@pytest.mark.parametrize("case", range(len(sp.GPT_CASES)))
@pytest.mark.parametrize("world", [2, 4])
def test_sharded_gpt_equals_one_process(world: int, case: int, gloo_groups) -> None:
    logits, grads = gloo_groups(world).call("sequence_parallel_helpers:sharded_gpt_case", case)[0]
    model, idx, weights = sp.gpt_case(case)
    assert idx.shape[1] % world  # uneven blocks
    expected = model(idx)
    (expected * weights).sum().backward()
    expected_grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    torch.testing.assert_close(logits, expected.detach(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grads, expected_grads, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("world", [2, 4])
def test_the_gpt_cases_include_a_shard_shorter_than_the_window(world: int) -> None:
    shortest = [  # (shortest block, window) of every case
        (min(b - a for a, b in (SequenceShard.bounds_of(n, world, r) for r in range(world))),
         resolve_graph(fields["graph"]).params["w"])
        for fields, n in sp.GPT_CASES
    ]  # fmt: skip
    assert any(block < w for block, w in shortest)


def _gpt(graph: str = "window[w=2]") -> GPT:
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, vocab_size=5, block_size=8, graph=graph))


def test_sharded_gpt_refuses_caches_graphs_long_sequences_and_other_lengths() -> None:
    model, shard = _gpt(), SequenceShard(6, 0, 2)
    idx = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="caches: expected no KV cache"):
        model(idx, [KVCache()], shard=shard)
    with pytest.raises(ValueError, match="return_graphs: expected no KV cache and no graphs"):
        model(idx, shard=shard, return_graphs=True)
    with pytest.raises(ValueError, match=r"shard: expected a sequence of at most block_size = 8"):
        model(torch.zeros(1, 5, dtype=torch.long), shard=SequenceShard(10, 0, 2))
    with pytest.raises(ValueError, match=r"idx: expected the shard's 3 tokens \(rows 0:3 of 6\)"):
        model(torch.zeros(1, 4, dtype=torch.long), shard=shard)
    with pytest.raises(TypeError, match="shard: expected a SequenceShard, got tuple"):
        model(idx, shard=(6, 0, 2))  # type: ignore[arg-type]


@pytest.mark.parametrize("graph", ["softmax", "topk[k=2]"])
def test_sharded_layer_refuses_kinds_that_need_every_key(graph: str) -> None:
    with pytest.raises(ValueError, match=r"^graph: "):  # the kind says why (the interface)
        _gpt(graph)(torch.zeros(1, 3, dtype=torch.long), shard=SequenceShard(6, 0, 2))


def test_sharded_layer_refuses_weights_cache_and_attention_dropout() -> None:
    layer = DiffusionAttention(8, 2, graph="window[w=2]", causal=True)
    shard, x = SequenceShard(6, 1, 2), torch.randn(1, 3, 8)
    with pytest.raises(ValueError, match="need_weights: expected False with a sharded sequence"):
        layer(x, need_weights=True, shard=shard)
    with pytest.raises(ValueError, match="cache: expected None with a sharded sequence"):
        layer(x, cache=KVCache(), shard=shard)
    router = HeadRouter("attention:2", 2, graph="window[w=2]")
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"dropout: expected 0 with a sharded sequence"):
        router.diffuse(q, q, q, AttentionMask(causal=True), dropout=0.1, shard=shard)
