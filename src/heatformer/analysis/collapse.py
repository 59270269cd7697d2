r"""Neural Collapse of labelled feature vectors: NC1 (variability) and NC2 (simplex ETF).

:func:`neural_collapse` measures how close class means are to the vertices of a simplex
equiangular tight frame and how small the within-class spread is next to the between-class
spread. The private helpers :func:`_class_means` and :func:`_nc1` also serve
:mod:`heatformer.analysis.separability`.

References:
    Papyan, Han, Donoho. Prevalence of neural collapse during the terminal phase of deep
    learning training. PNAS 117(40):24652-24663, 2020.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from heatformer.analysis._masked import accumulation_dtype
from heatformer.checks import bad_value, check_float_tensor, check_int_tensor

__all__ = ["NeuralCollapse", "neural_collapse"]


class NeuralCollapse(NamedTuple):
    """Neural Collapse statistics; see :func:`neural_collapse`. All are 0 at collapse."""

    nc1: Tensor
    equinorm: Tensor
    equiangularity: Tensor
    max_angle: Tensor
    etf_distance: Tensor


def _class_means(h: Tensor, inv: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """Per-class counts ``(C,)`` and means ``(C, D)`` of ``h`` ``(M, D)``."""
    counts = torch.zeros(num_classes, dtype=h.dtype, device=h.device)
    counts = counts.index_add_(0, inv, torch.ones_like(inv, dtype=h.dtype))  # (C,)
    sums = torch.zeros(num_classes, h.shape[-1], dtype=h.dtype, device=h.device)
    sums = sums.index_add_(0, inv, h)  # (C, D)
    return counts, sums / counts.clamp_min(1).unsqueeze(-1)


def _nc1(h: Tensor, inv: Tensor, class_mean: Tensor, eps: float) -> Tensor:
    r"""``tr(Σ_W Σ_B^+) / C`` without forming a ``D x D`` matrix.

    With centred class means ``M = U S V^T`` (rank ``r``), ``Σ_B = M^T M / C`` so
    ``Σ_B^+ = C V S^{-2} V^T`` and ``tr(Σ_W Σ_B^+) / C = Σ_k v_k^T Σ_W v_k / s_k^2``.
    """
    num_samples = h.shape[0]
    num_classes, dim = class_mean.shape
    centred = class_mean - class_mean.mean(0)  # (C, D)
    resid = h - class_mean[inv]  # (M, D)
    _, s, vh = torch.linalg.svd(centred, full_matrices=False)  # s: (r,), vh: (r, D)
    # Relative cut-off of torch.linalg.pinv / numpy.linalg.matrix_rank.
    tol = s[0] * max(num_classes, dim) * eps
    keep = s > tol
    inv_s2 = torch.where(keep, 1.0 / torch.where(keep, s, torch.ones_like(s)) ** 2, 0.0)
    proj = resid @ vh.transpose(0, 1)  # (M, r)
    nc1 = ((proj**2).sum(0) / num_samples * inv_s2).sum()
    # No between-class spread at all: the ratio is unbounded.
    return torch.where(s[0] > 0, nc1, torch.full_like(nc1, math.inf))


def _etf_statistics(class_mean: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """equinorm, equiangularity, max_angle, etf_distance of class means ``(C, D)``."""
    num_classes = class_mean.shape[0]
    centred = class_mean - class_mean.mean(0)  # (C, D)
    norms = centred.norm(dim=-1)  # (C,)
    mean_norm = norms.mean()
    tiny = torch.finfo(centred.dtype).tiny
    equinorm = norms.std(correction=0) / mean_norm.clamp_min(tiny)

    unit = centred / norms.clamp_min(tiny).unsqueeze(-1)  # (C, D), zero rows stay zero
    gram = unit @ unit.transpose(0, 1)  # (C, C) cosines
    off = ~torch.eye(num_classes, dtype=torch.bool, device=gram.device)
    cosines = gram[off]  # (C (C - 1),)
    equiangularity = cosines.std(correction=0)
    max_angle = (cosines + 1.0 / (num_classes - 1)).abs().mean()

    eye = torch.eye(num_classes, dtype=gram.dtype, device=gram.device)
    etf = num_classes / (num_classes - 1) * (eye - 1.0 / num_classes)  # (C, C)
    gram_normalized = gram / torch.linalg.matrix_norm(gram).clamp_min(tiny)
    etf_normalized = etf / torch.linalg.matrix_norm(etf)
    etf_distance = torch.linalg.matrix_norm(gram_normalized - etf_normalized)
    return equinorm, equiangularity, max_angle, etf_distance


def neural_collapse(features: Tensor, labels: Tensor) -> NeuralCollapse:
    r"""Neural Collapse statistics (NC1, NC2) of labelled feature vectors.

    With :math:`C` classes, class means :math:`\mu_c`, their unweighted centre
    :math:`\mu_G = \frac{1}{C}\sum_c \mu_c`, centred means :math:`\tilde\mu_c = \mu_c -
    \mu_G`, within-class covariance
    :math:`\Sigma_W = \frac{1}{M}\sum_i (h_i - \mu_{y_i})(h_i - \mu_{y_i})^\top` and
    between-class covariance :math:`\Sigma_B = \frac{1}{C}\sum_c \tilde\mu_c\tilde\mu_c^\top`:

    - ``nc1`` :math:`= \operatorname{tr}(\Sigma_W \Sigma_B^{+}) / C` (variability
      collapse, NC1). Computed from an SVD of the :math:`C \times D` centred means,
      never a :math:`D \times D` pseudo-inverse; singular values below
      ``max(C, D) * eps(features.dtype) * s_max`` count as zero, as in
      :func:`torch.linalg.pinv`. It is ``inf`` when all class means coincide.
    - ``equinorm`` :math:`= \operatorname{std}_c \lVert\tilde\mu_c\rVert /
      \operatorname{mean}_c \lVert\tilde\mu_c\rVert` (population std).
    - ``equiangularity`` :math:`= \operatorname{std}_{c \ne c'} \cos(\tilde\mu_c,
      \tilde\mu_{c'})` and ``max_angle`` :math:`= \operatorname{mean}_{c \ne c'}
      |\cos(\tilde\mu_c, \tilde\mu_{c'}) + 1/(C-1)|` (Papyan et al.'s two NC2 measures).
    - ``etf_distance`` :math:`= \lVert G/\lVert G\rVert_F - E/\lVert E\rVert_F\rVert_F`
      with :math:`G = \tilde M^\top \tilde M` the Gram matrix of the normalized centred
      means (the columns of :math:`\tilde M`) and :math:`E = \frac{C}{C-1}(I -
      \frac{1}{C}\mathbf{1}\mathbf{1}^\top)` that of a simplex ETF.

    All five are 0 when the features have collapsed onto the vertices of a simplex ETF.

    Args:
        features: feature vectors, shape ``(M, D)``.
        labels: integer class of each vector, shape ``(M,)``; at least 2 distinct values.

    Returns:
        :class:`NeuralCollapse` of float64 scalars.

    Raises:
        TypeError: ``features`` not floating or ``labels`` not integer.
        ValueError: bad shapes or devices, fewer than 2 classes.

    Shape:
        - features: :math:`(M, D)`; labels: :math:`(M)`
        - output: five scalars

    Notes:
        Papyan et al. centre at the global mean of all samples, which equals
        :math:`\mu_G` for balanced classes; the unweighted centre keeps the ETF metrics
        exact for imbalanced classes too. A centred class mean of norm 0 has cosine 0
        with every other mean.

    References:
        Papyan, Han, Donoho. Prevalence of neural collapse during the terminal phase of
        deep learning training. PNAS 117(40):24652-24663, 2020.

    Examples:
        >>> etf = torch.tensor([[1.0, 0.0], [-0.5, 3**0.5 / 2], [-0.5, -(3**0.5) / 2]])
        >>> stats = neural_collapse(etf.repeat(4, 1), torch.arange(3).repeat(4))
        >>> [round(abs(v.item()), 6) for v in stats]
        [0.0, 0.0, 0.0, 0.0, 0.0]
    """
    features = check_float_tensor("features", features, min_dim=2, shape="(M, D)")
    if features.ndim != 2:
        raise bad_value("features", f"expected shape (M, D), got {tuple(features.shape)}")
    labels = check_int_tensor("labels", labels, (features.shape[0],), features.device)
    _, inv = torch.unique(labels, return_inverse=True)  # (M,)
    num_classes = int(inv.max().item()) + 1 if inv.numel() else 0
    if num_classes < 2:
        raise bad_value("labels", f"expected at least 2 distinct classes, got {num_classes}")
    h = features.to(accumulation_dtype(features.device))  # (M, D)
    _, class_mean = _class_means(h, inv, num_classes)  # (C, D)
    nc1 = _nc1(h, inv, class_mean, torch.finfo(features.dtype).eps)
    return NeuralCollapse(nc1, *_etf_statistics(class_mean))
