"""Passkey retrieval: a few digits hidden at a chosen depth of a long filler text, asked for at
the end (Mohtashami & Jaggi 2023; the "needle in a haystack" of RULER, Hsieh et al. 2024).

The filler is the sentence of the original test, repeated, as word tokens: it is predictable,
so the passkey is the only thing in the sequence worth remembering. Cheap at any length: one
``seq_len`` filler row is built and copied; nothing is quadratic.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from heatformer.checks import bad_type, bad_value, check_positive_int
from heatformer.datasets._sampling import IGNORE_INDEX, seeded

__all__ = ["PASSKEY_VOCAB", "passkey"]

_FILLER_WORDS = "The grass is green . sky blue sun yellow Here we go There and back again".split()

#: the tokens of :func:`passkey` by id: the ten digits, the key and query markers, the filler
PASSKEY_VOCAB: tuple[str, ...] = (*"0123456789", "<key>", "<query>", *_FILLER_WORDS)

#: "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
_SENTENCE = (
    "The grass is green . The sky is blue . The sun is yellow . Here we go . There and back again ."
).split()
_KEY, _QUERY = PASSKEY_VOCAB.index("<key>"), PASSKEY_VOCAB.index("<query>")


def passkey(
    seq_len: int,
    num_examples: int,
    seed: int,
    depth: float | None = None,
    num_digits: int = 5,
) -> tuple[Tensor, Tensor]:
    """Passkey retrieval at a chosen depth.

    Tokens are :data:`PASSKEY_VOCAB` (28): ids ``0 ... 9`` the digits, ``10`` the key marker
    ``<key>``, ``11`` the question ``<query>``, ``12 ... 27`` the filler words. With
    ``k = num_digits`` and ``h = seq_len - k`` (the haystack), each example is:

    - positions ``0 ... h - 1``: the sentence "The grass is green. The sky is blue. The sun is
      yellow. Here we go. There and back again." repeated (token ``i`` is word ``i mod 24``),
      except the needle ``<key> d_1 ... d_k`` (``k`` digits drawn uniformly) written over it from
      position ``s = floor(depth * (h - k - 1) + 1/2)`` (the nearest, halves up): depth 0 puts
      it first, depth 1 right before the question; ``depth=None`` draws ``s`` uniformly from
      ``0 ... h - k - 1`` per example;
    - then ``<query> d_1 ... d_{k-1}`` (the answer, teacher-forced): the labels of these last
      ``k`` positions are ``d_1 ... d_k``, the next tokens; every other label is ``-100``.

    Shape:
        inputs, labels: ``(num_examples, seq_len)``, int64, on the CPU.

    Args:
        seq_len: ``>= 2 * num_digits + 1``.
        num_examples: examples to generate.
        seed: seed of this call's own :class:`torch.Generator`.
        depth: where the needle starts, a fraction of the haystack in ``[0, 1]``; ``None``
            for a uniform depth per example (for training).
        num_digits: ``k``, the passkey's length.

    Returns:
        ``(inputs, labels)``.

    Raises:
        TypeError: a size or ``seed`` that is not an int, a ``depth`` that is not a number.
        ValueError: naming the argument: a size below 1, a negative seed, ``depth`` outside
            ``[0, 1]``, or ``seq_len < 2 * num_digits + 1``.

    Notes:
        Cost (measured on one core of a busy 2-core CPU, torch 2): ``seq_len = 2**20`` with 8
        examples takes about 0.2 s, and the process's peak memory grows by 144 MiB: the two
        ``(8, 2**20)`` int64 tensors (128 MiB) and one ``2**20`` row.

        Differences from Mohtashami & Jaggi's prompt: it is words, not subword tokens; the
        needle is ``<key>`` and the digits (their "The pass key is 12345. Remember it. 12345
        is the pass key.") written over the filler rather than between sentences; the
        question is one ``<query>`` token (their "What is the pass key? The pass key is"); the
        passkey is ``k`` uniform digits (theirs an integer up to 50,000).

    References:
        Mohtashami, Jaggi. Landmark Attention: Random-Access Infinite Context Length for
        Transformers. NeurIPS 2023. Hsieh et al. RULER: What's the Real Context Size of Your
        Long-Context Language Models? COLM 2024.

    Example:
        The digits after ``<key>`` are the answer:

        >>> inputs, labels = passkey(64, 2, seed=0, depth=0.5, num_digits=3)
        >>> x = inputs[0].tolist()
        >>> start = x.index(10)
        >>> start, x[start + 1 : start + 4] == labels[0, -3:].tolist(), x[-3]
        (29, True, 11)
        >>> " ".join(PASSKEY_VOCAB[t] for t in x[:6])
        'The grass is green . The'

    Over 80 lines for its documentation (the exact layout, the cost, the differences from the
    original prompt); the body is thirty lines.
    """
    check_positive_int("seq_len", seq_len)
    check_positive_int("num_examples", num_examples)
    check_positive_int("num_digits", num_digits)
    if depth is not None:
        if isinstance(depth, bool) or not isinstance(depth, int | float):
            raise bad_type(
                "depth", f"expected None or a float in [0, 1], got {type(depth).__name__}"
            )
        if not (math.isfinite(depth) and 0 <= depth <= 1):
            raise bad_value("depth", f"expected None or a float in [0, 1], got {depth}")
    generator = seeded(seed)
    k = num_digits
    if seq_len < 2 * k + 1:
        raise bad_value(
            "seq_len", f"expected seq_len >= 2 * num_digits + 1 = {2 * k + 1}, got {seq_len}"
        )
    n, haystack = num_examples, seq_len - k
    span = haystack - k - 1  # the last start that keeps the needle in the haystack
    sentence = torch.tensor([PASSKEY_VOCAB.index(word) for word in _SENTENCE])
    row = sentence[torch.arange(seq_len) % sentence.numel()]
    inputs = row.expand(n, seq_len).clone()
    digits = torch.randint(0, 10, (n, k), generator=generator)
    if depth is None:
        start = torch.randint(0, span + 1, (n, 1), generator=generator)
    else:
        start = torch.full((n, 1), math.floor(depth * span + 0.5))
    needle = torch.cat([torch.full((n, 1), _KEY), digits], dim=1)  # (n, k + 1)
    inputs.scatter_(1, start + torch.arange(k + 1), needle)
    inputs[:, haystack] = _QUERY
    inputs[:, haystack + 1 :] = digits[:, :-1]
    labels = torch.full((n, seq_len), IGNORE_INDEX, dtype=torch.int64)
    labels[:, haystack:] = digits
    return inputs, labels
