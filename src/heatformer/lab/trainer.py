"""Train one run (one head schedule, one seed), resumably.

A run lives in its own folder:

- ``checkpoint.pt`` -- model, optimizer, data-generator and torch RNG states, the step
  and the curves so far; written atomically every ``ckpt_every`` steps, when a stop is
  requested, and at the end (the final weights, which ``heatformer analyze`` reads); also a
  model file: ``heatformer.models.load_model(run_dir)`` loads the model it holds.
- ``result.json`` -- written atomically *last*, after the final checkpoint and the
  analysis. Its presence is what makes a run finished; nothing else counts.
- ``metrics.jsonl`` -- every training step and evaluation, appended as it happens (and, with
  ``log="tensorboard"``, TensorBoard event files in ``tensorboard/``); a resume drops what
  came after its checkpoint (:mod:`heatformer.lab.metrics`).

Resuming restores every piece of state the next step depends on, so on the CPU a
resumed run produces the same loss curve, bit for bit, as an uninterrupted one.

The seed sets the global torch RNG right before the model is built (the weights) and
seeds a private CPU :class:`torch.Generator` that draws every training batch (the
batch order); dropout uses the global RNG, whose state is checkpointed too.

Stops (Ctrl-C, SIGTERM, :class:`StopSignal`) are honoured within seconds and the checkpoint
always holds a completed step; :mod:`heatformer.lab.stop` says how, and what happens
under DDP.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from heatformer.analysis.drift import weight_drift
from heatformer.analysis.filters import polynomial_filters
from heatformer.checks import bad_value
from heatformer.lab.checkpoint import (
    atomic_write_json,
    hold_folder,
    load_checkpoint,
    read_json,
)
from heatformer.lab.distributed import DistContext
from heatformer.lab.metrics import MetricsLog
from heatformer.lab.progress import Progress
from heatformer.lab.resume import (
    CHECKPOINT_NAME,
    ModelFactory,
    RunState,
    make_model,
    resume_run,
    setup_run,
)
from heatformer.lab.step import backward_pass, check_precision, optimizer_step
from heatformer.lab.stop import (
    StopRequested,
    StopSignal,
    TrainingInterrupted,
    step_restorer,
)
from heatformer.lab.tasks.base import Task

__all__ = [
    "MIN_GRAD_SCALE",
    "RESULT_NAME",
    "TrainingDiverged",
    "analyze_run",
    "is_finished",
    "train_run",
]

#: The result's file name inside a run folder (the checkpoint's: :data:`CHECKPOINT_NAME`).
RESULT_NAME = "result.json"

#: Under ``precision="fp16"``, a non-finite loss stops a run as diverged once the gradient
#: scaler's scale is below this: from torch's initial ``2**16``, 17 steps in a row skipped for
#: inf/NaN gradients (a float16 forward that overflows at every scale), while one such step
#: now and then only costs the step.
MIN_GRAD_SCALE = 1.0


class TrainingDiverged(ValueError):
    """The training loss of a run became NaN or infinite; the run stopped there.

    Raised at the first non-finite loss instead of training on with NaN weights (under
    ``precision="fp16"``, whose gradient scaler skips such steps, at the first once its scale
    is below :data:`MIN_GRAD_SCALE`). The bad step is not checkpointed: the run folder keeps
    its last periodic checkpoint, and the runs that finished before it keep their results.

    Attributes:
        run_dir: the run folder.
        step: the step whose loss was not finite (1-based).
        loss: that loss.
    """

    def __init__(self, run_dir: Path, step: int, steps: int, loss: float, lr: float) -> None:
        super().__init__(
            f"run {run_dir.name}: expected a finite training loss, got {loss} at step "
            f"{step}/{steps} (learning rate {lr:g}); training diverged: lower lr, keep "
            "grad_clip > 0, or train with --precision fp32"
        )
        self.run_dir = run_dir
        self.step = step
        self.loss = loss


def is_finished(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` finished (its ``result.json`` exists)."""
    return (run_dir / RESULT_NAME).is_file()


def _model_config_dict(model: nn.Module) -> dict[str, Any] | None:
    config = getattr(model, "config", None)
    if config is not None and dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    return None


def train_run(
    task: Task,
    heads: str,
    seed: int,
    run_dir: Path,
    *,
    ctx: DistContext | None = None,
    stop: StopSignal | None = None,
    stop_at_step: int | None = None,
    progress: bool = False,
    model_factory: ModelFactory | None = None,
    log: str = "jsonl",
) -> dict[str, Any]:
    """Train (or resume, or just read back) one run and return its record.

    If ``run_dir/result.json`` exists the run is finished and its record is returned
    as is. Otherwise this process becomes the one writer of ``run_dir`` (it holds its lock,
    :func:`~heatformer.lab.checkpoint.hold_folder`, unless it holds the lock of a
    folder above it, as :func:`~heatformer.lab.compare.run_compare` does) and the run
    starts from ``run_dir/checkpoint.pt`` if there is one (made by the same spec, head
    schedule and seed -- else ``ValueError``), or from scratch, trains to ``spec.steps``,
    evaluates every ``eval_every`` steps and at the end, computes the per-layer analysis
    (if ``spec.analysis``), and writes ``result.json`` last. ``eval_every``, ``ckpt_every``
    and the warm-up are those of :meth:`CompareSpec.resolved` (the one place for their
    defaults).

    Args:
        task: the task (holds the spec and the data).
        heads: the head schedule of this run.
        seed: the seed of this run (initial weights and batch order).
        run_dir: the run folder (created if missing).
        ctx: device and DDP context; default: single process on ``spec.device``.
        stop: a stop flag (e.g. set by Ctrl-C); checked after every step.
        stop_at_step: stop as if interrupted when the run reaches this step (for tests
            and time-sliced jobs); ignored if ``>= spec.steps``.
        progress: report progress on stderr (rank 0 only; see :mod:`heatformer.lab.progress`:
            a bar on a terminal, one line per 10 % of the steps otherwise).
        model_factory: builds the model; default ``task.build_model``.
        log: ``"jsonl"`` (every step and evaluation appended to ``run_dir/metrics.jsonl``) or
            ``"tensorboard"`` (also event files); one of :data:`~heatformer.lab.metrics.LOGS`.

    Returns:
        The run record: ``heads``, ``seed``, ``steps``, ``num_params``, ``train_loss``
        (one value per step, the global-batch mean), ``evals`` (a list of
        ``{"step": s, metric: value}``), ``final`` (metrics at the last step),
        ``analysis`` (``{metric: [per layer]}``, empty if disabled), ``filters`` and ``drift``
        (per layer, the ``as_dict()`` of :func:`~heatformer.analysis.polynomial_filters` and
        :func:`~heatformer.analysis.weight_drift`: each polynomial head's coefficients and band,
        each untied skip head's distance from its start; empty without such heads),
        ``train_time_s``, ``model_config``, ``world_size`` (of the last stretch) and
        ``world_sizes`` (every stretch trained with another number of processes:
        ``[{"world_size": 2, "from_step": 0}, {"world_size": 1, "from_step": 120}]``).

    Raises:
        TrainingInterrupted: a stop was requested; the checkpoint is saved.
        TrainingDiverged: the training loss became NaN or infinite (a ``ValueError``).
        FolderInUse: another process writes ``run_dir``.
        ValueError: the checkpoint belongs to another configuration.
        ImportError: ``log="tensorboard"`` without the ``tensorboard`` package.

    Warns:
        WorldSizeChanged: the checkpoint was written by another number of processes.
    """
    from heatformer.lab.distributed import resolve_device

    spec = task.spec.resolved()
    ctx = ctx or DistContext(device=resolve_device(spec.device))
    check_precision(spec.precision, ctx.device)
    stop = stop or StopSignal()
    run_dir = Path(run_dir)
    if is_finished(run_dir):
        record: dict[str, Any] = read_json(run_dir / RESULT_NAME)
        return record
    with hold_folder(run_dir, ctx, create=True, argument="run_dir"):
        if ctx.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)  # under a comparison's lock
        ctx.barrier()
        run = setup_run(task, heads, seed, run_dir, spec, ctx, model_factory)
        resume_run(run)
        return _train(run, stop, stop_at_step, progress, log)


def analyze_run(
    run_dir: Path,
    heads: str,
    task: Task,
    device: torch.device,
    model_factory: ModelFactory | None = None,
) -> dict[str, Any]:
    """Recompute the per-layer analysis of the finished run in ``run_dir`` from its final
    checkpoint and rewrite its ``result.json`` with it and the ``filters`` and ``drift`` of its
    weights (atomically); returns the record. The record of a run that diverged, which has no
    final weights, is returned as it is.

    Raises:
        ValueError: ``run_dir`` holds no checkpoint of the run's last step
            (``task.spec.steps``).
    """
    record: dict[str, Any] = read_json(run_dir / RESULT_NAME)
    if "diverged" in record:  # a diverged candidate has no final weights
        return record
    saved = load_checkpoint(run_dir / CHECKPOINT_NAME)
    if saved is None or int(saved["step"]) != task.spec.steps:
        raise ValueError(f"{run_dir}: expected the final checkpoint of a finished run, found none")
    model = make_model(task, heads, model_factory)
    model.load_state_dict(saved["model"])
    record["analysis"] = task.layer_metrics(model.to(device), device)
    record["filters"] = [f.as_dict() for f in polynomial_filters(model)]
    record["drift"] = [d.as_dict() for d in weight_drift(model)]
    atomic_write_json(run_dir / RESULT_NAME, record)
    return record


def _parallel(run: RunState) -> nn.Module:
    """What runs the forward pass: the model, wrapped in DDP under ``torchrun`` and compiled
    with ``spec.compile`` (after :func:`resume_run`: DDP broadcasts rank 0's weights)."""
    train_model: nn.Module = run.model
    if run.ctx.distributed and run.ctx.sequence_parallel == 1:  # else reduce_gradients
        from torch.nn.parallel import DistributedDataParallel

        device = run.ctx.device
        train_model = DistributedDataParallel(
            run.model, device_ids=[device.index] if device.type == "cuda" else None
        )
    if run.spec.compile:
        train_model = torch.compile(train_model)  # type: ignore[assignment]
    return train_model


def _step(
    run: RunState,
    train_model: nn.Module,
    shard: slice,
    buffers: list[Tensor],
    stop: StopSignal,
    interruptible: bool,
    stop_at_step: int | None,
) -> tuple[float, bool]:
    """One training step on this rank's ``shard`` of the global batch.

    A stop inside the interruptible part (any of the ``grad_accum`` micro-batches) discards
    the step (gradients dropped, the data generator, RNG states and ``buffers`` put back) and
    propagates :class:`StopRequested`.

    Returns:
        The step's loss (the global-batch mean) and whether a stop was requested on any rank.

    Raises:
        TrainingDiverged: the loss is not finite (the same on every rank); under
            ``precision="fp16"`` only once the gradient scaler, which skips such steps and
            halves its scale at each, has its scale below :data:`MIN_GRAD_SCALE`.
    """
    task, spec, ctx, device = run.task, run.spec, run.ctx, run.ctx.device
    started = time.perf_counter()
    for group in run.optimizer.param_groups:
        group["lr"] = spec.lr_at(run.step)
    restore = step_restorer(run.generator, device, buffers)
    try:
        with stop.interruptible(interruptible):
            inputs, targets = task.train_batch(spec.batch_size, run.generator)  # global
            inputs, targets = inputs[shard].to(device), targets[shard].to(device)
            sequence = ctx.shard(inputs.shape[1])  # this rank's block of every sequence
            if sequence is not None:
                inputs, targets = sequence.take(inputs, 1), sequence.take(targets, 1)
            loss = backward_pass(
                task, run.model, run.optimizer, inputs, targets, train_model, sequence, run.scaler
            )
    except StopRequested:  # the step is discarded: back to the last completed one
        run.optimizer.zero_grad(set_to_none=True)
        restore()
        raise
    ctx.reduce_gradients(run.model)  # sequence parallelism (DDP reduced them in backward)
    stepped = optimizer_step(task, run.model, run.optimizer, run.scaler)
    run.step += 1
    if stop_at_step is not None and run.step == stop_at_step < spec.steps:
        stop.request(f"--stop-at-step {stop_at_step}")
    flag = torch.tensor(float(stop.requested), dtype=torch.float64, device=device)
    status = torch.stack((loss.detach().double(), flag))  # (2,) local loss, local stop flag
    if ctx.distributed:  # the mean of the replicas' losses (a rank's share, summed, with P > 1)
        dist.all_reduce(status)
        status[0] /= ctx.data_world_size
    value = float(status[0])
    # the same on every rank (all-reduced); a step the scaler skipped is not divergence
    # until its scale, halved at each, gives up (every rank's scaler saw the same gradients)
    if not math.isfinite(value) and (stepped or _scale_spent(run)):
        raise TrainingDiverged(run.run_dir, run.step, spec.steps, value, spec.lr_at(run.step - 1))
    run.train_loss.append(value)
    run.train_time += time.perf_counter() - started
    return value, bool(status[1] > 0)


def _scale_spent(run: RunState) -> bool:
    """Whether the run's gradient scaler has lowered its scale below :data:`MIN_GRAD_SCALE`."""
    return run.scaler is not None and run.scaler.get_scale() < MIN_GRAD_SCALE


def _evaluate(run: RunState, stop: StopSignal, interruptible: bool, log: MetricsLog) -> None:
    """The evaluation due after ``run.step``, appended to ``run.evals`` and to ``log``."""
    with stop.interruptible(interruptible):
        shard_of = run.ctx.shard if run.ctx.sequence_parallel > 1 else None
        metrics = run.task.evaluate(
            run.model, run.ctx.device, precision=run.spec.precision, shard_of=shard_of
        )
    run.evals.append({"step": run.step, **metrics})
    log.evaluation(run.evals[-1])


def _checkpoint(run: RunState, metrics: MetricsLog) -> None:
    """Save ``run``'s checkpoint, after its metrics so far are on disk (a checkpoint never
    holds a step that ``metrics.jsonl`` lost)."""
    metrics.sync()
    run.checkpoint()


def _finish(run: RunState, analysis: dict[str, list[float]]) -> dict[str, Any]:
    """The run record; rank 0 writes it as ``result.json``, last (it marks the run finished)."""
    ctx = run.ctx
    record = {
        "heads": run.heads,
        "seed": run.seed,
        "run": run.run_dir.name,
        "steps": run.spec.steps,
        "num_params": sum(p.numel() for p in run.model.parameters()),
        "train_loss": run.train_loss,
        "evals": run.evals,
        "final": {k: v for k, v in run.evals[-1].items() if k != "step"},
        "analysis": analysis,
        "filters": [f.as_dict() for f in polynomial_filters(run.model)],
        "drift": [d.as_dict() for d in weight_drift(run.model)],
        "train_time_s": run.train_time,
        "model_config": _model_config_dict(run.model),
        "world_size": ctx.world_size,
        "world_sizes": run.world_sizes,
        "sequence_parallel": ctx.sequence_parallel,
    }
    if ctx.is_main:
        atomic_write_json(run.run_dir / RESULT_NAME, record)  # last: marks the run finished
    ctx.barrier()
    return record


def _train(
    run: RunState, stop: StopSignal, stop_at_step: int | None, progress: bool, log: str
) -> dict[str, Any]:
    """The training of :func:`train_run` (after :func:`setup_run` and :func:`resume_run`, in a
    run folder this process writes): the steps with their evaluations and checkpoints (each
    logged, :class:`MetricsLog`), the final analysis, then :func:`_finish`."""
    spec, ctx, run_dir = run.spec, run.ctx, run.run_dir
    train_model = _parallel(run)
    replicas = ctx.data_world_size  # data-parallel replicas (world size / sequence parallel)
    if spec.batch_size % replicas:
        raise bad_value(
            "batch_size",
            f"expected a multiple of the {replicas} data-parallel replicas (world size "
            f"{ctx.world_size} / sequence parallel {ctx.sequence_parallel}), got "
            f"{spec.batch_size}",
        )
    local = spec.batch_size // replicas
    if local % spec.grad_accum:
        raise bad_value(
            "grad_accum",
            f"expected batch_size {spec.batch_size} to be a multiple of grad_accum "
            f"{spec.grad_accum} x the {replicas} data-parallel replicas, got "
            f"{local} example(s) per replica",
        )
    shard = slice(ctx.data_rank * local, (ctx.data_rank + 1) * local)
    ckpt_every = int(spec.ckpt_every or 0)  # resolved
    metrics = MetricsLog(run_dir, step=run.step, evals=run.evals, log=log, enabled=ctx.is_main)

    bar = Progress(
        spec.steps,
        run_dir.name,
        initial=run.step,
        position=1,
        leave=False,
        enabled=progress and ctx.is_main,
    )
    smoothed = run.train_loss[-1] if run.train_loss else math.nan
    interruptible = not ctx.distributed  # see the module docstring
    state_names = set(run.model.state_dict())
    buffers = [b for name, b in run.model.named_buffers() if name in state_names]  # checkpointed

    run.model.train()
    try:
        if run.step and run.due(run.step) and not (run.evals and run.evals[-1]["step"] == run.step):
            _evaluate(run, stop, interruptible, metrics)  # cut short (or skipped) by the stop
        while run.step < spec.steps:
            value, stop_requested = _step(
                run, train_model, shard, buffers, stop, interruptible, stop_at_step
            )
            metrics.step(run.step, value, spec.lr_at(run.step - 1), run.train_time)
            smoothed = value if math.isnan(smoothed) else 0.9 * smoothed + 0.1 * value
            bar.update(1, loss=smoothed)
            if stop_requested and run.step < spec.steps:  # the evaluation waits for the resume
                _checkpoint(run, metrics)
                ctx.barrier()
                raise TrainingInterrupted(run_dir, run.step, spec.steps)
            if run.due(run.step):
                _evaluate(run, stop, interruptible, metrics)
            if run.step % ckpt_every == 0 and run.step < spec.steps:
                _checkpoint(run, metrics)
        bar.close()
        _checkpoint(run, metrics)  # the final weights, read by ``heatformer analyze``
        analysis: dict[str, list[float]] = {}
        if spec.analysis and ctx.is_main:
            with stop.interruptible(interruptible):
                analysis = run.task.layer_metrics(run.model, ctx.device)
    except StopRequested:  # raised in one process only (``interruptible``)
        if run.step != run.saved_step:
            _checkpoint(run, metrics)  # the last completed step
        raise TrainingInterrupted(run_dir, run.step, spec.steps) from None
    finally:
        bar.close()
        metrics.close()
    return _finish(run, analysis)
