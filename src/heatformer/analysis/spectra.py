r"""Singular spectra of token matrices: effective rank and power-law decay.

:func:`singular_spectrum` gives the singular values of each sequence's (centred) token
matrix, :func:`spectral_decay` their effective rank and decay exponent. Zhang & Papyan report
that with Laplacian heads these spectra decay *faster* (a larger exponent ``decay_rate``, a
lower ``effective_rank``) than with attention heads alone; docs/reproducing.md tests that
direction. This is the spectrum of the token cloud in feature space (the singular values of
the ``N x D`` matrix of a sequence's tokens), not a spectrum over the frequencies of the
attention graph: how smooth the tokens are on the graph (low-pass attention ``P`` averages
neighbours, the Laplacian ``I - P`` keeps what differs from them) is
:func:`~heatformer.analysis.dirichlet_energy`.

References:
    Zhang, Papyan. Laplacian heads. arXiv:2602.09297, 2026.
    Roy, Vetterli. The effective rank: a measure of effective dimensionality. EUSIPCO 2007.
    Stringer, Pachitariu, Steinmetz, Carandini, Harris. High-dimensional geometry of
    population responses in visual cortex. Nature 571:361-365, 2019.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from heatformer.analysis._masked import masked_float, resolve_mask
from heatformer.checks import bad_value, check_float_tensor

__all__ = ["SpectralDecay", "singular_spectrum", "spectral_decay"]


class SpectralDecay(NamedTuple):
    """Summary of a singular spectrum; see :func:`spectral_decay`. Shapes ``(...,)``."""

    effective_rank: Tensor
    decay_rate: Tensor


def singular_spectrum(x: Tensor, *, center: bool = True, mask: Tensor | None = None) -> Tensor:
    r"""Singular values of each sequence's token matrix, in descending order.

    With ``center=True`` (the default) each sequence is first centred at the mean of its
    real tokens, so the spectrum describes the spread of the token cloud, not its
    offset: :math:`s^2/n` are then the eigenvalues of the token covariance. With
    ``center=False`` the values are those of :func:`torch.linalg.svdvals` on ``x``.
    Masked tokens become zero rows, which leaves the nonzero singular values of the
    real tokens unchanged.

    Args:
        x: token states, shape ``(..., N, D)``.
        center: subtract each sequence's mean token first.
        mask: optional bool tensor ``(..., N)``, ``True`` = real token.

    Returns:
        float64 tensor of shape ``(..., min(N, D))``, descending along the last dim.

    Raises:
        TypeError: ``x`` not floating, ``mask`` not bool.
        ValueError: bad shapes.

    Shape:
        - x: :math:`(..., N, D)`; mask: :math:`(..., N)`
        - output: :math:`(..., \min(N, D))`

    Equivalent to (no mask)::

        torch.linalg.svdvals(x - x.mean(-2, keepdim=True) if center else x)

    Examples:
        >>> x = torch.tensor([[3.0, 0.0], [0.0, 2.0]])
        >>> singular_spectrum(x, center=False)
        tensor([3., 2.], dtype=torch.float64)
    """
    x = check_float_tensor("x", x, min_dim=2, shape="(..., N, D)")
    m = resolve_mask(mask, x)  # (..., N)
    xf = masked_float(x, m)  # (..., N, D)
    if center:
        count = m.to(xf.dtype).sum(-1).clamp_min(1)  # (...)
        mean = xf.sum(-2) / count.unsqueeze(-1)  # (..., D)
        xf = torch.where(m.unsqueeze(-1), xf - mean.unsqueeze(-2), 0.0)  # (..., N, D)
    return torch.linalg.svdvals(xf)


def spectral_decay(
    x: Tensor,
    *,
    center: bool = True,
    mask: Tensor | None = None,
    rtol: float | None = None,
) -> SpectralDecay:
    r"""Effective rank and power-law decay rate of each sequence's singular spectrum.

    From the singular values :math:`s_1 \ge s_2 \ge \dots` of
    :func:`singular_spectrum` (same ``center`` and ``mask``):

    - ``effective_rank`` :math:`= \exp\big(-\sum_k p_k \log p_k\big)` with
      :math:`p_k = s_k / \sum_j s_j` (Roy & Vetterli 2007). It is 1 for a rank-one
      matrix, :math:`r` for :math:`r` equal singular values, and 0 for a zero matrix.
    - ``decay_rate`` :math:`= \alpha` from the least-squares fit
      :math:`\log s_k \approx a - \alpha \log k` over the values with
      :math:`s_k > \text{rtol} \cdot s_1`. Larger means faster decay:
      :math:`s_k \propto k^{-\alpha}` gives exactly :math:`\alpha` (the covariance
      eigenvalues :math:`s_k^2/n` then decay with exponent :math:`2\alpha`). It is
      ``inf`` when fewer than two values pass the cut-off (the spectrum drops to zero
      after at most one value).

    Args:
        x: token states, shape ``(..., N, D)``.
        center: subtract each sequence's mean token first.
        mask: optional bool tensor ``(..., N)``, ``True`` = real token.
        rtol: relative cut-off for the fit; default ``max(N, D) * eps(x.dtype)``,
            which drops numerically zero singular values.

    Returns:
        :class:`SpectralDecay` of float64 tensors of shape ``x.shape[:-2]``.

    Raises:
        TypeError: ``x`` not floating, ``mask`` not bool.
        ValueError: bad shapes, negative ``rtol``.

    Shape:
        - x: :math:`(..., N, D)`; mask: :math:`(..., N)`
        - output: two tensors of shape :math:`(...)`

    References:
        Roy, Vetterli. The effective rank: a measure of effective dimensionality.
        EUSIPCO 2007.
        Stringer, Pachitariu, Steinmetz, Carandini, Harris. High-dimensional geometry
        of population responses in visual cortex. Nature 571:361-365, 2019.

    Examples:
        >>> x = torch.diag(torch.tensor([1.0, 1 / 4, 1 / 9]))
        >>> result = spectral_decay(x, center=False)
        >>> round(result.decay_rate.item(), 6)
        2.0
    """
    x = check_float_tensor("x", x, min_dim=2, shape="(..., N, D)")
    if rtol is None:
        rtol = max(x.shape[-2], x.shape[-1]) * torch.finfo(x.dtype).eps
    elif not rtol >= 0:
        raise bad_value("rtol", f"expected a non-negative float, got {rtol!r}")
    s = singular_spectrum(x, center=center, mask=mask)  # (..., K)
    tiny = torch.finfo(s.dtype).tiny
    total = s.sum(-1, keepdim=True)  # (..., 1)
    p = s / total.clamp_min(tiny)  # (..., K)
    entropy = -torch.special.xlogy(p, p).sum(-1)  # (...)
    effective_rank = torch.where(total.squeeze(-1) > 0, entropy.exp(), 0.0)

    keep = s > rtol * s[..., :1]  # (..., K), a prefix since s is descending
    w = keep.to(s.dtype)
    n = w.sum(-1)  # (...)
    log_k = torch.arange(1, s.shape[-1] + 1, dtype=s.dtype, device=s.device).log()  # (K,)
    log_s = torch.where(keep, s, 1.0).log()  # (..., K)
    u_mean = (w * log_k).sum(-1) / n.clamp_min(1)  # (...)
    v_mean = (w * log_s).sum(-1) / n.clamp_min(1)
    du = (log_k - u_mean.unsqueeze(-1)) * w  # (..., K)
    cov = (du * (log_s - v_mean.unsqueeze(-1))).sum(-1)
    var = (du**2).sum(-1)
    slope = cov / var.clamp_min(tiny)
    decay_rate = torch.where(n >= 2, -slope, math.inf)
    return SpectralDecay(effective_rank, decay_rate)
