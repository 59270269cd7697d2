"""Token-geometry metrics: collapse, neural collapse, separability, spectra, smoothness.

These are the quantities Zhang & Papyan (2026) use to explain what Laplacian heads do
to the token representations of a transformer: tokens of one sequence collapse towards
their mean, sequence means of one class collapse towards a simplex equiangular tight
frame (Neural Collapse), tokens that share a next token become linearly separable from
the others, and the singular spectrum of a sequence decays faster.

Conventions:

- Token states ``x`` have shape ``(B, N, D)``: ``B`` sequences of ``N`` tokens of
  dimension ``D``. Where it makes sense, any leading batch shape ``(..., N, D)`` works.
- ``mask`` has shape ``(B, N)`` (or ``(..., N)``), dtype ``torch.bool``, and ``True``
  marks a *real* token (the polarity of SDPA's ``attn_mask``: ``True`` = take part).
  Masked tokens are ignored completely; their values may be anything, even NaN.
- Every metric accumulates in float64 (float32 on devices without float64, such as
  MPS) and returns tensors of that dtype on the device of the input. Nothing here is
  wrapped in :func:`torch.no_grad`: the metrics are differentiable where the maths is,
  so :func:`dirichlet_energy` can serve as a regulariser. Wrap calls in
  ``torch.no_grad()`` for pure analysis.
- Bad input raises :class:`TypeError` (wrong type or dtype) or :class:`ValueError`
  (wrong shape, device, value), naming the argument, what was expected and what came.

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

from __future__ import annotations

import math
from typing import Literal, NamedTuple, NoReturn

import torch
from torch import Tensor

from heatformer.graph_ops import Graph, laplacian

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


# --------------------------------------------------------------------------- results


class VarianceDecomposition(NamedTuple):
    """Law-of-total-variance split of token states; see :func:`variance_decomposition`.

    ``total == within_sequence + within_class + between_class`` up to rounding.
    """

    total: Tensor
    within_sequence: Tensor
    within_class: Tensor
    between_class: Tensor


class NeuralCollapse(NamedTuple):
    """Neural Collapse statistics; see :func:`neural_collapse`. All are 0 at collapse."""

    nc1: Tensor
    equinorm: Tensor
    equiangularity: Tensor
    max_angle: Tensor
    etf_distance: Tensor


class NextTokenSeparability(NamedTuple):
    """Separability of tokens grouped by next token; see :func:`next_token_separability`."""

    nc1: Tensor
    probe_accuracy: Tensor
    num_groups: int
    num_tokens: int


class SpectralDecay(NamedTuple):
    """Summary of a singular spectrum; see :func:`spectral_decay`. Shapes ``(...,)``."""

    effective_rank: Tensor
    decay_rate: Tensor


# --------------------------------------------------------------------------- checks


def _accumulation_dtype(device: torch.device) -> torch.dtype:
    """float64, except on devices that have no float64 (MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


def _check_float_tensor(value: object, name: str, *, min_ndim: int, shape: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape {shape}, got {type(value)}")
    if not value.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got dtype {value.dtype}")
    if value.ndim < min_ndim:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(value.shape)}")
    return value


def _check_int_tensor(value: object, name: str, shape: tuple[int, ...], x: Tensor) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape {shape}, got {type(value)}")
    if value.is_floating_point() or value.is_complex():
        raise TypeError(f"{name}: expected an integer (or bool) tensor, got dtype {value.dtype}")
    if tuple(value.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(value.shape)}")
    if value.device != x.device:
        raise ValueError(f"{name}: expected a tensor on {x.device}, got one on {value.device}")
    return value


def _resolve_mask(mask: Tensor | None, x: Tensor, name: str = "mask") -> Tensor:
    """Return a bool mask of shape ``x.shape[:-1]`` (all True when ``mask`` is None)."""
    shape = tuple(x.shape[:-1])
    if mask is None:
        return torch.ones(shape, dtype=torch.bool, device=x.device)
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor of shape {shape}, got {type(mask)}")
    if mask.dtype != torch.bool:
        raise TypeError(f"{name}: expected dtype torch.bool (True = real token), got {mask.dtype}")
    if tuple(mask.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(mask.shape)}")
    if mask.device != x.device:
        raise ValueError(f"{name}: expected a tensor on {x.device}, got one on {mask.device}")
    return mask


def _raise_no_tokens(x: Tensor, mask: Tensor | None) -> NoReturn:
    if mask is None:
        raise ValueError(f"x: expected at least one token, got shape {tuple(x.shape)}")
    raise ValueError("mask: expected at least one real token, got every token masked")


def _masked_float(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` in the accumulation dtype with masked tokens set to 0 (NaN-safe)."""
    xf = x.to(_accumulation_dtype(x.device))
    return torch.where(mask.unsqueeze(-1), xf, torch.zeros((), dtype=xf.dtype, device=xf.device))


# --------------------------------------------------------------------------- collapse


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
    x = _check_float_tensor(x, "x", min_ndim=2, shape="(..., N, D)")
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction: expected 'mean' or 'none', got {reduction!r}")
    m = _resolve_mask(mask, x)  # (..., N)
    xf = _masked_float(x, m)  # (..., N, D)
    w = m.to(xf.dtype)  # (..., N)
    count = w.sum(-1)  # (...)
    mean = xf.sum(-2) / count.clamp_min(1).unsqueeze(-1)  # (..., D)
    sq = ((xf - mean.unsqueeze(-2)) ** 2).sum(-1) * w  # (..., N)
    per_sequence = sq.sum(-1) / count.clamp_min(1)  # (...)
    if reduction == "none":
        return per_sequence
    nonempty = count > 0  # (...)
    if not bool(nonempty.any()):
        _raise_no_tokens(x, mask)
    return per_sequence.sum() / nonempty.sum().to(per_sequence.dtype)


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
    x = _check_float_tensor(x, "x", min_ndim=3, shape="(B, N, D)")
    if x.ndim != 3:
        raise ValueError(f"x: expected shape (B, N, D), got {tuple(x.shape)}")
    labels = _check_int_tensor(labels, "labels", (x.shape[0],), x)
    m = _resolve_mask(mask, x)  # (B, N)
    xf = _masked_float(x, m)  # (B, N, D)
    dtype = xf.dtype
    w = m.to(dtype)  # (B, N)
    n_b = w.sum(-1)  # (B,)
    total_count = n_b.sum()
    if not bool(total_count > 0):
        _raise_no_tokens(x, mask)

    seq_sum = xf.sum(1)  # (B, D)
    seq_mean = seq_sum / n_b.clamp_min(1).unsqueeze(-1)  # (B, D)
    within_sequence = (((xf - seq_mean.unsqueeze(1)) ** 2).sum(-1) * w).sum() / total_count

    _, inv = torch.unique(labels, return_inverse=True)  # inv: (B,)
    num_classes = int(inv.max().item()) + 1 if inv.numel() else 0
    n_c = torch.zeros(num_classes, dtype=dtype, device=x.device).index_add_(0, inv, n_b)
    class_sum = torch.zeros(num_classes, x.shape[-1], dtype=dtype, device=x.device)
    class_sum = class_sum.index_add_(0, inv, seq_sum)  # (C, D)
    class_mean = class_sum / n_c.clamp_min(1).unsqueeze(-1)  # (C, D)
    within_class = (n_b * ((seq_mean - class_mean[inv]) ** 2).sum(-1)).sum() / total_count

    g = seq_sum.sum(0) / total_count  # (D,)
    between_class = (n_c * ((class_mean - g) ** 2).sum(-1)).sum() / total_count
    total = (((xf - g) ** 2).sum(-1) * w).sum() / total_count
    return VarianceDecomposition(total, within_sequence, within_class, between_class)


# --------------------------------------------------------------------------- neural collapse


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
    features = _check_float_tensor(features, "features", min_ndim=2, shape="(M, D)")
    if features.ndim != 2:
        raise ValueError(f"features: expected shape (M, D), got {tuple(features.shape)}")
    labels = _check_int_tensor(labels, "labels", (features.shape[0],), features)
    _, inv = torch.unique(labels, return_inverse=True)  # (M,)
    num_classes = int(inv.max().item()) + 1 if inv.numel() else 0
    if num_classes < 2:
        raise ValueError(f"labels: expected at least 2 distinct classes, got {num_classes}")
    h = features.to(_accumulation_dtype(features.device))  # (M, D)
    _, class_mean = _class_means(h, inv, num_classes)  # (C, D)
    nc1 = _nc1(h, inv, class_mean, torch.finfo(features.dtype).eps)
    return NeuralCollapse(nc1, *_etf_statistics(class_mean))


# --------------------------------------------------------------------------- separability


def _ridge_probe_accuracy(
    x_train: Tensor, y_train: Tensor, x_test: Tensor, y_test: Tensor, num_classes: int, ridge: float
) -> Tensor:
    """Test accuracy of a closed-form ridge regression onto one-hot targets."""
    mean = x_train.mean(0)  # (D,)
    xc = x_train - mean  # (T, D)
    targets = torch.nn.functional.one_hot(y_train, num_classes).to(xc.dtype)  # (T, K)
    target_mean = targets.mean(0)  # (K,)
    yc = targets - target_mean
    num_train, dim = xc.shape
    # Scale-free regularizer: ridge times the mean eigenvalue of xc^T xc.
    lam = (ridge * (xc**2).sum() / dim).clamp_min(torch.finfo(xc.dtype).tiny)
    if num_train >= dim:  # primal: (D, D) system
        eye = torch.eye(dim, dtype=xc.dtype, device=xc.device)
        weight = torch.linalg.solve(xc.T @ xc + lam * eye, xc.T @ yc)  # (D, K)
    else:  # dual: (T, T) system
        eye = torch.eye(num_train, dtype=xc.dtype, device=xc.device)
        weight = xc.T @ torch.linalg.solve(xc @ xc.T + lam * eye, yc)  # (D, K)
    scores = (x_test - mean) @ weight + target_mean  # (T_test, K)
    return (scores.argmax(-1) == y_test).to(xc.dtype).mean()


def next_token_separability(
    x: Tensor,
    next_tokens: Tensor,
    mask: Tensor | None = None,
    *,
    min_count: int = 2,
    ridge: float = 1e-3,
) -> NextTokenSeparability:
    r"""How well token states separate by the token that follows them.

    Tokens are grouped by their next token (the class in a language model's
    cross-entropy). Real tokens with a negative next token (such as the ignore index
    ``-100``) are skipped, and so are groups with fewer than ``min_count`` members:
    a singleton has no within-group spread and could not appear in both halves of the
    split below. On the :math:`T` tokens that remain, in :math:`K` groups:

    - ``nc1`` :math:`= \operatorname{tr}(\Sigma_W \Sigma_B^+)/K` of the groups, exactly
      as :func:`neural_collapse` computes it.
    - ``probe_accuracy``: test accuracy of a linear probe. The split is deterministic
      and stratified: in each group, taken in flattened ``(B, N)`` order, even-ranked
      tokens train and odd-ranked tokens test. The probe is ridge regression onto
      one-hot targets with an intercept,
      :math:`W = (X^\top X + \lambda I)^{-1} X^\top Y` on centred :math:`X, Y`, with
      :math:`\lambda = \text{ridge} \cdot \operatorname{tr}(X^\top X)/D` (invariant to
      the scale of ``x``); a test token is predicted as the argmax score. Chance level
      is about :math:`1/K` for balanced groups.

    Cost: :math:`O(T D \min(T, D))` time, :math:`O(\min(T, D)^2 + T K)` memory.

    Args:
        x: token states, shape ``(B, N, D)``.
        next_tokens: integer id of the token following each position, shape ``(B, N)``.
        mask: optional bool tensor ``(B, N)``, ``True`` = real token.
        min_count: groups with fewer members are ignored; at least 2.
        ridge: relative ridge strength, positive.

    Returns:
        :class:`NextTokenSeparability` with float64 scalars ``nc1``,
        ``probe_accuracy`` and ints ``num_groups`` (:math:`K`), ``num_tokens``
        (:math:`T`).

    Raises:
        TypeError: ``x`` not floating, ``next_tokens`` not integer, ``mask`` not bool.
        ValueError: bad shapes, ``min_count < 2``, ``ridge <= 0``, or fewer than two
            groups left.

    Shape:
        - x: :math:`(B, N, D)`; next_tokens, mask: :math:`(B, N)`
        - output: scalars

    References:
        Zhang, Papyan. Laplacian heads. arXiv:2602.09297, 2026.
        Alain, Bengio. Understanding intermediate layers using linear classifier
        probes. arXiv:1610.01644, 2016.

    Examples:
        >>> x = torch.tensor([[[0.0, 0.0], [5.0, 0.0], [0.0, 0.1], [5.0, 0.1]]])
        >>> result = next_token_separability(x, torch.tensor([[7, 8, 7, 8]]))
        >>> result.probe_accuracy.item(), result.num_groups, result.num_tokens
        (1.0, 2, 4)
    """
    x = _check_float_tensor(x, "x", min_ndim=3, shape="(B, N, D)")
    if x.ndim != 3:
        raise ValueError(f"x: expected shape (B, N, D), got {tuple(x.shape)}")
    next_tokens = _check_int_tensor(next_tokens, "next_tokens", tuple(x.shape[:2]), x)
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 2:
        raise ValueError(f"min_count: expected an int >= 2, got {min_count!r}")
    if not ridge > 0:
        raise ValueError(f"ridge: expected a positive float, got {ridge!r}")
    m = _resolve_mask(mask, x) & (next_tokens >= 0)  # (B, N)
    h = x[m].to(_accumulation_dtype(x.device))  # (T0, D)
    y = next_tokens[m]  # (T0,)
    _, inv, counts = torch.unique(y, return_inverse=True, return_counts=True)
    keep = (counts >= min_count)[inv]  # (T0,)
    h, y = h[keep], y[keep]  # (T, D), (T,)
    _, inv, counts = torch.unique(y, return_inverse=True, return_counts=True)
    num_groups = counts.numel()
    if num_groups < 2:
        raise ValueError(
            f"next_tokens: expected at least 2 distinct next tokens with >= {min_count} "
            f"real occurrences each, got {num_groups}"
        )
    _, class_mean = _class_means(h, inv, num_groups)
    nc1 = _nc1(h, inv, class_mean, torch.finfo(x.dtype).eps)

    # Stratified deterministic split: rank of each token inside its group.
    order = torch.sort(inv, stable=True).indices  # (T,)
    start = torch.cumsum(counts, 0) - counts  # (K,)
    rank = torch.empty_like(inv)
    rank[order] = torch.arange(inv.numel(), device=inv.device) - start[inv[order]]
    train = rank % 2 == 0  # (T,)
    accuracy = _ridge_probe_accuracy(
        h[train], inv[train], h[~train], inv[~train], num_groups, ridge
    )
    return NextTokenSeparability(nc1, accuracy, num_groups, int(inv.numel()))


# --------------------------------------------------------------------------- spectra


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
    x = _check_float_tensor(x, "x", min_ndim=2, shape="(..., N, D)")
    m = _resolve_mask(mask, x)  # (..., N)
    xf = _masked_float(x, m)  # (..., N, D)
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
    x = _check_float_tensor(x, "x", min_ndim=2, shape="(..., N, D)")
    if rtol is None:
        rtol = max(x.shape[-2], x.shape[-1]) * torch.finfo(x.dtype).eps
    elif not rtol >= 0:
        raise ValueError(f"rtol: expected a non-negative float, got {rtol!r}")
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


# --------------------------------------------------------------------------- smoothness


def dirichlet_energy(graph: Graph, x: Tensor, normalization: str = "rw") -> Tensor:
    r"""Dirichlet energy :math:`\operatorname{tr}(x^\top L x)` of a signal on a graph.

    :math:`L` is the Laplacian of ``graph`` in the requested normalization (out-degree
    :math:`D_{out}`, self-loops kept, as everywhere in :mod:`heatformer.graph_ops`):

    - ``"rw"``: :math:`L = D_{out}^{+}(D_{out} - W)`; for attention :math:`I - P`.
    - ``"sym"``: :math:`L = D^{+1/2}(D - W_s)D^{+1/2}`, :math:`W_s = (W + W^\top)/2`,
      :math:`D` the degrees of :math:`W_s`. For symmetric :math:`W` the energy is
      :math:`\frac12\sum_{ij} W_{ij}\lVert x_i/\sqrt{d_i} - x_j/\sqrt{d_j}\rVert^2`;
      its kernel is spanned by :math:`D^{1/2}\mathbf{1}`, not by the constant.
    - ``"combinatorial"``: :math:`L = D_{out} - W`; for symmetric :math:`W`,
      :math:`\frac12\sum_{ij} W_{ij}\lVert x_i - x_j\rVert^2`.

    Low energy means a smooth signal (neighbouring tokens alike), which is what
    over-smoothing drives to zero. For ``"rw"`` on a non-symmetric graph the quadratic
    form is not a sum of squares and can be negative.

    Unlike the other metrics this one is computed in the dtype of ``x`` and the graph,
    so it can be used directly as a differentiable regulariser.

    Args:
        graph: any :class:`heatformer.graph_ops.Graph` (``DenseGraph``,
            ``SoftmaxGraph``, ``SparseGraph``, ...) with batch shape ``(...)``.
        x: signal on the nodes, shape ``(..., N, C)``.
        normalization: ``"rw"``, ``"sym"`` or ``"combinatorial"``.

    Returns:
        Tensor of shape ``(...)``, one energy per graph.

    Raises:
        TypeError: ``graph`` not a Graph, ``x`` not a floating tensor of the graph's dtype.
        ValueError: ``x`` not ``(..., N, C)`` for the graph's ``N`` and batch shape, or an
            unknown ``normalization`` (both checked by
            :func:`heatformer.graph_ops.laplacian`).

    Shape:
        - x: :math:`(..., N, C)`
        - output: :math:`(...)`

    Equivalent to::

        (x * laplacian(graph, x, normalization)).sum((-2, -1))

    References:
        Chung. Spectral Graph Theory. AMS, 1997.
        Cai, Wang. A note on over-smoothing for graph neural networks.
        arXiv:2006.13318, 2020.

    Examples:
        >>> from heatformer.graph_ops import DenseGraph
        >>> path = DenseGraph(torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]))
        >>> dirichlet_energy(path, torch.tensor([[0.0], [1.0], [3.0]]), "combinatorial")
        tensor(5.)
        >>> dirichlet_energy(path, torch.ones(3, 1), "rw")
        tensor(0.)
    """
    x = _check_float_tensor(x, "x", min_ndim=2, shape="(..., N, C)")
    if not isinstance(graph, Graph):
        raise TypeError(f"graph: expected a heatformer.graph_ops.Graph, got {type(graph)}")
    if x.shape[-2] != graph.num_nodes:
        raise ValueError(
            f"x: expected shape (..., N={graph.num_nodes}, C), got {tuple(x.shape)} "
            f"(dim -2 must equal the graph's num_nodes)"
        )
    lx = laplacian(graph, x, normalization)  # (..., N, C)
    return (x * lx).sum((-2, -1))
