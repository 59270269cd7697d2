"""Independent NumPy (float64) references shared by the test folders.

Written from DESIGN.md's formulas, not from the library's code: the Laplacians of the three
normalizations (self-loops kept; a node without edges has a zero row) and the normalized
adjacencies the diffusion operators use.
"""

from __future__ import annotations

import math

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


def softmax_reference(
    q: np.ndarray,
    k: np.ndarray,
    *,
    scale: float | None = None,
    mask: np.ndarray | None = None,
    causal: bool = False,
) -> np.ndarray:
    """``softmax(q k^T * scale)`` over allowed keys; fully masked rows are 0. Shape (..., N, N)."""
    n, e = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(e) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    allowed = np.ones(s.shape, dtype=bool)
    if mask is not None:
        allowed &= np.broadcast_to(mask, s.shape)
    if causal:
        allowed &= np.tril(np.ones((n, n), dtype=bool))
    s = np.where(allowed, s, -np.inf)
    top = s.max(-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    ex = np.where(allowed, np.exp(s - top), 0.0)
    z = ex.sum(-1, keepdims=True)
    return np.divide(ex, z, out=np.zeros_like(ex), where=z > 0)


def topk_reference(p: np.ndarray, scores: np.ndarray, k: int) -> np.ndarray:
    """Keep the ``k`` highest ``scores`` of every row of ``p`` (ties: the lower index), then
    renormalize the kept weights to sum 1 (rows with no weight stay 0). Shape (..., N, N)."""
    n = p.shape[-1]
    out = np.zeros_like(p)
    flat_p, flat_s, flat_out = p.reshape(-1, n), scores.reshape(-1, n), out.reshape(-1, n)
    for r in range(flat_p.shape[0]):
        order = np.lexsort((np.arange(n), -flat_s[r]))  # descending score, then index
        keep = order[:k]
        total = flat_p[r, keep].sum()
        if total > 0:
            flat_out[r, keep] = flat_p[r, keep] / total
    return out
