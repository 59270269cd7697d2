"""Shared builders and independent references for the models tests.

The references compute each head's output from ``q, k, v`` (taken from
:meth:`DiffusionAttention.project_qkv`) with numpy/scipy in float64, from the formulas in
DESIGN.md, never with heatformer's graph code:

- ``P = softmax(q k^T / sqrt(Dh))`` over the allowed keys (key mask, causal); a row with no
  allowed key is 0;
- attention ``P v``; Laplacian ``step * L v``; heat ``expm(-t L) v`` (``scipy.linalg.expm``);
  PPR ``alpha (I - (1 - alpha) A)^{-1} v``; polynomial ``sum_k c_k L^k v``, with the three
  normalizations (self-loops kept, pseudo-inverse degrees); mean pooling ``scale * U v``
  with ``U`` uniform over each row's allowed keys; centring ``scale * (I' - U) v``; the untied
  skip ``P v + I' v W_S`` with the head's own ``W_S``.

Test modules import it directly (``import model_helpers as mh``; ``tests/`` is on
``sys.path``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import scipy.linalg
import torch
from torch import Tensor

from heatformer.graph_ops import DiffusionOperator
from heatformer.models import DiffusionAttention
from references import adjacency_reference, laplacian_reference


def to_numpy(x: Tensor) -> np.ndarray:
    """A float64 numpy copy of any tensor."""
    return x.detach().cpu().to(torch.float64).numpy()


def allowed_matrix(n: int, key_mask: np.ndarray | None, causal: bool) -> np.ndarray:
    """Bool ``(N, N)``: which key (column) each query (row) may attend to."""
    allowed = np.ones((n, n), dtype=bool)
    if key_mask is not None:
        allowed &= key_mask[None, :]
    if causal:
        allowed &= np.tril(np.ones((n, n), dtype=bool))
    return allowed


def softmax_probs(q: np.ndarray, k: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """``softmax(q k^T / sqrt(Dh))`` over the allowed keys; rows with none are 0. ``(N, N)``."""
    s = q @ k.T / math.sqrt(q.shape[-1])
    s = np.where(allowed, s, -np.inf)
    top = s.max(-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    ex = np.where(allowed, np.exp(s - top), 0.0)
    z = ex.sum(-1, keepdims=True)
    return np.divide(ex, z, out=np.zeros_like(ex), where=z > 0)


def _group_time(op: DiffusionOperator, head: int) -> float:
    t = to_numpy(op.t)
    return float(t) if t.ndim == 0 else float(t[head])


#: one float64 reference per registered operator name, from DESIGN.md's formulas:
#: ``(op, P, v, head) -> op(P, v)``, reading the operator's public parameters
REFERENCES: dict[str, Callable[[Any, np.ndarray, np.ndarray, int], np.ndarray]] = {
    "attention": lambda op, p, v, h: adjacency_reference(p, "rw") @ v,
    "laplacian": lambda op, p, v, h: (
        float(to_numpy(op.step)) * laplacian_reference(p, op.normalization) @ v
    ),
    "heat": lambda op, p, v, h: (
        scipy.linalg.expm(-_group_time(op, h) * laplacian_reference(p, op.normalization)) @ v
    ),
    "ppr": lambda op, p, v, h: (
        op.alpha
        * np.linalg.solve(
            np.eye(len(p)) - (1 - op.alpha) * adjacency_reference(p, op.normalization), v
        )
    ),
    "polynomial": lambda op, p, v, h: sum(
        c * np.linalg.matrix_power(_polynomial_base(op, p), i) @ v
        for i, c in enumerate(to_numpy(op.coeffs))
    ),
    "mean": lambda op, p, v, h: float(to_numpy(op.scale)) * uniform_reference(p) @ v,
    "center": lambda op, p, v, h: (
        float(to_numpy(op.scale)) * ((p != 0).any(-1, keepdims=True) * v - uniform_reference(p) @ v)
    ),
    "skip": lambda op, p, v, h: (
        adjacency_reference(p, "rw") @ v + (p != 0).any(-1, keepdims=True) * (v @ _skip(op, h, v))
    ),
    # two maps: p is (2, N, N)
    "diff": lambda op, p, v, h: _differential(op, p, v),
}


def _polynomial_base(op: DiffusionOperator, p: np.ndarray) -> np.ndarray:
    """The matrix a polynomial's powers are of: ``L`` or, in the adjacency basis, ``A``."""
    if op.basis == "laplacian":
        return laplacian_reference(p, op.normalization)
    return adjacency_reference(p, op.normalization)


def _differential(op: DiffusionOperator, p: np.ndarray, v: np.ndarray) -> np.ndarray:
    """A differential head (Ye et al., 2024) on its maps ``p`` ``(2, N, N)``:
    ``(1 - lambda_init) RMSNorm(P_1 v - lambda P_2 v)`` with ``lambda = exp(q1 . k1) -
    exp(q2 . k2) + lambda_init`` from the operator's vectors (``lambda_init`` without them)."""
    lam = op.lambda_init
    if op.lambda_q1 is not None:
        q1, k1, q2, k2 = (to_numpy(getattr(op, f"lambda_{w}")) for w in ("q1", "k1", "q2", "k2"))
        lam += math.exp(q1 @ k1) - math.exp(q2 @ k2)
    u = adjacency_reference(p[0], "rw") @ v - lam * adjacency_reference(p[1], "rw") @ v
    return (1 - op.lambda_init) * u / np.sqrt((u**2).mean(-1, keepdims=True) + op.eps)


def _skip(op: DiffusionOperator, head: int, v: np.ndarray) -> np.ndarray:
    """An untied skip head's ``W_S`` ``(C, C)``: its weight's matrix for ``head``, or
    ``init I`` for an operator without a shape."""
    weight = op.skip_weight
    if weight is None:
        return op.init * np.eye(v.shape[-1])
    return to_numpy(weight)[head if weight.shape[0] > 1 else 0]


def uniform_reference(p: np.ndarray) -> np.ndarray:
    """The uniform random walk on the non-zero pattern of ``p``: ``1[p != 0] / |N(i)|``, a row
    without entries 0 (mean pooling over the keys each query may attend)."""
    edges = (p != 0).astype(np.float64)
    count = edges.sum(-1, keepdims=True)
    return np.divide(edges, count, out=np.zeros_like(edges), where=count > 0)


def spectral_ref(op: DiffusionOperator, p: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Any operator from its frequency response: ``V f(Lambda) V^{-1} v`` for the
    eigendecomposition of its Laplacian (the ``"rw"`` one unless it declares another). Valid
    where every node has out-edges (``I' = I``) and ``L`` is diagonalizable."""
    lap = laplacian_reference(p, getattr(op, "normalization", "rw"))
    lam, vecs = np.linalg.eig(lap)
    response = op.frequency_response(torch.as_tensor(lam)).detach().numpy()
    return np.real(vecs @ np.diag(response) @ np.linalg.solve(vecs, v))


def operator_ref(op: DiffusionOperator, p: np.ndarray, v: np.ndarray, head: int) -> np.ndarray:
    """One head's output ``op(P, v)`` in float64, looked up by the operator's registry name
    (:data:`REFERENCES`; the spectral one for an operator without an entry); ``head`` is the
    head's index inside its operator's group (for a per-head heat time)."""
    reference = REFERENCES.get(op.name)
    return reference(op, p, v, head) if reference else spectral_ref(op, p, v)


def diffuse_ref(
    layer: DiffusionAttention, x: Tensor, key_mask: Tensor | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per-head outputs ``(B, H, N, Dh)`` and the layer output ``(B, N, D)``, float64."""
    q, k, v = (to_numpy(t) for t in layer.project_qkv(x))
    b, h, n, dh = q.shape
    mask = None if key_mask is None else key_mask.cpu().numpy()
    ops = layer.head_operators
    group_pos = {}  # head -> index inside its operator's group
    for hh, op in enumerate(ops):
        group_pos[hh] = sum(1 for o in ops[:hh] if o is op)
    y = np.empty((b, h, n, dh))
    for bi in range(b):
        allowed = allowed_matrix(n, None if mask is None else mask[bi], layer.causal)
        for hh in range(h):
            head_allowed = allowed
            if mask is not None and ops[hh].reads_transpose:
                # sym heads also drop the out-edges of padded queries: W_s must not carry them
                head_allowed = allowed & mask[bi][:, None]
            maps = ops[hh].maps  # a head's maps from the channels of its queries and keys
            qm, km = (np.split(t[bi, hh], maps, axis=-1) for t in (q, k))
            p = np.stack([softmax_probs(a, b, head_allowed) for a, b in zip(qm, km, strict=True)])
            y[bi, hh] = operator_ref(ops[hh], p if maps > 1 else p[0], v[bi, hh], group_pos[hh])
    merged = y.transpose(0, 2, 1, 3).reshape(b, n, h * dh)
    w = to_numpy(layer.out_proj.weight)
    bias = to_numpy(layer.out_proj.bias) if layer.out_proj.bias is not None else 0.0
    return y, merged @ w.T + bias


def random_layer(
    spec: str,
    *,
    embed_dim: int = 16,
    num_heads: int = 4,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
    **kwargs: object,
) -> DiffusionAttention:
    """A layer with random (not Xavier-only) weights and non-zero biases, drawn on the CPU and
    moved to ``device`` (the same weights on every device).

    Causal layers with 'sym' heads are refused by design (tested on their own), so a
    parametrized test that reaches that combination is skipped here.
    """
    if kwargs.get("causal") and "normalization=sym" in spec:
        pytest.skip(
            "sym heads are refused in causal layers (see test_causal_sym_heads_are_refused)"
        )
    torch.manual_seed(seed)
    layer = DiffusionAttention(embed_dim, num_heads, spec, dtype=dtype, **kwargs)  # type: ignore[arg-type]
    with torch.no_grad():
        for p in layer.parameters():
            if p.dim() == 1 and p.numel() > 1:
                p.normal_(0.0, 0.3)
    return layer.to(device)


def random_input(
    seed: int,
    b: int = 2,
    n: int = 6,
    d: int = 16,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
) -> Tensor:
    """``(B, N, D)`` standard normal, drawn on the CPU (the same numbers on every device)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(b, n, d, generator=gen, dtype=torch.float64).to(device, dtype)


def padding_mask(b: int, n: int, real: list[int], device: torch.device | str = "cpu") -> Tensor:
    """``(B, N)`` bool key mask with ``real[i]`` real tokens first in row ``i`` (right padding)."""
    mask = torch.zeros(b, n, dtype=torch.bool, device=device)
    for i, r in enumerate(real):
        mask[i, :r] = True
    return mask


laplacian_ref = laplacian_reference
