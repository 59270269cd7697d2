"""Tiny transformers models built from configs (no download), and inputs for them."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB = 61


def configs() -> dict[str, tuple[Any, Any]]:
    transformers = pytest.importorskip("transformers")
    common = {"vocab_size": VOCAB, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    return {
        "gpt2": (
            transformers.GPT2LMHeadModel,
            transformers.GPT2Config(
                n_layer=2, n_head=4, n_embd=32, n_positions=64, attn_pdrop=0.0,
                resid_pdrop=0.0, embd_pdrop=0.0, **common,
            ),
        ),
        "llama": (  # grouped-query attention: 4 query heads share 2 key/value heads
            transformers.LlamaForCausalLM,
            transformers.LlamaConfig(
                hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                **common,
            ),
        ),
        "bert": (
            transformers.BertModel,
            transformers.BertConfig(
                hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0, **common,
            ),
        ),
        "vit": (
            transformers.ViTModel,
            transformers.ViTConfig(
                image_size=16, patch_size=4, num_channels=3, hidden_size=32,
                num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            ),
        ),
    }  # fmt: skip


#: a tiny Llama-like architecture (grouped-query attention), offline: Mistral's and DiffLlama's
LLAMA_LIKE: dict[str, Any] = {
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": VOCAB,
    "max_position_embeddings": 64,
}  # fmt: skip


def diffllama_config(**overrides: Any) -> Any:
    """A tiny :class:`transformers.DiffLlamaConfig` (:data:`LLAMA_LIKE`, ``overrides`` on top):
    4 attention heads of width 8 (2 differential heads), 2 key/value heads."""
    transformers = pytest.importorskip("transformers")
    return transformers.DiffLlamaConfig(**{**LLAMA_LIKE, **overrides})


CAUSAL = ("gpt2", "llama")
FAMILIES = ("gpt2", "llama", "bert", "vit")


def model_inputs(family: str, batch: int = 3, n: int = 9, seed: int = 1) -> dict[str, Any]:
    """Inputs for a family: token ids and a padding mask (row 0 short), or pixels."""
    g = torch.Generator().manual_seed(seed)
    if family == "vit":
        return {"pixel_values": torch.randn(batch, 3, 16, 16, generator=g)}
    ids = torch.randint(3, VOCAB, (batch, n), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones(batch, n, dtype=torch.long)}


def output_of(family: str, out: Any) -> torch.Tensor:
    """The tensor a family's model returns (logits or last hidden states)."""
    return out.logits if family in CAUSAL else out.last_hidden_state
