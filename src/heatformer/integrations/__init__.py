"""Adapters that put heatformer's diffusion heads into other libraries' models.

One module per library, each imported on its own (its library is an optional extra):

- :mod:`heatformer.integrations.hf` -- Hugging Face ``transformers`` models (GPT-2,
  Llama-family, BERT, ViT): ``convert(model, heads)``, ``from_pretrained(model_class, path)``,
  ``attention_graphs(model, **inputs)`` (``pip install 'heatformer[hf]'``);
- :mod:`heatformer.integrations.timm` -- timm vision transformers (``vit_*``, ``deit3_*``):
  ``import_timm()``, ``convert(model, heads)``, ``load_state_dict(model, state_dict)``
  (``pip install 'heatformer[timm]'`` and ``pip install --no-deps 'timm>=1.0.9'``);
- :mod:`heatformer.integrations.torch` -- every :class:`torch.nn.MultiheadAttention` inside a
  module (``nn.TransformerEncoder``, ``nn.TransformerDecoderLayer``...): ``convert(module,
  heads)``, ``load_state_dict(module, state_dict)`` (no extra).

The adapters share :class:`~heatformer.integrations._heads.HeadOperators`, which applies one
operator per head to the host layer's own queries, keys and values (through the
:class:`~heatformer.models.routing.HeadRouter` that
:class:`~heatformer.models.DiffusionAttention` uses too), one convert skeleton
(:class:`~heatformer.integrations._convert.Adapter`: find, make, install), and the
conversion record of :mod:`heatformer.integrations._record`, which a saved converted model
carries (in ``config.json`` for transformers, in the state dict for timm and ``torch.nn``) so
that it loads as what it is.
"""

__all__: list[str] = []
