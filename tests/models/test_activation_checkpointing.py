"""Activation checkpointing (``activation_checkpointing=True`` in a model config): the same
losses and gradients as without, on every graph kind and model, in less memory.

The equality is exact in float64 up to round-off: the recomputed forward makes the same
operations on the same inputs (dropout and drop-path draw the same masks again, the top-k
selection picks the same keys).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from heatformer.models import (
    GPT,
    GPTConfig,
    SequenceClassifier,
    SequenceClassifierConfig,
    ViT,
    ViTConfig,
    load_model,
    save_model,
)

F64 = torch.float64
GRAPHS = ["softmax", "topk[k=3]", "window[w=3,global=1]"]
HEADS = ["attention:2,laplacian:2", "heat:2,mean:2"]


def _loss_and_grads(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor):
    torch.manual_seed(7)  # dropout draws
    logits = model(inputs)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
    return loss, grads


def _assert_same(make, inputs: torch.Tensor, targets: torch.Tensor) -> None:
    torch.manual_seed(0)
    plain = make(False).to(F64).train()
    torch.manual_seed(0)
    checkpointed = make(True).to(F64).train()
    assert all(b.activation_checkpointing for b in checkpointed.blocks)
    loss, grads = _loss_and_grads(plain, inputs, targets)
    loss_ck, grads_ck = _loss_and_grads(checkpointed, inputs, targets)
    torch.testing.assert_close(loss_ck, loss, atol=1e-12, rtol=0)
    for a, b in zip(grads_ck, grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("graph", GRAPHS)
def test_gpt_gradients_equal_without_checkpointing(graph: str, heads: str) -> None:
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 13, (2, 12), generator=gen)

    def make(on: bool) -> GPT:
        return GPT(GPTConfig(vocab_size=13, block_size=12, n_layer=2, n_head=4, n_embd=16,
                             heads=heads, graph=graph, dropout=0.1,
                             activation_checkpointing=on))  # fmt: skip

    _assert_same(make, idx, torch.roll(idx, -1, 1))


@pytest.mark.parametrize("pool", ["cls", "mean", "last"])
@pytest.mark.parametrize("graph", GRAPHS)
def test_classifier_gradients_equal_without_checkpointing(graph: str, pool: str) -> None:
    gen = torch.Generator().manual_seed(2)
    idx = torch.randint(0, 11, (3, 10), generator=gen)

    def make(on: bool) -> SequenceClassifier:
        return SequenceClassifier(SequenceClassifierConfig(
            vocab_size=11, num_classes=5, block_size=10, n_layer=2, n_head=2, n_embd=8,
            graph=graph, pool=pool, causal=pool == "last", activation_checkpointing=on,
        ))  # fmt: skip

    _assert_same(make, idx, torch.tensor([0, 3, 4]))


def test_vit_with_drop_path_gradients_equal_without_checkpointing() -> None:
    gen = torch.Generator().manual_seed(3)
    images = torch.randn(4, 1, 8, 8, generator=gen, dtype=F64)

    def make(on: bool) -> ViT:
        return ViT(ViTConfig(n_layer=3, n_head=2, n_embd=8, drop_path=0.3, dropout=0.1,
                             layer_scale_init=1e-2, activation_checkpointing=on))  # fmt: skip

    _assert_same(make, images, torch.tensor([0, 3, 9, 1]))


def test_checkpointing_is_off_without_gradients_and_with_a_cache() -> None:
    """Eval passes, ``no_grad`` passes and cached generation run the blocks as they are."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=13, block_size=16, n_layer=2, n_head=2, n_embd=8)
    plain = GPT(config).eval()
    checkpointed = GPT(dataclasses.replace(config, activation_checkpointing=True)).eval()
    checkpointed.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 13, (2, 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(checkpointed(idx), plain(idx), atol=0, rtol=0)
    torch.manual_seed(5)
    ours = checkpointed.generate(idx, 6)
    torch.manual_seed(5)
    assert torch.equal(ours, plain.generate(idx, 6))


@pytest.mark.parametrize("graph", ["topk[k=8]", "window[w=8,global=1]"])
def test_a_checkpointed_block_keeps_only_its_inputs(graph: str) -> None:
    """What backward keeps (the tensors packed by autograd's saved-tensor hooks): with
    checkpointing the two branch inputs of each block, ``(B, N, D)`` each, and nothing of the
    layer's ``q, k, v``, MLP states or graph (the window kind's autograd function saves its
    inputs and key mask through ``save_for_backward``, not on a graph object)."""

    def saved_bytes(on: bool) -> int:
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=13, block_size=64, n_layer=3, n_head=4, n_embd=32,
                              graph=graph, activation_checkpointing=on))  # fmt: skip
        idx = torch.randint(0, 13, (2, 64), generator=torch.Generator().manual_seed(1))
        sizes: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            sizes[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(idx)
        return sum(sizes.values())

    state = 2 * 64 * 32 * 4  # one (B, N, D) float32 residual state
    with_ck = saved_bytes(True)
    # 2 branch inputs x 3 blocks, the final norm's input, the logits' input and small tensors
    assert with_ck <= (2 * 3 + 3) * state
    assert saved_bytes(False) > 5 * with_ck


def test_the_option_is_checked_and_survives_save_and_load(tmp_path) -> None:
    with pytest.raises(TypeError, match=r"^activation_checkpointing:"):
        GPTConfig(activation_checkpointing="yes")  # type: ignore[arg-type]
    model = GPT(GPTConfig(vocab_size=13, block_size=8, n_layer=1, n_head=2, n_embd=8,
                          activation_checkpointing=True))  # fmt: skip
    save_model(model, tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    assert loaded.config.activation_checkpointing is True
    assert all(b.activation_checkpointing for b in loaded.blocks)


@pytest.mark.parametrize("on", [False, True])
def test_no_window_graph_is_kept_for_backward(monkeypatch, on: bool) -> None:
    """The window kind's autograd function saves tensors (``save_for_backward``: what
    checkpointing drops and recomputes), not the graph object with its ``q``, ``k`` and masks:
    after the forward pass no graph is alive, and the backward still runs."""
    import gc
    import weakref

    from heatformer.graph_ops.window import builder

    # the builder's path (it checked the arguments)
    original, made = builder.trusted_window_graph, []

    def recording(*args, **kwargs):
        graph = original(*args, **kwargs)
        made.append(weakref.ref(graph))
        return graph

    monkeypatch.setattr(builder, "trusted_window_graph", recording)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=13, block_size=32, n_layer=2, n_head=2, n_embd=16,
                          graph="window[w=4,global=1]", activation_checkpointing=on))  # fmt: skip
    idx = torch.randint(0, 13, (2, 32), generator=torch.Generator().manual_seed(1))
    gc.disable()  # freed by reference counting, not by a collection
    try:
        loss = model(idx).sum()
        assert len(made) == 2 and all(ref() is None for ref in made)
    finally:
        gc.enable()
    loss.backward()
    assert len(made) == (4 if on else 2)  # recomputed once per block
