"""Token-geometry metrics for transformer representations.

The quantities Zhang & Papyan (arXiv:2602.09297, 2026) use to explain Laplacian heads:
within-sequence collapse (:func:`within_sequence_variance`,
:func:`variance_decomposition`), Neural Collapse of sequence means
(:func:`neural_collapse`), separability of tokens that share a next token
(:func:`next_token_separability`), spectral decay (:func:`singular_spectrum`,
:func:`spectral_decay`) and smoothness on the attention graph
(:func:`dirichlet_energy`), plus :func:`collect_token_states` to read per-layer token
states out of any model with forward hooks.
"""

from heatformer.analysis.geometry import (
    NeuralCollapse,
    NextTokenSeparability,
    SpectralDecay,
    VarianceDecomposition,
    dirichlet_energy,
    neural_collapse,
    next_token_separability,
    singular_spectrum,
    spectral_decay,
    variance_decomposition,
    within_sequence_variance,
)
from heatformer.analysis.hooks import collect_token_states

__all__ = [
    "NeuralCollapse",
    "NextTokenSeparability",
    "SpectralDecay",
    "VarianceDecomposition",
    "collect_token_states",
    "dirichlet_energy",
    "neural_collapse",
    "next_token_separability",
    "singular_spectrum",
    "spectral_decay",
    "variance_decomposition",
    "within_sequence_variance",
]
