r"""Inference a reviewer asks for: trends in k, corrections, effect sizes, equivalence.

Every function takes per-seed numbers (plain sequences, ``None`` counts as NaN) and returns
plain numbers, so the report can print them and ``results.json`` can hold them. The seed is
the unit of replication; ``s`` is the sample standard deviation (``ddof=1``); tests are
two-sided unless stated; ``level`` is a confidence level and ``alpha`` a test's size.

- :func:`trend_test` -- the slope of a metric against k, one least-squares fit per seed, and
  a one-sample t-test of the slopes;
- :func:`holm`, :func:`benjamini_hochberg` -- adjusted p-values over a family of tests;
- :func:`many_to_one` -- every configuration against the one shared baseline (paired by seed),
  with Holm's family-wise correction;
- :func:`effect_size` -- the paired effect in seed-SD units (Cohen's :math:`d_z`) and its
  exact interval from the noncentral t;
- :func:`tost` -- equivalence within a margin (two one-sided tests);
  :func:`paired_power` -- the power of the paired t-test against an effect;
  :func:`detectable_effect` -- the smallest :math:`d_z` a design detects at a given power;
  :func:`equivalence_statement` -- "no effect larger than X", only when TOST shows it.

References:
    Holm, S. (1979). A simple sequentially rejective multiple test procedure. Scandinavian
    Journal of Statistics 6(2), 65-70.
    Benjamini, Y. and Hochberg, Y. (1995). Controlling the false discovery rate. JRSS B 57(1),
    289-300.
    Schuirmann, D. J. (1987). A comparison of the two one-sided tests procedure and the power
    approach for assessing the equivalence of average bioavailability. J. Pharmacokinetics and
    Biopharmaceutics 15(6), 657-680.
    Steiger, J. H. and Fouladi, R. T. (1997). Noncentrality interval estimation and the
    evaluation of statistical models. In Harlow, Mulaik and Steiger (eds.), What If There Were
    No Significance Tests?, 221-257.
    Lakens, D. (2017). Equivalence tests: a practical primer for t tests, correlations, and
    meta-analyses. Social Psychological and Personality Science 8(4), 355-362.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from heatformer.checks import bad_value
from heatformer.lab.report.stats import mean_std, one_sample_t, paired_difference

__all__ = [
    "benjamini_hochberg",
    "detectable_effect",
    "effect_size",
    "equivalence_statement",
    "holm",
    "many_to_one",
    "paired_power",
    "tost",
    "trend_test",
]


def _floats(values: Sequence[float | None]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


def _check_unit(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise bad_value(name, f"expected a float in (0, 1), got {value!r}")
    return float(value)


def trend_test(
    values: Sequence[Sequence[float]], ks: Sequence[float], level: float = 0.95
) -> dict[str, Any]:
    r"""Trend of a metric in k: a least-squares slope per seed, then a t-test of the slopes.

    For seed :math:`s` with values :math:`y_{sj}` at :math:`k_j`,

    .. math:: b_s = \frac{\sum_j (k_j - \bar k)(y_{sj} - \bar y_s)}{\sum_j (k_j - \bar k)^2},
        \qquad t = \frac{\bar b}{s_b / \sqrt n}, \qquad \nu = n - 1,

    :math:`p = 2 P(T_\nu \ge |t|)` and the interval :math:`\bar b \pm t_{(1+\text{level})/2,\,\nu}
    \, s_b/\sqrt n`. The seeds are the replicates: the slope's error is its spread over seeds,
    not the residuals of one pooled fit (which would treat the k points of one seed as
    independent).

    Args:
        values: one row per seed, each with one value per entry of ``ks``.
        ks: the k of each column; at least two distinct.
        level: the confidence level of ``ci95`` (the key keeps its name).

    Returns:
        ``{"slope", "ci95", "t", "p", "df", "n", "slopes"}``: the mean slope, the half-width
        of its interval, the t statistic, the two-sided p-value, the degrees of freedom, the
        number of seeds and the per-seed slopes (NaN for a seed with a NaN value).

    Raises:
        ValueError: fewer than two distinct ks, no seeds, or a row of another length.

    Examples:
        >>> r = trend_test([[1.0, 2.0, 3.0], [1.0, 3.0, 5.0], [2.0, 3.0, 4.0]], [0, 1, 2])
        >>> r["slopes"], round(r["slope"], 4), round(r["t"], 4), r["df"], round(r["p"], 4)
        ([1.0, 2.0, 1.0], 1.3333, 4.0, 2, 0.0572)
    """
    x = [float(k) for k in ks]
    k_mean = math.fsum(x) / len(x) if x else math.nan
    sxx = math.fsum((k - k_mean) ** 2 for k in x)
    if len(set(x)) < 2:
        raise bad_value("ks", f"expected at least two distinct values, got {list(ks)}")
    if not values:
        raise bad_value("values", "expected at least one seed, got none")
    slopes = []
    for row in values:
        if len(row) != len(x):
            raise bad_value("values", f"expected {len(x)} values per seed, got {len(row)}")
        y = _floats(row)
        y_mean = math.fsum(y) / len(y)
        slopes.append(math.fsum((k - k_mean) * (v - y_mean) for k, v in zip(x, y)) / sxx)
    test = one_sample_t(slopes, level)
    return {
        "slope": test["mean"],
        **{key: test[key] for key in ("ci95", "t", "p", "df", "n")},
        "slopes": slopes,
    }


def _check_p(p_values: Sequence[float]) -> list[float]:
    p = _floats(p_values)
    bad = [v for v in p if not (math.isnan(v) or 0.0 <= v <= 1.0)]
    if bad:
        raise bad_value("p_values", f"expected p-values in [0, 1] (or NaN), got {bad}")
    return p


def holm(p_values: Sequence[float]) -> list[float]:
    r"""Holm's step-down adjusted p-values: family-wise error control under any dependence.

    With the :math:`m` finite p-values sorted, :math:`p_{(1)} \le \dots \le p_{(m)}`,

    .. math:: \tilde p_{(i)} = \max_{j \le i} \min\bigl(1,\ (m - j + 1)\, p_{(j)}\bigr),

    so rejecting every hypothesis with :math:`\tilde p \le \alpha` is Holm's procedure (reject
    :math:`H_{(1)}, H_{(2)}, \dots` while :math:`p_{(i)} \le \alpha / (m - i + 1)`). The
    adjusted values keep the order of the raw ones and are never below them. A NaN p-value (a
    test that could not be made, e.g. one seed) stays NaN and does not count in :math:`m`.

    Args:
        p_values: the family's p-values, in any order.

    Returns:
        The adjusted p-values, in the order given.

    Raises:
        ValueError: a p-value outside ``[0, 1]``.

    Examples:
        >>> holm([0.01, 0.04, 0.03, 0.5])
        [0.04, 0.09, 0.09, 0.5]
    """
    p = _check_p(p_values)
    order = sorted((i for i, v in enumerate(p) if not math.isnan(v)), key=lambda i: p[i])
    adjusted = list(p)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p[i]))
        adjusted[i] = running
    return adjusted


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    r"""Benjamini–Hochberg adjusted p-values (q-values): false-discovery-rate control.

    With the :math:`m` finite p-values sorted, :math:`p_{(1)} \le \dots \le p_{(m)}`,

    .. math:: \tilde p_{(i)} = \min_{j \ge i} \min\bigl(1,\ \tfrac{m}{j}\, p_{(j)}\bigr)

    (``scipy.stats.false_discovery_control(p, method="bh")``). It controls the expected share
    of false rejections for independent or positively dependent tests -- a weaker promise than
    :func:`holm`'s. NaN p-values stay NaN and do not count in :math:`m`.

    Args:
        p_values: as for :func:`holm`: one per test of the family, NaN for a test not made.

    Returns:
        The q-values, in the order of ``p_values``; reject where ``q <= `` the target FDR.

    Raises:
        ValueError: as :func:`holm` does.

    Examples:
        >>> [round(q, 4) for q in benjamini_hochberg([0.01, 0.04, 0.03, 0.5])]
        [0.04, 0.0533, 0.0533, 0.5]
    """
    p = _check_p(p_values)
    order = sorted((i for i, v in enumerate(p) if not math.isnan(v)), key=lambda i: -p[i])
    adjusted = list(p)
    running = 1.0
    for position, i in enumerate(order):
        running = min(running, len(order) * p[i] / (len(order) - position))
        adjusted[i] = running
    return adjusted


def many_to_one(
    configs: Mapping[str, Sequence[float]], baseline: Sequence[float], level: float = 0.95
) -> dict[str, dict[str, Any]]:
    r"""Every configuration against one shared baseline, paired by seed, Holm-corrected.

    For configuration :math:`c`, the differences :math:`d_{cs} = y_{cs} - y_{0s}` get the
    paired t-test of :func:`~heatformer.lab.report.stats.paired_difference`; the
    :math:`m` p-values are then adjusted by :func:`holm`, and ``ci_simultaneous`` is the
    Bonferroni interval (level :math:`1 - (1 - \text{level})/m`), which covers all :math:`m`
    mean differences at once with probability at least ``level``.

    The choice: the comparisons share the baseline's runs, so their t statistics are
    positively correlated (a lucky baseline seed moves all of them). Dunnett's test uses that
    correlation to lower its critical value, but needs the correlation matrix of the
    differences, estimated from the same five or eight seeds; a max-|t| simulated from that
    estimate has no finite-sample guarantee (4 comparisons, correlation 0.5, 2000 simulated
    studies: family-wise error 0.055 for 5 and for 8 seeds -- near alpha, not provably within
    it), and a sign-flip permutation of 5 seeds cannot reach p < 2/32 = 0.0625. Holm needs no
    model of the dependence: its family-wise error is at most ``1 - level`` for any
    correlation. It is conservative exactly where Dunnett would gain -- strongly correlated
    comparisons.

    Args:
        configs: name -> the configuration's metric, one per seed, in the baseline's order.
        baseline: the baseline's metric on the same seeds.
        level: the confidence level of the intervals; the family's error rate is ``1 - level``.

    Returns:
        name -> :func:`paired_difference`'s dict plus ``p_adjusted`` (Holm over the family)
        and ``ci_simultaneous`` (the Bonferroni half-width).

    Raises:
        ValueError: no configurations, or a configuration with another number of seeds.

    Examples:
        >>> out = many_to_one({"a": [1.2, 1.4, 1.1], "b": [1.0, 1.1, 1.0]}, [1.0, 1.0, 1.0])
        >>> round(out["a"]["p"], 4), round(out["a"]["p_adjusted"], 4)
        (0.1181, 0.2362)
    """
    if not configs:
        raise bad_value("configs", "expected at least one configuration, got none")
    level = _check_unit("level", level)
    m = len(configs)
    out = {name: paired_difference(values, baseline, level) for name, values in configs.items()}
    adjusted = holm([row["p"] for row in out.values()])
    for row, p in zip(out.values(), adjusted):
        row["p_adjusted"] = p
        row["ci_simultaneous"] = one_sample_t(row["values"], 1 - (1 - level) / m)["ci95"]
    return out


def _solve(f: Callable[[float], float], low: float, high: float) -> float:
    """A root of the increasing ``f`` in ``[low, high]``, the bracket widened until it holds."""
    from scipy.optimize import brentq

    while f(low) > 0:
        low -= 2 * (high - low)
    while f(high) < 0:
        high += 2 * (high - low)
    return float(brentq(f, low, high, xtol=1e-12, rtol=1e-12))


#: Beyond this ``|nc|`` :func:`_nct_cdf` uses the noncentral t's limit (old scipy aborts the
#: process from about 1e5, newer ones return NaN from about 1e6).
_NC_LIMIT = 1e4


def _nct_cdf(x: float, df: int, nc: float) -> float:
    r"""``scipy.stats.nct.cdf``, whose far tails (below ~1e-15) come back NaN: there the value is
    1 for ``nc`` below ``x`` and 0 above (the cdf falls as ``nc`` grows).

    For :math:`|nc| \ge` 1e4 (a t statistic of differences that hardly vary) it is the limit
    of :math:`T = (Z + nc)/S`, :math:`S^2 = V/\nu \sim \chi^2_\nu/\nu`, as :math:`Z/nc \to 0`:
    :math:`P(T \le x) = P(\chi^2_\nu \ge \nu (nc/x)^2)` for :math:`nc, x > 0` (and the mirror
    image for :math:`nc < 0`), within 1e-7 of scipy at 1e4.
    """
    from scipy.stats import chi2, nct

    if abs(nc) >= _NC_LIMIT:
        if (x > 0) != (nc > 0):  # T has the sign of nc
            return float(nc < 0)
        tail = float(chi2.sf(df * (nc / x) ** 2, df))
        return tail if nc > 0 else 1.0 - tail
    value = float(nct.cdf(x, df, nc))
    return value if not math.isnan(value) else float(nc < x)


def effect_size(differences: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    r"""Paired effect in seed-SD units, Cohen's :math:`d_z`, with its exact interval.

    .. math:: d_z = \frac{\bar d}{s_d}, \qquad t = d_z \sqrt n \sim
        t'_{n-1}\bigl(\delta \sqrt n\bigr)

    (noncentral t with noncentrality :math:`\delta\sqrt n`, :math:`\delta` the true
    :math:`\mu_d/\sigma_d`). The interval inverts the noncentral t: its ends are the
    :math:`\delta` whose distribution puts the observed :math:`t` at the
    :math:`(1 \pm \text{level})/2` quantiles (Steiger & Fouladi 1997), not the normal
    approximation, which is too narrow for a handful of seeds.

    Args:
        differences: paired differences, one per seed.
        level: the confidence level.

    Returns:
        ``{"d", "low", "high", "n"}``; the interval is NaN below two seeds, with a NaN, or when
        the differences do not vary (``d`` is then 0 or +-inf).

    Raises:
        ValueError: no differences, or ``level`` outside (0, 1).

    Examples:
        >>> r = effect_size([0.3, 0.5, 0.1, 0.4, 0.2])
        >>> round(r["d"], 4), round(r["low"], 3), round(r["high"], 3)
        (1.8974, 0.333, 3.407)
    """
    level = _check_unit("level", level)
    d = _floats(differences)
    if not d:
        raise bad_value("differences", "expected at least one number, got none")
    test = one_sample_t(d, level)
    n = test["n"]
    out = {"d": test["t"] / math.sqrt(n), "low": math.nan, "high": math.nan, "n": n}
    if n < 2 or not math.isfinite(out["d"]):
        out["d"] = math.nan if n < 2 else out["d"]
        return out
    t_obs, df = test["t"], n - 1
    for key, q in (("low", (1 + level) / 2), ("high", (1 - level) / 2)):

        def excess(nc: float, q: float = q) -> float:  # the cdf at t_obs falls as nc grows
            return q - _nct_cdf(t_obs, df, nc)

        out[key] = _solve(excess, t_obs - 1, t_obs + 1) / math.sqrt(n)
    return out


def tost(differences: Sequence[float], margin: float, alpha: float = 0.05) -> dict[str, Any]:
    r"""Equivalence of a paired difference within ``margin``: two one-sided t-tests.

    The null hypothesis is :math:`|\mu_d| \ge \Delta`; with :math:`\mathrm{se} = s_d/\sqrt n`
    and :math:`\nu = n - 1`,

    .. math:: t_L = \frac{\bar d + \Delta}{\mathrm{se}},\ p_L = P(T_\nu \ge t_L), \qquad
        t_U = \frac{\bar d - \Delta}{\mathrm{se}},\ p_U = P(T_\nu \le t_U),

    and :math:`p = \max(p_L, p_U)` (``ttest_1samp(d, -margin, alternative="greater")`` and
    ``ttest_1samp(d, margin, alternative="less")``). Rejecting at ``alpha`` -- "equivalent" --
    is the same as the :math:`1 - 2\alpha` interval of :math:`\mu_d` lying inside
    :math:`(-\Delta, \Delta)`.

    Args:
        differences: paired differences, one per seed (at least two).
        margin: the equivalence margin :math:`\Delta > 0`, in the metric's units.
        alpha: the size of each one-sided test.

    Returns:
        ``{"p", "p_lower", "p_upper", "df", "margin", "equivalent"}``; NaN p-values (and not
        equivalent) with a NaN difference; with differences that do not vary, each one-sided
        p is 0 or 1.

    Raises:
        ValueError: fewer than two differences, a margin that is not positive, or ``alpha``
            outside (0, 1).

    Examples:
        >>> r = tost([0.01, -0.02, 0.0, 0.015, -0.005], margin=0.05)
        >>> round(r["p"], 5), r["equivalent"]
        (0.00061, True)
    """
    alpha = _check_unit("alpha", alpha)
    if isinstance(margin, bool) or not isinstance(margin, int | float) or not margin > 0:
        raise bad_value("margin", f"expected a number > 0, got {margin!r}")
    d = _floats(differences)
    if len(d) < 2:
        raise bad_value("differences", f"expected at least two numbers, got {len(d)}")
    lower = one_sample_t([v + margin for v in d])
    upper = one_sample_t([v - margin for v in d])
    from scipy.stats import t

    def one_sided(stat: float, sf: bool) -> float:
        if math.isnan(stat):
            return math.nan
        return float(t.sf(stat, len(d) - 1) if sf else t.cdf(stat, len(d) - 1))

    p_lower, p_upper = one_sided(lower["t"], True), one_sided(upper["t"], False)
    p = max(p_lower, p_upper) if not math.isnan(p_lower + p_upper) else math.nan
    return {
        "p": p,
        "p_lower": p_lower,
        "p_upper": p_upper,
        "df": len(d) - 1,
        "margin": float(margin),
        "equivalent": bool(p < alpha),
    }


def paired_power(n: int, effect: float, alpha: float = 0.05) -> float:
    r"""The power of the two-sided paired t-test of size ``alpha`` on ``n`` seeds against a
    true effect of ``effect`` seed-SDs (:math:`d_z = \mu_d / \sigma_d`).

    With :math:`\nu = n - 1`, :math:`c = t_{1-\alpha/2,\,\nu}` and the noncentral t,

    .. math:: \operatorname{power}(\delta) = P\bigl(|t'_\nu(\delta\sqrt n)| > c\bigr)
        = 1 - F_{t'}(c) + F_{t'}(-c).

    Args:
        n: the number of seeds (pairs), at least 2.
        effect: :math:`\delta`, in seed-SD units (the sign does not matter; NaN gives NaN).
        alpha: the test's size (a corrected one, e.g. :math:`\alpha / m`, for a family).

    Returns:
        The probability that the test rejects.

    Raises:
        ValueError: ``n < 2`` or ``alpha`` outside (0, 1).

    Examples:
        >>> round(paired_power(5, detectable_effect(5)), 6)
        0.8
        >>> round(paired_power(5, 0.0), 6)  # no effect: the size
        0.05
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise bad_value("n", f"expected an int >= 2, got {n!r}")
    alpha = _check_unit("alpha", alpha)
    if math.isnan(effect):
        return math.nan
    from scipy.stats import t

    df, nc = n - 1, effect * math.sqrt(n)
    crit = float(t.ppf(1 - alpha / 2, df))
    return 1 - _nct_cdf(crit, df, nc) + _nct_cdf(-crit, df, nc)


def detectable_effect(n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    r"""The smallest :math:`d_z` a two-sided paired t-test on ``n`` seeds detects at ``power``.

    With :math:`\nu = n - 1`, :math:`c = t_{1-\alpha/2,\,\nu}` and the noncentral t,

    .. math:: \operatorname{power}(\delta) = P\bigl(|t'_\nu(\delta\sqrt n)| > c\bigr)
        = 1 - F_{t'}(c) + F_{t'}(-c),

    the returned :math:`\delta` solves :math:`\operatorname{power}(\delta) = ` ``power``. In the
    metric's units it is :math:`\delta\, \sigma_d`, the seed-SD of the differences.

    Args:
        n: the number of seeds (pairs), at least 2.
        alpha: the test's size.
        power: the target power.

    Returns:
        :math:`\delta`, in seed-SD units.

    Raises:
        ValueError: ``n < 2`` or ``alpha``/``power`` outside (0, 1).

    Examples:
        >>> round(detectable_effect(5), 3)  # five seeds: only effects of 1.7 seed-SDs
        1.682
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise bad_value("n", f"expected an int >= 2, got {n!r}")
    alpha, power = _check_unit("alpha", alpha), _check_unit("power", power)
    from scipy.stats import t

    df, root_n = n - 1, math.sqrt(n)
    crit = float(t.ppf(1 - alpha / 2, df))

    def shortfall(delta: float) -> float:
        nc = delta * root_n
        return 1 - _nct_cdf(crit, df, nc) + _nct_cdf(-crit, df, nc) - power

    if shortfall(0.0) >= 0:  # power <= alpha: any effect, even none, is "detected"
        return 0.0
    return _solve(shortfall, 0.0, 1.0)


def equivalence_statement(
    differences: Sequence[float],
    margin: float | None = None,
    alpha: float = 0.05,
    power: float = 0.8,
) -> str | None:
    r"""``"no effect larger than X"``, only when TOST rejects at margin X; else ``None``.

    X is ``margin`` or, without one, the design's detectable effect in the metric's units,
    :func:`detectable_effect` (``n``, ``alpha``, ``power``) times the seed-SD :math:`s_d` of
    the differences: the bound the study was powered to see. The sentence is returned only
    when :func:`tost` shows :math:`|\mu_d| < X` at ``alpha``; a difference that is merely not
    significant gets ``None`` ("undetermined", not "no effect").

    The default X depends on the data through :math:`s_d`, so the claim is really "no effect
    larger than :math:`\delta_{80}` seed-SDs": TOST then rejects when
    :math:`|t| < \delta_{80}\sqrt n - t_{1-\alpha,\,n-1}`, and when the true effect is
    exactly :math:`\delta_{80}\sigma_d` that happens with probability 0.027 for 5 seeds and
    0.034 for 8 (noncentral t, ``alpha`` 0.05), below ``alpha``.

    Args:
        differences: paired differences, one per seed (at least two).
        margin: X; by default the detectable effect times :math:`s_d`.
        alpha: the size of each one-sided test (and of the power computation).
        power: the power that defines the default margin.

    Returns:
        The sentence, X to three significant digits, or ``None``.

    Examples:
        >>> equivalence_statement([0.01, -0.02, 0.0, 0.015, -0.005], margin=0.05)
        'no effect larger than 0.05'
        >>> equivalence_statement([0.3, 0.5, 0.1, 0.4, 0.2]) is None
        True
    """
    d = _floats(differences)
    if margin is None:
        std = mean_std(d)[1]
        if len(d) < 2 or not std > 0:
            return None
        margin = detectable_effect(len(d), alpha, power) * std
    if not tost(d, margin, alpha)["equivalent"]:
        return None
    return f"no effect larger than {margin:.3g}"
