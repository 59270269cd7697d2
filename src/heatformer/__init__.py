"""heatformer: attention matrices as weighted graphs, and diffusion heads for transformers.

Subpackages:

- :mod:`heatformer.graph_ops` -- attention graphs, Laplacians and diffusion operators.
- :mod:`heatformer.models` -- :class:`DiffusionAttention`, transformer blocks, GPT and ViT.
- :mod:`heatformer.analysis` -- token-geometry metrics.
- :mod:`heatformer.datasets` -- seeded generators of synthetic benchmarks (MQAR, induction heads,
  selective copying, parity, ListOps, passkey retrieval), tensors out.
- :mod:`heatformer.viz` -- plots of attention graphs, heat flow and spectra (needs the ``viz``
  extra).
- :mod:`heatformer.lab` -- built-in tasks, trainer and the compare runner.
- :mod:`heatformer.lab.demo` -- the teaching demo behind ``heatformer demo`` (trains small models,
  draws with :mod:`heatformer.viz`).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
