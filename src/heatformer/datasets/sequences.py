"""Tasks on the whole sequence: selective copying (MAD-Lab, Mamba), parity and majority of bits.

Each returns ``(inputs, labels)``, int64 tensors of shape ``(num_examples, seq_len)``; a label
is the token a model should emit at that position, ``-100`` where nothing is scored.
"""

from __future__ import annotations

import torch
from torch import Tensor

from heatformer.checks import bad_value, check_positive_int
from heatformer.datasets._sampling import IGNORE_INDEX, check_vocab_size, seeded

__all__ = ["BIT_VOCAB", "majority", "parity", "selective_copy"]

#: the tokens of :func:`parity` and :func:`majority` by id: the two bits and the question
BIT_VOCAB = ("0", "1", "=")


def selective_copy(
    vocab_size: int,
    num_examples: int,
    seq_len: int,
    seed: int,
    num_tokens_to_copy: int = 16,
) -> tuple[Tensor, Tensor]:
    """Selective copying, with the arguments and semantics of MAD-Lab's
    ``generate_selective_copying_instance`` (Poli et al. 2024), the task of Mamba (Gu & Dao
    2023, section 3.1): data tokens scattered among blanks, to be copied in order after a
    copy token.

    With ``V = vocab_size`` and ``c = num_tokens_to_copy``, tokens ``0 ... V - 3`` are data,
    ``V - 2`` is the blank (noise) token and ``V - 1`` the copy token. Each example:

    - ``c`` data tokens drawn uniformly with replacement, in order;
    - ``b = seq_len - 2c - 1`` blanks, each inserted right before a data token chosen
      uniformly (as MAD-Lab's ``np.insert`` does), so blanks may precede the first data token
      and the last data token always stands right before the copy token;
    - the copy token at position ``seq_len - c - 1``, then ``c`` blanks;
    - labels: the data tokens, in order, at the last ``c`` positions (the blanks after the copy
      token); ``-100`` elsewhere.

    Shape:
        inputs, labels: ``(num_examples, seq_len)``, int64, on the CPU.

    Args:
        vocab_size: ``V >= 3``.
        num_examples: examples to generate.
        seq_len: ``> 2 * num_tokens_to_copy + 1`` (MAD-Lab's assertion).
        seed: seed of this call's own :class:`torch.Generator`.
        num_tokens_to_copy: ``c`` (MAD-Lab's default 16).

    Returns:
        ``(inputs, labels)``.

    Raises:
        TypeError: a size or ``seed`` that is not an int.
        ValueError: naming the argument: a size below 1 (``vocab_size`` below 3), a negative
            seed, or ``seq_len <= 2 * num_tokens_to_copy + 1``.

    Notes:
        MAD-Lab draws the data tokens from its seeded ``rng`` but the blank positions from
        numpy's global ``np.random``; here every draw comes from ``seed``. MAD-Lab's training
        instances score every position; the labels here are those of its test instances,
        the copied tokens only.

    References:
        Poli, Thomas, Nguyen, et al. Mechanistic Design and Scaling of Hybrid Architectures.
        ICML 2024 (code: github.com/athms/mad-lab, ``mad/data/instances.py``). Gu, Dao.
        Mamba: Linear-Time Sequence Modeling with Selective State Spaces. arXiv:2312.00752,
        2023.

    Example:
        Reading the tokens that are neither blank nor copy, in order, answers the question:

        >>> inputs, labels = selective_copy(8, 2, 12, seed=0, num_tokens_to_copy=3)
        >>> x = inputs[0].tolist()
        >>> data = [t for t in x[:8] if t < 6]
        >>> data == labels[0, -3:].tolist(), x[8:], labels[0, :-3].tolist() == [-100] * 9
        (True, [7, 6, 6, 6], True)

    Over 80 lines for its documentation (the exact semantics and the differences from
    MAD-Lab's code); the body is twenty lines.
    """
    check_positive_int("num_examples", num_examples)
    check_positive_int("num_tokens_to_copy", num_tokens_to_copy)
    check_vocab_size(vocab_size, 3, "data, blank and copy tokens")
    check_positive_int("seq_len", seq_len)
    generator = seeded(seed)
    c = num_tokens_to_copy
    if seq_len <= 2 * c + 1:
        raise bad_value(
            "seq_len", f"expected seq_len > 2 * num_tokens_to_copy + 1 = {2 * c + 1}, got {seq_len}"
        )
    n, blanks, blank = num_examples, seq_len - 2 * c - 1, vocab_size - 2
    data = torch.randint(0, vocab_size - 2, (n, c), generator=generator)
    before = torch.randint(0, c, (n, blanks), generator=generator)  # the data token after each
    counts = torch.zeros(n, c, dtype=torch.int64).scatter_add_(1, before, torch.ones_like(before))
    where = torch.arange(c) + counts.cumsum(dim=1)  # (n, c): position of data token j
    inputs = torch.full((n, seq_len), blank, dtype=torch.int64)
    inputs.scatter_(1, where, data)
    inputs[:, seq_len - c - 1] = vocab_size - 1
    labels = torch.full((n, seq_len), IGNORE_INDEX, dtype=torch.int64)
    labels[:, seq_len - c :] = data
    return inputs, labels


def parity(num_examples: int, seq_len: int, seed: int) -> tuple[Tensor, Tensor]:
    """Parity of a bit string: is the number of ones odd?

    The task of the length-generalization literature: PARITY in Hahn (2020), "parity check"
    in Delétang et al. (2023), Anil et al. (2022). Tokens (:data:`BIT_VOCAB`): ``0`` and ``1``
    the bits, ``2`` the question ``=``. Each example is ``seq_len - 1`` bits drawn uniformly
    and independently, then ``=``; the label at ``=`` is the parity (``1`` when the number of
    ones is odd), every other label ``-100``. For length generalization, train at one
    ``seq_len`` and test at a longer one.

    Shape:
        inputs, labels: ``(num_examples, seq_len)``, int64, on the CPU.

    Args:
        num_examples: examples to generate.
        seq_len: ``>= 2`` (at least one bit).
        seed: seed of this call's own :class:`torch.Generator`.

    Returns:
        ``(inputs, labels)``.

    Raises:
        TypeError: a size or ``seed`` that is not an int.
        ValueError: naming the argument: a size too small, a negative seed.

    References:
        Hahn. Theoretical Limitations of Self-Attention in Neural Sequence Models. TACL 8,
        2020. Delétang et al. Neural Networks and the Chomsky Hierarchy. ICLR 2023. Anil et al.
        Exploring Length Generalization in Large Language Models. NeurIPS 2022.

    Example:
        >>> inputs, labels = parity(2, 6, seed=0)
        >>> x = inputs[0].tolist()
        >>> x[-1], labels[0, -1].item() == sum(x[:-1]) % 2, labels[0, :-1].tolist()
        (2, True, [-100, -100, -100, -100, -100])
    """
    bits, inputs, labels = _bits(num_examples, seq_len, seed)
    labels[:, -1] = bits.sum(dim=1) % 2
    return inputs, labels


def majority(num_examples: int, seq_len: int, seed: int) -> tuple[Tensor, Tensor]:
    """Majority of a bit string: are there more ones than zeros?

    MAJORITY of Hahn (2020) and of the length-generalization literature, laid out as
    :func:`parity`: ``seq_len - 1`` uniform bits, then ``=`` (token ``2``); the label at ``=``
    is ``1`` when ones outnumber zeros, else ``0``; every other label ``-100``. The number of
    bits is odd, so there is no tie: ``seq_len`` must be even.

    Shape:
        inputs, labels: ``(num_examples, seq_len)``, int64, on the CPU.

    Args:
        num_examples: examples to generate.
        seq_len: even, ``>= 2``.
        seed: seed of this call's own :class:`torch.Generator`.

    Returns:
        ``(inputs, labels)``.

    Raises:
        TypeError: a size or ``seed`` that is not an int.
        ValueError: naming the argument: a size too small, an odd ``seq_len``, a negative seed.

    References:
        Hahn. Theoretical Limitations of Self-Attention in Neural Sequence Models. TACL 8,
        2020.

    Example:
        >>> inputs, labels = majority(2, 6, seed=0)
        >>> x = inputs[0].tolist()
        >>> labels[0, -1].item() == int(sum(x[:-1]) > 2.5)
        True
    """
    if isinstance(seq_len, int) and not isinstance(seq_len, bool) and seq_len % 2:
        raise bad_value(
            "seq_len", f"expected an even seq_len (an odd number of bits), got {seq_len}"
        )
    bits, inputs, labels = _bits(num_examples, seq_len, seed)
    labels[:, -1] = (2 * bits.sum(dim=1) > bits.shape[1]).long()
    return inputs, labels


def _bits(num_examples: int, seq_len: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """The bits, the inputs (bits then ``=``) and all-ignored labels of a bit task."""
    check_positive_int("num_examples", num_examples)
    check_positive_int("seq_len", seq_len)
    if seq_len < 2:
        raise bad_value("seq_len", f"expected seq_len >= 2 (at least one bit), got {seq_len}")
    generator = seeded(seed)
    bits = torch.randint(0, 2, (num_examples, seq_len - 1), generator=generator)
    question = torch.full((num_examples, 1), BIT_VOCAB.index("="), dtype=torch.int64)
    labels = torch.full((num_examples, seq_len), IGNORE_INDEX, dtype=torch.int64)
    return bits, torch.cat([bits, question], dim=1), labels
