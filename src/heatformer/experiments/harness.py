"""Per-task glue between the data, the reference models, the loss and the metrics.

A :class:`TaskHarness` knows, for one task of :mod:`heatformer.experiments.data`:

- which reference model to build (``chars`` -> :class:`~heatformer.models.GPT`,
  ``digits`` -> :class:`~heatformer.models.ViT`, ``recall`` ->
  :class:`~heatformer.models.SequenceClassifier`) from a head schedule and a
  :class:`~heatformer.experiments.spec.CompareSpec`;
- how to draw a training batch and compute its loss;
- how to evaluate on the task's fixed evaluation set (the metrics reported in the
  final table);
- which fixed batch the per-layer token-geometry analysis runs on, and which labels
  group its token states.

Metrics (all on fixed evaluation data, so configurations are comparable):

========  ============================================  ===============================
task      evaluation metrics                            analysis grouping (``nc1``)
========  ============================================  ===============================
chars     ``val_loss`` (nats/byte), ``val_bpc``         next byte of every token
digits    ``test_acc``, ``test_loss``                   class of each image's token mean
recall    ``val_acc``, ``val_loss``                     target of the final-position state
========  ============================================  ===============================

Per layer the analysis reports ``within_seq_var`` (mean squared distance of a sequence's
tokens to their mean), ``within_seq_frac`` (the same divided by the total token
variance of the batch, so it is scale free), ``effective_rank`` (mean over sequences
of the effective rank of the centred token matrix) and ``nc1``
(:func:`~heatformer.analysis.next_token_separability` for chars, with its
``probe_acc``; :func:`~heatformer.analysis.neural_collapse` otherwise). For recall the
final-position states are the features the classifier reads, so ``nc1`` uses those.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from heatformer.experiments.data import (
    CharsTask,
    DigitsTask,
    RecallTask,
    bits_per_char,
    load_chars,
    load_digits_task,
)
from heatformer.experiments.spec import CompareSpec, split_layers

__all__ = [
    "CharsHarness",
    "DigitsHarness",
    "RecallHarness",
    "TaskHarness",
    "make_harness",
]


def autocast(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager[Any]:
    """bfloat16 autocast on ``device`` when ``enabled``, else a no-op context."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


class TaskHarness:
    """Base class: the task-independent parts. Subclasses fill in the rest.

    Args:
        spec: the comparison spec (resolved here).
        task: an already built task object of the right kind (``None``: load it as the
            spec says).

    Attributes:
        spec: the resolved comparison spec.
    """

    #: task name, as in :data:`heatformer.experiments.data.TASK_NAMES`.
    name: ClassVar[str] = ""
    #: evaluation metrics, the first one is the headline metric of plots.
    metric_names: ClassVar[tuple[str, ...]] = ()
    #: whether larger is better for each metric (same order).
    higher_is_better: ClassVar[tuple[bool, ...]] = ()
    #: per-layer analysis metrics.
    analysis_names: ClassVar[tuple[str, ...]] = (
        "within_seq_var",
        "within_seq_frac",
        "effective_rank",
        "nc1",
    )
    #: the metric whose eval curve is drawn next to the training loss.
    eval_loss_name: ClassVar[str] = ""

    def __init__(self, spec: CompareSpec, task: Any = None) -> None:
        self.spec = spec.resolved()
        self._setup(task)

    def _setup(self, task: Any) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def model_config(self, heads: str) -> Any:  # pragma: no cover - abstract
        """The model's config dataclass for the head schedule ``heads``."""
        raise NotImplementedError

    def build_model(self, heads: str) -> nn.Module:  # pragma: no cover - abstract
        """A freshly initialized model (uses the global torch RNG for its weights)."""
        raise NotImplementedError

    def train_batch(
        self, batch_size: int, generator: torch.Generator
    ) -> tuple[Tensor, Tensor]:  # pragma: no cover - abstract
        """A training batch ``(inputs, targets)`` on the CPU, drawn from ``generator``."""
        raise NotImplementedError

    def eval_batches(self) -> Iterator[tuple[Tensor, Tensor]]:  # pragma: no cover - abstract
        """The fixed evaluation set, in batches."""
        raise NotImplementedError

    def analysis_batch(self) -> tuple[Tensor, Tensor]:  # pragma: no cover - abstract
        """The fixed analysis batch ``(inputs, labels)``; see the module docstring."""
        raise NotImplementedError

    # ---------------------------------------------------------------- shared logic

    def _heads_arg(self, heads: str) -> str | tuple[str, ...]:
        return split_layers(heads)

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy (float32) of ``logits`` ``(..., K)`` against ``targets``."""
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def evaluate(
        self, model: nn.Module, device: torch.device, *, bf16: bool = False
    ) -> dict[str, float]:
        """Loss and accuracy on the fixed evaluation set (eval mode, no gradients).

        Args:
            model: the (unwrapped) model.
            device: where the model lives.
            bf16: run the forward passes under bfloat16 autocast.

        Returns:
            The metrics named in :attr:`metric_names`.
        """
        was_training = model.training
        model.eval()
        total_loss, total_correct, total_count = 0.0, 0, 0
        try:
            with torch.no_grad():
                for inputs, targets in self.eval_batches():
                    inputs, targets = inputs.to(device), targets.to(device)
                    with autocast(device, bf16):
                        logits = model(inputs)
                    flat = logits.float().reshape(-1, logits.shape[-1])  # (M, K)
                    flat_targets = targets.reshape(-1)  # (M,)
                    total_loss += float(F.cross_entropy(flat, flat_targets, reduction="sum"))
                    total_correct += int((flat.argmax(-1) == flat_targets).sum())
                    total_count += flat_targets.numel()
        finally:
            model.train(was_training)
        return self._metrics(total_loss / total_count, total_correct / total_count)

    def _metrics(self, loss: float, accuracy: float) -> dict[str, float]:  # pragma: no cover
        raise NotImplementedError

    def layer_metrics(self, model: nn.Module, device: torch.device) -> dict[str, list[float]]:
        """Per-layer token-geometry metrics on the fixed analysis batch.

        Args:
            model: the (unwrapped) model; its ``blocks`` are the layers.
            device: where the model lives.

        Returns:
            ``{metric: [value of layer 0, layer 1, ...]}`` for :attr:`analysis_names`;
            a value that is not finite (e.g. ``nc1`` with coinciding class means) is NaN.
        """
        from heatformer.analysis import collect_token_states

        inputs, labels = self.analysis_batch()
        states = collect_token_states(model, inputs.to(device), to_cpu=True)
        out: dict[str, list[float]] = {name: [] for name in self.analysis_names}
        for x in states.values():
            for name, value in self._layer_values(x.float(), labels).items():
                out[name].append(value if math.isfinite(value) else math.nan)
        return out

    def _layer_values(self, x: Tensor, labels: Tensor) -> dict[str, float]:
        from heatformer.analysis import spectral_decay, within_sequence_variance

        within = float(within_sequence_variance(x))
        flat = x.reshape(-1, x.shape[-1]).double()  # (B * N, D)
        total = float(((flat - flat.mean(0)) ** 2).sum(-1).mean())
        return {
            "within_seq_var": within,
            "within_seq_frac": within / total if total > 0 else math.nan,
            "effective_rank": float(spectral_decay(x).effective_rank.mean()),
            **self._grouping_values(x, labels),
        }

    def _grouping_values(self, x: Tensor, labels: Tensor) -> dict[str, float]:
        from heatformer.analysis import neural_collapse

        return {"nc1": float(neural_collapse(self._pooled(x), labels).nc1)}

    def _pooled(self, x: Tensor) -> Tensor:
        return x.mean(1)  # (B, D) sequence means


def _model_kwargs(
    spec: CompareSpec, heads_arg: str | tuple[str, ...], n_head: int
) -> dict[str, Any]:
    return {
        "n_layer": spec.n_layer,
        "n_head": n_head,
        "n_embd": spec.n_embd,
        "heads": heads_arg,
        "topk": spec.topk,
        "dropout": spec.dropout,
    }


class CharsHarness(TaskHarness):
    """Byte-level language modelling with a GPT (see the module docstring)."""

    name = "chars"
    metric_names = ("val_bpc", "val_loss")
    higher_is_better = (False, False)
    analysis_names = (
        "within_seq_var",
        "within_seq_frac",
        "effective_rank",
        "nc1",
        "probe_acc",
    )
    eval_loss_name = "val_loss"

    def _setup(self, task: Any) -> None:
        self.data: CharsTask = (
            task if task is not None else load_chars(self.spec.text, max_bytes=self.spec.max_bytes)
        )
        self.seq_len: int = self.spec.seq_len or 128
        self.data.num_eval_windows(self.seq_len, self.spec.eval_size)  # checks seq_len

    def model_config(self, heads: str) -> Any:
        from heatformer.models import GPTConfig

        return GPTConfig(
            vocab_size=self.data.vocab_size,
            block_size=self.seq_len,
            **_model_kwargs(self.spec, self._heads_arg(heads), self.spec.heads_per_layer(heads)),
        )

    def build_model(self, heads: str) -> nn.Module:
        from heatformer.models import GPT

        return GPT(self.model_config(heads))

    def train_batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return self.data.get_batch("train", batch_size, self.seq_len, generator)

    def eval_batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        return self.data.eval_batches(64, self.seq_len, max_windows=self.spec.eval_size)

    def _metrics(self, loss: float, accuracy: float) -> dict[str, float]:
        return {"val_bpc": bits_per_char(loss), "val_loss": loss}

    def analysis_batch(self) -> tuple[Tensor, Tensor]:
        size = self.spec.analysis_size or 32
        x, y = next(iter(self.data.eval_batches(size, self.seq_len, max_windows=size)))
        return x, y  # (b, N) inputs and their next bytes

    def _grouping_values(self, x: Tensor, labels: Tensor) -> dict[str, float]:
        from heatformer.analysis import next_token_separability

        result = next_token_separability(x, labels)
        return {"nc1": float(result.nc1), "probe_acc": float(result.probe_accuracy)}


class DigitsHarness(TaskHarness):
    """Image classification with a ViT (see the module docstring)."""

    name = "digits"
    metric_names = ("test_acc", "test_loss")
    higher_is_better = (True, False)
    eval_loss_name = "test_loss"

    def _setup(self, task: Any) -> None:
        self.data: DigitsTask = task if task is not None else load_digits_task(self.spec.npz)
        _, height, width = self.data.image_shape
        if height != width:
            raise ValueError(f"npz: expected square images, got {height}x{width}")
        if height % self.spec.patch_size:
            raise ValueError(
                f"patch_size: expected a divisor of the image size {height}, "
                f"got {self.spec.patch_size}"
            )
        patches = (height // self.spec.patch_size) ** 2
        topk = self.spec.topk
        if topk is not None and topk > patches + 1:  # the ViT reads patches + a cls token
            raise ValueError(
                f"topk: expected at most {patches + 1} edges per query (the ViT's tokens: "
                f"{patches} patches + cls), got {topk}"
            )

    def model_config(self, heads: str) -> Any:
        from heatformer.models import ViTConfig

        channels, size, _ = self.data.image_shape
        return ViTConfig(
            image_size=size,
            patch_size=self.spec.patch_size,
            in_channels=channels,
            num_classes=self.data.num_classes,
            **_model_kwargs(self.spec, self._heads_arg(heads), self.spec.heads_per_layer(heads)),
        )

    def build_model(self, heads: str) -> nn.Module:
        from heatformer.models import ViT

        return ViT(self.model_config(heads))

    def train_batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return self.data.get_batch("train", batch_size, generator)

    def eval_batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        return self.data.eval_batches(256, "test")

    def _metrics(self, loss: float, accuracy: float) -> dict[str, float]:
        return {"test_acc": accuracy, "test_loss": loss}

    def analysis_batch(self) -> tuple[Tensor, Tensor]:
        size = min(self.spec.analysis_size or 512, self.data.test_labels.numel())
        return self.data.test_images[:size], self.data.test_labels[:size]


class RecallHarness(TaskHarness):
    """Associative recall with a causal sequence classifier (see the module docstring)."""

    name = "recall"
    metric_names = ("val_acc", "val_loss")
    higher_is_better = (True, False)
    eval_loss_name = "val_loss"

    def _setup(self, task: Any) -> None:
        self.data: RecallTask = (
            task
            if task is not None
            else RecallTask(seq_len=self.spec.seq_len or 128, val_size=self.spec.eval_size)
        )

    def model_config(self, heads: str) -> Any:
        from heatformer.models import SequenceClassifierConfig

        return SequenceClassifierConfig(
            vocab_size=self.data.vocab_size,
            num_classes=self.data.num_classes,
            block_size=self.data.seq_len,
            pool="last",
            causal=True,
            **_model_kwargs(self.spec, self._heads_arg(heads), self.spec.heads_per_layer(heads)),
        )

    def build_model(self, heads: str) -> nn.Module:
        from heatformer.models import SequenceClassifier

        return SequenceClassifier(self.model_config(heads))

    def train_batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return self.data.get_batch(batch_size, generator)

    def eval_batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        return self.data.eval_batches(128)

    def _metrics(self, loss: float, accuracy: float) -> dict[str, float]:
        return {"val_acc": accuracy, "val_loss": loss}

    def analysis_batch(self) -> tuple[Tensor, Tensor]:
        x, target = next(iter(self.data.eval_batches(self.spec.analysis_size or 256)))
        return x, target

    def _pooled(self, x: Tensor) -> Tensor:
        return x[:, -1]  # (B, D) final-position states, what the classifier reads


_HARNESSES: dict[str, type[TaskHarness]] = {
    "chars": CharsHarness,
    "digits": DigitsHarness,
    "recall": RecallHarness,
}


def make_harness(spec: CompareSpec, task: Any = None) -> TaskHarness:
    """The harness of ``spec.task``, loading its data (or using ``task`` if given).

    Args:
        spec: a comparison spec (resolved or not).
        task: an already built task object of the right kind (tests use tiny ones).

    Returns:
        The harness.

    Raises:
        ValueError: unknown task, or data that does not fit the spec (e.g. a corpus too
            short for ``seq_len``).
        FileNotFoundError: ``spec.text`` / ``spec.npz`` does not exist.
    """
    cls = _HARNESSES.get(spec.task)
    if cls is None:
        raise ValueError(f"task: expected one of {sorted(_HARNESSES)}, got {spec.task!r}")
    return cls(spec, task)
