r"""How well each window's top principal components separate its tokens' categories.

The ``masked`` task's ``seg_score`` (:func:`segmentation_score`): Zhang & Papyan (2026) say
that the Laplacian heads of a self-supervised transformer give principal components better
suited to segmentation. Here a window is a sequence of ``N`` token states
:math:`x_1 .. x_N \in \mathbb{R}^D` whose tokens carry categories :math:`y_i` (the Python token
category of each byte, :mod:`heatformer.lab.tasks._python_tokens`; :data:`UNKNOWN` ones are
left out). For each window :math:`s`:

1. **PCA of the window.** Centre the states, :math:`\bar X = X - \mathbf{1}\mu^\top`, and keep
   the coordinates on its top :math:`r` = :data:`SEG_RANK` principal components,
   :math:`z_i = V_r^\top (x_i - \mu) \in \mathbb{R}^r` (:math:`V_r`: the right singular vectors
   of the :math:`r` largest singular values of :math:`\bar X`; fewer when
   :math:`\min(N, D) < r`). Every token takes part in the PCA, of whatever category.
2. **Leave-one-out nearest class mean.** The categories with at least two tokens in the window
   are its classes :math:`\mathcal K_s` (a category seen once has no mean without its one
   token); each token of a class is assigned to the class whose mean, computed without that
   token, is nearest in :math:`z`:
   :math:`\hat y_i = \arg\min_{k \in \mathcal K_s} \lVert z_i - \mu_k^{(-i)} \rVert^2`, where
   :math:`\mu_k^{(-i)} = \mu_k` for :math:`k \ne y_i` and, for its own class of :math:`n_k`
   tokens, :math:`\lVert z_i - \mu_{y_i}^{(-i)} \rVert = \tfrac{n_k}{n_k - 1}
   \lVert z_i - \mu_{y_i} \rVert` (ties go to the lowest category id).
3. **Chance-adjusted balanced accuracy.** With :math:`K_s = |\mathcal K_s|` and the recall of
   each class :math:`R_k = |\{i : y_i = k, \hat y_i = k\}| / n_k`, the window's score is

   .. math::
       S_s = \frac{\tfrac{1}{K_s}\sum_{k \in \mathcal K_s} R_k - 1/K_s}{1 - 1/K_s}
       \qquad (K_s \ge 2; \text{ else no score}),

   1 when every token is nearest its own category's mean, about 0 at chance (random
   categories), 0 exactly for states collapsed to one point (every token is assigned the
   lowest category).

``seg_score`` is the mean of :math:`S_s` over the windows that have one (NaN if none). It is
scikit-learn's ``balanced_accuracy_score(adjusted=True)`` of ``NearestCentroid`` under
``LeaveOneOut`` on ``PCA(r)`` coordinates, window by window (the tests check it against
those). The probe is fitted within a window and not across windows because each window has
its own principal axes (defined up to sign and rotation: nearest class means do not depend on
them), as a segmentation of one image is made from its own components. The score is invariant
to a rotation, translation or scaling of the states and to the order of the tokens; where the
:math:`r`-th and :math:`(r+1)`-th singular values are equal the top components are not unique
and the score follows the SVD's choice.

References:
    Zhang, Papyan. Laplacian heads. arXiv:2602.09297, 2026.
    Brodersen, Ong, Stephan, Buhmann. The balanced accuracy and its posterior distribution.
    ICPR 2010.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from heatformer.checks import bad_value
from heatformer.lab.tasks._python_tokens import UNKNOWN

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["SEG_RANK", "segmentation_score", "window_scores"]

#: The principal components per window that ``seg_score`` reads (3: the components a
#: segmentation map of PCA shows as RGB).
SEG_RANK = 3


def segmentation_score(x: Tensor, labels: Tensor, *, rank: int = SEG_RANK) -> float:
    """``seg_score``: the mean of :func:`window_scores` over the windows that have one.

    Args:
        x: token states ``(B, N, D)``.
        labels: category ids ``(B, N)``, non-negative or :data:`UNKNOWN` (left out).
        rank: principal components per window.

    Returns:
        The mean score, NaN when no window has two categories of two tokens each.

    Examples:
        >>> import torch
        >>> labels = torch.tensor([[0, 0, 1, 1]])
        >>> segmentation_score(torch.tensor([[[0.0], [0.1], [5.0], [5.2]]]), labels)
        1.0
        >>> segmentation_score(torch.zeros(1, 4, 3), labels)  # collapsed: chance
        0.0
    """
    scores = window_scores(x, labels, rank=rank)
    scores = scores[scores.isfinite()]
    return float(scores.mean()) if scores.numel() else math.nan


def window_scores(x: Tensor, labels: Tensor, *, rank: int = SEG_RANK) -> Tensor:
    """The score of each window (see the module docstring), in float64.

    Args:
        x: token states ``(B, N, D)``.
        labels: category ids ``(B, N)``, non-negative or :data:`UNKNOWN`.
        rank: principal components per window, at least 1.

    Returns:
        ``(B,)`` float64 on ``x``'s device: :math:`S_s`, NaN for a window with fewer than two
        categories of at least two tokens.

    Raises:
        ValueError: shapes that do not match, a rank below 1, labels below :data:`UNKNOWN`.
    """
    import torch

    if x.dim() != 3 or labels.shape != x.shape[:2]:
        raise bad_value(
            "labels",
            f"expected states (B, N, D) and labels (B, N), got {tuple(x.shape)} and "
            f"{tuple(labels.shape)}",
        )
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise bad_value("rank", f"expected an int >= 1, got {rank!r}")
    labels = labels.to(x.device, torch.int64)
    if labels.numel() and int(labels.min()) < UNKNOWN:
        raise bad_value("labels", f"expected ids >= {UNKNOWN}, got {int(labels.min())}")
    z = _top_components(x, rank)  # (B, N, r)
    classes = int(labels.max()) + 1 if labels.numel() else 0
    if classes < 2:
        return torch.full(x.shape[:1], math.nan, dtype=torch.float64, device=x.device)
    known = labels >= 0  # (B, N)
    onehot = torch.nn.functional.one_hot(labels.clamp(min=0), classes).double()
    onehot = onehot * known[..., None]  # (B, N, K)
    counts = onehot.sum(1)  # (B, K)
    means = onehot.transpose(1, 2) @ z / counts.clamp(min=1)[..., None]  # (B, K, r)
    eligible = counts >= 2  # (B, K) a class: two tokens or more
    distance = (z[:, :, None, :] - means[:, None]).square().sum(-1)  # (B, N, K)
    own = (counts / (counts - 1).clamp(min=1)).square()  # (B, K) leave-one-out factor
    distance = torch.where(onehot.bool(), distance * own[:, None], distance)
    distance = distance.masked_fill(~eligible[:, None], math.inf)
    hits = onehot * (distance.argmin(-1) == labels)[..., None]  # (B, N, K) correct, by class
    recall = hits.sum(1) / counts.clamp(min=1)  # (B, K)
    k = eligible.sum(1).double()  # (B,)
    balanced = (recall * eligible).sum(1) / k.clamp(min=1)  # (B,)
    adjusted = (balanced - 1 / k) / (1 - 1 / k)
    return adjusted.masked_fill(k < 2, math.nan)


def _top_components(x: Tensor, rank: int) -> Tensor:
    """``(B, N, r)`` float64: each window's centred states on its top ``r = min(rank, N, D)``
    principal components, :math:`U_r \\Sigma_r` of the SVD of the centred states."""
    import torch

    centred = x.double() - x.double().mean(1, keepdim=True)  # (B, N, D)
    u, s, _ = torch.linalg.svd(centred, full_matrices=False)  # (B, N, m), (B, m)
    r = min(rank, s.shape[-1])
    return u[..., :r] * s[..., None, :r]  # (B, N, r)
