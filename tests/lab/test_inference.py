"""The report's inference (trend in k, Holm and BH, many-to-one, d_z, TOST, detectable effect)
against ``scipy.stats``, direct reference implementations and simulated null data."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from heatformer.lab import report

_floats = st.floats(-100, 100, allow_nan=False, allow_infinity=False)
_p_values = st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=15)


def _varies(values: np.ndarray) -> bool:
    """Spread enough that scipy's t statistic is finite and well conditioned."""
    return bool(np.std(values) > 1e-6 * (1 + np.abs(values).max()))


@st.composite
def _samples(draw: st.DrawFn, min_size: int = 2) -> list[float]:
    values = draw(st.lists(_floats, min_size=min_size, max_size=10))
    return values if _varies(np.asarray(values)) else [*values[:-1], values[-1] + 1.0]


# ----------------------------------------------------------------------------- one-sample t


@settings(max_examples=60, deadline=None)
@given(values=_samples(), level=st.sampled_from([0.9, 0.95, 0.99]))
def test_one_sample_t_is_scipys_ttest_1samp(values: list[float], level: float) -> None:
    result = report.one_sample_t(values, level)
    test = scipy.stats.ttest_1samp(values, 0.0)
    assert result["t"] == pytest.approx(float(test.statistic), rel=1e-9, abs=1e-9)
    assert result["p"] == pytest.approx(float(test.pvalue), rel=1e-7, abs=1e-12)
    assert result["df"] == len(values) - 1 and result["n"] == len(values)


def test_one_sample_t_edge_cases() -> None:
    shifted, zero = report.one_sample_t([2.0, 2.0]), report.one_sample_t([0.0, 0.0])
    assert shifted["p"] == 0.0 and shifted["t"] == math.inf
    assert zero["p"] == 1.0 and zero["t"] == 0.0
    assert math.isnan(report.one_sample_t([1.0])["p"])
    assert math.isnan(report.one_sample_t([1.0, None])["t"])


# ----------------------------------------------------------------------------- trend in k


@settings(max_examples=50, deadline=None)
@given(data=st.data(), n=st.integers(2, 8), ks=st.sampled_from([[0, 1, 2], [0, 1, 2, 3], [1, 4]]))
def test_trend_test_is_linregress_slopes_then_ttest_1samp(
    data: st.DataObject, n: int, ks: list[int]
) -> None:
    rows = [data.draw(st.lists(_floats, min_size=len(ks), max_size=len(ks))) for _ in range(n)]
    slopes = np.array([scipy.stats.linregress(ks, row).slope for row in rows])
    result = report.trend_test(rows, ks, level=0.9)
    assert result["slopes"] == pytest.approx(list(slopes), rel=1e-9, abs=1e-9)
    assert result["slope"] == pytest.approx(slopes.mean(), rel=1e-9, abs=1e-9)
    assert result["df"] == n - 1 and result["n"] == n
    if not _varies(slopes):
        return  # equal slopes: scipy's t is inf or nan
    test = scipy.stats.ttest_1samp(slopes, 0.0)
    assert result["t"] == pytest.approx(float(test.statistic), rel=1e-7, abs=1e-9)
    assert result["p"] == pytest.approx(float(test.pvalue), rel=1e-6, abs=1e-12)
    sem = scipy.stats.sem(slopes)
    low, high = scipy.stats.t.interval(0.9, n - 1, loc=slopes.mean(), scale=sem)
    assert result["slope"] - result["ci95"] == pytest.approx(low, rel=1e-7, abs=1e-9)
    assert result["slope"] + result["ci95"] == pytest.approx(high, rel=1e-7, abs=1e-9)


def test_trend_test_rejects_bad_input_and_keeps_nan() -> None:
    with pytest.raises(ValueError, match="ks"):
        report.trend_test([[1.0, 2.0]], [1, 1])
    with pytest.raises(ValueError, match="values"):
        report.trend_test([[1.0, 2.0, 3.0]], [0, 1])
    with pytest.raises(ValueError, match="values"):
        report.trend_test([], [0, 1])
    result = report.trend_test([[1.0, 2.0], [1.0, None]], [0, 1])  # a diverged run stays NaN
    assert math.isnan(result["slopes"][1]) and math.isnan(result["slope"])
    assert math.isnan(result["p"])


# ----------------------------------------------------------------------------- Holm and BH


def _holm_reference(p: list[float]) -> list[float]:
    """Holm's adjusted p-values by their definition, sorted with numpy."""
    order = np.argsort(p, kind="stable")
    m = len(p)
    scaled = np.minimum(1.0, (m - np.arange(m)) * np.asarray(p)[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)
    return list(adjusted)


def _holm_rejects(p: list[float], alpha: float) -> set[int]:
    """Holm's procedure: reject in order while p_(i) <= alpha / (m - i + 1)."""
    rejected: set[int] = set()
    for rank, i in enumerate(sorted(range(len(p)), key=lambda i: p[i])):
        if p[i] > alpha / (len(p) - rank):
            break
        rejected.add(i)
    return rejected


def _bh_rejects(p: list[float], alpha: float) -> set[int]:
    """Benjamini-Hochberg: reject the k smallest, k the largest i with p_(i) <= i alpha / m."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    passing = [rank for rank, i in enumerate(order, 1) if p[i] <= rank * alpha / len(p)]
    return set(order[: max(passing, default=0)])


@settings(max_examples=100, deadline=None)
@given(p=_p_values, alpha=st.sampled_from([0.01, 0.05, 0.1, 0.25]))
def test_holm_is_the_step_down_procedure(p: list[float], alpha: float) -> None:
    adjusted = report.holm(p)
    assert adjusted == pytest.approx(_holm_reference(p), rel=1e-12, abs=0)
    assert {i for i, q in enumerate(adjusted) if q <= alpha} == _holm_rejects(p, alpha)
    assert all(q >= v for q, v in zip(adjusted, p)) and max(adjusted) <= 1.0
    order = np.argsort(p, kind="stable")  # monotone: the adjusted values keep the raw order
    assert all(np.diff(np.asarray(adjusted)[order]) >= 0)


@settings(max_examples=40, deadline=None)
@given(p=_p_values)
def test_holm_is_statsmodels_multipletests(p: list[float]) -> None:
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    expected = multitest.multipletests(p, method="holm")[1]
    assert report.holm(p) == pytest.approx(list(expected), rel=1e-12)


@pytest.mark.skipif(
    not hasattr(scipy.stats, "false_discovery_control"), reason="scipy < 1.11 has no BH"
)
@settings(max_examples=100, deadline=None)
@given(p=_p_values, alpha=st.sampled_from([0.01, 0.05, 0.1, 0.25]))
def test_benjamini_hochberg_is_scipys_false_discovery_control(p: list[float], alpha: float) -> None:
    adjusted = report.benjamini_hochberg(p)
    expected = scipy.stats.false_discovery_control(p, method="bh")
    assert adjusted == pytest.approx(list(expected), rel=1e-12, abs=1e-15)
    assert {i for i, q in enumerate(adjusted) if q <= alpha} == _bh_rejects(p, alpha)
    holm_adjusted = report.holm(p)  # BH never asks for more than Holm
    assert all(q <= h * (1 + 1e-12) for q, h in zip(adjusted, holm_adjusted))


def test_corrections_known_values_nan_and_range() -> None:
    assert report.holm([0.01, 0.02, 0.03]) == pytest.approx([0.03, 0.04, 0.04])
    assert report.benjamini_hochberg([0.01, 0.02, 0.03]) == pytest.approx([0.03, 0.03, 0.03])
    adjusted = report.holm([0.01, math.nan, 0.02])  # an untestable cell is not in the family
    assert math.isnan(adjusted[1]) and adjusted[0] == pytest.approx(0.02)
    assert math.isnan(report.benjamini_hochberg([None, 0.5])[0])
    for correct in (report.holm, report.benjamini_hochberg):
        assert correct([]) == []
        with pytest.raises(ValueError, match="p_values"):
            correct([0.5, 1.5])


# ----------------------------------------------------------------------------- many-to-one


def test_many_to_one_is_paired_tests_then_holm() -> None:
    rng = np.random.default_rng(0)
    base = rng.normal(size=6)
    configs = {f"c{i}": list(base + rng.normal(0.3 * i, 1.0, 6)) for i in range(4)}
    out = report.many_to_one(configs, list(base))
    raw = [report.paired_difference(v, list(base))["p"] for v in configs.values()]
    assert [row["p"] for row in out.values()] == pytest.approx(raw)
    assert [row["p_adjusted"] for row in out.values()] == pytest.approx(report.holm(raw))
    for name, row in out.items():  # Bonferroni: the t interval at level 1 - 0.05 / 4
        diffs = np.subtract(configs[name], base)
        sem = scipy.stats.sem(diffs)
        assert row["ci_simultaneous"] == pytest.approx(scipy.stats.t.ppf(1 - 0.025 / 4, 5) * sem)
    with pytest.raises(ValueError, match="configs"):
        report.many_to_one({}, [1.0])
    with pytest.raises(ValueError, match="baseline"):
        report.many_to_one({"a": [1.0, 2.0]}, [1.0])


@pytest.mark.parametrize("effects", [(0.0, 0.0, 0.0, 0.0), (0.0, 0.0, 0.0, 3.0)])
def test_many_to_one_family_wise_error_on_null_data_is_at_most_alpha(
    effects: tuple[float, ...],
) -> None:
    """Five seeds, four configurations on one shared baseline (seed effects make the paired
    comparisons correlated, ~0.5): the share of studies with any false rejection, and of
    studies whose simultaneous intervals miss a true null, stay within alpha = 0.05 up to three
    Monte-Carlo standard errors (strong control: also with one real effect in the family)."""
    rng = np.random.default_rng(25)
    studies, n, alpha = 1500, 5, 0.05
    errors = misses = 0
    for _ in range(studies):
        seed_effect = rng.normal(size=n)
        base = seed_effect + rng.normal(size=n)
        configs = {
            f"c{i}": list(seed_effect + effect + rng.normal(size=n))
            for i, effect in enumerate(effects)
        }
        out = report.many_to_one(configs, list(base), level=1 - alpha)
        nulls = [row for row, effect in zip(out.values(), effects) if effect == 0]
        errors += any(row["p_adjusted"] <= alpha for row in nulls)
        misses += any(abs(row["mean"]) > row["ci_simultaneous"] for row in nulls)
    bound = alpha + 3 * math.sqrt(alpha * (1 - alpha) / studies)
    assert errors / studies <= bound
    assert misses / studies <= bound


# ----------------------------------------------------------------------------- effect size


@settings(max_examples=40, deadline=None)
@given(values=_samples(min_size=3), level=st.sampled_from([0.9, 0.95]))
def test_effect_size_inverts_scipys_noncentral_t(values: list[float], level: float) -> None:
    n = len(values)
    t_obs = float(scipy.stats.ttest_1samp(values, 0.0).statistic)
    if abs(t_obs) > 30:
        return  # the noncentral t's tails are not accurate enough to check there
    result = report.effect_size(values, level)
    assert result["d"] == pytest.approx(t_obs / math.sqrt(n), rel=1e-9, abs=1e-12)
    assert result["low"] < result["d"] < result["high"]
    cdf = scipy.stats.nct.cdf
    assert cdf(t_obs, n - 1, result["low"] * math.sqrt(n)) == pytest.approx((1 + level) / 2)
    assert cdf(t_obs, n - 1, result["high"] * math.sqrt(n)) == pytest.approx((1 - level) / 2)


def test_effect_size_interval_covers_on_simulated_seeds() -> None:
    rng = np.random.default_rng(7)
    studies, delta = 400, 0.8
    covered = 0
    for _ in range(studies):
        result = report.effect_size(list(rng.normal(delta, 1.0, 5)))
        covered += result["low"] <= delta <= result["high"]
    assert abs(covered / studies - 0.95) <= 3 * math.sqrt(0.95 * 0.05 / studies)


def test_effect_size_edge_cases() -> None:
    assert math.isnan(report.effect_size([1.0])["d"])
    constant = report.effect_size([1.0, 1.0, 1.0])
    assert constant["d"] == math.inf and math.isnan(constant["low"])
    with pytest.raises(ValueError, match="level"):
        report.effect_size([1.0, 2.0], level=95)


# ----------------------------------------------------------------------------- TOST and power


@settings(max_examples=60, deadline=None)
@given(values=_samples(), margin=st.floats(0.01, 200), alpha=st.sampled_from([0.05, 0.1]))
def test_tost_is_two_scipy_one_sided_t_tests(
    values: list[float], margin: float, alpha: float
) -> None:
    result = report.tost(values, margin, alpha)
    lower = scipy.stats.ttest_1samp(values, -margin, alternative="greater").pvalue
    upper = scipy.stats.ttest_1samp(values, margin, alternative="less").pvalue
    assert result["p_lower"] == pytest.approx(float(lower), rel=1e-7, abs=1e-12)
    assert result["p_upper"] == pytest.approx(float(upper), rel=1e-7, abs=1e-12)
    assert result["p"] == max(result["p_lower"], result["p_upper"])
    n = len(values)  # equivalent <=> the 1 - 2 alpha interval lies inside (-margin, margin)
    low, high = scipy.stats.t.interval(
        1 - 2 * alpha, n - 1, loc=np.mean(values), scale=scipy.stats.sem(values)
    )
    if min(abs(low + margin), abs(high - margin)) > 1e-9 * (1 + margin):
        assert result["equivalent"] == (-margin < low and high < margin)


def test_tost_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="margin"):
        report.tost([0.1, 0.2], 0.0)
    with pytest.raises(ValueError, match="differences"):
        report.tost([0.1], 1.0)
    with pytest.raises(ValueError, match="alpha"):
        report.tost([0.1, 0.2], 1.0, alpha=1.0)
    diverged = report.tost([0.1, None], 1.0)
    assert math.isnan(diverged["p"]) and not diverged["equivalent"]


def test_detectable_effect_known_cases() -> None:
    # G*Power, paired t, two-sided alpha 0.05: d_z = 0.5 needs n = 34 for power 0.80 (0.8078)
    assert report.detectable_effect(34) < 0.5 < report.detectable_effect(33)
    # issue 25: five seeds detect only effects of about 1.7 seed-SDs
    assert report.detectable_effect(5) == pytest.approx(1.682, abs=5e-4)
    sizes = [report.detectable_effect(n) for n in (3, 5, 8, 20)]
    assert sizes == sorted(sizes, reverse=True)
    assert report.detectable_effect(8, alpha=0.01) > report.detectable_effect(8, alpha=0.05)
    with pytest.raises(ValueError, match="n"):
        report.detectable_effect(1)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 60), alpha=st.sampled_from([0.01, 0.05, 0.1]), power=st.floats(0.5, 0.95))
def test_detectable_effect_has_the_power_by_scipys_nct(n: int, alpha: float, power: float) -> None:
    delta = report.detectable_effect(n, alpha, power)
    crit = scipy.stats.t.ppf(1 - alpha / 2, n - 1)
    nc = delta * math.sqrt(n)
    lower = scipy.stats.nct.cdf(-crit, n - 1, nc)  # NaN where it is below ~1e-15
    achieved = scipy.stats.nct.sf(crit, n - 1, nc) + (0.0 if math.isnan(lower) else lower)
    assert achieved == pytest.approx(power, abs=1e-8)


@settings(max_examples=40, deadline=None)
@given(values=_samples(), margin=st.one_of(st.none(), st.floats(0.01, 200)))
def test_equivalence_statement_only_when_tost_rejects(
    values: list[float], margin: float | None
) -> None:
    sentence = report.equivalence_statement(values, margin)
    bound = margin
    if bound is None:
        bound = report.detectable_effect(len(values)) * float(np.std(values, ddof=1))
    if sentence is None:
        assert not report.tost(values, bound)["equivalent"]
    else:
        assert report.tost(values, bound)["equivalent"]
        assert sentence == f"no effect larger than {bound:.3g}"


def test_equivalence_statement_on_a_flat_and_a_clear_effect() -> None:
    flat = [0.001, -0.002, 0.0015, -0.0005, 0.0, 0.001, -0.001, 0.0005]
    sentence = report.equivalence_statement(flat)  # 8 seeds: powered for 1.2 seed-SDs, mean ~0
    assert sentence is not None and sentence.startswith("no effect larger than ")
    assert report.equivalence_statement([0.3, 0.5, 0.1, 0.4, 0.2]) is None  # d_z = 1.9
    assert report.equivalence_statement([0.0, 0.0, 0.0]) is None  # no spread: no bound to state


@pytest.mark.parametrize("n", [5, 8])
def test_equivalence_statement_is_rare_when_the_effect_is_the_detectable_one(n: int) -> None:
    """The default bound is the detectable effect times the sample SD; with the true effect
    exactly at that size (in SDs), "no effect larger than X" is said in at most alpha of
    simulated studies (0.027 for 5 seeds, 0.034 for 8 by the noncentral t)."""
    rng = np.random.default_rng(n)
    studies, alpha = 800, 0.05
    delta = report.detectable_effect(n)
    said = sum(
        report.equivalence_statement(list(rng.normal(delta, 1.0, n))) is not None
        for _ in range(studies)
    )
    assert said / studies <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / studies)


@pytest.mark.parametrize("nc", [1e4, 3e4, -1e4])
@pytest.mark.parametrize("ratio", [1.0001, 0.5, 2.0, -1.0])
def test_the_noncentral_t_beyond_1e4_is_its_limit_and_agrees_with_scipy(
    nc: float, ratio: float
) -> None:
    from heatformer.lab.report.inference import _nct_cdf

    expected = float(scipy.stats.nct.cdf(nc * ratio, 3, nc))
    if math.isnan(expected):  # scipy's far tail: T has the sign of nc
        expected = float(nc < 0)
    assert _nct_cdf(nc * ratio, 3, nc) == pytest.approx(expected, rel=1e-6, abs=1e-12)


def test_the_effect_of_differences_that_hardly_vary_is_finite_not_a_crash() -> None:
    # t ~ 1e9: scipy 1.10's nct aborts the process from nc ~ 1e5 (boost rounding_error)
    d = [0.5 + 1e-10 * v for v in (1.0, -1.0, 2.0, 0.0, -2.0)]
    r = report.effect_size(d)
    assert math.isfinite(r["low"]) and r["low"] < r["d"] < r["high"]
    assert r["d"] == pytest.approx(np.mean(d) / np.std(d, ddof=1))
