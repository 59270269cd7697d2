"""The ``passkey`` task: retrieve digits hidden in a long filler text, trained on short
sequences and evaluated at longer ones, with a causal GPT.

The data are :func:`heatformer.datasets.passkey`: ``num_digits`` digits after a ``<key>``
marker at a depth of a repeated sentence, asked for at the end. Training sequences are
``seq_len`` tokens with a uniform depth; so is the fixed evaluation set (``val_acc``,
``val_loss``: the digits, teacher-forced, chance 1/10). Each evaluation also scores a grid,
``grid_size`` examples at every length of ``eval_lengths`` and every depth of ``eval_depths``
(the needle-in-a-haystack table): ``acc_L{length}_d{depth}`` is the accuracy of one cell
(``acc_L1024_d0.5``), ``grid_acc`` their mean (a final metric of the report, and a possible
``--primary`` endpoint; the cells are in each run's ``result.json``).

The model's position table covers the longest length (``block_size = max(seq_len,
eval_lengths)``); the GPT's positions are learned, so the ones beyond ``seq_len`` are never
trained: the grid measures what a model trained at ``seq_len`` does at longer lengths, not a
length-generalizing position scheme. The memory estimate of a run is that of the longest
length. What the synthetic tasks share: :mod:`heatformer.lab.tasks._synthetic`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from heatformer.checks import bad_value, check_positive_int
from heatformer.lab.tasks._synthetic import EVAL_SEED, SyntheticOptions, SyntheticTask
from heatformer.lab.tasks.base import PASS_TOKENS, VALIDATION
from heatformer.lab.tasks.options import option

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

__all__ = ["Passkey", "PasskeyOptions", "cell_name"]


def _ints(text: str) -> tuple[int, ...]:
    """``"256,1024"`` -> ``(256, 1024)`` (the flag's parser)."""
    return tuple(int(part) for part in text.split(","))


def _floats(text: str) -> tuple[float, ...]:
    """``"0,0.5,1"`` -> ``(0.0, 0.5, 1.0)`` (the flag's parser)."""
    return tuple(float(part) for part in text.split(","))


def cell_name(length: int, depth: float) -> str:
    """The metric of one cell of the grid: ``cell_name(1024, 0.5) == "acc_L1024_d0.5"``."""
    return f"acc_L{length}_d{depth:g}"


@dataclass(frozen=True)
class PasskeyOptions(SyntheticOptions):
    """Options of the ``passkey`` task (``--seq-len``, ``--eval-lengths``, ...)."""

    seq_len: int = option(256, "training (and val_acc) sequence length")
    num_digits: int = option(5, "digits of the passkey")
    eval_lengths: tuple[int, ...] = option(
        (256, 1024), "lengths of the evaluation grid", parse=_ints, metavar="N,N,..."
    )
    eval_depths: tuple[float, ...] = option(
        (0.0, 0.25, 0.5, 0.75, 1.0), "needle depths of the evaluation grid, in [0, 1]",
        parse=_floats, metavar="X,X,...",
    )  # fmt: skip
    grid_size: int = option(16, "examples per cell of the evaluation grid")

    def __post_init__(self) -> None:
        for name, kind in (("eval_lengths", int), ("eval_depths", float)):
            value = getattr(self, name)
            if isinstance(value, list):  # a spec.json's list
                object.__setattr__(self, name, value := tuple(value))
            if not (isinstance(value, tuple) and value) or any(
                isinstance(v, bool) or not isinstance(v, (int, kind)) for v in value
            ):
                raise bad_value(name, f"expected a non-empty tuple of numbers, got {value!r}")
            if len(set(value)) != len(value):
                raise bad_value(name, f"expected distinct values, got {value!r}")
        check_positive_int("grid_size", self.grid_size)
        for depth in self.eval_depths:
            if not (math.isfinite(depth) and 0 <= depth <= 1):
                raise bad_value("eval_depths", f"expected depths in [0, 1], got {depth}")
        super().__post_init__()
        for length in self.eval_lengths:
            check_positive_int("eval_lengths", length)
            if length < 2 * self.num_digits + 1:
                raise bad_value(
                    "eval_lengths",
                    f"expected lengths >= 2 * num_digits + 1 = {2 * self.num_digits + 1}, "
                    f"got {length}",
                )

    def _generate(
        self, num_examples: int, seed: int, length: int | None = None, depth: float | None = None
    ) -> tuple[Tensor, Tensor]:
        from heatformer.datasets import passkey

        length = self.seq_len if length is None else length
        return passkey(length, num_examples, seed, depth=depth, num_digits=self.num_digits)

    def cell(self, length: int, depth: float, seed: int) -> tuple[Tensor, Tensor]:
        """``grid_size`` examples of the grid's cell ``(length, depth)``."""
        return self._generate(self.grid_size, seed, length, float(depth))

    def num_tokens(self) -> int:
        from heatformer.datasets import PASSKEY_VOCAB

        return len(PASSKEY_VOCAB)

    def max_tokens(self) -> int:
        return max(self.seq_len, *self.eval_lengths)


class Passkey(SyntheticTask):
    """Passkey retrieval with a causal GPT, with a length x depth grid (see the module
    docstring)."""

    name = "passkey"
    Options = PasskeyOptions
    metric_names = ("val_acc", "grid_acc", "val_loss")
    higher_is_better = (True, True, False)

    options: PasskeyOptions

    def metrics(self, loss: float, accuracy: float) -> dict[str, float]:
        """``val_acc`` and ``val_loss`` (:meth:`evaluate` adds ``grid_acc`` and the cells)."""
        return {"val_acc": accuracy, "val_loss": loss}

    def grid(self) -> list[tuple[int, float]]:
        """The cells ``(length, depth)`` of the evaluation grid, in order."""
        o = self.options
        return [(length, depth) for length in o.eval_lengths for depth in o.eval_depths]

    def _cell_batches(
        self, index: int, length: int, depth: float
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """A cell's examples (seeded by ``EVAL_SEED + 1 + index``) in batches of at most
        ``PASS_TOKENS`` tokens (one sequence at least)."""
        inputs, labels = self.options.cell(length, depth, EVAL_SEED + 1 + index)
        step = max(1, PASS_TOKENS // length)
        return ((inputs[i : i + step], labels[i : i + step]) for i in range(0, len(inputs), step))

    def evaluate(
        self,
        model: nn.Module,
        device: torch.device,
        *,
        precision: str = "fp32",
        shard_of: Any = None,
        batches: Any = None,
    ) -> dict[str, float]:
        """:meth:`Task.evaluate <heatformer.lab.tasks.base.Task.evaluate>` on the evaluation
        set, then on each cell of the grid: ``val_acc``, ``val_loss``, the cells'
        ``acc_L{length}_d{depth}`` and their mean ``grid_acc`` (and each under
        ``validation/`` when the spec selects settings)."""
        base = super().evaluate
        out = base(model, device, precision=precision, shard_of=shard_of, batches=batches)
        if batches is not None:
            return out
        sums: dict[str, float] = {}
        for index, (length, depth) in enumerate(self.grid()):
            cell = base(model, device, precision=precision, shard_of=shard_of,
                        batches=self._cell_batches(index, length, depth))  # fmt: skip
            for key, value in cell.items():
                prefix = VALIDATION if key.startswith(VALIDATION) else ""
                if key == prefix + "val_acc":
                    out[prefix + cell_name(length, depth)] = value
                    sums[prefix] = sums.get(prefix, 0.0) + value
        for prefix, total in sums.items():
            out[prefix + "grid_acc"] = total / len(self.grid())
        return out
