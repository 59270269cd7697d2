r"""The Poisson weights of the heat series: how many terms a tolerance needs, and what they
guarantee.

The series ``exp(-tL) x = e^{-tau} sum_k tau^k / k! M^k x`` (``tau = c t``, see
:mod:`heatformer.graph_ops.heat`) weighs its ``k``-th term by the Poisson probability
``P[Poisson(tau) = k]``: truncated after ``K`` terms it misses exactly the tail
``P[Poisson(tau) > K]`` of a row-stochastic ``M``. :func:`series_plan` splits ``tau`` into
``s`` sub-steps of at most :data:`SERIES_MAX_STEP` and picks the smallest ``K`` whose tail is
within ``tol / s`` (:func:`poisson_order`, from the tail as :func:`poisson_tail` sums it);
:func:`series_certificate` states the plan with the bound it guarantees
(:class:`SeriesCertificate`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from heatformer import checks as V

__all__ = [
    "SERIES_MAX_STEP", "SeriesCertificate", "poisson_order", "poisson_tail", "series_certificate",
    "series_plan",
]  # fmt: skip

#: Largest ``tau = c t`` handled in one series sub-step.
SERIES_MAX_STEP = 8.0


def _poisson_terms(tau: float, floor: float) -> list[float]:
    """``P[Poisson(tau) = k]`` for ``k = 0 .. M``, ``M`` past ``tau`` and far enough that the
    terms after it sum to less than ``floor * 2^-55`` (a geometric bound: beyond the mode each
    term is at most ``r = tau / (k + 1)`` times the one before)."""
    log_tau = math.log(tau)
    log_pmf, k, terms = -tau, 0, []
    while True:
        p = math.exp(log_pmf)
        terms.append(p)
        r = tau / (k + 1)
        if k > tau and (p == 0.0 or p * r / (1.0 - r) <= floor * 2.0**-55):
            return terms
        k += 1
        log_pmf += log_tau - math.log(k)


def poisson_tail(tau: float, order: int) -> float:
    r"""``P[Poisson(tau) > order]``, the truncation error of the series after ``order`` terms.

    Summed from the terms themselves, all positive, so it is accurate to a few roundings
    relative to itself however small it is (``1 - CDF`` would lose everything below
    ``2^-53``).

    Example:
        >>> f"{poisson_tail(1.0, 9):.3e}"  # e^-1 sum_{k > 9} 1/k!
        '1.114e-07'
        >>> poisson_tail(0.0, 0), poisson_tail(2.0, -1)
        (0.0, 1.0)
    """
    if tau <= 0:
        return 0.0
    if order < 0:
        return 1.0
    k = order + 1
    log_tau = math.log(tau)
    log_pmf = -tau + k * log_tau - math.lgamma(k + 1)
    total = 0.0
    while True:
        p = math.exp(log_pmf)
        total += p
        r = tau / (k + 1)
        if k > tau and (p == 0.0 or p * r / (1.0 - r) <= total * 2.0**-55):
            return total
        k += 1
        log_pmf += log_tau - math.log(k)


def poisson_order(tau: float, tol: float) -> int:
    """Smallest ``K`` with ``P[Poisson(tau) > K] <= tol`` (the tail as :func:`poisson_tail`
    computes it: accurate also where ``tol`` is below ``2^-53``).

    Example:
        >>> poisson_order(1.0, 1e-6)
        9
        >>> poisson_order(0.0, 1e-6)
        0
    """
    if tau <= 0:
        return 0
    terms = _poisson_terms(tau, tol)
    tail = 0.0  # P[X > k], summed from the smallest terms up
    for k in range(len(terms) - 1, -1, -1):
        if tail + terms[k] > tol:  # P[X > k - 1] > tol: k is the smallest
            return k
        tail += terms[k]
    return 0  # pragma: no cover - the terms sum to 1 > tol


@dataclass(frozen=True)
class SeriesCertificate:
    r"""What the positive heat series guarantees for one plan: :func:`series_certificate`.

    The series runs ``s`` sub-steps ``exp(-(tau/s)(I - M))``, each truncated after the order
    ``K``. With ``M`` row-stochastic (``"rw"``: ``M = D^+ W``, rows without edges kept as they
    are; ``"combinatorial"``: ``M = I - L / c``) every sub-step's truncation ``T`` is a
    non-negative matrix with row sums ``1 - tail``, and ``exp(-(tau/s)(I - M)) - T`` a
    non-negative one with row sums ``tail``, so the truncation error of the whole series, in
    the norm induced by the maximum norm, is exactly

    .. math::

        \|e^{-tL} - T^s\|_\infty = 1 - (1 - \text{tail})^s \le s \, \text{tail} \le \text{tol},
        \qquad \text{tail} = P[\mathrm{Poisson}(\tau / s) > K],

    so ``max|y - exp(-tL) x| <= bound * max|x|`` for every signal ``x``, with equality for
    ``x = 1``. For ``"sym"`` (``||M||_2 <= 1``, ``M`` symmetric) the same bound holds in the
    2-norm of each channel. It is a bound on the truncation in exact arithmetic: a computation
    in floating point adds its rounding (about ``K * 2^-24 * max|x|`` in float32).
    A time below ``tau`` (another head's, a learnable time under its clamp) has a smaller
    tail with the same ``s`` and ``K``: the bound covers it.

    Attributes:
        tau: ``c t``, the largest time the series is planned for (``c = 1`` but for the
            combinatorial Laplacian of a graph that is not row-stochastic).
        tol: the tolerance asked for.
        splits: ``s``, sub-steps of ``tau / s <= 8`` each.
        order: ``K``, propagations per sub-step: the smallest with ``tail <= tol / s``.
        tail: ``P[Poisson(tau / s) > K]``, one sub-step's truncation error.
        bound: ``1 - (1 - tail)^s``, the truncation error of the whole series (``<= tol``).
    """

    tau: float
    tol: float
    splits: int
    order: int
    tail: float
    bound: float

    @property
    def propagations(self) -> int:
        """``s K``: the graph products one call costs (more than ``SERIES_MAX_TERMS``:
        ``method="auto"`` computes ``"exact"`` instead, with no truncation)."""
        return self.splits * self.order


def series_certificate(tau: float, tol: float = 1e-6) -> SeriesCertificate:
    r"""The plan of the heat series for ``tau = c t`` and ``tol``, with the bound it guarantees.

    Args:
        tau: ``c t >= 0`` (``t`` for ``"rw"`` and ``"sym"``, and for ``"combinatorial"`` on
            row-stochastic graphs such as attention; ``d_max t`` on other graphs).
        tol: the tolerance, ``0 < tol < 1``.

    Returns:
        A :class:`SeriesCertificate`: ``splits``, ``order``, ``tail`` and ``bound <= tol``.

    Raises:
        ValueError: ``tau`` negative or not finite, ``tol`` outside (0, 1).

    Example:
        >>> c = series_certificate(1.0, 1e-6)
        >>> c.splits, c.order, f"{c.bound:.2e}"
        (1, 9, '1.11e-07')
        >>> c = series_certificate(20.0, 1e-6)  # split into 3 sub-steps of 6.67
        >>> c.splits, c.order, c.bound <= 1e-6
        (3, 23, True)
    """
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not math.isfinite(tau):
        raise V.bad_value("tau", f"expected a finite float >= 0, got {tau!r}")
    if tau < 0:
        raise V.bad_value("tau", f"expected a finite float >= 0, got {tau!r}")
    tol = V.check_tol(tol)
    s, order = series_plan(float(tau), tol)
    tail = poisson_tail(tau / s, order)
    bound = -math.expm1(s * math.log1p(-tail)) if tail < 1.0 else 1.0  # 1 - (1 - tail)^s
    return SeriesCertificate(tau, tol, s, order, tail, bound)


def series_plan(tau_max: float, tol: float) -> tuple[int, int]:
    """``(splits s, order K)`` of the series at ``tau`` (the largest of a batch): ``s`` sub-steps
    of ``tau / s <= SERIES_MAX_STEP``, each truncated after the smallest ``K`` whose Poisson tail
    is at most ``tol / s``.

    Example:
        >>> series_plan(1.0, 1e-6), series_plan(20.0, 1e-6)
        ((1, 9), (3, 23))
    """
    s = max(1, math.ceil(tau_max / SERIES_MAX_STEP))
    return s, poisson_order(tau_max / s, tol / s)
