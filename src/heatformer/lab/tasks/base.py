"""What a task of ``heatformer compare`` is (:class:`Task`), and the logic every task shares.

A task is one subclass of :class:`Task` plus one entry of :data:`heatformer.lab.tasks.TASKS`
(:func:`~heatformer.lab.tasks.register_task`). The subclass declares, in one place:

- ``name`` -- what ``--task`` says;
- ``Options`` -- a frozen dataclass of its options with their defaults, each field made with
  :func:`~heatformer.lab.tasks.options.option` (its help line; the command line turns every
  field into a flag);
- :meth:`Task.load_data` -- its data, from the options;
- :meth:`Task.model_config` / :meth:`Task.build_model` -- the reference model for a head
  schedule;
- one batch interface, the same for every task: :meth:`Task.train_batch` (drawn from a
  caller's generator), :meth:`Task.eval_batches` (a fixed set) and :meth:`Task.analysis_batch`
  (the fixed batch of the per-layer analysis, with the labels that group its token states);
- ``metric_names`` / ``higher_is_better`` / ``eval_loss_name`` and :meth:`Task.metrics`
  (the evaluation metrics of the final table, from the mean loss and accuracy).

Everything else -- the loss, evaluation, the per-layer token-geometry analysis -- is shared
here. Per layer the analysis reports ``within_seq_var`` (mean squared distance of a sequence's
tokens to their mean), ``between_seq_var`` (mean squared distance of the sequence means to the
mean token of the batch: ``within_seq_var + between_seq_var`` is the total token variance, every
sequence having the same number of tokens), ``within_seq_frac`` (the share
``within_seq_var / (within_seq_var + between_seq_var)``, scale free: it falls when the first
part falls or the second rises, so the report prints both parts next to it),
``effective_rank`` and ``decay_rate`` (means over sequences of the effective rank and of the
power-law decay exponent of the centred token matrix's singular values,
:func:`~heatformer.analysis.spectral_decay`; sequences whose spectrum has fewer than two
nonzero values have no exponent and are left out of its mean), and ``nc1`` / ``nc2``
(:func:`~heatformer.analysis.neural_collapse` of the pooled states, :meth:`Task.pooled`, against
the labels: variability collapse, and the ``etf_distance`` of the class means from a simplex
ETF; a task may replace them, as ``chars`` does with
:func:`~heatformer.analysis.next_token_separability`, through :meth:`Task.grouping_states` (what
is kept of each slice) and :meth:`Task.grouping_values`). What the analysis reads is the
spec's choice (:meth:`Task.analysis_inputs`, :meth:`Task.analysis_states`): the held-out
:meth:`Task.analysis_batch` (``analysis_split="test"``, the default) or a training batch of the
same size (``"train"``: Neural Collapse is defined on training features); every token, or all
but the model's cls token (``analysis_cls=False``); each block's output, i.e. before the final
LayerNorm (``analysis_point="pre_ln"``, the default), or that output through the model's final
LayerNorm (``"post_ln"``). Evaluation and analysis run in slices of
:attr:`Task.sequences_per_pass` examples (at most :data:`PASS_TOKENS` tokens beyond a training
batch), so that long sequences need no more memory there than in training.

This module imports no torch at import time (the command line reads the options of every task
for its help pages before torch is loaded); the methods import it when they run.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import math
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from heatformer.checks import bad_value
from heatformer.lab.tasks._layer_stats import LayerStats
from heatformer.lab.tasks.options import RunSpec, TaskOptions

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from heatformer.graph_ops import SequenceShard

__all__ = [
    "IGNORE_INDEX",
    "PASS_TOKENS",
    "VALIDATION",
    "NextTokenGrouping",
    "Task",
    "autocast",
]


#: A target of this value is not scored: the loss, the accuracy and the count of scored
#: positions leave it out (``F.cross_entropy``'s default ``ignore_index``; a masked-token task
#: scores only its masked positions this way).
IGNORE_INDEX = -100

#: The prefix of the validation-half metrics in a run's ``final`` and ``evals`` (a spec that
#: selects settings splits the evaluation set, :meth:`Task.evaluate`).
VALIDATION = "validation/"

#: Tokens per forward pass of evaluation and analysis (at least a training batch's): longer
#: batches run in slices (:attr:`Task.sequences_per_pass`), so that evaluating a model of long
#: sequences needs no more memory than training it.
PASS_TOKENS = 8192


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    """The autocast of a run's ``precision`` on ``device``: bfloat16 for ``"bf16"``, float16
    for ``"fp16"``, none (a no-op context) for ``"fp32"``.

    Raises:
        ValueError: another ``precision`` (naming it).
    """
    if precision == "fp32":
        return contextlib.nullcontext()
    import torch

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    if precision not in dtypes:
        raise bad_value("precision", f"expected 'fp32', 'bf16' or 'fp16', got {precision!r}")
    return torch.autocast(device_type=device.type, dtype=dtypes[precision])


class Task(abc.ABC):
    """One task of a comparison, bound to a spec, with its data loaded.

    Args:
        spec: the comparison spec (resolved here); ``spec.task`` names this task and
            ``spec.options`` holds its :attr:`Options`.
        data: the task's data, already built (tests use tiny ones); ``None``: :meth:`load_data`.

    Attributes:
        spec: the resolved spec.
        options: ``spec.options``, an instance of :attr:`Options`.
        data: what :meth:`load_data` returned.

    Raises:
        ValueError: data that do not fit the options, or a head schedule, graph kind or size
            that the task's model config refuses (checked for every schedule of the spec).
    """

    #: the name ``--task`` takes and :data:`~heatformer.lab.tasks.TASKS` files it under
    name: ClassVar[str] = ""
    #: the frozen dataclass of this task's options (fields made with :func:`option`)
    Options: ClassVar[type[TaskOptions]] = TaskOptions
    #: evaluation metrics; the first is the headline metric of plots
    metric_names: ClassVar[tuple[str, ...]] = ()
    #: whether larger is better, for each metric (same order)
    higher_is_better: ClassVar[tuple[bool, ...]] = ()
    #: the metric whose evaluation curve is drawn next to the training loss
    eval_loss_name: ClassVar[str] = ""
    #: per-layer analysis metrics (see the module docstring)
    analysis_names: ClassVar[tuple[str, ...]] = (
        "within_seq_var",
        "between_seq_var",
        "within_seq_frac",
        "effective_rank",
        "decay_rate",
        "nc1",
        "nc2",
    )
    #: builds the data from keyword arguments, for :func:`~heatformer.lab.tasks.load_task`
    #: (``None``: the data come from the options only)
    data_factory: ClassVar[Callable[..., Any] | None] = None

    def __init__(self, spec: RunSpec, data: Any = None) -> None:
        if spec.task != self.name:
            raise bad_value(
                "task", f"expected {self.name!r} for {type(self).__name__}, got {spec.task!r}"
            )
        self.spec: Any = spec.resolved()  # the lab's CompareSpec, duck-typed as a RunSpec here
        self.options: Any = self.spec.options
        self.data: Any = self.load_data() if data is None else data
        self.check_data()
        for heads in self.spec.heads:  # a config is cheap: every refusal before any training
            self.model_config(heads)
        if not self.spec.analysis_cls and self.cls_index() is None:
            raise bad_value(
                "analysis_cls",
                f"expected True for task {self.name!r}: its model has no cls token to leave out "
                "of the analysis, got False",
            )

    # ------------------------------------------------------------------ what a task defines

    @abc.abstractmethod
    def load_data(self) -> Any:
        """The task's data, built from :attr:`options`."""

    def check_data(self) -> None:  # noqa: B027 - optional hook
        """Refuse data that do not fit the options (called once, after loading)."""

    @abc.abstractmethod
    def model_config(self, heads: str) -> Any:
        """The model's config dataclass for the head schedule ``heads``.

        :meth:`model_kwargs` gives the fields every config shares (sizes, heads, graph kinds).
        """

    @abc.abstractmethod
    def build_model(self, heads: str) -> nn.Module:
        """A freshly initialized model (its weights come from the global torch RNG)."""

    @abc.abstractmethod
    def train_batch(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """A training batch ``(inputs, targets)`` on the CPU, drawn from ``generator`` only."""

    @abc.abstractmethod
    def eval_batches(self) -> Iterator[tuple[Tensor, Tensor]]:
        """The fixed evaluation set, in batches ``(inputs, targets)`` (never random)."""

    @abc.abstractmethod
    def analysis_batch(self) -> tuple[Tensor, Tensor]:
        """The fixed analysis batch ``(inputs, labels)``; ``labels`` group the token states."""

    @abc.abstractmethod
    def metrics(self, loss: float, accuracy: float) -> dict[str, float]:
        """The metrics named in :attr:`metric_names`, from the mean evaluation loss and accuracy."""

    # ------------------------------------------------------------------ shared logic

    def model_kwargs(self, heads: str) -> dict[str, Any]:
        """Config fields every reference model shares: the run's model fields and the head
        schedule ``heads``, parsed when the spec was made (:meth:`RunSpec.schedule`)."""
        spec = self.spec
        schedule = spec.schedule(heads)
        return {
            "n_layer": spec.n_layer,
            "n_head": schedule.num_heads,
            "n_embd": spec.n_embd,
            "mlp_ratio": spec.mlp_ratio,
            "zero_init": spec.zero_init_proj,
            "heads": schedule.config_heads,
            "graph": spec.graph,
            "dropout": spec.dropout,
            "activation_checkpointing": spec.activation_checkpointing,
        }

    def scored_logits(
        self,
        model: nn.Module,
        inputs: Tensor,
        targets: Tensor,
        shard: SequenceShard | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``(logits, targets)``: what the loss and the evaluation score, from one forward pass
        of ``model`` (or its DDP or compiled wrapper) on ``inputs`` (with ``shard``: this
        rank's block, ``model(inputs, shard=shard)``).

        Here the model's logits at every position and ``targets`` as given; a task scored at a
        few positions per sequence returns the logits and targets of those alone (the same
        mean loss and accuracy, see :class:`~heatformer.lab.tasks._synthetic.SyntheticTask`).
        """
        logits = model(inputs) if shard is None else model(inputs, shard=shard)
        return logits, targets

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy (in float32, or float64 for float64 logits) of ``logits``
        ``(..., K)`` against ``targets``, over the targets that are not :data:`IGNORE_INDEX`."""
        import torch
        import torch.nn.functional as F

        dtype = torch.promote_types(logits.dtype, torch.float32)  # half -> float32
        flat = logits.to(dtype).reshape(-1, logits.shape[-1])  # (M, K)
        return F.cross_entropy(flat, targets.reshape(-1), ignore_index=IGNORE_INDEX)

    @functools.cached_property
    def sequences_per_pass(self) -> int | None:
        """Examples per forward pass of :meth:`evaluate` and :meth:`layer_metrics`.

        An evaluation or analysis batch of long sequences is run in slices of
        ``max(batch_size, PASS_TOKENS // N)`` examples (``N``: the model's
        ``config.max_tokens()``), so that these passes hold no more activations than a training
        step; the results do not depend on the slicing (every metric is a sum over examples).
        ``None`` when the model's config does not say its length: whole batches.
        """
        config = self.model_config(self.spec.heads[0])
        max_tokens = getattr(config, "max_tokens", None)
        tokens = max_tokens() if callable(max_tokens) else None
        if not isinstance(tokens, int) or tokens <= 0:
            return None
        return max(self.spec.batch_size, PASS_TOKENS // tokens)

    def evaluate(
        self,
        model: nn.Module,
        device: torch.device,
        *,
        precision: str = "fp32",
        shard_of: Callable[[int], SequenceShard | None] | None = None,
        batches: Iterable[tuple[Tensor, Tensor]] | None = None,
    ) -> dict[str, float]:
        """Loss and accuracy on the fixed evaluation set (eval mode, no gradients).

        Each batch of :meth:`eval_batches` (or of ``batches``) runs in slices of
        :attr:`sequences_per_pass`. When the spec selects settings (``spec.select_by``,
        :mod:`heatformer.lab.tuning`) the set is split by example parity, counted over the
        whole set along dim 0: the odd examples (the *test* half) give the metrics, the even
        ones (the *validation* half) the same metrics again under ``"validation/<name>"``.

        Args:
            model: the (unwrapped) model.
            device: where the model lives.
            precision: the autocast of the forward passes, as the run's ``spec.precision``
                (:func:`autocast`): ``"fp32"`` (none), ``"bf16"`` or ``"fp16"``.
            shard_of: sequence parallelism: ``shard_of(N)`` is this rank's block of a
                sequence of ``N`` tokens (:meth:`~heatformer.lab.distributed.
                DistContext.shard`); every rank of the block's group scores its tokens
                (the model takes ``shard=``) and the sums are added over the group, so every
                rank returns the metrics of the whole set.
            batches: the ``(inputs, targets)`` batches to score instead of
                :meth:`eval_batches` (``passkey`` scores each cell of its length x depth grid
                this way).

        Returns:
            :meth:`metrics` of the mean loss and accuracy over every scored position (of the
            test half, and of the validation half prefixed, when the spec selects).
        """
        import torch

        halves = 2 if self.spec.select_by is not None else 1
        totals = [[0.0, 0, 0] for _ in range(halves)]  # loss, correct, count per half
        seen = 0
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                for batch in self.eval_batches() if batches is None else batches:
                    for inputs, targets in _slices(batch, self.sequences_per_pass):
                        parity = (torch.arange(inputs.shape[0]) + seen) % halves  # (b,)
                        seen += inputs.shape[0]
                        for half, total in enumerate(totals):
                            keep = parity == (1 - half if halves == 2 else 0)  # test first
                            _score(
                                self, model, inputs[keep], targets[keep], device, precision, total,
                                shard_of,
                            )  # fmt: skip
        finally:
            model.train(was_training)
        if shard_of is not None:
            totals = _summed_over_group(totals, shard_of)
        if halves == 2 and any(total[2] == 0 for total in totals):
            raise bad_value(
                "select_by",
                f"expected at least {halves} evaluation examples to split into validation and "
                f"test halves, got {seen}",
            )
        out = self.metrics(totals[0][0] / totals[0][2], totals[0][1] / totals[0][2])
        if halves == 2:
            held = self.metrics(totals[1][0] / totals[1][2], totals[1][1] / totals[1][2])
            out.update({VALIDATION + name: value for name, value in held.items()})
        return out

    def analysis_inputs(self) -> tuple[Tensor, Tensor]:
        """The batch ``(inputs, labels)`` the analysis reads, by ``spec.analysis_split``.

        ``"test"``: :meth:`analysis_batch`. ``"train"``: :meth:`train_batch` of as many
        examples, drawn from a generator seeded with 0 (the same batch for every run, whatever
        its seed), whose targets group the token states as the analysis batch's labels do.
        """
        batch = self.analysis_batch()
        if self.spec.analysis_split == "test":
            return batch
        import torch

        return self.train_batch(batch[0].shape[0], torch.Generator().manual_seed(0))

    def cls_index(self) -> int | None:
        """Where the model's cls token sits (its config's ``cls_index()``), ``None`` if none."""
        config = self.model_config(self.spec.heads[0])
        where = getattr(config, "cls_index", None)
        index = where() if callable(where) else None
        return index if isinstance(index, int) else None

    def analysis_states(
        self, model: nn.Module, inputs: Tensor, device: torch.device
    ) -> list[Tensor]:
        """The token states the analysis reads of ``inputs``, one ``(b, N', D)`` CPU tensor per
        block: the block's output (``analysis_point="pre_ln"``) or the model's final LayerNorm
        ``model.ln_f`` of it (``"post_ln"``), without the cls token when
        ``analysis_cls=False`` (``N' = N - 1``).

        Raises:
            ValueError: ``"post_ln"`` on a model without a final ``nn.LayerNorm`` ``ln_f``
                (names ``analysis_point``).
        """
        import torch

        from heatformer.analysis import collect_token_states

        post_ln = self.spec.analysis_point == "post_ln"
        norm = getattr(model, "ln_f", None) if post_ln else None
        if post_ln and not isinstance(norm, torch.nn.LayerNorm):
            raise bad_value(
                "analysis_point",
                f"expected a model with a final LayerNorm ln_f for 'post_ln', got "
                f"{type(model).__name__} without one",
            )
        states = list(collect_token_states(model, inputs.to(device), to_cpu=not post_ln).values())
        if isinstance(norm, torch.nn.LayerNorm):  # on the model's device, then to the CPU
            with torch.no_grad():
                states = [norm(x).cpu() for x in states]
        index = None if self.spec.analysis_cls else self.cls_index()
        if index is not None:
            keep = [i for i in range(states[0].shape[1]) if i != index % states[0].shape[1]]
            states = [x[:, keep] for x in states]  # (b, N - 1, D)
        return states

    def analysis_description(self) -> str:
        """What the analysis read, in words: "the test batch, before the final LayerNorm, cls
        token included" (no word on the cls token for a model without one)."""
        spec = self.spec
        where = "the test batch" if spec.analysis_split == "test" else "a training batch"
        point = "before" if spec.analysis_point == "pre_ln" else "after"
        words = [where, f"{point} the final LayerNorm"]
        if self.cls_index() is not None:
            words.append("cls token included" if spec.analysis_cls else "cls token left out")
        return ", ".join(words)

    def layer_metrics(self, model: nn.Module, device: torch.device) -> dict[str, list[float]]:
        """Per-layer token-geometry metrics on the analysis batch (:meth:`analysis_inputs`,
        :meth:`analysis_states`).

        The batch runs in slices of :attr:`sequences_per_pass`; each layer keeps running sums
        (:class:`~heatformer.lab.tasks._layer_stats.LayerStats`) and the
        :meth:`grouping_states`, never every token state of a long-sequence batch at once.

        Args:
            model: the (unwrapped) model; its ``blocks`` are the layers.
            device: where the model lives.

        Returns:
            ``{metric: [value of layer 0, layer 1, ...]}`` for :attr:`analysis_names`; a value
            that is not finite (e.g. ``nc1`` with coinciding class means) is NaN.
        """
        layers: list[LayerStats] = []
        for inputs, labels in _slices(self.analysis_inputs(), self.sequences_per_pass):
            states = self.analysis_states(model, inputs, device)
            layers = layers or [LayerStats() for _ in states]
            for stats, x in zip(layers, states):
                stats.add(self, x.float(), labels)
        out: dict[str, list[float]] = {name: [] for name in self.analysis_names}
        for stats in layers:
            for name, value in stats.values(self).items():
                out[name].append(value if math.isfinite(value) else math.nan)
        return out

    def layer_values(self, x: Tensor, labels: Tensor) -> dict[str, float]:
        """The analysis metrics of one layer's token states ``x`` ``(B, N, D)``."""
        return LayerStats().add(self, x, labels).values(self)

    def grouping_states(self, x: Tensor) -> Tensor:
        """What :meth:`grouping_values` reads of a slice ``x`` ``(b, N, D)``, concatenated over
        slices along dim 0: by default the :meth:`pooled` states ``(b, D)``."""
        return self.pooled(x)

    def grouping_values(self, states: Tensor, labels: Tensor) -> dict[str, float]:
        """``nc1``, ``nc2``: Neural Collapse of the :meth:`grouping_states` (the pooled states)
        grouped by ``labels``."""
        from heatformer.analysis import neural_collapse

        collapse = neural_collapse(states, labels)
        return {"nc1": float(collapse.nc1), "nc2": float(collapse.etf_distance)}

    def pooled(self, x: Tensor) -> Tensor:
        """One feature per sequence from ``x`` ``(B, N, D)``: the mean over its tokens."""
        return x.mean(1)  # (B, D)


class NextTokenGrouping(Task):
    """A task whose analysis groups every token by its target, not each sequence by a label.

    The grouping keeps every token state (:meth:`grouping_states`) and measures
    :func:`~heatformer.analysis.next_token_separability` against the analysis batch's targets
    (``nc1``, ``probe_acc`` in place of ``nc2``); targets that are :data:`IGNORE_INDEX` are
    skipped, so a task that scores a few positions is grouped by their answers only. The
    language-model tasks (``chars``, ``masked``, and the synthetic benchmarks) are these.
    """

    analysis_names = (*(n for n in Task.analysis_names if n != "nc2"), "probe_acc")

    def grouping_states(self, x: Tensor) -> Tensor:
        return x  # every token, grouped by its target

    def grouping_values(self, states: Tensor, labels: Tensor) -> dict[str, float]:
        from heatformer.analysis import next_token_separability

        result = next_token_separability(states, labels)
        return {"nc1": float(result.nc1), "probe_acc": float(result.probe_accuracy)}


def _score(
    task: Task,
    model: nn.Module,
    inputs: Tensor,
    targets: Tensor,
    device: torch.device,
    precision: str,
    total: list[Any],
    shard_of: Callable[[int], SequenceShard | None] | None = None,
) -> None:
    """Add the summed loss, correct count and count of one slice's scored positions (targets
    other than :data:`IGNORE_INDEX`) to ``total`` (with ``shard_of``: of this rank's block of
    the slice's sequences)."""
    import torch.nn.functional as F

    if not inputs.shape[0]:
        return
    inputs, targets = inputs.to(device), targets.to(device)
    shard = shard_of(inputs.shape[1]) if shard_of is not None else None
    if shard is not None:
        inputs, targets = shard.take(inputs, 1), shard.take(targets, 1)  # (b, n_local)
    with autocast(device, precision):
        logits, targets = task.scored_logits(model, inputs, targets, shard)
    flat = logits.float().reshape(-1, logits.shape[-1])  # (M, K)
    flat_targets = targets.reshape(-1)  # (M,)
    total[0] += float(
        F.cross_entropy(flat, flat_targets, reduction="sum", ignore_index=IGNORE_INDEX)
    )
    total[1] += int((flat.argmax(-1) == flat_targets).sum())  # an ignored target never matches
    total[2] += int((flat_targets != IGNORE_INDEX).sum())


def _summed_over_group(
    totals: list[list[Any]], shard_of: Callable[[int], SequenceShard | None]
) -> list[list[Any]]:
    """Every rank's ``[loss, correct, count]`` sums added over its sequence group."""
    import torch
    import torch.distributed as dist

    shard = shard_of(1)  # any length: its group is the one asked for
    if shard is None:
        return totals
    box = torch.tensor(totals, dtype=torch.float64)  # (halves, 3)
    dist.all_reduce(box, group=shard.group)
    return [[float(loss), int(correct), int(count)] for loss, correct, count in box.tolist()]


def _slices(batch: tuple[Tensor, Tensor], size: int | None) -> Iterator[tuple[Tensor, Tensor]]:
    """``(inputs, targets)`` in slices of at most ``size`` examples along dim 0 (``None``: the
    whole batch)."""
    inputs, targets = batch
    count = inputs.shape[0]
    if size is None or count <= size:
        yield inputs, targets
        return
    for start in range(0, count, size):
        yield inputs[start : start + size], targets[start : start + size]
