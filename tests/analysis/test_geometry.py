"""Tests for the token-geometry metrics of heatformer.analysis on geometries with known answers."""

from __future__ import annotations

import itertools
import math

import networkx as nx
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from device_helpers import DEVICES
from heatformer.analysis import (
    dirichlet_energy,
    neural_collapse,
    next_token_separability,
    singular_spectrum,
    spectral_decay,
    variance_decomposition,
    within_sequence_variance,
)
from heatformer.graph_ops import DenseGraph, SoftmaxGraph, laplacian_matrix


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _random_mask(b: int, n: int, seed: int) -> torch.Tensor:
    mask = torch.rand(b, n, generator=_gen(seed)) < 0.7
    mask[:, 0] = True  # every sequence keeps at least one token
    return mask


def _simplex_etf(num_classes: int, dim: int, seed: int = 0) -> torch.Tensor:
    """``(C, D)`` rows = vertices of a simplex ETF (unit norm, cosines -1/(C-1)), rotated."""
    eye = torch.eye(num_classes, dtype=torch.float64)
    vertices = (eye - 1.0 / num_classes) * math.sqrt(num_classes / (num_classes - 1))  # (C, C)
    q, _ = torch.linalg.qr(torch.randn(dim, num_classes, generator=_gen(seed), dtype=torch.float64))
    return vertices @ q.T  # (C, D), an isometric embedding into D dims


# ----------------------------------------------------------------- NumPy oracles


def _np_within_sequence(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    out = np.zeros(x.shape[0])
    for b in range(x.shape[0]):
        tokens = x[b][mask[b]]
        if len(tokens):
            out[b] = ((tokens - tokens.mean(0)) ** 2).sum(1).mean()
    return out


def _np_decomposition(x: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> list[float]:
    tokens = [x[b][mask[b]] for b in range(x.shape[0])]
    everything = np.concatenate(tokens)
    g = everything.mean(0)
    total = ((everything - g) ** 2).sum(1).mean()
    within_seq = sum(((t - t.mean(0)) ** 2).sum() for t in tokens if len(t)) / len(everything)
    within_class = between = 0.0
    for c in np.unique(labels):
        members = np.concatenate([tokens[b] for b in range(len(tokens)) if labels[b] == c])
        if not len(members):
            continue
        class_mean = members.mean(0)
        between += len(members) * ((class_mean - g) ** 2).sum()
        for b in range(len(tokens)):
            if labels[b] == c and len(tokens[b]):
                within_class += len(tokens[b]) * ((tokens[b].mean(0) - class_mean) ** 2).sum()
    n = len(everything)
    return [total, within_seq, within_class / n, between / n]


# ----------------------------------------------------------------- within-sequence variance


@pytest.mark.parametrize("device", DEVICES)
def test_within_sequence_variance_is_zero_for_identical_tokens(device: torch.device) -> None:
    v = torch.randn(3, 1, 5, generator=_gen(0))
    x = v.expand(3, 7, 5).to(device)
    assert within_sequence_variance(x).item() == pytest.approx(0.0, abs=1e-12)
    per_seq = within_sequence_variance(x, reduction="none")
    assert per_seq.shape == (3,)
    assert per_seq.device.type == device.type
    assert per_seq.dtype == torch.float64


@pytest.mark.parametrize("device", DEVICES)
def test_within_sequence_variance_matches_numpy_with_mask(device: torch.device) -> None:
    x = torch.randn(4, 9, 3, generator=_gen(1), dtype=torch.float64)
    mask = _random_mask(4, 9, seed=2)
    mask[3] = False  # a fully masked sequence: 0 per sequence, left out of the mean
    expected = _np_within_sequence(x.numpy(), mask.numpy())
    x, mask = x.to(device), mask.to(device)
    per_seq = within_sequence_variance(x, mask, reduction="none")
    assert per_seq.device.type == device.type
    np.testing.assert_allclose(per_seq.cpu().numpy(), expected, rtol=1e-12)
    assert per_seq[3].item() == 0.0
    mean = within_sequence_variance(x, mask)
    assert mean.item() == pytest.approx(expected[:3].mean(), rel=1e-12)


def test_within_sequence_variance_ignores_garbage_in_masked_tokens() -> None:
    x = torch.randn(2, 5, 3, generator=_gen(3))
    mask = torch.tensor([[True, True, True, False, False], [True, True, False, False, False]])
    dirty = x.clone()
    dirty[~mask] = float("nan")
    assert torch.equal(within_sequence_variance(dirty, mask), within_sequence_variance(x, mask))


def test_within_sequence_variance_batched_leading_dims() -> None:
    x = torch.randn(2, 3, 6, 4, generator=_gen(4))
    per_seq = within_sequence_variance(x, reduction="none")
    assert per_seq.shape == (2, 3)
    expected = ((x.double() - x.double().mean(-2, keepdim=True)) ** 2).sum(-1).mean(-1)
    torch.testing.assert_close(per_seq, expected)


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 4),
    n=st.integers(1, 8),
    d=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_within_sequence_variance_is_invariant_to_token_permutations(
    b: int, n: int, d: int, seed: int
) -> None:
    x = torch.randn(b, n, d, generator=_gen(seed), dtype=torch.float64)
    mask = _random_mask(b, n, seed + 1)
    perm = torch.randperm(n, generator=_gen(seed + 2))
    before = within_sequence_variance(x, mask, reduction="none")
    after = within_sequence_variance(x[:, perm], mask[:, perm], reduction="none")
    torch.testing.assert_close(before, after, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------- variance decomposition


@pytest.mark.parametrize("device", DEVICES)
def test_variance_decomposition_matches_numpy_with_mask(device: torch.device) -> None:
    x = torch.randn(10, 8, 4, generator=_gen(5), dtype=torch.float64) * 3 + 1
    labels = torch.tensor([3, -1, 3, 7, 7, 7, -1, 3, 7, -1])
    mask = _random_mask(10, 8, seed=6)
    mask[4] = False  # a fully masked sequence contributes nothing
    expected = _np_decomposition(x.numpy(), labels.numpy(), mask.numpy())
    parts = variance_decomposition(x.to(device), labels.to(device), mask.to(device))
    assert parts.total.device.type == device.type
    np.testing.assert_allclose([p.item() for p in parts], expected, rtol=1e-12)
    total = parts.within_sequence + parts.within_class + parts.between_class
    assert total.item() == pytest.approx(parts.total.item(), rel=1e-13)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_between_sequence_is_the_variance_of_the_sequence_means(dtype: torch.dtype) -> None:
    # within + between sequences = total, against a float64 NumPy reference with padding
    # masks; float16 tokens up to 6e4 (near its largest value: their squares overflow it) too
    scale = 3.0 if dtype == torch.float32 else 1e4
    x = (torch.randn(7, 9, 5, generator=_gen(11)) * scale + scale).clamp(max=6e4).to(dtype)
    mask = _random_mask(7, 9, seed=12)
    mask[2] = False  # a fully masked sequence: no mean, no weight
    x[~mask] = torch.nan  # padded tokens are ignored whatever they hold
    parts = variance_decomposition(x, torch.zeros(7, dtype=torch.long), mask)
    xs, ms = x.double().numpy(), mask.numpy()
    tokens = [xs[b][ms[b]] for b in range(7)]
    g = np.concatenate(tokens).mean(0)
    count = sum(len(t) for t in tokens)
    between = sum(len(t) * ((t.mean(0) - g) ** 2).sum() for t in tokens if len(t)) / count
    within = sum(((t - t.mean(0)) ** 2).sum() for t in tokens if len(t)) / count
    total = ((np.concatenate(tokens) - g) ** 2).sum(1).mean()
    assert parts.between_sequence.dtype == torch.float64
    assert math.isfinite(parts.between_sequence.item())
    assert parts.between_sequence.item() == pytest.approx(between, rel=1e-10)
    assert parts.within_sequence.item() == pytest.approx(within, rel=1e-10)
    assert (parts.within_sequence + parts.between_sequence).item() == pytest.approx(
        total, rel=1e-10
    )
    assert len(parts) == 4  # a property: the tuple keeps its four fields


@settings(max_examples=40, deadline=None)
@given(
    b=st.integers(1, 6),
    n=st.integers(1, 6),
    d=st.integers(1, 3),
    num_classes=st.integers(1, 4),
    scale=st.floats(1e-3, 1e3),
    seed=st.integers(0, 2**16),
)
def test_variance_decomposition_parts_add_up(
    b: int, n: int, d: int, num_classes: int, scale: float, seed: int
) -> None:
    x = torch.randn(b, n, d, generator=_gen(seed), dtype=torch.float64) * scale + scale
    labels = torch.randint(num_classes, (b,), generator=_gen(seed + 1))
    mask = _random_mask(b, n, seed + 2)
    parts = variance_decomposition(x, labels, mask)
    assert all(p.item() >= 0 for p in parts)
    total = parts.within_sequence + parts.within_class + parts.between_class
    assert total.item() == pytest.approx(parts.total.item(), rel=1e-10, abs=1e-12 * scale**2)


def test_variance_decomposition_within_sequence_agrees_without_mask() -> None:
    x = torch.randn(5, 6, 3, generator=_gen(7))
    labels = torch.tensor([0, 1, 0, 1, 1])
    parts = variance_decomposition(x, labels)
    assert parts.within_sequence.item() == pytest.approx(
        within_sequence_variance(x).item(), rel=1e-12
    )


def test_variance_decomposition_collapsed_geometry() -> None:
    # Every token equals its class's vertex: all variance is between classes.
    etf = _simplex_etf(3, 4)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    x = etf[labels].unsqueeze(1).expand(6, 5, 4)
    parts = variance_decomposition(x, labels)
    assert parts.within_sequence.item() == pytest.approx(0.0, abs=1e-14)
    assert parts.within_class.item() == pytest.approx(0.0, abs=1e-14)
    assert parts.between_class.item() == pytest.approx(parts.total.item(), rel=1e-12)
    assert parts.total.item() == pytest.approx(1.0, rel=1e-12)  # unit-norm, centred vertices


# ----------------------------------------------------------------- neural collapse


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("num_classes", "dim"), [(2, 2), (3, 5), (10, 16)])
def test_neural_collapse_is_zero_on_a_perfect_simplex_etf(
    device: torch.device, num_classes: int, dim: int
) -> None:
    etf = _simplex_etf(num_classes, dim) * 4.0 + 2.5  # scaled and shifted
    labels = torch.arange(num_classes).repeat_interleave(7)
    stats = neural_collapse(etf[labels].to(device), labels.to(device))
    assert stats.nc1.item() == pytest.approx(0.0, abs=1e-8)
    assert stats.etf_distance.item() == pytest.approx(0.0, abs=1e-8)
    assert stats.equinorm.item() == pytest.approx(0.0, abs=1e-8)
    assert stats.equiangularity.item() == pytest.approx(0.0, abs=1e-8)
    assert stats.max_angle.item() == pytest.approx(0.0, abs=1e-8)
    assert stats.nc1.device.type == device.type


def test_neural_collapse_nc1_grows_with_within_class_noise() -> None:
    etf = _simplex_etf(5, 12)
    labels = torch.arange(5).repeat(40)
    noise = torch.randn(200, 12, generator=_gen(8), dtype=torch.float64)
    values = [
        neural_collapse(etf[labels] + level * noise, labels).nc1.item()
        for level in (0.0, 0.01, 0.1, 0.5, 1.0)
    ]
    assert values[0] == pytest.approx(0.0, abs=1e-8)
    assert all(a < b for a, b in itertools.pairwise(values))


def test_neural_collapse_nc1_matches_pinv_formula() -> None:
    # Imbalanced classes; Σ_B is centred at the unweighted mean of class means.
    features = torch.randn(50, 6, generator=_gen(9), dtype=torch.float64)
    labels = torch.randint(4, (50,), generator=_gen(10))
    h, y = features.numpy(), labels.numpy()
    classes = np.unique(y)
    means = np.stack([h[y == c].mean(0) for c in classes])  # (C, D)
    centred = means - means.mean(0)
    resid = h - means[np.searchsorted(classes, y)]
    sigma_w = resid.T @ resid / len(h)
    sigma_b = centred.T @ centred / len(classes)
    expected = np.trace(sigma_w @ np.linalg.pinv(sigma_b)) / len(classes)
    assert neural_collapse(features, labels).nc1.item() == pytest.approx(expected, rel=1e-9)


def test_neural_collapse_equinorm_and_angles() -> None:
    # Scaled standard basis: once centred, equal norms and cosines -1/3, i.e. an ETF.
    means = torch.eye(4, dtype=torch.float64) * 3.0
    stats = neural_collapse(means, torch.arange(4))
    assert stats.equinorm.item() == pytest.approx(0.0, abs=1e-12)
    assert stats.etf_distance.item() == pytest.approx(0.0, abs=1e-12)

    square = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]], dtype=torch.float64)
    stats = neural_collapse(square * 2.0, torch.arange(4))
    assert stats.equinorm.item() == pytest.approx(0.0, abs=1e-12)
    # cosines: four at 0, two at -1 (both ways) -> not equiangular, not an ETF.
    cos = np.array([0, -1, 0, 0, 0, -1, -1, 0, 0, 0, -1, 0], dtype=float)
    assert stats.equiangularity.item() == pytest.approx(cos.std(), rel=1e-12)
    assert stats.max_angle.item() == pytest.approx(np.abs(cos + 1 / 3).mean(), rel=1e-12)
    # G: 1 on the diagonal, -1 for opposite corners; E: 1 and -1/3. <G, E> = 16/3,
    # |G| = sqrt(8), |E| = sqrt(16/3), so the distance is sqrt(2 - 2 sqrt(2/3)).
    assert stats.etf_distance.item() == pytest.approx(
        math.sqrt(2 - 2 * math.sqrt(2 / 3)), rel=1e-12
    )

    unequal = square * torch.tensor([[1.0], [2.0], [1.0], [2.0]], dtype=torch.float64)
    stats = neural_collapse(unequal, torch.arange(4))
    norms = np.array([1.0, 2.0, 1.0, 2.0])
    assert stats.equinorm.item() == pytest.approx(norms.std() / norms.mean(), rel=1e-12)


def _np_nc2(h: np.ndarray, y: np.ndarray) -> list[float]:
    """equinorm, equiangularity, max_angle, etf_distance straight from the definitions."""
    classes = np.unique(y)
    c = len(classes)
    means = np.stack([h[y == k].mean(0) for k in classes])
    centred = means - means.mean(0)
    norms = np.sqrt((centred**2).sum(1))
    cos = np.array(
        [[centred[i] @ centred[j] / (norms[i] * norms[j]) for j in range(c)] for i in range(c)]
    )
    off = np.array([cos[i, j] for i in range(c) for j in range(c) if i != j])
    etf = c / (c - 1) * (np.eye(c) - np.ones((c, c)) / c)
    distance = np.sqrt(((cos / np.sqrt((cos**2).sum()) - etf / np.sqrt((etf**2).sum())) ** 2).sum())
    return [
        norms.std() / norms.mean(),
        off.std(),
        np.abs(off + 1 / (c - 1)).mean(),
        distance,
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("num_classes", "dim"), [(3, 2), (5, 8), (7, 4)])
def test_neural_collapse_nc2_statistics_match_numpy(
    num_classes: int, dim: int, device: torch.device
) -> None:
    # Imbalanced classes with random, unequal means: every statistic is well away from 0.
    labels = torch.randint(num_classes, (80,), generator=_gen(40 + dim))
    labels[:num_classes] = torch.arange(num_classes)  # every class present
    centres = torch.randn(num_classes, dim, generator=_gen(41), dtype=torch.float64) * 3
    features = centres[labels] + torch.randn(80, dim, generator=_gen(42), dtype=torch.float64)
    stats = neural_collapse(features.to(device), labels.to(device))
    expected = _np_nc2(features.numpy(), labels.numpy())
    got = [stats.equinorm, stats.equiangularity, stats.max_angle, stats.etf_distance]
    assert stats.equinorm.device.type == device.type
    np.testing.assert_allclose([v.item() for v in got], expected, rtol=1e-10)
    assert min(expected) > 1e-3  # a non-trivial case


def test_neural_collapse_with_coinciding_class_means_is_inf() -> None:
    features = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [-1.0, 0.0]])
    stats = neural_collapse(features, torch.tensor([0, 0, 1, 1]))
    assert math.isinf(stats.nc1.item())


def test_neural_collapse_bad_inputs() -> None:
    features = torch.randn(6, 3)
    with pytest.raises(ValueError, match="labels: expected at least 2 distinct classes"):
        neural_collapse(features, torch.zeros(6, dtype=torch.long))
    with pytest.raises(TypeError, match="labels"):
        neural_collapse(features, torch.zeros(6))
    with pytest.raises(ValueError, match="labels: expected shape"):
        neural_collapse(features, torch.zeros(5, dtype=torch.long))
    with pytest.raises(TypeError, match="features"):
        neural_collapse(features.long(), torch.arange(6))
    with pytest.raises(ValueError, match="features: expected shape"):
        neural_collapse(features.unsqueeze(0), torch.arange(6))


# ----------------------------------------------------------------- next-token separability


@pytest.mark.parametrize("dim", [8, 64])  # 30 training tokens: primal and dual ridge
def test_next_token_separability_on_separated_clusters(dim: int) -> None:
    centres = _simplex_etf(4, dim) * 10.0
    next_tokens = torch.randint(4, (6, 10), generator=_gen(11)) + 100  # ids need not be 0..K-1
    noise = torch.randn(6, 10, dim, generator=_gen(12), dtype=torch.float64)
    x = centres[next_tokens - 100] + 1e-6 * noise
    result = next_token_separability(x, next_tokens)
    assert result.nc1.item() < 1e-10
    assert result.probe_accuracy.item() == 1.0
    assert result.num_groups == 4
    assert result.num_tokens == 60


def test_next_token_separability_on_random_data_is_near_chance() -> None:
    x = torch.randn(40, 50, 16, generator=_gen(13))
    next_tokens = torch.randint(4, (40, 50), generator=_gen(14))
    result = next_token_separability(x, next_tokens)
    # chance is 0.25; 1000 test tokens give a standard deviation of about 0.014
    assert 0.2 < result.probe_accuracy.item() < 0.3
    assert result.nc1.item() > 10.0  # noise dominates the small spread of group means


def test_next_token_separability_skips_small_groups_masked_and_ignored_tokens() -> None:
    centres = torch.tensor([[0.0, 0.0], [5.0, 0.0], [0.0, 5.0]], dtype=torch.float64)
    next_tokens = torch.tensor([[0, 1, 0, 1, 2, -100], [0, 1, 0, 1, 3, 3]])
    x = centres[next_tokens.clamp(0, 2)]
    x[1, 5] = float("nan")  # masked garbage
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 5] = False
    result = next_token_separability(x, next_tokens, mask)
    # groups: 0 (4), 1 (4); token 2 and token 3 appear once each (after the mask), -100 skipped
    assert (result.num_groups, result.num_tokens) == (2, 8)
    assert result.probe_accuracy.item() == 1.0
    with pytest.raises(ValueError, match=r"next_tokens: expected at least 2 .* >= 5"):
        next_token_separability(x, next_tokens, mask, min_count=5)


def _np_separability(
    x: np.ndarray, tokens: np.ndarray, mask: np.ndarray, min_count: int, ridge: float
) -> tuple[float, float, int, int]:
    """The documented recipe, step by step, in NumPy."""
    keep = mask & (tokens >= 0)
    h, y = x[keep], tokens[keep]  # flattened (B, N) order
    groups, counts = np.unique(y, return_counts=True)
    big = set(groups[counts >= min_count].tolist())
    sel = np.array([v in big for v in y])
    h, y = h[sel], y[sel]
    groups = np.unique(y)
    # nc1 = tr(S_W S_B^+) / K
    means = np.stack([h[y == g].mean(0) for g in groups])
    centred = means - means.mean(0)
    resid = h - means[np.searchsorted(groups, y)]
    sigma_w = resid.T @ resid / len(h)
    sigma_b = centred.T @ centred / len(groups)
    nc1 = np.trace(sigma_w @ np.linalg.pinv(sigma_b)) / len(groups)
    # even-ranked members of each group train, odd-ranked test
    rank = np.zeros(len(y), dtype=int)
    for g in groups:
        rank[y == g] = np.arange((y == g).sum())
    train = rank % 2 == 0
    onehot = (y[:, None] == groups[None, :]).astype(float)
    xt, yt = h[train], onehot[train]
    xm, ym = xt.mean(0), yt.mean(0)
    xc = xt - xm
    lam = ridge * (xc**2).sum() / xc.shape[1]
    weight = np.linalg.solve(xc.T @ xc + lam * np.eye(xc.shape[1]), xc.T @ (yt - ym))
    scores = (h[~train] - xm) @ weight + ym
    accuracy = (scores.argmax(1) == onehot[~train].argmax(1)).mean()
    return nc1, accuracy, len(groups), len(y)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim", [6, 48])  # about 40 training tokens: primal and dual ridge
def test_next_token_separability_matches_numpy(dim: int, device: torch.device) -> None:
    next_tokens = torch.randint(5, (6, 16), generator=_gen(50))
    next_tokens[0, :3] = torch.tensor([-100, 9, -100])  # ignored ids and a singleton group
    centres = torch.randn(10, dim, generator=_gen(51), dtype=torch.float64)
    noise = torch.randn(6, 16, dim, generator=_gen(52), dtype=torch.float64)
    x = centres[next_tokens.clamp_min(0)] + 1.5 * noise  # overlapping groups
    mask = _random_mask(6, 16, seed=53)
    on = (t.to(device) for t in (x, next_tokens, mask))
    result = next_token_separability(*on, ridge=0.05)
    assert result.nc1.device.type == device.type
    nc1, accuracy, groups, tokens = _np_separability(
        x.numpy(), next_tokens.numpy(), mask.numpy(), 2, 0.05
    )
    assert (result.num_groups, result.num_tokens) == (groups, tokens) == (5, tokens)
    assert result.nc1.item() == pytest.approx(nc1, rel=1e-9)
    assert result.probe_accuracy.item() == pytest.approx(accuracy, abs=1e-12)
    assert 0.3 < accuracy < 1.0  # neither chance nor perfect: the oracle is discriminating


def test_next_token_separability_bad_inputs() -> None:
    x = torch.randn(2, 3, 4)
    tokens = torch.tensor([[0, 1, 0], [1, 0, 1]])
    with pytest.raises(TypeError, match="next_tokens"):
        next_token_separability(x, tokens.float())
    with pytest.raises(ValueError, match="next_tokens: expected shape"):
        next_token_separability(x, tokens[:, :2])
    with pytest.raises(ValueError, match="next_tokens: expected at least 2"):
        next_token_separability(x, torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="min_count"):
        next_token_separability(x, tokens, min_count=1)
    with pytest.raises(ValueError, match="ridge"):
        next_token_separability(x, tokens, ridge=0.0)
    with pytest.raises(TypeError, match="mask"):
        next_token_separability(x, tokens, torch.ones(2, 3))


# ----------------------------------------------------------------- spectra


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("center", [True, False])
def test_singular_spectrum_matches_numpy_svd(center: bool, device: torch.device) -> None:
    x = torch.randn(3, 7, 5, generator=_gen(15), dtype=torch.float64) + 2.0
    s = singular_spectrum(x.to(device), center=center)
    assert s.shape == (3, 5) and s.device.type == device.type
    s = s.cpu()
    xn = x.numpy()
    if center:
        xn = xn - xn.mean(-2, keepdims=True)
    np.testing.assert_allclose(s.numpy(), np.linalg.svd(xn, compute_uv=False), rtol=1e-10)
    assert bool((s[..., :-1] >= s[..., 1:]).all())


def test_singular_spectrum_with_mask_uses_only_real_tokens() -> None:
    x = torch.randn(2, 6, 3, generator=_gen(16), dtype=torch.float64)
    mask = torch.tensor([[True] * 4 + [False] * 2, [True] * 6])
    s = singular_spectrum(x, mask=mask)
    real = x[0, :4].numpy()
    expected = np.linalg.svd(real - real.mean(0), compute_uv=False)
    np.testing.assert_allclose(s[0].numpy(), expected, rtol=1e-10)


def test_effective_rank_of_isotropic_and_rank_one_matrices() -> None:
    isotropic = torch.randn(4000, 8, generator=_gen(17), dtype=torch.float64)
    assert spectral_decay(isotropic).effective_rank.item() == pytest.approx(8.0, rel=0.01)

    u = torch.randn(30, 1, generator=_gen(18), dtype=torch.float64)
    v = torch.randn(1, 6, generator=_gen(19), dtype=torch.float64)
    rank_one = spectral_decay(u @ v)
    assert rank_one.effective_rank.item() == pytest.approx(1.0, abs=1e-9)
    assert math.isinf(rank_one.decay_rate.item())

    zero = spectral_decay(torch.zeros(5, 3))
    assert zero.effective_rank.item() == 0.0


def _with_spectrum(s: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """``(n, len(s))`` matrix with singular values ``s`` (random orthogonal factors)."""
    d = s.numel()
    u, _ = torch.linalg.qr(torch.randn(n, d, generator=_gen(seed), dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(d, d, generator=_gen(seed + 1), dtype=torch.float64))
    return u @ torch.diag(s) @ v.T


def test_decay_rate_recovers_power_laws_and_orders_them() -> None:
    k = torch.arange(1, 17, dtype=torch.float64)
    slow = _with_spectrum(5.0 * k**-0.5, 40, seed=20)
    fast = _with_spectrum(5.0 * k**-2.0, 40, seed=22)
    result = spectral_decay(torch.stack([slow, fast]), center=False)
    torch.testing.assert_close(
        result.decay_rate, torch.tensor([0.5, 2.0], dtype=torch.float64), rtol=1e-8, atol=1e-8
    )
    assert result.effective_rank[0] > result.effective_rank[1]
    flat = spectral_decay(_with_spectrum(torch.ones(6, dtype=torch.float64), 10, 24), center=False)
    assert flat.decay_rate.item() == pytest.approx(0.0, abs=1e-10)
    assert flat.effective_rank.item() == pytest.approx(6.0, rel=1e-12)


def test_effective_rank_and_decay_rate_match_numpy_with_mask() -> None:
    x = torch.randn(3, 12, 5, generator=_gen(60), dtype=torch.float64)
    x = x * torch.tensor([4.0, 2.0, 1.0, 0.5, 0.1], dtype=torch.float64)  # anisotropic
    mask = _random_mask(3, 12, seed=61)
    mask[2, :3], mask[2, 3:] = True, False  # 3 real tokens: centred rank 2, the rest ~0
    result = spectral_decay(x, mask=mask)
    for b in range(3):
        tokens = x[b][mask[b]].numpy()
        s = np.linalg.svd(tokens - tokens.mean(0), compute_uv=False)
        p = s / s.sum()
        p = p[p > 0]
        assert result.effective_rank[b].item() == pytest.approx(
            np.exp(-(p * np.log(p)).sum()), rel=1e-10
        )
        s = s[s > max(12, 5) * np.finfo(np.float64).eps * s[0]]
        slope = np.polyfit(np.log(np.arange(1, len(s) + 1)), np.log(s), 1)[0]
        assert result.decay_rate[b].item() == pytest.approx(-slope, rel=1e-9)
    assert result.effective_rank[2].item() < 2.0 + 1e-12  # rank two at most


def test_spectral_bad_inputs() -> None:
    with pytest.raises(ValueError, match="x: expected shape"):
        singular_spectrum(torch.randn(5))
    with pytest.raises(TypeError, match="x"):
        spectral_decay(torch.ones(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="rtol"):
        spectral_decay(torch.randn(3, 3), rtol=-1.0)
    with pytest.raises(ValueError, match="mask: expected shape"):
        singular_spectrum(torch.randn(2, 3, 3), mask=torch.ones(2, 4, dtype=torch.bool))


# ----------------------------------------------------------------- Dirichlet energy


def _random_weighted_graph(n: int, seed: int) -> nx.Graph:
    """Undirected graph with random positive weights and a few self-loops."""
    graph = nx.gnp_random_graph(n, 0.5, seed=seed)
    rng = np.random.default_rng(seed)
    for u, v in graph.edges:
        graph.edges[u, v]["weight"] = rng.uniform(0.1, 2.0)
    for u in (0, n // 2):
        graph.add_edge(u, u, weight=rng.uniform(0.1, 2.0))
    return graph


@pytest.mark.parametrize("device", DEVICES)
def test_dirichlet_energy_of_the_kernel_is_zero(device: torch.device) -> None:
    w = torch.rand(2, 3, 6, 6, generator=_gen(30), dtype=torch.float64).to(device)  # directed
    graph = DenseGraph(w)
    ones = torch.ones(2, 3, 6, 2, dtype=torch.float64, device=device) * torch.tensor(
        [1.5, -2.0], dtype=torch.float64, device=device
    )
    for normalization in ("rw", "combinatorial"):
        energy = dirichlet_energy(graph, ones, normalization)
        assert energy.shape == (2, 3)
        assert energy.device.type == device.type
        torch.testing.assert_close(energy, torch.zeros_like(energy), atol=1e-12, rtol=0)
    # For "sym" the constant is not in the kernel, D^{1/2} 1 is (D: degrees of W_s).
    degree = (0.5 * (w + w.transpose(-1, -2))).sum(-1)  # (2, 3, 6)
    assert dirichlet_energy(graph, ones, "sym").abs().min() > 1e-3
    kernel = degree.sqrt().unsqueeze(-1)  # (2, 3, 6, 1)
    energy = dirichlet_energy(graph, kernel, "sym")
    torch.testing.assert_close(energy, torch.zeros_like(energy), atol=1e-12, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dirichlet_energy_matches_networkx_laplacians(seed: int, device: torch.device) -> None:
    graph = _random_weighted_graph(9, seed)
    dense = DenseGraph(DenseGraph.from_networkx(graph, dtype=torch.float64).weight.to(device))
    x = torch.randn(9, 3, generator=_gen(seed), dtype=torch.float64)
    lap = nx.laplacian_matrix(graph).toarray()
    sym = nx.normalized_laplacian_matrix(graph).toarray()
    degree = lap.diagonal() + nx.to_numpy_array(graph).diagonal()  # row sums of W
    rw = lap / degree[:, None]
    for normalization, matrix in (("combinatorial", lap), ("sym", sym), ("rw", rw)):
        expected = np.trace(x.numpy().T @ matrix @ x.numpy())
        energy = dirichlet_energy(dense, x.to(device), normalization)
        assert energy.item() == pytest.approx(expected, rel=1e-10), normalization


def test_combinatorial_dirichlet_energy_is_half_the_weighted_squared_differences() -> None:
    w = torch.rand(7, 7, generator=_gen(31), dtype=torch.float64)
    w = w + w.T
    x = torch.randn(7, 2, generator=_gen(32), dtype=torch.float64, requires_grad=True)
    energy = dirichlet_energy(DenseGraph(w), x, "combinatorial")
    diffs = ((x.unsqueeze(1) - x.unsqueeze(0)) ** 2).sum(-1)  # (7, 7)
    assert energy.item() == pytest.approx(0.5 * (w * diffs).sum().item(), rel=1e-12)
    (grad,) = torch.autograd.grad(energy, x)  # differentiable: d tr(x^T L x)/dx = 2 L x
    lap = torch.diag(w.sum(-1)) - w
    torch.testing.assert_close(grad, 2 * lap @ x.detach())


def test_dirichlet_energy_on_a_softmax_graph_equals_the_dense_attention_graph() -> None:
    q = torch.randn(2, 5, 4, generator=_gen(33), dtype=torch.float64)
    k = torch.randn(2, 5, 4, generator=_gen(34), dtype=torch.float64)
    x = torch.randn(2, 5, 3, generator=_gen(35), dtype=torch.float64)
    p = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1)  # scale 1/sqrt(4)
    for normalization in ("rw", "sym", "combinatorial"):
        torch.testing.assert_close(
            dirichlet_energy(SoftmaxGraph(q, k), x, normalization),
            dirichlet_energy(DenseGraph(p), x, normalization),
        )
    lap = laplacian_matrix(DenseGraph(p), "rw")  # I - P
    expected = torch.einsum("bnc,bnm,bmc->b", x, lap, x)
    torch.testing.assert_close(dirichlet_energy(SoftmaxGraph(q, k), x), expected)


def test_dirichlet_energy_bad_inputs() -> None:
    graph = DenseGraph(torch.rand(4, 4))
    with pytest.raises(TypeError, match="x"):
        dirichlet_energy(graph, torch.ones(4, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="x"):
        dirichlet_energy(graph, torch.ones(5, 1))
    with pytest.raises(ValueError, match="x: expected shape"):
        dirichlet_energy(graph, torch.ones(4))
    with pytest.raises(ValueError, match="normalization"):
        dirichlet_energy(graph, torch.ones(4, 1), "random-walk")
    with pytest.raises(TypeError, match="graph"):
        dirichlet_energy(torch.rand(4, 4), torch.ones(4, 1))


# ----------------------------------------------------------------- shared input checks


def test_within_sequence_and_decomposition_bad_inputs() -> None:
    x = torch.randn(2, 3, 4)
    with pytest.raises(TypeError, match=r"x: expected a torch\.Tensor"):
        within_sequence_variance(np.zeros((2, 3, 4)))
    with pytest.raises(TypeError, match="x: expected a floating-point tensor"):
        within_sequence_variance(x.long())
    with pytest.raises(ValueError, match="x: expected shape"):
        within_sequence_variance(torch.randn(4))
    with pytest.raises(TypeError, match=r"mask: expected dtype torch\.bool"):
        within_sequence_variance(x, torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"mask: expected shape \(2, 3\)"):
        within_sequence_variance(x, torch.ones(3, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="reduction"):
        within_sequence_variance(x, reduction="sum")
    with pytest.raises(ValueError, match="mask: expected at least one real token"):
        within_sequence_variance(x, torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="x: expected at least one token"):
        within_sequence_variance(torch.randn(2, 0, 4))
    with pytest.raises(ValueError, match="x: expected at least one token"):
        variance_decomposition(torch.randn(2, 0, 4), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"labels: expected shape \(2,\)"):
        variance_decomposition(x, torch.tensor([0, 1, 2]))
    with pytest.raises(TypeError, match="labels"):
        variance_decomposition(x, torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"x: expected shape \(B, N, D\)"):
        variance_decomposition(x[0], torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="mask: expected at least one real token"):
        variance_decomposition(x, torch.tensor([0, 1]), torch.zeros(2, 3, dtype=torch.bool))


_X = torch.randn(2, 3, 4, generator=_gen(0))
_PATH = DenseGraph(torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]))


@pytest.mark.parametrize(
    ("call", "argument", "kind"),
    [
        (lambda: within_sequence_variance(_X.long()), "x", TypeError),
        (lambda: within_sequence_variance(_X, torch.ones(2, 3)), "mask", TypeError),
        (lambda: within_sequence_variance(_X, reduction="sum"), "reduction", ValueError),
        (lambda: variance_decomposition(_X, torch.tensor([0, 1, 2])), "labels", ValueError),
        (lambda: neural_collapse(_X[0], torch.zeros(3, dtype=torch.long)), "labels", ValueError),
        (lambda: next_token_separability(_X, torch.zeros(2, 3), min_count=2), "next_tokens",
         TypeError),
        (lambda: next_token_separability(_X, torch.zeros(2, 3, dtype=torch.long), ridge=0.0),
         "ridge", ValueError),
        (lambda: spectral_decay(_X, rtol=-1.0), "rtol", ValueError),
        (lambda: dirichlet_energy(_PATH, torch.ones(4, 1)), "x", ValueError),
        (lambda: dirichlet_energy(torch.eye(3), torch.ones(3, 1)), "graph", TypeError),
    ],
)  # fmt: skip
def test_errors_carry_the_argument_name(call, argument: str, kind: type) -> None:
    from heatformer.checks import ArgumentError

    with pytest.raises(kind) as info:
        call()
    assert isinstance(info.value, ArgumentError)
    assert info.value.argument == argument
    assert str(info.value).startswith(f"{argument}: expected ")
