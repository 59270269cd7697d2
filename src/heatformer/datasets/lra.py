"""ListOps, the nested list-operation task of Long Range Arena (Tay et al. 2020).

An example is one expression in prefix notation, a tree of operators over the digits 0-9,
and its label is the expression's value, a digit (ten classes)::

    [MAX 4 3 [MIN 2 3 ] 1 0 [MED 1 5 8 9 2 ] ]      ->  5

The operators are those of LRA's generator (``lra_benchmarks/data/listops.py``), each applied
to its list of arguments:

- ``[MIN``, ``[MAX``: the smallest, the largest argument;
- ``[MED``: the integer part of the median, ``int(np.median(args))``: the middle argument of
  an odd number of them, the floor of the mean of the two middle ones of an even number;
- ``[SM``: the sum modulo 10.

``]`` closes the innermost open operator. The tree has LRA's shape: a node at depth ``d``
(the root at depth 1) is an operator with probability ``VALUE_P = 0.25`` (LRA's name) when
``d < max_depth``, else a value (always a value at ``d = max_depth``); a value is a uniform
digit; an operator is one of the four, uniformly, with a uniform number of arguments in
``2 ... max_args``, each a node at depth ``d + 1``. A tree is ``L`` tokens long: one per value,
two per operator (the operator and its ``]``). Trees outside the requested lengths are drawn
again (rejection), so the examples follow LRA's distribution conditioned on their length.

Tokens (:data:`LISTOPS_VOCAB`, strings by id): ``v`` the digit ``v`` (so a label, a value, is
also the token of that digit, as in every generator of :mod:`heatformer.datasets`), then
``[MIN``, ``[MAX``, ``[MED``, ``[SM`` and ``]`` (ids 10-14): the 15 tokens LRA's maintainers
state the model is to see (google-research/long-range-arena issue 14); ``15`` is the padding
``<pad>``. LRA's released pipeline read its files with the alphanumeric ``tfds`` tokenizer,
which drops ``[`` and ``]`` and with them the nesting; here the brackets are tokens, as
intended.

References:
    Tay, Y., Dehghani, M., Abnar, S., Shen, Y., Bahri, D., Pham, P., Rao, J., Yang, L.,
    Ruder, S. & Metzler, D. (2021). Long Range Arena: A Benchmark for Efficient Transformers.
    ICLR 2021. arXiv:2011.04006.
    Nangia, N. & Bowman, S. R. (2018). ListOps: A Diagnostic Dataset for Latent Tree
    Learning. NAACL SRW 2018.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import Tensor

from heatformer.checks import bad_value, check_int
from heatformer.datasets._sampling import IGNORE_INDEX, seeded

__all__ = ["LISTOPS_VOCAB", "listops"]

#: the tokens of ListOps by id: the digits 0-9, the operators, the closing bracket, padding
LISTOPS_VOCAB: tuple[str, ...] = (*"0123456789", "[MIN", "[MAX", "[MED", "[SM", "]", "<pad>")

_MIN, _MAX, _MED, _SM, _END, _PAD = 10, 11, 12, 13, 14, 15
#: LRA's probability that a node above the deepest level is an operator
_VALUE_P = 0.25
#: a length range that fewer trees than this fall in is refused (~1/_RAREST draws an example)
_RAREST = 1e-5
#: uniform floats drawn from the generator at a time
_BLOCK = 1 << 16


def listops(
    num_examples: int,
    seed: int,
    min_length: int = 256,
    max_length: int = 1024,
    max_depth: int = 10,
    max_args: int = 10,
) -> tuple[Tensor, Tensor]:
    """ListOps expressions of ``min_length`` to ``max_length`` tokens and their values.

    LRA's generator and semantics (see the module docstring), with its argument names: trees
    of at most ``max_depth`` levels whose operators take ``2 ... max_args`` arguments, drawn
    until one is ``min_length <= L <= max_length`` tokens long. Each example is
    left-aligned and padded with ``<pad>`` (id 15, the last); the label at its last token
    (where a causal model has read the whole expression) is its value ``0 ... 9`` (the id of
    that digit's token), every other label ``-100``. LRA's per-sequence target is
    ``labels.amax(dim=1)``, an example's length ``(inputs != 15).sum(dim=1)``.

    The defaults are a CPU scale; LRA's board used ``min_length=501, max_length=1999`` (its
    bounds are strict), ``max_depth=10``, ``max_args=10``, 96,000 training examples.

    Cost (CPU time on a 2-core machine, one thread; Python per token): 1,000 examples of
    500-1,000 tokens take about 1.0 s, of 256-1,024 0.6 s, of 501-1,999 0.8 s, of
    2,000-4,000 7 s; most of it is spent on rejected trees (1 draw in 13, 22, 12 and 92 is
    kept). With ``max_depth=10`` and ``max_args=10`` long trees are rare (4,000-8,000 tokens:
    1 draw in 2,700, minutes per 1,000); a range that fewer than one draw in ``10**5`` falls
    in is refused, by LRA's exact length distribution, before any draw (raise ``max_depth`` or
    ``max_args`` to reach longer trees). Generation is sequential: scale it up by calling with
    several seeds in parallel.

    Deliberate differences from LRA: lengths within ``[min_length, max_length]``, both
    included (LRA keeps ``min_length < L < max_length``); the brackets are tokens (see the
    module docstring); no deduplication (LRA keeps a set of trees; two trees of 256 tokens,
    at least 86 of them digits, coincide with negligible probability); the random draws
    come from this call's :class:`torch.Generator`, so LRA's files are not reproduced.

    Shape:
        inputs, labels: ``(num_examples, max_length)``, int64, on the CPU.

    Args:
        num_examples: examples to generate.
        seed: seed of this call's own :class:`torch.Generator`.
        min_length: the fewest tokens of an example, ``>= 1``.
        max_length: the most tokens of an example, ``>= min_length``; the width of ``inputs``.
        max_depth: levels of a tree, ``>= 1`` (``1``: a single digit).
        max_args: the most arguments of an operator, ``>= 2``.

    Returns:
        ``(inputs, labels)``: token ids of :data:`LISTOPS_VOCAB`, and the value (``0 ... 9``)
        at each example's last token, ``-100`` elsewhere.

    Raises:
        TypeError: ``seed`` that is not an int.
        ValueError: naming the argument: a size that is not an int or is too small,
            ``min_length > max_length``, or a length range that LRA's trees of this
            ``max_depth`` and ``max_args`` (almost) never fall in.

    Example:
        >>> inputs, labels = listops(2, seed=0, min_length=8, max_length=16)
        >>> x = inputs[0]
        >>> print(" ".join(LISTOPS_VOCAB[t] for t in x[x != 15].tolist()))
        [MED 1 0 4 3 7 [SM 3 0 ] ]
        >>> labels[0].amax().item(), (labels[0] != -100).sum().item()  # median of 0 1 3 3 4 7
        (3, 1)
    """
    _check_arguments(num_examples, min_length, max_length, max_depth, max_args)
    uniforms = _uniforms(seeded(seed))
    inputs = np.full((num_examples, max_length), _PAD, dtype=np.int64)
    labels = np.full((num_examples, max_length), IGNORE_INDEX, dtype=np.int64)
    made = 0
    while made < num_examples:
        tokens = _draw_tree(uniforms, max_depth, max_args, max_length)
        if tokens is None or len(tokens) < min_length:
            continue
        inputs[made, : len(tokens)] = tokens
        labels[made, len(tokens) - 1] = _evaluate(tokens)
        made += 1
    return torch.from_numpy(inputs), torch.from_numpy(labels)


def _check_arguments(
    num_examples: int, min_length: int, max_length: int, max_depth: int, max_args: int
) -> None:
    """The sizes' checks, then that LRA's trees fall in the length range often enough."""
    check_int("num_examples", num_examples, minimum=1)
    check_int("min_length", min_length, minimum=1)
    check_int("max_length", max_length, minimum=1)
    check_int("max_depth", max_depth, minimum=1)
    check_int("max_args", max_args, minimum=2)
    if min_length > max_length:
        raise bad_value(
            "min_length", f"expected at most max_length ({max_length}), got {min_length}"
        )
    probability = _length_probabilities(max_depth, max_args, max_length)
    inside = float(probability[min_length:].sum())
    if inside >= _RAREST:
        return
    longer = max(0.0, 1.0 - float(probability.sum()))
    odds = f"{inside:.1e}" if inside > 1e-12 else "0"
    trees = f"LRA's trees of max_depth={max_depth} and max_args={max_args}"
    if longer >= _RAREST:  # trees skip the range: a gap (lengths 2, 3), or too narrow a range
        gap = "a tree is 1 token or at least 4; " if max_length < 4 else ""
        gap += "with max_args=2 a tree is 3j + 1 tokens; " if max_args == 2 else ""
        raise bad_value(
            "max_length",
            f"expected a range [min_length, max_length] that {trees} fall in, got "
            f"[{min_length}, {max_length}] (probability {odds}; {gap}widen the range)",
        )
    raise bad_value(
        "min_length",
        f"expected a length that {trees} reach, got {min_length} (probability {odds} to fall "
        f"in [{min_length}, {max_length}], below {_RAREST:.0e}; lower min_length or raise "
        "max_depth or max_args)",
    )


def _length_probabilities(max_depth: int, max_args: int, max_length: int) -> np.ndarray:
    """``P[L]``, ``L = 0 ... max_length``: the probability that LRA's process makes a tree of
    ``L`` tokens (the mass of longer trees is ``1 - P.sum()``).

    Level by level from the deepest, with generating functions: a node's length is ``1``
    with probability ``1 - VALUE_P`` (always at ``max_depth``), else ``2`` plus the sum of
    ``k`` independent lengths of the level below, ``k`` uniform in ``2 ... max_args``; the
    ``k``-fold sums are products of polynomials, by FFT, truncated at ``max_length``
    (round-off ~1e-16, far below the refusal threshold).
    """
    size_max = max_length + 1
    p = np.zeros(size_max)
    p[1] = 1.0
    top = 1  # the longest tree at this level, capped at max_length
    for _ in range(max_depth - 1):
        width = min(size_max, max_args * top + 1)
        fft_size = 1 << (width + top).bit_length()
        spectrum = np.fft.rfft(p[: top + 1], fft_size)
        power, sums = p[: top + 1], np.zeros(width)
        for _ in range(2, max_args + 1):
            power = np.fft.irfft(np.fft.rfft(power, fft_size) * spectrum, fft_size)[:width]
            power = power.clip(min=0.0)
            sums += power
        p = np.zeros(size_max)
        p[1] = 1.0 - _VALUE_P
        kept = min(width, size_max - 2)
        p[2 : 2 + kept] += _VALUE_P / (max_args - 1) * sums[:kept]
        top = min(max_length, 2 + max_args * top)
    return p


def _uniforms(generator: torch.Generator) -> Iterator[float]:
    """Uniform floats in ``[0, 1)`` from ``generator``, drawn in blocks, handed out one by one."""
    while True:
        yield from torch.rand(_BLOCK, generator=generator, dtype=torch.float64).tolist()


def _draw_tree(
    uniforms: Iterator[float], max_depth: int, max_args: int, max_length: int
) -> list[int] | None:
    """One tree of LRA's process as token ids, in prefix order; ``None`` as soon as it is
    sure to be longer than ``max_length`` (each open operator still owes its ``]``).

    ``open_args[i]``: the arguments the ``i``-th open operator still waits for; the node
    drawn next is at depth ``len(open_args) + 1``. ``min(int(u * n), n - 1)`` is a uniform
    integer of ``0 ... n - 1`` (``u * n`` can round up to ``n``).
    """
    tokens: list[int] = []
    open_args: list[int] = []
    draw = uniforms.__next__
    while len(tokens) + len(open_args) < max_length:
        if len(open_args) + 1 < max_depth and draw() <= _VALUE_P:
            tokens.append(_MIN + min(int(draw() * 4), 3))
            open_args.append(2 + min(int(draw() * (max_args - 1)), max_args - 2))
            continue
        tokens.append(min(int(draw() * 10), 9))
        while open_args:  # a subtree is complete: its parent has one argument fewer
            open_args[-1] -= 1
            if open_args[-1]:
                break
            open_args.pop()
            tokens.append(_END)
        else:
            return tokens  # the root is complete
    return None


def _median(args: list[int]) -> int:
    """``int(np.median(args))`` of digits: the middle one, or the floor of the two middle's mean."""
    ordered = sorted(args)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) // 2


def _sum_mod_10(args: list[int]) -> int:
    return sum(args) % 10


#: what each operator token computes from its arguments
_APPLY: dict[int, Callable[[list[int]], int]] = {
    _MIN: min,
    _MAX: max,
    _MED: _median,
    _SM: _sum_mod_10,
}


def _evaluate(tokens: list[int]) -> int:
    """The value of a tree of token ids, by a stack of the open operators' arguments."""
    stack: list[list[int]] = [[]]
    operators: list[int] = []
    for token in tokens:
        if token == _END:
            value = _APPLY[operators.pop()](stack.pop())
            stack[-1].append(value)
        elif token >= _MIN:
            operators.append(token)
            stack.append([])
        else:
            stack[-1].append(token)
    return stack[0][0]
