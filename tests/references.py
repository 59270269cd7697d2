"""Independent NumPy (float64) references shared by the test folders.

Written from DESIGN.md's formulas, not from the library's code: the Laplacians of the three
normalizations (self-loops kept; a node without edges has a zero row) and the normalized
adjacencies the diffusion operators use.
"""

from __future__ import annotations

import numpy as np


def pinv_diag(d: np.ndarray) -> np.ndarray:
    """``1/d`` where ``d > 0``, else 0 (pseudo-inverse of a diagonal)."""
    return np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)


def laplacian_reference(w: np.ndarray, normalization: str) -> np.ndarray:
    """The Laplacian of one graph ``w`` (N, N), self-loops kept."""
    n = w.shape[-1]
    if normalization == "combinatorial":
        return np.diag(w.sum(1)) - w
    if normalization == "rw":
        d = w.sum(1)
        return np.diag((d > 0).astype(float)) - pinv_diag(d)[:, None] * w
    if normalization == "sym":
        ws = 0.5 * (w + w.T)
        d = ws.sum(1)
        s = np.sqrt(pinv_diag(d))
        return np.eye(n) * (d > 0) - s[:, None] * ws * s[None, :]
    raise ValueError(normalization)


def adjacency_reference(w: np.ndarray, normalization: str) -> np.ndarray:
    """The normalized adjacency ``A`` of one graph: ``D^+ W``, ``D^{+1/2} W_s D^{+1/2}``, or
    ``I - L/dmax`` (combinatorial; ``dmax`` = the largest out-degree, 1 for an empty graph)."""
    n = w.shape[-1]
    if normalization == "rw":
        return pinv_diag(w.sum(1))[:, None] * w
    if normalization == "sym":
        ws = 0.5 * (w + w.T)
        s = np.sqrt(pinv_diag(ws.sum(1)))
        return s[:, None] * ws * s[None, :]
    dmax = w.sum(1).max()
    return np.eye(n) - laplacian_reference(w, "combinatorial") / (dmax if dmax > 0 else 1.0)
