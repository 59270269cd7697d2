"""The ``parity`` task: is the number of ones in a bit string odd? With a causal GPT.

The data are :func:`heatformer.datasets.parity`: ``seq_len - 1`` uniform bits, then ``=``;
the model is scored at ``=`` alone, where it has read every bit (``val_acc``: chance is 1/2).
Its tokens are :data:`~heatformer.datasets.BIT_VOCAB`. What the synthetic tasks share:
:mod:`heatformer.lab.tasks._synthetic`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from heatformer.lab.tasks._synthetic import SyntheticOptions, SyntheticTask
from heatformer.lab.tasks.options import option

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["Parity", "ParityOptions"]


@dataclass(frozen=True)
class ParityOptions(SyntheticOptions):
    """Options of the ``parity`` task (``--seq-len``)."""

    seq_len: int = option(64, "sequence length: seq_len - 1 bits and the question")

    def _generate(self, num_examples: int, seed: int) -> tuple[Tensor, Tensor]:
        from heatformer.datasets import parity

        return parity(num_examples, self.seq_len, seed)

    def num_tokens(self) -> int:
        from heatformer.datasets import BIT_VOCAB

        return len(BIT_VOCAB)

    def max_tokens(self) -> int:
        return self.seq_len


class Parity(SyntheticTask):
    """Parity of bits with a causal GPT, scored at the question (see the module docstring)."""

    name = "parity"
    Options = ParityOptions
