"""GPT's ``logits_at`` (the output layer at chosen positions only) and ``tie_embeddings`` (the
output layer is the token embedding): equal to the full logits gathered, the same loss and
gradients as the full cross-entropy with ``ignore_index``, through the KV cache, saved and
loaded tied, and bad input refused naming the argument."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from heatformer.models import GPT, GPTConfig, KVCache, load_model, save_model

F64 = torch.float64
IGNORE = -100


def tiny_gpt(heads: str = "attention:2,laplacian:2", **kwargs: object) -> GPT:
    torch.manual_seed(0)
    fields: dict[str, object] = {
        "vocab_size": 29, "block_size": 16, "n_layer": 2, "n_head": 4, "n_embd": 16,
    }  # fmt: skip
    fields.update(kwargs)
    return GPT(GPTConfig(heads=heads, **fields)).to(F64)  # type: ignore[arg-type]


def tokens(seed: int, b: int, n: int, vocab: int = 29) -> torch.Tensor:
    return torch.randint(0, vocab, (b, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("heads", ["attention:2,laplacian:2", "heat:2,ppr:2"])
def test_logits_at_are_the_full_logits_gathered(heads: str) -> None:
    model = tiny_gpt(heads).eval()
    idx = tokens(0, 3, 11)
    positions = torch.tensor([[0, 10, 10, 4], [3, 2, 1, 0], [7, 7, 7, 9]])  # repeats, any order
    full = model(idx)
    part = model(idx, logits_at=positions)
    assert part.shape == (3, 4, 29)
    expected = full.gather(1, positions.unsqueeze(-1).expand(-1, -1, 29))
    torch.testing.assert_close(part, expected, atol=1e-12, rtol=1e-12)


def test_logits_at_scored_positions_give_the_full_loss_and_gradients() -> None:
    """The lab's use: the mean cross-entropy over the scored positions, from their logits
    alone, equals the full cross-entropy with ignore_index, and so do the gradients."""
    from heatformer.lab.tasks._synthetic import scored_positions

    idx = tokens(1, 4, 12)
    targets = torch.full((4, 12), IGNORE)
    gen = torch.Generator().manual_seed(2)
    for row, count in enumerate([3, 1, 0, 5]):  # a sequence with nothing scored
        where = torch.randperm(12, generator=gen)[:count]
        targets[row, where] = torch.randint(0, 29, (count,), generator=gen)
    grads = []
    losses = []
    for gathered in (False, True):
        model = tiny_gpt("attention:2,heat:2", tie_embeddings=gathered)
        model.zero_grad()
        if gathered:
            positions, scored = scored_positions(targets)
            assert positions.shape == (4, 5)
            logits, labels = model(idx, logits_at=positions), scored
        else:
            logits, labels = model(idx), targets
        loss = F.cross_entropy(logits.reshape(-1, 29), labels.reshape(-1), ignore_index=IGNORE)
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    # the tied model differs: compare the untied model with logits_at instead
    model = tiny_gpt("attention:2,heat:2")
    positions, scored = scored_positions(targets)
    logits = model(idx, logits_at=positions)
    loss = F.cross_entropy(logits.reshape(-1, 29), scored.reshape(-1), ignore_index=IGNORE)
    loss.backward()
    torch.testing.assert_close(loss.detach(), losses[0], atol=1e-12, rtol=1e-12)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, grads[0][name], atol=1e-12, rtol=1e-12)


def test_scored_positions_keep_order_and_pad_with_unscored() -> None:
    from heatformer.lab.tasks._synthetic import scored_positions

    targets = torch.tensor([[IGNORE, 4, IGNORE, 2, 8], [IGNORE] * 5, [1, 1, IGNORE, IGNORE, 0]])
    positions, scored = scored_positions(targets)
    assert positions.tolist() == [[1, 3, 4], [0, 1, 2], [0, 1, 4]]
    assert scored.tolist() == [[4, 2, 8], [IGNORE] * 3, [1, 1, 0]]
    nothing = torch.full((2, 3), IGNORE)
    positions, scored = scored_positions(nothing)
    assert positions.shape == (2, 1) and scored.eq(IGNORE).all()


def test_logits_at_with_the_kv_cache() -> None:
    model = tiny_gpt("attention:2,laplacian:2").eval()
    idx = tokens(3, 2, 9)
    full = model(idx)
    caches = [KVCache() for _ in model.blocks]
    model(idx[:, :5], caches)
    step = model(idx[:, 5:], caches, logits_at=torch.tensor([[3, 0], [1, 1]]))
    torch.testing.assert_close(step[0], full[0, [8, 5]], atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(step[1], full[1, [6, 6]], atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize(
    "bad",
    [
        torch.tensor([[0, 1]], dtype=torch.int32),  # dtype
        torch.tensor([0, 1]),  # 1-D
        torch.zeros(3, 2, dtype=torch.long),  # another batch
        [[0, 1], [2, 3]],  # not a tensor
    ],
)
def test_bad_logits_at_is_refused_by_name(bad: object) -> None:
    model = tiny_gpt()
    with pytest.raises(TypeError, match="logits_at") as info:
        model(tokens(0, 2, 5), logits_at=bad)  # type: ignore[arg-type]
    assert info.value.argument == "logits_at"  # type: ignore[attr-defined]


def test_tied_embeddings_share_one_parameter_and_train_it() -> None:
    tied = tiny_gpt(tie_embeddings=True)
    untied = tiny_gpt()
    assert tied.head.weight is tied.tok_emb.weight
    assert untied.num_parameters() - tied.num_parameters() == 29 * 16
    idx = tokens(4, 2, 7)
    logits = tied(idx)
    # the output layer's logits are the states' inner products with the token embeddings
    states = tied.ln_f(tied.blocks[-1](tied.blocks[0](tied.tok_emb(idx) + tied.pos_emb.weight[:7])))
    torch.testing.assert_close(logits, states @ tied.tok_emb.weight.T, atol=1e-12, rtol=1e-12)
    logits.sum().backward()
    assert tied.tok_emb.weight.grad is not None  # both uses add into the one gradient


def test_tied_model_saves_and_loads_tied_and_bit_identical(tmp_path) -> None:
    model = tiny_gpt(tie_embeddings=True).float().eval()  # a model file loads in float32
    with torch.no_grad():
        model.tok_emb.weight.add_(0.5)  # trained away from the initialisation
    save_model(model, tmp_path / "m.pt")
    loaded = load_model(tmp_path / "m.pt").eval()
    assert loaded.config.tie_embeddings is True
    assert loaded.head.weight is loaded.tok_emb.weight
    idx = tokens(5, 2, 9)
    assert torch.equal(loaded(idx), model(idx))


def test_tie_embeddings_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="tie_embeddings"):
        GPTConfig(tie_embeddings="yes")  # type: ignore[arg-type]


def test_attention_only_blocks_have_no_mlp_branch(tmp_path) -> None:
    """``mlp_ratio=0`` (Zoology's ``state_mixer=Identity``): each block is
    ``x + attn(LN1(x))``, with and without activation checkpointing, saved and loaded."""
    from heatformer.models import TransformerBlock

    model = tiny_gpt("attention:2,heat:2", mlp_ratio=0)
    block = model.blocks[0]
    assert block.mlp is None and block.ln2 is None
    assert not any("mlp" in name or "ln2" in name for name, _ in model.named_parameters())
    x = torch.randn(2, 7, 16, dtype=F64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(block(x), x + block.attn(block.ln1(x)), atol=0, rtol=0)
    checkpointed = TransformerBlock(16, 4, "attention:2,heat:2", mlp_ratio=0, causal=True,
                                    activation_checkpointing=True).to(F64)  # fmt: skip
    checkpointed.load_state_dict(block.state_dict())
    x.requires_grad_(True)
    torch.testing.assert_close(checkpointed(x), block(x), atol=1e-14, rtol=0)
    model = model.float().eval()
    save_model(model, tmp_path / "m.pt")
    loaded = load_model(tmp_path / "m.pt").eval()
    assert loaded.config.mlp_ratio == 0
    idx = tokens(6, 2, 9)
    assert torch.equal(loaded(idx), model(idx))
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="mlp_ratio"):
            GPTConfig(mlp_ratio=bad)  # type: ignore[arg-type]
