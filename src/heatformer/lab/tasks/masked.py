"""The ``masked`` task: masked-byte modelling (BERT-style) on the ``chars`` corpus.

The self-supervised task of the study: the data are those of ``chars`` (:class:`CharsTask`,
:func:`load_chars`: byte streams split by file), the model a *bidirectional* encoder, a
:class:`~heatformer.models.GPT` with ``causal=False`` (every token attends to every token)
over 257 token ids, the 256 byte values and :data:`MASK_ID`. In each window of ``seq_len``
bytes, ``m = max(1, round(mask_rate * seq_len))`` positions drawn uniformly without
replacement (:func:`mask_bytes`) have their byte replaced by :data:`MASK_ID`; the model predicts
the hidden bytes, and only those positions are scored: their targets are the bytes, every other
target is :data:`~heatformer.lab.tasks.base.IGNORE_INDEX`, which the shared loss and
evaluation leave out. Unlike BERT every chosen byte becomes the mask token (no 10 % random and
10 % unchanged), and the exact count ``m`` per sequence keeps the masking rate fixed and every
batch scored.

Metrics, on fixed validation windows with a fixed mask: ``val_bpc`` (bits per masked byte,
:func:`~heatformer.lab.tasks.chars.bits_per_char` of the loss), ``val_acc`` (masked
bytes predicted exactly) and ``val_loss`` (nats per masked byte). The per-layer analysis is that
of every task (within-sequence collapse, spectra, over every token); its grouping reads the
masked positions only, grouped by the byte they hide (``nc1``, ``probe_acc``:
:func:`~heatformer.analysis.next_token_separability` skips the ignored targets), i.e. how
linearly the states the model predicts from separate by their answer. ``seg_score`` asks the
paper's self-supervised question instead, of every token: how well each analysed window's top
principal components separate the Python token categories of its bytes (keyword, identifier,
operator, number, string, comment, layout: :mod:`~heatformer.lab.tasks._python_tokens`, the
split's stream tokenized once), the chance-adjusted balanced accuracy of a leave-one-out
nearest-class-mean probe on each window's top 3 components
(:func:`~heatformer.lab.tasks._segmentation.segmentation_score`, its definition). The analysis
labels are therefore ``(B, N, 2)``: the hidden byte (or the ignore index) and the category of
each position.

Why bytes and not digit patches: this reuses the ``chars`` corpus, its split and windows, the
GPT layout (one flag), the shared cross-entropy loss and evaluation (an ignore index) and the
``chars`` grouping of the analysis; masked patches of 8×8 digits would need a new regression
head, loss and metrics for a near-linear data set.

Every random draw goes through a caller's CPU ``torch.Generator``; the evaluation and analysis
masks come from generators seeded with 0. Tensors are returned on the CPU.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from heatformer.checks import bad_value, check_generator
from heatformer.lab.tasks._python_tokens import byte_categories
from heatformer.lab.tasks._segmentation import segmentation_score
from heatformer.lab.tasks.base import IGNORE_INDEX
from heatformer.lab.tasks.chars import Chars, CharsOptions, bits_per_char
from heatformer.lab.tasks.options import option

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

__all__ = ["MASK_ID", "MaskedChars", "MaskedCharsOptions", "mask_bytes"]

#: The token id of a masked byte (one past the 256 byte values).
MASK_ID = 256

_Split = Literal["train", "val"]


def mask_bytes(
    x: torch.Tensor, mask_rate: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hide ``m = max(1, round(mask_rate * N))`` bytes of every sequence of ``x`` ``(B, N)``.

    The positions are the first ``m`` of a uniformly random permutation of each row (drawn from
    ``generator`` only: the same state gives the same mask).

    Args:
        x: byte values ``(B, N)``, int64 in ``[0, 256)``.
        mask_rate: share of each sequence's bytes to hide, in ``(0, 1]``.
        generator: CPU generator that draws the positions.

    Returns:
        ``(inputs, targets)``, both ``(B, N)`` int64: ``inputs`` is ``x`` with :data:`MASK_ID` at
        the hidden positions; ``targets`` holds their bytes there and
        :data:`~heatformer.lab.tasks.base.IGNORE_INDEX` everywhere else.

    Examples:
        >>> import torch
        >>> x = torch.tensor([[104, 101, 97, 116]])
        >>> inputs, targets = mask_bytes(x, 0.5, torch.Generator().manual_seed(0))
        >>> hidden = inputs == MASK_ID
        >>> int(hidden.sum()), bool((targets[hidden] == x[hidden]).all())
        (2, True)
        >>> targets[~hidden].tolist()
        [-100, -100]
    """
    import torch

    check_generator(generator)
    count = max(1, round(mask_rate * x.shape[1]))
    order = torch.rand(x.shape, generator=generator).argsort(dim=1)  # (B, N) a permutation
    hidden = torch.zeros(x.shape, dtype=torch.bool).scatter_(1, order[:, :count], True)  # (B, N)
    inputs = x.masked_fill(hidden, MASK_ID)
    targets = x.masked_fill(~hidden, IGNORE_INDEX)
    return inputs, targets


@dataclass(frozen=True)
class MaskedCharsOptions(CharsOptions):
    """Options of the ``masked`` task: those of ``chars`` and ``--mask-rate``."""

    mask_rate: float = option(0.15, "share of each sequence's bytes hidden and predicted")

    def __post_init__(self) -> None:
        super().__post_init__()
        rate = self.mask_rate
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1:
            raise bad_value("mask_rate", f"expected a share in (0, 1], got {rate!r}")


class MaskedChars(Chars):
    """Masked-byte modelling with a bidirectional encoder (see the module docstring).

    Everything but the masking, the model's direction and vocabulary, the metrics and
    ``seg_score`` is ``chars``'s: the data, their options, the windows, the analysis grouping.
    """

    name = "masked"
    Options = MaskedCharsOptions
    analysis_names = (*Chars.analysis_names, "seg_score")
    metric_names = ("val_bpc", "val_acc", "val_loss")
    higher_is_better = (False, True, False)
    eval_loss_name = "val_loss"

    options: MaskedCharsOptions

    def model_config(self, heads: str) -> Any:
        from heatformer.models import GPTConfig

        return GPTConfig(
            vocab_size=MASK_ID + 1, block_size=self.options.seq_len, causal=False,
            **self.model_kwargs(heads),
        )  # fmt: skip

    def build_model(self, heads: str) -> nn.Module:
        from heatformer.models import GPT

        return GPT(self.model_config(heads))

    def train_batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        starts = self.data.random_starts("train", batch_size, self.options.seq_len, generator)
        return self._masked("train", starts, generator)

    def _masked(
        self, split: _Split, starts: Tensor, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        """The windows of ``split`` at ``starts`` ``(b,)``, masked by :func:`mask_bytes` with
        ``generator``."""
        x, _ = self.data.windows(split, starts, self.options.seq_len)  # (b, N)
        return mask_bytes(x, self.options.mask_rate, generator)

    def _fixed(self, windows: int) -> tuple[Tensor, Tensor]:
        """The first batch of ``windows`` evenly spaced validation windows, masked with a
        generator seeded with 0."""
        import torch

        starts = self.data.eval_starts(self.options.seq_len, windows)  # (windows,)
        return self._masked("val", starts, torch.Generator().manual_seed(0))

    def eval_batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        inputs, targets = self._fixed(self.options.eval_size)
        return ((inputs[i : i + 64], targets[i : i + 64]) for i in range(0, len(inputs), 64))

    def analysis_batch(self) -> tuple[Tensor, Tensor]:
        """The first :attr:`~MaskedCharsOptions.analysis_size` evaluation windows with their
        fixed mask; labels ``(B, N, 2)``: the hidden byte (else ignored) and the category of
        each position (:meth:`categories`)."""
        import torch

        starts = self.data.eval_starts(self.options.seq_len, self.options.analysis_size)
        return self._labelled("val", starts, torch.Generator().manual_seed(0))  # as _fixed

    def analysis_inputs(self) -> tuple[Tensor, Tensor]:
        """:meth:`analysis_batch` (``analysis_split="test"``), or the training batch of as many
        windows that :meth:`train_batch` draws from a generator seeded with 0 (``"train"``),
        with the same ``(B, N, 2)`` labels."""
        if self.spec.analysis_split == "test":
            return self.analysis_batch()
        import torch

        generator = torch.Generator().manual_seed(0)
        size = self.data.num_eval_windows(self.options.seq_len, self.options.analysis_size)
        starts = self.data.random_starts("train", size, self.options.seq_len, generator)
        return self._labelled("train", starts, generator)

    def _labelled(
        self, split: _Split, starts: Tensor, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:
        """``(inputs, labels)`` of the windows at ``starts``: :meth:`_masked`, and labels
        ``(b, N, 2)``, the targets beside the categories of the window's bytes."""
        import torch

        inputs, targets = self._masked(split, starts, generator)
        where = starts[:, None] + torch.arange(self.options.seq_len)  # (b, N)
        categories = self.categories(split)[where].long()  # (b, N)
        return inputs, torch.stack([targets, categories], -1)  # (b, N, 2)

    def categories(self, split: _Split) -> Tensor:
        """``(num_bytes,)`` int8: the Python token category of every byte of a split's stream
        (:func:`~heatformer.lab.tasks._python_tokens.byte_categories`), tokenized once per task
        (0.1 s for the default corpus's 0.1 MB validation split, 2 s for its 1.9 MB training
        split, measured here)."""
        if split not in self._categories:
            stream = self.data.train if split == "train" else self.data.val
            self._categories[split] = byte_categories(stream.numpy().tobytes())
        return self._categories[split]

    @functools.cached_property
    def _categories(self) -> dict[str, Tensor]:
        return {}

    def grouping_values(self, states: Tensor, labels: Tensor) -> dict[str, float]:
        """``nc1`` and ``probe_acc`` of the states by their hidden byte (``labels[..., 0]``),
        and ``seg_score`` of the windows by their bytes' categories (``labels[..., 1]``)."""
        values = super().grouping_values(states, labels[..., 0])
        return {**values, "seg_score": segmentation_score(states, labels[..., 1])}

    def metrics(self, loss: float, accuracy: float) -> dict[str, float]:
        return {"val_bpc": bits_per_char(loss), "val_acc": accuracy, "val_loss": loss}
