"""Transformer layers with a diffusion operator per head, and reference models."""

from heatformer.models.attention import DiffusionAttention
from heatformer.models.cache import KVCache
from heatformer.models.configs import GPTConfig, SequenceClassifierConfig, ViTConfig
from heatformer.models.heads import (
    HeadSchedule,
    format_heads,
    parse_heads,
    parse_layer_graphs,
    parse_layer_heads,
)
from heatformer.models.transformer import (
    GPT,
    MLP,
    SequenceClassifier,
    TransformerBlock,
    ViT,
    load_model,
    save_model,
)

__all__ = [
    "GPT",
    "MLP",
    "DiffusionAttention",
    "GPTConfig",
    "HeadSchedule",
    "KVCache",
    "SequenceClassifier",
    "SequenceClassifierConfig",
    "TransformerBlock",
    "ViT",
    "ViTConfig",
    "format_heads",
    "load_model",
    "parse_heads",
    "parse_layer_graphs",
    "parse_layer_heads",
    "save_model",
]
