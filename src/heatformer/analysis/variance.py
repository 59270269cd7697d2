r"""Within-sequence collapse: how far the tokens of a sequence stay from their mean.

:func:`within_sequence_variance` is the mean squared distance of a sequence's tokens to its
mean token; :func:`variance_decomposition` splits the total token variance exactly into a
within-sequence, a within-class and a between-class part. Conventions (shapes, masks,
float64) are those of :mod:`heatformer.analysis`.

References:
    Zhang, Papyan. Laplacian heads. arXiv:2602.09297, 2026.
    Dong, Cordonnier, Loukas. Attention is not all you need: pure attention loses rank
    doubly exponentially with depth. ICML 2021.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor

from heatformer.analysis._masked import masked_float, raise_no_tokens, resolve_mask
from heatformer.checks import bad_value, check_float_tensor, check_int_tensor

__all__ = ["VarianceDecomposition", "variance_decomposition", "within_sequence_variance"]


class VarianceDecomposition(NamedTuple):
    """Law-of-total-variance split of token states; see :func:`variance_decomposition`.

    ``total == within_sequence + within_class + between_class`` up to rounding, and so
    ``total == within_sequence + between_sequence``.
    """

    total: Tensor
    within_sequence: Tensor
    within_class: Tensor
    between_class: Tensor

    @property
    def between_sequence(self) -> Tensor:
        r"""The variance of the sequence means, :math:`\tfrac{1}{T}\sum_b n_b \lVert \mu_b - g
        \rVert^2` ``= within_class + between_class``: what a within-sequence share
        ``within_sequence / total`` sets the within part against."""
        return self.within_class + self.between_class


def within_sequence_variance(
    x: Tensor,
    mask: Tensor | None = None,
    *,
    reduction: Literal["mean", "none"] = "mean",
) -> Tensor:
    r"""Mean squared distance of the tokens of a sequence to their sequence mean.

    For sequence :math:`b` with real tokens :math:`S_b` (:math:`n_b = |S_b|`) and mean
    :math:`\mu_b = \frac{1}{n_b}\sum_{i \in S_b} x_{bi}`,

    .. math::
        v_b = \frac{1}{n_b} \sum_{i \in S_b} \lVert x_{bi} - \mu_b \rVert^2,
        \qquad
        \text{result} = \frac{1}{|\{b : n_b > 0\}|} \sum_{b : n_b > 0} v_b .

    It is the trace of the (biased) token covariance of each sequence, and 0 exactly when
    every token of a sequence is the same vector ("within-sequence collapse", the rank
    collapse of Dong et al. 2021 seen through second moments).

    Args:
        x: token states, shape ``(B, N, D)`` or any ``(..., N, D)``.
        mask: optional bool tensor ``(..., N)``, ``True`` = real token.
        reduction: ``"mean"`` averages :math:`v_b` over the sequences with at least one
            real token, each sequence weighted equally; ``"none"`` returns :math:`v_b`
            per sequence, shape ``(...)``, with 0 for a fully masked sequence.

    Returns:
        A float64 tensor: a scalar for ``"mean"``, shape ``x.shape[:-2]`` for ``"none"``.

    Raises:
        TypeError: ``x`` is not a floating tensor, ``mask`` is not bool.
        ValueError: bad shapes, an unknown ``reduction``, or (for ``"mean"``) no real
            token at all.

    Shape:
        - x: :math:`(..., N, D)`; mask: :math:`(..., N)`
        - output: :math:`()` or :math:`(...)`

    Equivalent to (no mask)::

        ((x - x.mean(-2, keepdim=True)) ** 2).sum(-1).mean(-1).mean()

    Notes:
        :func:`variance_decomposition` weights sequences by their token count instead;
        the two agree when every sequence has the same number of real tokens.

    References:
        Zhang, Papyan. Laplacian heads. arXiv:2602.09297, 2026.
        Dong, Cordonnier, Loukas. Attention is not all you need: pure attention loses
        rank doubly exponentially with depth. ICML 2021.

    Examples:
        >>> x = torch.tensor([[[0.0, 0.0], [2.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]]])
        >>> within_sequence_variance(x, reduction="none")
        tensor([1., 0.], dtype=torch.float64)
        >>> within_sequence_variance(x)
        tensor(0.5000, dtype=torch.float64)
    """
    x = check_float_tensor("x", x, min_dim=2, shape="(..., N, D)")
    if reduction not in ("mean", "none"):
        raise bad_value("reduction", f"expected 'mean' or 'none', got {reduction!r}")
    m = resolve_mask(mask, x)  # (..., N)
    xf = masked_float(x, m)  # (..., N, D)
    w = m.to(xf.dtype)  # (..., N)
    count = w.sum(-1)  # (...)
    mean = xf.sum(-2) / count.clamp_min(1).unsqueeze(-1)  # (..., D)
    sq = ((xf - mean.unsqueeze(-2)) ** 2).sum(-1) * w  # (..., N)
    per_sequence = sq.sum(-1) / count.clamp_min(1)  # (...)
    if reduction == "none":
        return per_sequence
    nonempty = count > 0  # (...)
    if not bool(nonempty.any()):
        raise_no_tokens(x, mask)
    return per_sequence.sum() / nonempty.sum().to(per_sequence.dtype)


def _class_means(labels: Tensor, n_b: Tensor, seq_sum: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per class of ``labels`` ``(B,)``: its token count ``(C,)`` and token mean ``(C, D)``
    from the sequences' counts ``n_b`` ``(B,)`` and sums ``seq_sum`` ``(B, D)``; and each
    sequence's class index ``(B,)``."""
    _, inv = torch.unique(labels, return_inverse=True)  # inv: (B,)
    num_classes = int(inv.max().item()) + 1 if inv.numel() else 0
    n_c = torch.zeros(num_classes, dtype=n_b.dtype, device=n_b.device).index_add_(0, inv, n_b)
    class_sum = torch.zeros(num_classes, seq_sum.shape[-1], dtype=n_b.dtype, device=n_b.device)
    class_sum = class_sum.index_add_(0, inv, seq_sum)  # (C, D)
    return n_c, class_sum / n_c.clamp_min(1).unsqueeze(-1), inv


def variance_decomposition(
    x: Tensor, labels: Tensor, mask: Tensor | None = None
) -> VarianceDecomposition:
    r"""Split the token variance into within-sequence, within-class and between-class parts.

    Tokens nest in sequences and sequences in classes (one label per sequence). With
    :math:`T` real tokens, sequence means :math:`\mu_b` over :math:`n_b` tokens, class
    means of the sequence means :math:`m_c = \sum_{b \in c} n_b \mu_b / n_c`
    (:math:`n_c = \sum_{b \in c} n_b`) and the global mean :math:`g`, the law of total
    variance applied twice gives the exact identity

    .. math::
        \underbrace{\tfrac{1}{T}\sum_{b,i} \lVert x_{bi} - g \rVert^2}_{\text{total}}
        = \underbrace{\tfrac{1}{T}\sum_{b,i} \lVert x_{bi} - \mu_b \rVert^2}_{\text{within seq.}}
        + \underbrace{\tfrac{1}{T}\sum_b n_b \lVert \mu_b - m_{c(b)} \rVert^2}_{\text{within class}}
        + \underbrace{\tfrac{1}{T}\sum_c n_c \lVert m_c - g \rVert^2}_{\text{between class}} .

    Every token has weight :math:`1/T`, so a sequence counts in proportion to its
    number of real tokens; that weighting is what makes the parts add up exactly.
    Each part is computed directly (not as a difference), so the identity holds up to
    float64 rounding.

    Args:
        x: token states, shape ``(B, N, D)``.
        labels: integer class of each sequence, shape ``(B,)``; any integer values.
        mask: optional bool tensor ``(B, N)``, ``True`` = real token. Fully masked
            sequences contribute nothing.

    Returns:
        :class:`VarianceDecomposition` of float64 scalars
        ``(total, within_sequence, within_class, between_class)``.

    Raises:
        TypeError: ``x`` not floating, ``labels`` not integer, ``mask`` not bool.
        ValueError: bad shapes or devices, or no real token at all.

    Shape:
        - x: :math:`(B, N, D)`; labels: :math:`(B)`; mask: :math:`(B, N)`
        - output: four scalars

    Notes:
        ``within_sequence`` weights sequences by token count, unlike
        :func:`within_sequence_variance`; they agree when no token is masked.

    References:
        Zhang, Papyan. Laplacian heads. arXiv:2602.09297, 2026.
        Papyan, Han, Donoho. Prevalence of neural collapse during the terminal phase of
        deep learning training. PNAS 117(40), 2020.

    Examples:
        >>> x = torch.tensor([[[0.0], [2.0]], [[4.0], [4.0]], [[10.0], [10.0]]])
        >>> parts = variance_decomposition(x, torch.tensor([0, 0, 1]))
        >>> [round(p.item(), 4) for p in parts]
        [14.3333, 0.3333, 1.5, 12.5]
    """
    x = check_float_tensor("x", x, min_dim=3, shape="(B, N, D)")
    if x.ndim != 3:
        raise bad_value("x", f"expected shape (B, N, D), got {tuple(x.shape)}")
    labels = check_int_tensor("labels", labels, (x.shape[0],), x.device)
    m = resolve_mask(mask, x)  # (B, N)
    xf = masked_float(x, m)  # (B, N, D)
    dtype = xf.dtype
    w = m.to(dtype)  # (B, N)
    n_b = w.sum(-1)  # (B,)
    total_count = n_b.sum()
    if not bool(total_count > 0):
        raise_no_tokens(x, mask)

    seq_sum = xf.sum(1)  # (B, D)
    seq_mean = seq_sum / n_b.clamp_min(1).unsqueeze(-1)  # (B, D)
    within_sequence = (((xf - seq_mean.unsqueeze(1)) ** 2).sum(-1) * w).sum() / total_count

    n_c, class_mean, inv = _class_means(labels, n_b, seq_sum)  # (C,), (C, D), (B,)
    within_class = (n_b * ((seq_mean - class_mean[inv]) ** 2).sum(-1)).sum() / total_count

    g = seq_sum.sum(0) / total_count  # (D,)
    between_class = (n_c * ((class_mean - g) ** 2).sum(-1)).sum() / total_count
    total = (((xf - g) ** 2).sum(-1) * w).sum() / total_count
    return VarianceDecomposition(total, within_sequence, within_class, between_class)
