"""In-context recall: multi-query associative recall (Zoology's MQAR) and induction heads (H3).

Both return ``(inputs, labels)``, int64 tensors of shape ``(num_examples, length)``. A label
is the token a causal model should emit *at* that position -- the next token -- and
``-100`` (``cross_entropy``'s ``ignore_index``) where nothing is scored.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from heatformer.checks import bad_type, bad_value, check_bool, check_positive_int
from heatformer.datasets._sampling import (
    IGNORE_INDEX,
    check_vocab_size,
    seeded,
    uniform_without_replacement,
    weighted_without_replacement,
)

__all__ = ["induction", "mqar"]


def mqar(
    vocab_size: int,
    num_examples: int,
    input_seq_len: int,
    seed: int,
    power_a: float = 0.01,
    num_kv_pairs: int = 8,
    num_passes: int = 1,
    random_non_queries: bool = True,
) -> tuple[Tensor, Tensor]:
    """Multi-query associative recall, with the arguments and semantics of Zoology's
    ``multiquery_ar`` (Arora, Eyuboglu et al. 2023), so its configurations carry over.

    Each example, with ``V = vocab_size``, ``K = num_kv_pairs``, ``P = num_passes``,
    ``L = input_seq_len``:

    - ``K`` distinct keys from ``1 ... V//2 - 1`` and ``K`` distinct values from
      ``V//2 ... V - 1``, each ordered sample equally likely; key ``i`` is paired with value
      ``i``;
    - the context ``k_1 v_1 k_2 v_2 ... k_K v_K``, repeated ``P`` times (the JRT passes), fills
      positions ``0 ... 2KP - 1``;
    - then every key is asked once: key ``i`` sits at position ``2KP + 2 g_i``, with distinct
      gaps ``g_i`` in ``0 ... S - 1``, ``S = (L - 2KP) // 2``, drawn one after the other for
      ``i = 1 ... K``, each proportionally to ``power_a * (g + 1) ** (power_a - 1)`` among the
      gaps not yet drawn (a power law: short gaps are likely, ``power_a = 1`` is uniform);
    - the label at a query position is the value paired with its key (the next token a model
      should emit there); every other label is ``-100``;
    - every other input position holds a token drawn uniformly from ``0 ... V - 1`` (it may
      equal a key or a value) when ``random_non_queries``, else ``0``.

    Shape:
        inputs, labels: ``(num_examples, input_seq_len)``, int64, on the CPU.

    Args:
        vocab_size: ``V``, greater than ``input_seq_len`` (Zoology asserts it).
        num_examples: examples to generate.
        input_seq_len: ``L``, even.
        seed: seed of this call's own :class:`torch.Generator` (global RNG state is neither
            read nor changed).
        power_a: exponent of the query-gap power law, ``> 0``.
        num_kv_pairs: ``K``; ``2 K (P + 1) <= L``.
        num_passes: ``P``, how many times the key-value context is repeated.
        random_non_queries: fill the empty positions with random tokens (else ``0``).

    Returns:
        ``(inputs, labels)``.

    Raises:
        TypeError: a size or ``seed`` that is not an int, a ``power_a`` that is not a number, a
            ``random_non_queries`` that is not a bool.
        ValueError: naming the argument: a size below 1, a negative seed, ``power_a <= 0``,
            an odd ``input_seq_len``, ``vocab_size <= input_seq_len``, or ``2 K (P + 1) > L``.

    Notes:
        Deliberate differences from Zoology's code (``zoology/data/multiquery_ar.py``), none of
        them in the distribution of an example: the filler is drawn from this call's seeded
        generator (Zoology draws it from torch's unseeded global generator, so its inputs are
        not reproducible from the seed), and the draws are not numpy's, so the same seed gives
        other examples than Zoology. For ``num_passes > 1`` Zoology's code fails to broadcast
        the keys into its context; this implements its stated intent (the ``K`` pairs repeated
        ``P`` times, as in JRT, Arora et al. 2024), so each key appears ``P`` times in the
        context and once as a query. Zoology's ``include_slices`` (metadata of its
        ``DataSegment``) has no counterpart.

        Cost (one core of a busy 2-core CPU): 100,000 examples of Zoology's largest Figure 2
        setting (``vocab_size=8192``, ``input_seq_len=512``, ``num_kv_pairs=64``) take about
        6 s and 1 GiB (the two tensors are 800 MiB); of ``input_seq_len=64``,
        ``num_kv_pairs=4``, about 1 s and 140 MiB.

    References:
        Arora, Eyuboglu, Timalsina, Johnson, Poli, Zou, Rudra, Ré. Zoology: Measuring and
        Improving Recall in Efficient Language Models. arXiv:2312.04927, 2023 (code:
        github.com/HazyResearch/zoology). Arora et al. Just read twice: closing the recall gap
        for recurrent language models. arXiv:2407.05483, 2024.

    Example:
        A dictionary read from the context answers every query:

        >>> inputs, labels = mqar(20, 3, 16, seed=0, num_kv_pairs=2, random_non_queries=False)
        >>> inputs.shape, labels.shape
        (torch.Size([3, 16]), torch.Size([3, 16]))
        >>> x, y = inputs[0].tolist(), labels[0].tolist()
        >>> pairs = dict(zip(x[0:4:2], x[1:4:2]))
        >>> all(pairs[x[i]] == y[i] for i in range(16) if y[i] != -100)
        True
        >>> sum(label != -100 for label in y)
        2

    Over 80 lines for its documentation: the exact semantics, the differences from Zoology's
    code and the cost; the body is the argument checks and a dozen tensor operations.
    """
    for name, value in (
        ("vocab_size", vocab_size),
        ("num_examples", num_examples),
        ("input_seq_len", input_seq_len),
        ("num_kv_pairs", num_kv_pairs),
        ("num_passes", num_passes),
    ):
        check_positive_int(name, value)
    if isinstance(power_a, bool) or not isinstance(power_a, int | float):
        raise bad_type("power_a", f"expected a float > 0, got {type(power_a).__name__}")
    if not (math.isfinite(power_a) and power_a > 0):
        raise bad_value("power_a", f"expected a finite float > 0, got {power_a}")
    check_bool("random_non_queries", random_non_queries)
    generator = seeded(seed)
    if input_seq_len % 2:
        raise bad_value(
            "input_seq_len", f"expected an even length (queries sit 2 apart), got {input_seq_len}"
        )
    if vocab_size <= input_seq_len:
        raise bad_value(
            "vocab_size",
            f"expected vocab_size > input_seq_len = {input_seq_len} (as Zoology asserts), "
            f"got {vocab_size}",
        )
    context = 2 * num_kv_pairs * num_passes
    if context + 2 * num_kv_pairs > input_seq_len:
        raise bad_value(
            "num_kv_pairs",
            f"expected 2 * num_kv_pairs * (num_passes + 1) <= input_seq_len = {input_seq_len} "
            f"(the context and one query per key), got num_kv_pairs={num_kv_pairs}, "
            f"num_passes={num_passes}",
        )
    n, k, half = num_examples, num_kv_pairs, vocab_size // 2
    keys = 1 + uniform_without_replacement(n, half - 1, k, generator)  # (n, K)
    values = half + uniform_without_replacement(n, vocab_size - half, k, generator)  # (n, K)
    space = (input_seq_len - context) // 2
    ranks = torch.arange(1, space + 1, dtype=torch.float64)
    gaps = weighted_without_replacement(n, power_a * ranks ** (power_a - 1), k, generator)
    where = context + 2 * gaps  # (n, K): the position of key i's query
    if random_non_queries:  # the filler, then the context and the queries written over it
        inputs = torch.randint(0, vocab_size, (n, input_seq_len), generator=generator)
    else:
        inputs = torch.zeros(n, input_seq_len, dtype=torch.int64)
    inputs[:, :context] = torch.stack([keys, values], dim=2).reshape(n, 2 * k).repeat(1, num_passes)
    inputs.scatter_(1, where, keys)
    labels = torch.full((n, input_seq_len), IGNORE_INDEX, dtype=torch.int64)
    labels.scatter_(1, where, values)
    return inputs, labels


def induction(
    vocab_size: int,
    num_examples: int,
    seq_len: int,
    seed: int,
    induction_len: int = 1,
    num_triggers: int = 1,
) -> tuple[Tensor, Tensor]:
    """Induction heads, with the semantics of H3's generator (Fu, Dao et al. 2023), the task
    Mamba (Gu & Dao 2023) trains at length 256 and tests up to ``2**20``.

    The pattern an induction head completes, ``... A B ... A -> B`` (Olsson et al. 2022), with a
    special trigger token as ``A``. With ``V = vocab_size``, ``m = induction_len`` and
    ``n = seq_len - m`` (H3's ``input_seq_len``), each example is built as H3 builds it:

    - ``n`` tokens drawn uniformly from ``0 ... V - 3`` (H3 reserves two special tokens: the
      trigger, here ``V - 1``, and a no-op, here ``V - 2``, which never appears);
    - trigger positions: with probability 1/2 one position, else ``num_triggers`` positions
      (sorted), each uniform in ``0 ... n - m - 2``; a position within ``m`` of the last one
      kept is dropped. The ``m`` tokens after the first trigger are the pattern; every kept
      position gets the trigger followed by the pattern;
    - then the trigger again at position ``n``, followed by the pattern: a sequence of
      ``n + 1 + m`` tokens, of which ``inputs`` are the first ``seq_len`` and the labels the
      next tokens of the last ``m`` positions: the pattern, read after the final trigger;
      every other label is ``-100``.

    Shape:
        inputs, labels: ``(num_examples, seq_len)``, int64, on the CPU.

    Args:
        vocab_size: ``V >= 3``.
        num_examples: examples to generate.
        seq_len: ``>= 2 * induction_len + 2``.
        seed: seed of this call's own :class:`torch.Generator`.
        induction_len: ``m``, the tokens to recall after the trigger (H3's default 1).
        num_triggers: the most trigger occurrences before the final one (H3's default 1).

    Returns:
        ``(inputs, labels)``.

    Raises:
        TypeError: a size or ``seed`` that is not an int.
        ValueError: naming the argument: a size below 1 (``vocab_size`` below 3), a negative
            seed, or ``seq_len < 2 * induction_len + 2``.

    Notes:
        Differences from H3 (``src/dataloaders/synthetics.py`` of HazyResearch/safari): H3
        trains on the next token of every position and scores only the answer; the labels
        here are the scored answer only (every next-token target is ``inputs[:, 1:]``). H3's
        token ids sort the token strings; here data tokens are ``0 ... V - 3``. H3 also drops
        duplicate examples; these are independent draws. The random stream is this call's
        own (not numpy's), so the same seed gives other examples than H3.

    References:
        Fu, Dao, Saab, Thomas, Rudra, Ré. Hungry Hungry Hippos: Towards Language Modeling with
        State Space Models. ICLR 2023. Gu, Dao. Mamba: Linear-Time Sequence Modeling with
        Selective State Spaces. arXiv:2312.00752, 2023. Olsson et al. In-context Learning and
        Induction Heads. Transformer Circuits Thread, 2022.

    Example:
        The tokens after the first trigger answer the question the last one asks:

        >>> inputs, labels = induction(16, 2, 12, seed=0, induction_len=2)
        >>> x = inputs[0].tolist()
        >>> first = x.index(15)
        >>> x[first + 1 : first + 3] == labels[0, -2:].tolist(), x[-2] == 15
        (True, True)
        >>> (labels[:, :-2] == -100).all().item()
        True

    Over 80 lines for its documentation (H3's exact construction and the differences from its
    code); the body is the checks and H3's steps, vectorized over examples.
    """
    check_positive_int("num_examples", num_examples)
    check_positive_int("induction_len", induction_len)
    check_positive_int("num_triggers", num_triggers)
    check_vocab_size(vocab_size, 3, "two special tokens and one data token")
    check_positive_int("seq_len", seq_len)
    generator = seeded(seed)
    m = induction_len
    if seq_len < 2 * m + 2:
        raise bad_value(
            "seq_len", f"expected seq_len >= 2 * induction_len + 2 = {2 * m + 2}, got {seq_len}"
        )
    n, rows, trigger = seq_len - m, torch.arange(num_examples)[:, None], vocab_size - 1
    tokens = torch.randint(0, vocab_size - 2, (num_examples, n + 1 + m), generator=generator)
    one = torch.rand(num_examples, generator=generator) < 0.5
    draws = torch.randint(0, n - m - 1, (num_examples, num_triggers), generator=generator)
    positions = torch.where(one[:, None], draws[:, :1], draws.sort(dim=1).values)  # (B, T)
    kept = torch.ones_like(positions, dtype=torch.bool)
    kept[one, 1:] = False
    last = positions[:, 0]
    for t in range(1, num_triggers):  # drop a position within m of the last one kept
        kept[:, t] &= positions[:, t] - last > m
        last = torch.where(kept[:, t], positions[:, t], last)
    offsets = torch.arange(1, m + 1)
    pattern = tokens[rows, positions[:, :1] + offsets]  # (B, m): after the first trigger
    for t in range(num_triggers):
        at = positions[kept[:, t], t][:, None]  # (b, 1)
        tokens[kept[:, t].nonzero(), at] = trigger
        tokens[kept[:, t].nonzero(), at + offsets] = pattern[kept[:, t]]
    tokens[:, n] = trigger
    tokens[:, n + 1 :] = pattern
    labels = torch.full((num_examples, seq_len), IGNORE_INDEX, dtype=torch.int64)
    labels[:, n:] = pattern
    return tokens[:, :seq_len].clone(), labels
