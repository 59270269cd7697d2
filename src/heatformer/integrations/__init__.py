"""Adapters that put heatformer's diffusion heads into other libraries' models.

One module per library, each imported on its own (its library is an optional extra):

- :mod:`heatformer.integrations.hf` -- Hugging Face ``transformers`` models (GPT-2,
  Llama-family, BERT, ViT): ``convert(model, heads)``, ``attention_graphs(model, **inputs)``
  (``pip install 'heatformer[hf]'``);
- :mod:`heatformer.integrations.timm` -- timm vision transformers (``vit_*``, ``deit3_*``):
  ``convert(model, heads)`` (``pip install 'heatformer[timm]'``);
- :mod:`heatformer.integrations.torch` -- every :class:`torch.nn.MultiheadAttention` inside a
  module (``nn.TransformerEncoder``, ``nn.TransformerDecoderLayer``...): ``convert(module,
  heads)`` (no extra).

The adapters share :class:`~heatformer.integrations._heads.HeadOperators`, which applies one
operator per head to the host layer's own queries, keys and values.
"""

__all__: list[str] = []
