r"""Before a comparison trains: its memory estimate, the memory available, and timed steps.

:func:`estimate_memory` predicts the peak memory one run of a comparison adds to the process
that has loaded the task's data (the interpreter, torch and the data are already counted by
then), from the model (built on the meta device: no weights are allocated), the graph kind of
every layer, the batch and the sequence length. With ``s`` bytes per value (4: float32),
``P`` parameters, ``L`` layers of width ``D``, ``H`` heads (head width ``D_h``), MLP ratio
``r``, ``N`` tokens per sequence, ``B`` the training micro-batch per process (the batch per
process divided by ``grad_accum``: a step's micro-batches run one after the other, and only
the gradients outlive each), ``B_e`` the examples of one evaluation or analysis pass:

.. math::

    \text{peak} = R_0 + 4 s P + \max(A_\text{train}, A_\text{eval})

- ``4 s P``: the weights, their gradients and AdamW's two moments.
- :math:`A_\text{train} = \sum_\ell B N \big(s\,(12 + 2r) D
  + \sum_h e_\ell\,b_\ell + s\,c_\text{op} D_h [h \text{ not fused}]\big) + 3 s B n V`:
  what backward keeps per token and layer -- ``(12 + 2r) D`` values (the two LayerNorms'
  inputs and outputs, ``q, k, v``, the heads' output before and after merging, the
  residual, the MLP's hidden layer before and after GELU) -- plus, per head, the graph
  kind's stored edges: ``e`` edges per row (:meth:`~heatformer.graph_ops.GraphBuilder.
  edges_per_row`) of ``b`` bytes each (:meth:`~heatformer.graph_ops.GraphBuilder.
  saved_bytes_per_edge`: 0 for ``softmax``, whose fused SDPA path recomputes its weights;
  a weight for ``window``; a weight and an index for ``topk``); a head whose operator is not
  affine in ``P v`` (heat, PageRank, polynomial, mean, center, skip: one propagation or
  more of its own) keeps ``c_op = 20`` values of its width per token more (fitted on
  ``heat[t=1]``, the most expensive default; an upper bound for the one-propagation heads
  ``mean``, ``center``, ``skip``); and the logits ``(B, n, V)`` of ``n`` scored positions per
  sequence, their float32 copy and their gradient. With activation checkpointing
  (``--activation-checkpointing``) backward keeps the two branch inputs of every block,
  ``2 s D`` per token and layer, and recomputes one residual branch at a time: the sum over
  layers becomes ``2 s D L`` plus the largest branch, an attention branch's ``8 D`` values
  (its LayerNorm's output, ``q, k, v``, the heads' output before and after merging, the
  projection) with its graph's edges, or an MLP branch's ``(2 + 2r) D``.
- :math:`A_\text{eval} = B_e N (s (4 + 2r) D + \max_\ell \sum_h e\,b) + 2 s B_e n V`:
  one layer's values at a time under ``no_grad`` (its input, ``q, k, v``, the heads' output,
  the MLP's hidden layer before and after GELU), and the logits, for the evaluation and the
  analysis passes, which run ``B_e`` examples at a time (the larger of their batches, in
  slices of :attr:`~heatformer.lab.tasks.Task.sequences_per_pass`).
- ``R_0 = 64 MiB``: what the first run loads and keeps whatever the model (kernels, lazily
  imported modules, caches, the code pages of torch's libraries it touches). It depends on the
  machine more than the rest: measured here, a first run peaks 26-41 MiB above a second run of
  the same model in the same process, of which 25-27 MiB are code pages (file-backed: shared
  and reclaimable) and 2-15 MiB anonymous; on the CI machine first runs peaked 23-37 MiB
  higher still, hence the margin.

The formula was checked against measured peaks (``tests/lab/test_preflight.py``), with
glibc's mmap threshold fixed at 1 MiB as the command does (:mod:`heatformer.lab.cli._heap`:
freed large blocks leave the process, so the passes without gradients start from the weights,
not on top of the training's activations). Each case trains a whole run twice in one fresh
process after loading its data: ``R_0`` must cover the anonymous memory the first run's peak
adds over the second's (code pages are file-backed: shared, and reclaimed under pressure),
and the rest of the estimate must lie within 30 % of the second run's peak resident set over
its resident set before it (ratios 0.86-1.16 for the six measured cases). On CUDA it describes the
caching allocator less well (its own rounding); it is an estimate, to refuse what cannot fit,
not an accounting.

:func:`time_steps` runs a few real steps of a configuration (after a warm-up) and one
evaluation, which ``heatformer compare --dry-run`` extrapolates to the whole plan
(:func:`plan_time`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heatformer.checks import bad_value

if TYPE_CHECKING:
    import torch
    from torch import nn

    from heatformer.lab.spec import CompareSpec
    from heatformer.lab.tasks.base import Task
    from heatformer.models import DiffusionAttention

__all__ = [
    "MemoryEstimate",
    "StepTimes",
    "available_memory",
    "check_memory",
    "estimate_memory",
    "evaluations_per_run",
    "plan_time",
    "time_steps",
]

#: ``R_0``: bytes the first run loads and keeps whatever the model.
RUNTIME_BYTES = 64 * 2**20
#: ``c_op``: values per token a head keeps whose operator is not affine in ``P v``.
OPERATOR_VALUES = 20


@dataclass(frozen=True)
class MemoryEstimate:
    """The estimated peak memory one run adds to a process that has loaded its data.

    Attributes:
        weights: weights, gradients and the two AdamW moments (``4 s P``), bytes.
        training: ``A_train``: what backward keeps.
        evaluation: ``A_eval``: the largest pass without gradients.
        runtime: ``R_0``.
    """

    weights: int
    training: int
    evaluation: int
    runtime: int = RUNTIME_BYTES

    @property
    def total(self) -> int:
        """The estimated peak, in bytes."""
        return self.weights + self.runtime + max(self.training, self.evaluation)

    def describe(self) -> str:
        """``"1.21 GB (weights and optimizer 0.01, training 1.0, evaluation 0.2 GB)"``."""
        return (
            f"{_gb(self.total)} GB (weights and optimizer {_gb(self.weights)}, training "
            f"{_gb(self.training)}, evaluation {_gb(self.evaluation)} GB)"
        )


def _gb(size: float) -> str:
    return f"{size / 1e9:.2f}"


def _layer_bytes(layer: DiffusionAttention, tokens: int, itemsize: int) -> tuple[int, int]:
    """Bytes per token of one attention layer's graphs: ``(stored edges, unfused heads)``."""
    kind = layer.graph_kind
    edges = kind.edges_per_row(tokens, causal=bool(layer.causal))
    per_head = edges * kind.saved_bytes_per_edge(itemsize)
    unfused = layer.num_heads - len(layer.fused_heads)
    return layer.num_heads * per_head, unfused * OPERATOR_VALUES * layer.head_dim * itemsize


def estimate_memory(task: Task, heads: str, *, batch_size: int | None = None) -> MemoryEstimate:
    """The estimated peak memory of one run of ``heads`` on ``task`` (the formula above).

    Args:
        task: the task, its data loaded (``task.spec`` gives the batch and the model).
        heads: the run's head schedule.
        batch_size: the training batch of this process (default ``task.spec.batch_size``;
            under DDP the global batch divided by the processes); it trains in micro-batches
            of ``batch_size / task.spec.grad_accum`` examples, which ``B`` is.

    Returns:
        The estimate, in bytes.
    """
    import torch

    from heatformer.models import DiffusionAttention

    spec = task.spec
    batch = max(1, (batch_size or spec.batch_size) // spec.grad_accum)  # one micro-batch
    itemsize = 4
    with torch.device("meta"):
        model = task.build_model(heads)
    config: Any = model.config
    n, d, r = config.max_tokens(), config.n_embd, config.mlp_ratio
    layers = [m for m in model.modules() if isinstance(m, DiffusionAttention)]
    graph_bytes = [_layer_bytes(layer, n, itemsize) for layer in layers]
    if getattr(config, "activation_checkpointing", False):  # inputs kept, one branch at a time
        branch = max((itemsize * 8 * d + e + u for e, u in graph_bytes), default=0)
        branch = max(branch, itemsize * (2 + 2 * r) * d)
        per_token = 2 * itemsize * d * len(layers) + branch
    else:
        per_token = sum(itemsize * (12 + 2 * r) * d + e + u for e, u in graph_bytes)
    scored, classes = _logits_shape(task, model)
    train = batch * n * per_token + 3 * itemsize * batch * scored * classes
    passes = _pass_size(task)
    widest = max((e for e, _ in graph_bytes), default=0)
    evaluation = passes * n * (itemsize * (4 + 2 * r) * d + widest)
    evaluation += 2 * itemsize * passes * scored * classes
    params = sum(p.numel() for p in model.parameters())
    return MemoryEstimate(
        weights=4 * itemsize * params,
        training=train,
        evaluation=evaluation,
    )


def _logits_shape(task: Task, model: nn.Module) -> tuple[int, int]:
    """``(n, V)``: positions scored per sequence and classes per position."""
    import torch
    from torch import nn

    _, targets = task.train_batch(1, torch.Generator().manual_seed(0))
    head = getattr(model, "head", None)
    classes = head.out_features if isinstance(head, nn.Linear) else 0
    return targets[0].numel(), classes


def _pass_size(task: Task) -> int:
    """``B_e``: examples per no-grad pass -- the larger of the first evaluation batch and the
    analysis batch, in slices of at most :attr:`~heatformer.lab.tasks.Task.
    sequences_per_pass`."""
    inputs, _ = next(iter(task.eval_batches()))
    largest = max(inputs.shape[0], task.analysis_batch()[0].shape[0] if task.spec.analysis else 0)
    per_pass = task.sequences_per_pass
    return int(largest if per_pass is None else min(largest, per_pass))


def available_memory(device: torch.device) -> tuple[int, str] | None:
    """The memory a new allocation can take on ``device``, and where the number comes from.

    CUDA: the free memory of the device (``torch.cuda.mem_get_info``); CPU: ``MemAvailable``
    of ``/proc/meminfo`` (Linux). ``None`` where neither can be read.
    """
    import torch

    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), f"free on {device}"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "MemAvailable"
    except OSError:
        return None
    return None


def check_memory(
    estimate: MemoryEstimate, available: tuple[int, str] | None, *, seq_len: int | None = None
) -> None:
    """Refuse a run whose estimated peak exceeds the memory available.

    Raises:
        ValueError: naming ``batch_size`` (and ``--seq-len`` when the task has one,
            ``--grad-accum``), with the estimate, the memory available and ``--force``.
    """
    if available is None or estimate.total <= available[0]:
        return
    lower = "--batch-size" + (f" or --seq-len (now {seq_len})" if seq_len else "")
    raise bad_value(
        "batch_size",
        f"the estimated peak memory of a run, {estimate.describe()}, exceeds the "
        f"{_gb(available[0])} GB available ({available[1]}); lower {lower}, split each step "
        "into micro-batches (--grad-accum), or pass --force to run anyway",
    )


@dataclass(frozen=True)
class StepTimes:
    """Measured seconds of one configuration.

    Attributes:
        step: one optimizer step (the mean of the timed steps).
        evaluation: one evaluation on the fixed set.
        analysis: the per-layer analysis at the end of a run (0 when turned off).
    """

    step: float
    evaluation: float
    analysis: float


def time_steps(
    task: Task, heads: str, device: torch.device, *, steps: int = 2, warmup: int = 1
) -> StepTimes:
    """Time ``steps`` real optimizer steps of ``heads`` after ``warmup`` untimed ones, one
    evaluation and (if the spec asks for it) the analysis, on a fresh model; writes nothing.

    A step is the trainer's (:mod:`heatformer.lab.step`): ``spec.grad_accum`` micro-batches,
    under the autocast (and with the gradient scaler) of ``spec.precision``.

    Args:
        task: the task.
        heads: the head schedule.
        device: where to run.
        steps: timed steps, at least 1.
        warmup: untimed steps first (first-call costs: allocation, kernel choice).
    """
    import torch

    from heatformer.lab.step import backward_pass, build_optimizer, make_scaler, optimizer_step

    spec = task.spec
    if steps < 1:
        raise bad_value("steps", f"expected at least 1 timed step, got {steps}")
    torch.manual_seed(0)
    model = task.build_model(heads).to(device)
    optimizer = build_optimizer(model, spec.lr, spec.weight_decay)
    scaler = make_scaler(spec.precision, device)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for i in range(warmup + steps):
        if i == warmup:
            started = time.perf_counter()
        inputs, targets = task.train_batch(spec.batch_size, generator)
        inputs, targets = inputs.to(device), targets.to(device)
        backward_pass(task, model, optimizer, inputs, targets, None, None, scaler)
        optimizer_step(task, model, optimizer, scaler)
    _sync(device)
    step = (time.perf_counter() - started) / steps
    started = time.perf_counter()
    task.evaluate(model, device, precision=spec.precision)
    evaluation = time.perf_counter() - started
    started = time.perf_counter()
    if spec.analysis:
        task.layer_metrics(model, device)
    return StepTimes(step, evaluation, time.perf_counter() - started if spec.analysis else 0.0)


def _sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def evaluations_per_run(spec: CompareSpec) -> int:
    """Evaluations of one run: every ``eval_every`` steps and at the last step.

    Example:
        >>> from heatformer.lab.spec import CompareSpec
        >>> evaluations_per_run(CompareSpec(steps=500, eval_every=50)), evaluations_per_run(
        ...     CompareSpec(steps=10, eval_every=4))
        (10, 3)
    """
    resolved = spec.resolved()
    every = int(resolved.eval_every or 1)
    return spec.steps // every + (1 if spec.steps % every else 0)


def plan_time(spec: CompareSpec, times: dict[str, StepTimes]) -> float:
    """Seconds of the whole comparison: every run's steps, evaluations and analysis.

    ``times`` holds the measured :class:`StepTimes` of each head schedule of ``spec``.
    """
    evals = evaluations_per_run(spec)
    per_run = {
        heads: spec.steps * t.step + evals * t.evaluation + t.analysis for heads, t in times.items()
    }
    return len(spec.seeds) * sum(per_run[heads] for heads in spec.heads)
