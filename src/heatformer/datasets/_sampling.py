"""The random draws the generators share: a private generator from a seed, and ordered samples
without replacement, vectorized over examples.

Every draw goes through the :class:`torch.Generator` that :func:`seeded` makes, never through
torch's or numpy's global state, so the same seed gives the same tensors in any process.
"""

from __future__ import annotations

import torch
from torch import Tensor

from heatformer.checks import bad_type, bad_value

__all__ = [
    "IGNORE_INDEX",
    "check_seed",
    "check_vocab_size",
    "seeded",
    "uniform_without_replacement",
    "weighted_without_replacement",
]

#: the label of an unscored position (``torch.nn.functional.cross_entropy``'s default)
IGNORE_INDEX = -100

#: elements of one block of a per-example table (rows are processed in blocks of this size)
_BLOCK_ELEMENTS = 1 << 22


def check_seed(seed: object) -> int:
    """``seed`` when it is an int ``>= 0`` (not a bool)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise bad_type("seed", f"expected an int >= 0, got {type(seed).__name__}")
    if seed < 0:
        raise bad_value("seed", f"expected an int >= 0, got {seed}")
    return seed


def check_vocab_size(vocab_size: object, minimum: int, why: str) -> int:
    """``vocab_size`` when it is an int ``>= minimum``; ``why`` says what the minimum holds."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise bad_type(
            "vocab_size", f"expected an int >= {minimum}, got {type(vocab_size).__name__}"
        )
    if vocab_size < minimum:
        raise bad_value("vocab_size", f"expected an int >= {minimum} ({why}), got {vocab_size}")
    return vocab_size


def seeded(seed: object) -> torch.Generator:
    """A fresh CPU generator seeded with ``seed`` (checked: an int ``>= 0``)."""
    return torch.Generator().manual_seed(check_seed(seed))


def uniform_without_replacement(
    num_rows: int, population: int, k: int, generator: torch.Generator
) -> Tensor:
    """``(num_rows, k)`` int64: per row, ``k`` distinct integers of ``[0, population)`` in a
    uniformly random order (each ordered ``k``-sample equally likely, like numpy's
    ``choice(population, k, replace=False)``).

    Floyd's algorithm (Bentley & Floyd, CACM 30(9), 1987) draws a uniform ``k``-subset with
    ``k`` draws per row, a table of taken integers answering "already drawn?"; a random
    permutation of the ``k`` columns then makes the order uniform. Rows go in blocks so the
    table holds about ``2**22`` entries.
    """
    out = torch.empty(num_rows, k, dtype=torch.int64)
    block = max(1, _BLOCK_ELEMENTS // population)
    for start in range(0, num_rows, block):
        rows = min(block, num_rows - start)
        taken = torch.zeros(rows, population, dtype=torch.bool)
        picks = torch.empty(rows, k, dtype=torch.int64)
        for i in range(k):
            top = population - k + i  # draw from [0, top]; if taken, take top itself
            draw = torch.randint(0, top + 1, (rows, 1), generator=generator)
            pick = torch.where(taken.gather(1, draw), top, draw)
            taken.scatter_(1, pick, True)
            picks[:, i : i + 1] = pick
        order = torch.rand(rows, k, generator=generator).argsort(dim=1)
        out[start : start + rows] = picks.gather(1, order)
    return out


def weighted_without_replacement(
    num_rows: int, weights: Tensor, k: int, generator: torch.Generator
) -> Tensor:
    """``(num_rows, k)`` int64: per row, ``k`` distinct indices of ``weights`` drawn one after
    the other, each with probability proportional to its weight among those not yet drawn
    (numpy's ``choice(len(weights), k, replace=False, p=weights / weights.sum())``), in the
    order drawn.

    The Gumbel-top-k trick (Vieira 2014; Kool, van Hoof & Welling, ICML 2019): the ``k``
    largest of ``log w_i + G_i`` with i.i.d. standard Gumbel ``G_i``, sorted descending, have
    exactly the distribution of that sequential draw. Computed in float64, rows in blocks.
    """
    log_w = weights.to(torch.float64).log()
    out = torch.empty(num_rows, k, dtype=torch.int64)
    block = max(1, _BLOCK_ELEMENTS // log_w.numel())
    tiny = torch.finfo(torch.float64).tiny
    for start in range(0, num_rows, block):
        rows = min(block, num_rows - start)
        uniform = torch.rand(rows, log_w.numel(), generator=generator, dtype=torch.float64)
        gumbel = -(-uniform.clamp_min(tiny).log()).log()
        out[start : start + rows] = (log_w + gumbel).topk(k, dim=1, sorted=True).indices
    return out
