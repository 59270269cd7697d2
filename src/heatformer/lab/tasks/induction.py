"""The ``induction`` task: induction heads (H3, Mamba), with a causal GPT; and
:func:`induction_score`, the same measure on any model.

The data are :func:`heatformer.datasets.induction` with H3's arguments: random tokens of
``0 ... vocab_size - 3`` with a trigger token (``vocab_size - 1``) followed by a pattern of
``induction_len`` tokens, the trigger again at the end; the model is scored on the pattern
after the final trigger (``val_acc``, teacher-forced; chance ``1 / (vocab_size - 2)``). The
defaults are Mamba's training setting (length 256, a vocabulary of 16, one token to recall).
What the synthetic tasks share: :mod:`heatformer.lab.tasks._synthetic`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from heatformer.checks import bad_type, bad_value, check_positive_int
from heatformer.lab.tasks._synthetic import SyntheticOptions, SyntheticTask
from heatformer.lab.tasks.options import option

if TYPE_CHECKING:
    import torch
    from torch import Tensor

__all__ = ["Induction", "InductionOptions", "induction_score"]


@dataclass(frozen=True)
class InductionOptions(SyntheticOptions):
    """Options of the ``induction`` task (``--seq-len``, ``--induction-len``, ...)."""

    seq_len: int = option(256, "sequence length, >= 2 * induction_len + 2")
    vocab_size: int = option(16, "token ids: data tokens, then a no-op and the trigger")
    induction_len: int = option(1, "tokens to recall after the trigger")
    num_triggers: int = option(1, "the most trigger occurrences before the final one")

    def _generate(self, num_examples: int, seed: int) -> tuple[Tensor, Tensor]:
        from heatformer.datasets import induction

        return induction(
            self.vocab_size, num_examples, self.seq_len, seed,
            induction_len=self.induction_len, num_triggers=self.num_triggers,
        )  # fmt: skip

    def num_tokens(self) -> int:
        return self.vocab_size

    def max_tokens(self) -> int:
        return self.seq_len


class Induction(SyntheticTask):
    """Induction heads with a causal GPT (see the module docstring)."""

    name = "induction"
    Options = InductionOptions


def induction_score(
    model: Any,
    *,
    vocab_size: int = 16,
    seq_len: int = 256,
    num_examples: int = 256,
    seed: int = 0,
    induction_len: int = 1,
    batch_size: int = 64,
    device: torch.device | str | None = None,
) -> float:
    """The share of induction answers ``model`` gets right: its most likely next token at the
    scored positions of a fresh :func:`~heatformer.datasets.induction` batch (seeded by
    ``seed``), the pattern after the final trigger.

    The ``induction`` task's ``val_acc`` on another set, for any model that maps token ids
    ``(B, N)`` to next-token logits ``(B, N, V)`` with ``V >= vocab_size`` (a
    :class:`~heatformer.models.GPT`; a Hugging Face causal LM, whose output's ``logits`` are
    read): a trained model of the task scores near 1, chance is ``1 / (vocab_size - 2)``. The
    model runs in eval mode without gradients (its mode is restored).

    Args:
        model: the model (callable on token ids).
        vocab_size: the task's ``V`` (the trigger is token ``V - 1``).
        seq_len: sequence length (at most the model's context).
        num_examples: sequences scored.
        seed: seed of the batch.
        induction_len: tokens to recall after the trigger.
        batch_size: sequences per forward pass.
        device: where the inputs go (default: the device of the model's first parameter, else
            the CPU).

    Returns:
        The accuracy in ``[0, 1]``.

    Raises:
        TypeError: a model whose output is neither a tensor nor has ``logits``.
        ValueError: arguments the generator refuses (naming them), or a model with fewer than
            ``vocab_size`` logits.

    Example:
        >>> import torch
        >>> from heatformer.models import GPT, GPTConfig
        >>> _ = torch.manual_seed(0)
        >>> model = GPT(GPTConfig(vocab_size=16, block_size=32, n_layer=1, n_head=1, n_embd=8))
        >>> score = induction_score(model, seq_len=32, num_examples=8)
        >>> 0 <= score <= 1
        True
    """
    import torch

    from heatformer.datasets import induction

    check_positive_int("batch_size", batch_size)
    inputs, labels = induction(
        vocab_size, num_examples, seq_len, seed, induction_len=induction_len
    )  # (E, N) each
    if device is None:
        first = next(iter(getattr(model, "parameters", lambda: iter(()))()), None)
        device = first.device if first is not None else torch.device("cpu")
    was_training = getattr(model, "training", None)
    if was_training is not None:
        model.eval()
    correct = scored = 0
    try:
        with torch.no_grad():
            for begin in range(0, num_examples, batch_size):
                x = inputs[begin : begin + batch_size].to(device)
                y = labels[begin : begin + batch_size].to(device)
                logits = _logits(model(x), vocab_size)  # (b, N, V)
                keep = y != -100
                correct += int((logits.argmax(-1)[keep] == y[keep]).sum())
                scored += int(keep.sum())
    finally:
        if was_training is not None:
            model.train(was_training)
    return correct / scored


def _logits(output: Any, vocab_size: int) -> Tensor:
    """A model's logits ``(b, N, V)``: its output, or its output's ``logits``; checked to hold
    the task's tokens."""
    import torch

    logits = output if isinstance(output, torch.Tensor) else getattr(output, "logits", None)
    if not isinstance(logits, torch.Tensor):
        raise bad_type(
            "model", f"expected an output that is a logits tensor or has one as .logits, got "
            f"{type(output).__name__}",
        )  # fmt: skip
    if logits.shape[-1] < vocab_size:
        raise bad_value(
            "model", f"expected logits over at least vocab_size={vocab_size} tokens, got "
            f"{logits.shape[-1]}",
        )  # fmt: skip
    return logits
