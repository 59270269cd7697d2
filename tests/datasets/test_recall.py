"""``mqar`` and ``induction``: oracle solvers score 100 %, the stated layout and vocabulary hold,
and MQAR's query gaps follow the same law as Zoology's own draw (numpy's ``choice``)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from heatformer.datasets import induction, mqar


def _mqar_oracle(inputs: torch.Tensor, num_kv_pairs: int, num_passes: int = 1) -> torch.Tensor:
    """Labels predicted from a dictionary of the context's key-value pairs: after the context,
    the value of every token that is a key (-100 elsewhere)."""
    out = torch.full_like(inputs, -100)
    context = 2 * num_kv_pairs * num_passes
    for b, row in enumerate(inputs.tolist()):
        pairs = dict(zip(row[0:context:2], row[1:context:2]))
        for i in range(context, len(row)):
            out[b, i] = pairs.get(row[i], -100)
    return out


@pytest.mark.parametrize("num_passes", [1, 2])
def test_mqar_layout_and_oracle(num_passes: int) -> None:
    V, K, L = 128, 6, 64
    inputs, labels = mqar(V, 200, L, seed=3, num_kv_pairs=K, num_passes=num_passes,
                          random_non_queries=False)  # fmt: skip
    assert inputs.shape == labels.shape == (200, L)
    assert inputs.dtype == labels.dtype == torch.int64
    context = 2 * K * num_passes
    keys, values = inputs[:, 0 : 2 * K : 2], inputs[:, 1 : 2 * K : 2]
    # vocabulary halves, each key and each value once per pass
    assert ((keys >= 1) & (keys < V // 2)).all() and ((values >= V // 2) & (values < V)).all()
    assert all(len(set(r)) == K for r in keys.tolist())
    assert all(len(set(r)) == K for r in values.tolist())
    assert torch.equal(inputs[:, :context], inputs[:, : 2 * K].repeat(1, num_passes))
    # after the context: each key exactly once, at an even offset, zeros elsewhere
    rest = inputs[:, context:]
    scored = labels != -100
    assert not scored[:, :context].any() and (scored.sum(dim=1) == K).all()
    assert torch.equal(rest != 0, scored[:, context:])
    offsets = scored[:, context:].nonzero()[:, 1]
    assert (offsets % 2 == 0).all()
    assert torch.equal(rest[rest != 0].reshape(200, K).sort(1).values, keys.sort(1).values)
    # the oracle reads the context and answers every query
    assert torch.equal(_mqar_oracle(inputs, K, num_passes)[scored], labels[scored])
    solved = {k: v for k, v in zip(keys[0].tolist(), values[0].tolist())}
    assert [solved[k] for k in inputs[0][scored[0]].tolist()] == labels[0][scored[0]].tolist()


def test_mqar_random_non_queries_fills_every_other_position() -> None:
    V, K, L = 100, 4, 32
    clean, labels = mqar(V, 300, L, seed=5, num_kv_pairs=K, random_non_queries=False)
    noisy, noisy_labels = mqar(V, 300, L, seed=5, num_kv_pairs=K)
    assert torch.equal(labels, noisy_labels)
    kept = clean != 0
    assert torch.equal(noisy[kept], clean[kept])  # same keys, values and queries
    filler = noisy[~kept]
    assert filler.min() >= 0 and filler.max() < V
    assert len(set(filler.tolist())) > 0.9 * V  # uniform over the whole vocabulary
    scored = labels != -100
    assert torch.equal(_mqar_oracle(noisy, K)[scored], labels[scored])


def test_mqar_fills_the_tightest_fit() -> None:
    """2K(P+1) == L: the K queries take every even slot after the context."""
    inputs, labels = mqar(64, 50, 32, seed=0, num_kv_pairs=4, num_passes=3,
                          random_non_queries=False)  # fmt: skip
    assert (inputs[:, 24::2] != 0).all() and (labels[:, 24::2] != -100).all()
    assert (inputs[:, 25::2] == 0).all()


def _gap_frequencies(gaps: np.ndarray, space: int) -> tuple[np.ndarray, np.ndarray]:
    """Per gap: how often it is drawn at all, and how often it is the first key's gap."""
    included = np.bincount(gaps.ravel(), minlength=space) / len(gaps)
    first = np.bincount(gaps[:, 0], minlength=space) / len(gaps)
    return included, first


@pytest.mark.parametrize("power_a", [0.01, 1.0])
def test_mqar_query_gaps_follow_zoologys_law(power_a: float) -> None:
    """Zoology draws the K gaps with ``np.random.choice(space, K, replace=False, p=p)``,
    ``p ∝ power_a * i ** (power_a - 1)``, and gives gap ``j`` to key ``j``: the same law
    here (inclusion and first-key frequencies within 4.5 standard errors)."""
    V, K, L, n = 128, 4, 64, 4000
    space = (L - 2 * K) // 2
    inputs, labels = mqar(V, n, L, seed=11, power_a=power_a, num_kv_pairs=K,
                          random_non_queries=False)  # fmt: skip
    positions = (labels != -100).nonzero()[:, 1].reshape(n, K)  # sorted per row
    keys = inputs[:, 0 : 2 * K : 2]
    # the gap of key j: where key j is asked
    asked = inputs.gather(1, positions)  # (n, K) keys in the order asked
    order = (asked[:, None, :] == keys[:, :, None]).float().argmax(dim=2)  # key j -> slot
    ours = ((positions.gather(1, order) - 2 * K) // 2).numpy()
    p = power_a * np.arange(1, space + 1) ** (power_a - 1)
    p = p / p.sum()
    rng = np.random.RandomState(0)  # Zoology's draw: numpy's legacy choice
    zoology = np.stack([rng.choice(space, K, replace=False, p=p) for _ in range(n)])
    for mine, theirs in zip(_gap_frequencies(ours, space), _gap_frequencies(zoology, space)):
        error = np.sqrt(2 * np.maximum(theirs * (1 - theirs), 1 / n) / n)
        assert (np.abs(mine - theirs) < 4.5 * error + 1e-9).all()
    if power_a == 0.01:  # a power law: short gaps far more likely than long ones
        first = _gap_frequencies(ours, space)[1]
        assert first[0] > 5 * first[space // 2]
        assert abs(first[0] - p[0]) < 0.03


def test_mqar_argument_errors_name_the_argument() -> None:
    good = dict(vocab_size=128, num_examples=2, input_seq_len=64, seed=0)
    cases = [
        (dict(input_seq_len=63), "input_seq_len", ValueError),
        (dict(vocab_size=64), "vocab_size", ValueError),
        (dict(num_kv_pairs=17), "num_kv_pairs", ValueError),
        (dict(num_kv_pairs=8, num_passes=4), "num_kv_pairs", ValueError),
        (dict(num_kv_pairs=0), "num_kv_pairs", ValueError),
        (dict(num_examples=0), "num_examples", ValueError),
        (dict(num_passes=0), "num_passes", ValueError),
        (dict(power_a=0.0), "power_a", ValueError),
        (dict(power_a=float("nan")), "power_a", ValueError),
        (dict(power_a="0.1"), "power_a", TypeError),
        (dict(seed=-1), "seed", ValueError),
        (dict(seed=1.5), "seed", TypeError),
        (dict(vocab_size=128.0), "vocab_size", TypeError),
        (dict(random_non_queries=1), "random_non_queries", TypeError),
    ]
    for change, argument, kind in cases:
        with pytest.raises(kind) as caught:
            mqar(**{**good, **change})  # type: ignore[arg-type]
        assert caught.value.argument == argument, change  # type: ignore[attr-defined]
        assert str(caught.value).startswith(f"{argument}: expected"), change


def _triggers(row: list[int], trigger: int) -> list[int]:
    return [i for i, t in enumerate(row) if t == trigger]


@pytest.mark.parametrize(("induction_len", "num_triggers"), [(1, 1), (3, 1), (2, 4)])
def test_induction_layout_and_oracle(induction_len: int, num_triggers: int) -> None:
    V, L, n, m = 16, 40, 400, induction_len
    inputs, labels = induction(V, n, L, seed=2, induction_len=m, num_triggers=num_triggers)
    assert inputs.shape == labels.shape == (n, L) and inputs.dtype == torch.int64
    assert (inputs != V - 2).all() and inputs.min() >= 0 and inputs.max() <= V - 1
    assert (labels[:, : L - m] == -100).all() and (labels[:, L - m :] < V - 2).all()
    before_final = []
    for row, label in zip(inputs.tolist(), labels.tolist()):
        where = _triggers(row, V - 1)
        assert where[-1] == L - m  # the final trigger, then the pattern (teacher-forced)
        assert where[0] <= L - m - m - 2  # H3: uniform in 0 ... n - m - 2
        # oracle: the m tokens after the first trigger answer the question
        assert row[where[0] + 1 : where[0] + 1 + m] == label[L - m :]
        assert row[L - m + 1 :] == label[L - m : -1]
        for w in where[:-1]:  # every earlier trigger is followed by the pattern
            assert row[w + 1 : w + 1 + m] == label[L - m :]
        assert all(b - a > m for a, b in itertools.pairwise(where))
        before_final.append(len(where) - 1)
    counts = np.bincount(before_final, minlength=num_triggers + 1)
    assert counts[0] == 0 and counts[num_triggers + 1 :].sum() == 0
    if num_triggers == 1:
        assert counts[1] == n
    else:  # H3: one trigger with probability 1/2, else up to num_triggers
        assert 0.4 < counts[1] / n < 0.6 and counts[num_triggers] > 0.1 * n


def test_induction_argument_errors_name_the_argument() -> None:
    good = dict(vocab_size=16, num_examples=2, seq_len=16, seed=0)
    cases = [
        (dict(vocab_size=2), "vocab_size", ValueError),
        (dict(vocab_size="16"), "vocab_size", TypeError),
        (dict(seq_len=7, induction_len=3), "seq_len", ValueError),
        (dict(induction_len=0), "induction_len", ValueError),
        (dict(num_triggers=0), "num_triggers", ValueError),
        (dict(num_examples=-2), "num_examples", ValueError),
        (dict(seed=-1), "seed", ValueError),
    ]
    for change, argument, kind in cases:
        with pytest.raises(kind) as caught:
            induction(**{**good, **change})  # type: ignore[arg-type]
        assert caught.value.argument == argument, change  # type: ignore[attr-defined]
    inputs, _ = induction(3, 5, 4, seed=0)  # the smallest: one data token, seq_len 2m + 2
    assert set(inputs.unique().tolist()) <= {0, 2}
