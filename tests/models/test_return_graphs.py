"""The reference models return each layer's attention graph on request (return_graphs=True)."""

from __future__ import annotations

import pytest
import torch

from heatformer.analysis import snapshot_attention
from heatformer.graph_ops import SoftmaxGraph
from heatformer.models import (
    GPT,
    GPTConfig,
    KVCache,
    SequenceClassifier,
    SequenceClassifierConfig,
    ViT,
    ViTConfig,
)


def test_gpt_returns_the_graph_of_every_layer() -> None:
    torch.manual_seed(0)
    graph = "softmax;topk[k=2];softmax"
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=3, n_head=2, n_embd=8,
                       heads="attention:1,laplacian:1", graph=graph)  # fmt: skip
    gpt = GPT(config)
    idx = torch.randint(0, 11, (2, 6))
    logits, graphs = gpt(idx, return_graphs=True)
    torch.testing.assert_close(logits, gpt(idx))
    assert len(graphs) == 3 and isinstance(graphs[0], SoftmaxGraph)
    assert all(tuple(g.batch_shape) == (2, 2) and g.num_nodes == 6 for g in graphs)
    assert (graphs[1].to_dense() > 0).sum(-1).le(2).all()  # the layer's own graph kind
    for i, snap in enumerate(snapshot_attention(gpt, idx[:1])):  # the graphs the heads used
        torch.testing.assert_close(graphs[i].to_dense()[0].double(), snap.graph.to_dense())
    logits.sum().backward()  # graphs are built in the caller's grad mode
    q_grad = torch.autograd.grad(graphs[0].to_dense().sum(), gpt.blocks[0].attn.in_proj.weight)
    assert q_grad[0].abs().sum() > 0
    with pytest.raises(ValueError, match="together with caches") as err:
        gpt(idx, [KVCache() for _ in range(3)], return_graphs=True)
    assert err.value.argument == "return_graphs"  # type: ignore[attr-defined]


def test_vit_and_classifier_return_graphs_with_their_masks() -> None:
    torch.manual_seed(0)
    vit = ViT(ViTConfig(image_size=8, patch_size=4, in_channels=1, n_layer=2, n_head=2, n_embd=8))
    images = torch.randn(3, 1, 8, 8)
    logits, graphs = vit(images, return_graphs=True)
    torch.testing.assert_close(logits, vit(images))
    assert [(*g.batch_shape, g.num_nodes) for g in graphs] == [(3, 2, 5)] * 2  # cls + 4
    clf = SequenceClassifier(SequenceClassifierConfig(vocab_size=7, block_size=6, n_layer=2,
                                                      n_head=2, n_embd=8, pool="cls"))  # fmt: skip
    idx = torch.randint(0, 7, (2, 6))
    key_mask = torch.ones(2, 6, dtype=torch.bool)
    key_mask[1, 4:] = False
    logits, graphs = clf(idx, key_mask, return_graphs=True)
    torch.testing.assert_close(logits, clf(idx, key_mask))
    dense = graphs[0].to_dense()  # (B, H, 7, 7): the tokens, then the cls token (causal)
    assert dense.shape == (2, 2, 7, 7) and dense.triu(1).eq(0).all()
    assert dense[1, ..., 4:6].eq(0).all() and dense[0, :, 6, 4:6].gt(0).all()  # padded keys
    with pytest.raises(TypeError, match="expected a bool") as err:
        clf(idx, return_graphs="yes")
    assert err.value.argument == "return_graphs"  # type: ignore[attr-defined]
