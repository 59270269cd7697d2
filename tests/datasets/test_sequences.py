"""``selective_copy``, ``parity`` and ``majority``: oracle solvers score 100 % and the stated
layout holds (MAD-Lab's blank placement for selective copying)."""

from __future__ import annotations

import pytest
import torch

from heatformer.datasets import BIT_VOCAB, majority, parity, selective_copy


def test_selective_copy_layout_and_oracle() -> None:
    V, L, c, n = 10, 40, 6, 500
    inputs, labels = selective_copy(V, n, L, seed=4, num_tokens_to_copy=c)
    assert inputs.shape == labels.shape == (n, L) and inputs.dtype == torch.int64
    blank, copy = V - 2, V - 1
    assert (inputs[:, L - c - 1] == copy).all() and (inputs[:, L - c :] == blank).all()
    assert (labels[:, : L - c] == -100).all()
    first_blanks = []
    for row, label in zip(inputs.tolist(), labels.tolist()):
        head = row[: L - c - 1]
        assert copy not in head and head.count(blank) == L - 2 * c - 1
        # oracle: the data tokens of the head, in order, are the labels
        assert [t for t in head if t != blank] == label[L - c :]
        assert head[-1] != blank  # MAD-Lab: blanks go before data tokens, never after the last
        first_blanks.append(head.index(next(t for t in head if t != blank)))
    # each blank precedes the first data token with probability 1/c: mean b/c blanks there
    mean = sum(first_blanks) / n
    assert abs(mean - (L - 2 * c - 1) / c) < 0.5
    assert labels[:, L - c :].min() >= 0 and labels[:, L - c :].max() <= V - 3


def test_selective_copy_smallest_and_errors() -> None:
    inputs, labels = selective_copy(3, 4, 4, seed=0, num_tokens_to_copy=1)  # one blank, 1 token
    assert inputs.tolist() == [[1, 0, 2, 1]] * 4 and labels[:, -1].tolist() == [0] * 4
    good = dict(vocab_size=16, num_examples=2, seq_len=40, seed=0)
    cases = [
        (dict(seq_len=33), "seq_len", ValueError),  # MAD-Lab: seq_len > 2 * 16 + 1
        (dict(vocab_size=2), "vocab_size", ValueError),
        (dict(num_tokens_to_copy=0), "num_tokens_to_copy", ValueError),
        (dict(num_tokens_to_copy=2.0), "num_tokens_to_copy", TypeError),
        (dict(seed=-3), "seed", ValueError),
    ]
    for change, argument, kind in cases:
        with pytest.raises(kind) as caught:
            selective_copy(**{**good, **change})  # type: ignore[arg-type]
        assert caught.value.argument == argument, change  # type: ignore[attr-defined]


@pytest.mark.parametrize("seq_len", [2, 17, 64])
def test_parity_oracle(seq_len: int) -> None:
    inputs, labels = parity(400, seq_len, seed=1)
    assert inputs.shape == labels.shape == (400, seq_len)
    assert (inputs[:, -1] == BIT_VOCAB.index("=")).all()
    assert set(inputs[:, :-1].unique().tolist()) <= {0, 1}
    assert (labels[:, :-1] == -100).all()
    oracle = [sum(row[:-1]) % 2 for row in inputs.tolist()]  # count the ones
    assert labels[:, -1].tolist() == oracle
    assert 0.4 < labels[:, -1].float().mean() < 0.6


@pytest.mark.parametrize("seq_len", [2, 8, 64])
def test_majority_oracle(seq_len: int) -> None:
    inputs, labels = majority(400, seq_len, seed=1)
    assert inputs.shape == labels.shape == (400, seq_len)
    assert (inputs[:, -1] == 2).all() and (labels[:, :-1] == -100).all()
    oracle = [int(row[:-1].count(1) > row[:-1].count(0)) for row in inputs.tolist()]
    assert labels[:, -1].tolist() == oracle
    assert 0.4 < labels[:, -1].float().mean() < 0.6  # odd bit counts: no ties, balanced


def test_bit_tasks_errors() -> None:
    with pytest.raises(ValueError, match=r"^seq_len: expected an even seq_len") as caught:
        majority(2, 9, seed=0)
    assert caught.value.argument == "seq_len"  # type: ignore[attr-defined]
    for task in (parity, majority):
        for kwargs, argument, kind in [
            (dict(num_examples=2, seq_len=1, seed=0), "seq_len", ValueError),
            (dict(num_examples=0, seq_len=4, seed=0), "num_examples", ValueError),
            (dict(num_examples=2, seq_len="4", seed=0), "seq_len", TypeError),
            (dict(num_examples=2, seq_len=4, seed=True), "seed", TypeError),
        ]:
            with pytest.raises(kind) as caught:
                task(**kwargs)  # type: ignore[arg-type]
            assert caught.value.argument == argument  # type: ignore[attr-defined]
