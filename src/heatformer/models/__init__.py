"""Transformer layers with a diffusion operator per head, and reference models."""

from heatformer.models.attention import DiffusionAttention
from heatformer.models.cache import KVCache
from heatformer.models.configs import GPTConfig, SequenceClassifierConfig, ViTConfig
from heatformer.models.files import UnfinishedTraining, load_model, model_file_keys, save_model
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
    "UnfinishedTraining",
    "ViT",
    "ViTConfig",
    "format_heads",
    "load_model",
    "model_file_keys",
    "parse_heads",
    "parse_layer_graphs",
    "parse_layer_heads",
    "save_model",
]
