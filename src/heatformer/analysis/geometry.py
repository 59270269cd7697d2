"""The token-geometry metrics under their former module name (kept for existing imports).

The metrics now live one concept per module -- :mod:`~heatformer.analysis.variance`,
:mod:`~heatformer.analysis.collapse`, :mod:`~heatformer.analysis.separability`,
:mod:`~heatformer.analysis.spectra`, :mod:`~heatformer.analysis.energy` -- and are imported
from :mod:`heatformer.analysis`; ``from heatformer.analysis.geometry import ...`` keeps
working.
"""

from heatformer.analysis.collapse import NeuralCollapse, neural_collapse
from heatformer.analysis.energy import dirichlet_energy
from heatformer.analysis.separability import NextTokenSeparability, next_token_separability
from heatformer.analysis.spectra import SpectralDecay, singular_spectrum, spectral_decay
from heatformer.analysis.variance import (
    VarianceDecomposition,
    variance_decomposition,
    within_sequence_variance,
)

__all__ = [
    "NeuralCollapse",
    "NextTokenSeparability",
    "SpectralDecay",
    "VarianceDecomposition",
    "dirichlet_energy",
    "neural_collapse",
    "next_token_separability",
    "singular_spectrum",
    "spectral_decay",
    "variance_decomposition",
    "within_sequence_variance",
]
