r"""Separability of token states grouped by the token that follows them.

:func:`next_token_separability` groups the tokens of a language model by their next token
(the class of its cross-entropy) and reports the groups' NC1 (as
:func:`~heatformer.analysis.neural_collapse` computes it) and the test accuracy of a
closed-form ridge probe on a deterministic stratified split.

References:
    Zhang, Papyan. Laplacian heads. arXiv:2602.09297, 2026.
    Alain, Bengio. Understanding intermediate layers using linear classifier probes.
    arXiv:1610.01644, 2016.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from heatformer.analysis._masked import accumulation_dtype, resolve_mask
from heatformer.analysis.collapse import _class_means, _nc1
from heatformer.checks import bad_value, check_float_tensor, check_int_tensor

__all__ = ["NextTokenSeparability", "next_token_separability"]


class NextTokenSeparability(NamedTuple):
    """Separability of tokens grouped by next token; see :func:`next_token_separability`."""

    nc1: Tensor
    probe_accuracy: Tensor
    num_groups: int
    num_tokens: int


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


def _groups(
    x: Tensor, next_tokens: Tensor, mask: Tensor | None, min_count: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The real tokens whose next token occurs at least ``min_count`` times:
    ``(h (T, D), group id (T,), group sizes (K,))``, ``h`` in the accumulation dtype."""
    m = resolve_mask(mask, x) & (next_tokens >= 0)  # (B, N)
    h = x[m].to(accumulation_dtype(x.device))  # (T0, D)
    y = next_tokens[m]  # (T0,)
    _, inv, counts = torch.unique(y, return_inverse=True, return_counts=True)
    keep = (counts >= min_count)[inv]  # (T0,)
    h, y = h[keep], y[keep]  # (T, D), (T,)
    _, inv, counts = torch.unique(y, return_inverse=True, return_counts=True)
    if counts.numel() < 2:
        raise bad_value(
            "next_tokens",
            f"expected at least 2 distinct next tokens with >= {min_count} real occurrences "
            f"each, got {counts.numel()}",
        )
    return h, inv, counts


def _check_options(min_count: int, ridge: float) -> None:
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 2:
        raise bad_value("min_count", f"expected an int >= 2, got {min_count!r}")
    if not ridge > 0:
        raise bad_value("ridge", f"expected a positive float, got {ridge!r}")


def _even_ranked(inv: Tensor, counts: Tensor) -> Tensor:
    """The stratified deterministic split: ``True`` where a token's rank inside its group
    (``inv`` ``(T,)`` group ids, ``counts`` ``(K,)`` their sizes), in order, is even."""
    order = torch.sort(inv, stable=True).indices  # (T,)
    start = torch.cumsum(counts, 0) - counts  # (K,)
    rank = torch.empty_like(inv)
    rank[order] = torch.arange(inv.numel(), device=inv.device) - start[inv[order]]
    return rank % 2 == 0  # (T,)


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
    x = check_float_tensor("x", x, min_dim=3, shape="(B, N, D)")
    if x.ndim != 3:
        raise bad_value("x", f"expected shape (B, N, D), got {tuple(x.shape)}")
    next_tokens = check_int_tensor("next_tokens", next_tokens, tuple(x.shape[:2]), x.device)
    _check_options(min_count, ridge)
    h, inv, counts = _groups(x, next_tokens, mask, min_count)  # (T, D), (T,), (K,)
    num_groups = counts.numel()
    _, class_mean = _class_means(h, inv, num_groups)
    nc1 = _nc1(h, inv, class_mean, torch.finfo(x.dtype).eps)

    train = _even_ranked(inv, counts)  # (T,)
    accuracy = _ridge_probe_accuracy(
        h[train], inv[train], h[~train], inv[~train], num_groups, ridge
    )
    return NextTokenSeparability(nc1, accuracy, num_groups, int(inv.numel()))
