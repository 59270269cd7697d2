"""The ``listops`` task: the value of a nested list expression (Long Range Arena), with a
causal GPT scored at the expression's last token.

The data are :func:`heatformer.datasets.listops` with LRA's arguments: trees of at most
``max_depth`` levels whose operators take up to ``max_args`` arguments, ``min_length`` to
``seq_len`` tokens long (the lab's ``seq_len`` is LRA's ``max_length``), padded to ``seq_len``;
their tokens are :data:`~heatformer.datasets.LISTOPS_VOCAB`. ``val_acc`` is LRA's accuracy,
one answer per expression (ten classes; the most frequent value is about a sixth). The
defaults are a CPU scale; LRA's board used ``--min-length 501 --seq-len 1999`` and 96,000
training examples (here every batch is fresh). What the synthetic tasks share:
:mod:`heatformer.lab.tasks._synthetic`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from heatformer.lab.tasks._synthetic import SyntheticOptions, SyntheticTask
from heatformer.lab.tasks.options import option

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["ListOps", "ListOpsOptions"]


@dataclass(frozen=True)
class ListOpsOptions(SyntheticOptions):
    """Options of the ``listops`` task (``--seq-len``, ``--min-length``, ...)."""

    renamed: ClassVar[dict[str, str]] = {"max_length": "seq_len"}

    seq_len: int = option(1024, "the most tokens of an expression (LRA's max_length)")
    min_length: int = option(256, "the fewest tokens of an expression")
    max_depth: int = option(10, "levels of an expression's tree")
    max_args: int = option(10, "the most arguments of an operator")

    def _generate(self, num_examples: int, seed: int) -> tuple[Tensor, Tensor]:
        from heatformer.datasets import listops

        return listops(
            num_examples, seed, min_length=self.min_length, max_length=self.seq_len,
            max_depth=self.max_depth, max_args=self.max_args,
        )  # fmt: skip

    def num_tokens(self) -> int:
        from heatformer.datasets import LISTOPS_VOCAB

        return len(LISTOPS_VOCAB)

    def max_tokens(self) -> int:
        return self.seq_len


class ListOps(SyntheticTask):
    """ListOps with a causal GPT, scored at each expression's last token (see the module
    docstring)."""

    name = "listops"
    Options = ListOpsOptions
