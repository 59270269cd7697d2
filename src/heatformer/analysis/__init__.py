"""Token-geometry metrics for transformer representations, and hooks that read them out.

The quantities Zhang & Papyan (arXiv:2602.09297, 2026) use to explain Laplacian heads, one
module per concept:

- :mod:`~heatformer.analysis.variance` -- within-sequence collapse
  (:func:`within_sequence_variance`, :func:`variance_decomposition`);
- :mod:`~heatformer.analysis.collapse` -- Neural Collapse of sequence means
  (:func:`neural_collapse`);
- :mod:`~heatformer.analysis.separability` -- separability of tokens that share a next token
  (:func:`next_token_separability`);
- :mod:`~heatformer.analysis.spectra` -- spectral decay (:func:`singular_spectrum`,
  :func:`spectral_decay`);
- :mod:`~heatformer.analysis.energy` -- smoothness on the attention graph
  (:func:`dirichlet_energy`);
- :mod:`~heatformer.analysis.stats` -- in-degree, row entropy and largest logit of an
  attention graph without its ``N x N`` matrix (:func:`attention_stats`);
- :mod:`~heatformer.analysis.filters` -- the learned polynomial filters of a model's heads:
  their coefficients, response and band (:func:`polynomial_filters`, :func:`filter_response`);
- :mod:`~heatformer.analysis.drift` -- how far the matrices heads learn (an untied skip head's
  ``W_S``) moved from their start (:func:`weight_drift`);
- :mod:`~heatformer.analysis.markov` -- the random walk on an attention graph, at any length:
  :func:`stationary_distribution` (TokenRank), :func:`leading_eigenvalues` (``lambda_2``,
  the spectral gap) and :func:`leading_eigenvectors` (with the right eigenvectors: ``v_2``);
- :mod:`~heatformer.analysis.rollout` -- attention rollout through every head's operator
  (:func:`rollout`): the influence of the input tokens on chosen output tokens, a ``(Q, N)``
  block of rows propagated backwards through the layers;
- :mod:`~heatformer.analysis.hooks` -- :func:`collect_token_states` reads per-layer token
  states out of any model with forward hooks, :func:`snapshot_attention` the attention graphs
  and values of every layer.

Conventions of the metrics:

- Token states ``x`` have shape ``(B, N, D)``: ``B`` sequences of ``N`` tokens of
  dimension ``D``. Where it makes sense, any leading batch shape ``(..., N, D)`` works.
- ``mask`` has shape ``(B, N)`` (or ``(..., N)``), dtype ``torch.bool``, and ``True``
  marks a *real* token (the polarity of SDPA's ``attn_mask``: ``True`` = take part).
  Masked tokens are ignored completely; their values may be anything, even NaN.
- Every metric accumulates in float64 (float32 on devices without float64, such as
  MPS) and returns tensors of that dtype on the device of the input (but
  :func:`attention_stats`, which works at the graph's own precision so that it scales to a
  model's sequence length: ``graph.to(torch.float64)`` for float64). Nothing here is
  wrapped in :func:`torch.no_grad`: the metrics are differentiable where the maths is,
  so :func:`dirichlet_energy` can serve as a regulariser. Wrap calls in
  ``torch.no_grad()`` for pure analysis.
- Bad input raises :class:`TypeError` (wrong type or dtype) or :class:`ValueError`
  (wrong shape, device, value), naming the argument, what was expected and what came
  (the errors of :mod:`heatformer.checks`, whose ``.argument`` is the name).

References:
    Zhang, Papyan. Laplacian heads. arXiv:2602.09297, 2026.
    Papyan, Han, Donoho. Prevalence of neural collapse during the terminal phase of deep
    learning training. PNAS 117(40):24652-24663, 2020.
    Roy, Vetterli. The effective rank: a measure of effective dimensionality.
    EUSIPCO 2007.
    Alain, Bengio. Understanding intermediate layers using linear classifier probes.
    arXiv:1610.01644, 2016.
    Chung. Spectral Graph Theory. AMS, 1997.
"""

from heatformer.analysis.collapse import NeuralCollapse, neural_collapse
from heatformer.analysis.drift import WeightDrift, weight_drift
from heatformer.analysis.energy import dirichlet_energy
from heatformer.analysis.filters import (
    PASSBANDS,
    FilterResponse,
    HeadFilter,
    filter_response,
    polynomial_filters,
)
from heatformer.analysis.hooks import LayerSnapshot, collect_token_states, snapshot_attention
from heatformer.analysis.markov import (
    leading_eigenvalues,
    leading_eigenvectors,
    stationary_distribution,
)
from heatformer.analysis.rollout import rollout
from heatformer.analysis.separability import NextTokenSeparability, next_token_separability
from heatformer.analysis.spectra import SpectralDecay, singular_spectrum, spectral_decay
from heatformer.analysis.stats import AttentionStats, attention_stats
from heatformer.analysis.variance import (
    VarianceDecomposition,
    variance_decomposition,
    within_sequence_variance,
)

__all__ = [
    "PASSBANDS",
    "AttentionStats",
    "FilterResponse",
    "HeadFilter",
    "LayerSnapshot",
    "NeuralCollapse",
    "NextTokenSeparability",
    "SpectralDecay",
    "VarianceDecomposition",
    "WeightDrift",
    "attention_stats",
    "collect_token_states",
    "dirichlet_energy",
    "filter_response",
    "leading_eigenvalues",
    "leading_eigenvectors",
    "neural_collapse",
    "next_token_separability",
    "polynomial_filters",
    "rollout",
    "singular_spectrum",
    "snapshot_attention",
    "spectral_decay",
    "stationary_distribution",
    "variance_decomposition",
    "weight_drift",
    "within_sequence_variance",
]
