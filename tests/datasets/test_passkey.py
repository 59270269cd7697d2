"""``passkey``: an oracle reading the digits after ``<key>`` scores 100 %, the needle sits at
the requested depth in the repeated sentence, and a million tokens are cheap."""

from __future__ import annotations

import time

import pytest
import torch

from heatformer.datasets import PASSKEY_VOCAB, passkey

KEY, QUERY = PASSKEY_VOCAB.index("<key>"), PASSKEY_VOCAB.index("<query>")
SENTENCE = (
    "The grass is green . The sky is blue . The sun is yellow . Here we go . There and back again ."
)


def _oracle(inputs: torch.Tensor, num_digits: int) -> torch.Tensor:
    """Labels predicted by finding ``<key>`` and reading the digits after it."""
    out = torch.full_like(inputs, -100)
    for b, row in enumerate(inputs.tolist()):
        start = row.index(KEY)
        out[b, -num_digits:] = torch.tensor(row[start + 1 : start + 1 + num_digits])
    return out


@pytest.mark.parametrize(("depth", "num_digits"), [(0.0, 5), (0.5, 3), (1.0, 1), (None, 5)])
def test_passkey_layout_and_oracle(depth: float | None, num_digits: int) -> None:
    L, n, k = 200, 64, num_digits
    inputs, labels = passkey(L, n, seed=7, depth=depth, num_digits=k)
    assert inputs.shape == labels.shape == (n, L) and inputs.dtype == torch.int64
    assert len(PASSKEY_VOCAB) == 28 and inputs.min() >= 0 and inputs.max() < 28
    assert torch.equal(_oracle(inputs, k), labels)
    assert (labels[:, : L - k] == -100).all() and (labels[:, L - k :] <= 9).all()
    assert (inputs[:, L - k] == QUERY).all()
    assert torch.equal(inputs[:, L - k + 1 :], labels[:, L - k : -1])  # teacher-forced answer
    starts = (inputs == KEY).float().argmax(dim=1)
    assert ((inputs == KEY).sum(dim=1) == 1).all() and ((inputs == QUERY).sum(dim=1) == 1).all()
    span = L - k - k - 1
    if depth is None:
        assert len(set(starts.tolist())) > n // 3 and starts.max() <= span
    else:
        assert (starts == int(depth * span + 0.5)).all()
    # every other haystack position holds the sentence, word i mod 24
    words = [PASSKEY_VOCAB[t] for t in inputs[0].tolist()]
    sentence = SENTENCE.split()
    needle = range(starts[0].item(), starts[0].item() + k + 1)
    assert all(words[i] == sentence[i % 24] for i in range(L - k) if i not in needle)


def test_passkey_a_million_tokens_is_cheap() -> None:
    begin = time.perf_counter()
    inputs, labels = passkey(2**20, 2, seed=0, depth=0.25)
    assert time.perf_counter() - begin < 5.0  # about 0.05 s; the docstring's 60 s bound
    start = int(0.25 * (2**20 - 11) + 0.5)
    assert (inputs[:, start] == KEY).all()
    assert torch.equal(inputs[:, start + 1 : start + 6], labels[:, -5:])


def test_passkey_errors_name_the_argument() -> None:
    good = dict(seq_len=64, num_examples=2, seed=0)
    cases = [
        (dict(seq_len=10), "seq_len", ValueError),  # 2 * 5 + 1 = 11 at least
        (dict(depth=1.5), "depth", ValueError),
        (dict(depth=-0.1), "depth", ValueError),
        (dict(depth="middle"), "depth", TypeError),
        (dict(num_digits=0), "num_digits", ValueError),
        (dict(num_examples=0), "num_examples", ValueError),
        (dict(seed=-1), "seed", ValueError),
    ]
    for change, argument, kind in cases:
        with pytest.raises(kind) as caught:
            passkey(**{**good, **change})  # type: ignore[arg-type]
        assert caught.value.argument == argument, change  # type: ignore[attr-defined]
    inputs, _ = passkey(11, 1, seed=0)  # the smallest: needle, then the question
    assert inputs[0, 0] == KEY and inputs[0, 6] == QUERY
