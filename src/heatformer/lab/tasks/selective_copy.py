"""The ``selective_copy`` task: copy the data tokens scattered among blanks (MAD-Lab, Mamba).

The data are :func:`heatformer.datasets.selective_copy` with MAD-Lab's arguments: the
``num_tokens_to_copy`` data tokens among ``vocab_size - 2`` data ids, blanks, a copy token,
then the tokens to be written in order (teacher-forced: ``val_acc`` is the share of copied
tokens right, chance ``1 / (vocab_size - 2)``). The defaults are MAD-Lab's (16 tokens, a
vocabulary of 16) at length 256. What the synthetic tasks share:
:mod:`heatformer.lab.tasks._synthetic`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from heatformer.lab.tasks._synthetic import SyntheticOptions, SyntheticTask
from heatformer.lab.tasks.options import option

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["SelectiveCopy", "SelectiveCopyOptions"]


@dataclass(frozen=True)
class SelectiveCopyOptions(SyntheticOptions):
    """Options of the ``selective_copy`` task (``--seq-len``, ``--num-tokens-to-copy``, ...)."""

    seq_len: int = option(256, "sequence length, > 2 * num_tokens_to_copy + 1")
    vocab_size: int = option(16, "token ids: data tokens, then the blank and the copy token")
    num_tokens_to_copy: int = option(16, "data tokens to copy, in order")

    def _generate(self, num_examples: int, seed: int) -> tuple[Tensor, Tensor]:
        from heatformer.datasets import selective_copy

        return selective_copy(
            self.vocab_size, num_examples, self.seq_len, seed,
            num_tokens_to_copy=self.num_tokens_to_copy,
        )  # fmt: skip

    def num_tokens(self) -> int:
        return self.vocab_size

    def max_tokens(self) -> int:
        return self.seq_len


class SelectiveCopy(SyntheticTask):
    """Selective copying with a causal GPT (see the module docstring)."""

    name = "selective_copy"
    Options = SelectiveCopyOptions
