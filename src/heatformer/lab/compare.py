"""The comparison runner: several head schedules × several seeds under one budget.

Layout of a comparison folder::

    OUT/
      spec.json            the CompareSpec (written first; --resume reads it)
      invocations.json     every invocation that trained here: start, elapsed time,
                           outcome (finished / stopped / interrupted / failed), the command
                           line's running flags (threads, ...: what --resume reuses),
                           environment
      runs/<run>/          one folder per (schedule, optimiser setting, seed): checkpoint.pt,
                           metrics.jsonl (tensorboard/ with log="tensorboard"), result.json
      results.json         spec, environment, summary (mean ± std, 95 % intervals, paired
                           differences against the baseline), sweeps, the selection of each
                           schedule's setting, the primary endpoints, the contrasts A - B,
                           every run record, the runs' start ("started", the first
                           invocation's, with its UTC offset)
      results.csv          one row per run
      plots/*.png          loss curves, final metrics, per-layer analysis, sweeps

Runs go seed-major (every schedule with seed 0, then seed 1, ...), so an interrupted
comparison already holds comparable runs. With optimiser sweeps (``spec.tune``, see
:mod:`heatformer.lab.tuning`) each schedule runs every setting of the grid, named in
its folder (``c01-attention3+laplacian1-lr0.002-s0``) and in its checkpoint's key (the run's
spec holds the setting), and the report keeps, per schedule, the setting chosen on the
validation half (``spec.select_by``); the primary endpoints (``spec.primary``) are tested by
:func:`~heatformer.lab.report.primary_endpoints`. A run is finished when its ``result.json``
exists (written atomically, last); ``resume`` skips finished runs, continues the
interrupted one from its checkpoint, and starts the rest. ``results.json``,
``results.csv`` and the plots are rewritten from the run records at the end.

``wall_time_s`` in ``results.json`` is the time of every invocation that trained in the folder, the
stopped and interrupted ones too: the sum of the ``elapsed_s`` recorded in ``invocations.json`` (at
the start, after each finished run, and when the invocation ends or writes the report; a killed
process loses the time since its last record). ``environment`` is that of the training invocation
that wrote the report; :func:`analyze` keeps it and adds its own as ``analysis_environment``.

One process writes a comparison folder at a time: :func:`run_compare` and :func:`analyze` hold its
lock (``OUT/.lock``, :func:`~heatformer.lab.checkpoint.hold_folder`) from before ``spec.json`` is
written (or read, when resuming) until the report is written; another process that comes for the
folder meanwhile is refused with :class:`~heatformer._atomic.FolderInUse` ("OUT is in use by pid N
on HOST") before it writes anything. The holder removes the temporaries that killed writers left in
the folder. A start killed before ``spec.json`` was in place leaves a folder with no spec (at most
the lock file and a ``.spec.json.tmp-PID``): nothing was trained there, so it is taken as a new
``--out`` and refused by ``--resume`` with a message that says so.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heatformer.checks import bad_type, bad_value
from heatformer.lab.bracket import bracketed, folder_plan, select_bracketed
from heatformer.lab.checkpoint import atomic_write_json, hold_folder, read_json
from heatformer.lab.distributed import DistContext, resolve_device
from heatformer.lab.folder import (
    INVOCATIONS_NAME,
    Invocation,
    check_output,
    first_start,
    load_spec,
    prepare_output,
    read_invocations,
    run_name,
    total_time,
)
from heatformer.lab.metrics import require_log
from heatformer.lab.progress import Progress
from heatformer.lab.report import (
    add_paired,
    aggregate,
    environment,
    paired_contrasts,
    plot_report,
    primary_endpoints,
    write_csv,
)
from heatformer.lab.resume import ModelFactory, load_run_checkpoint
from heatformer.lab.spec import SPEC_NAME, CompareSpec
from heatformer.lab.step import check_precision
from heatformer.lab.stop import StopSignal, TrainingInterrupted
from heatformer.lab.sweep import baseline_heads, find_sweeps
from heatformer.lab.tasks import Task, resolve_task
from heatformer.lab.tasks.base import VALIDATION
from heatformer.lab.trainer import (
    RESULT_NAME,
    TrainingDiverged,
    analyze_run,
    is_finished,
    train_run,
)
from heatformer.lab.tuning import setting_label, settings

__all__ = [
    "INVOCATIONS_NAME",
    "RESULTS_NAME",
    "SPEC_NAME",
    "CompareReport",
    "analyze",
    "load_spec",
    "prepare_output",
    "run_compare",
    "validate_spec",
]

RESULTS_NAME = "results.json"


@dataclass
class CompareReport:
    """What a finished comparison produced.

    Attributes:
        out_dir: the comparison folder.
        results: the content of ``results.json``.
        metric_names: the task's final metrics (first = headline).
        analysis_names: the task's per-layer metrics.
        plots: the PNG files written (empty if matplotlib is missing).
    """

    out_dir: Path
    results: dict[str, Any]
    metric_names: tuple[str, ...]
    analysis_names: tuple[str, ...]
    plots: list[Path]

    @property
    def summary(self) -> list[dict[str, Any]]:
        """Per-configuration mean ± std (see :func:`~heatformer.lab.report.aggregate`)."""
        summary: list[dict[str, Any]] = self.results["summary"]
        return summary


def _runs(spec: CompareSpec) -> Iterator[tuple[str, dict[str, Any], int, str]]:
    """``(heads, setting, seed, folder name)`` in run order: seed-major, then the
    configurations, then their optimiser settings (``{}`` without a sweep)."""
    grid = settings(spec.tune)
    for seed in spec.seeds:
        for index, heads in enumerate(spec.heads):
            for setting in grid:
                yield heads, setting, seed, run_name(index, heads, seed, setting_label(setting))


class _SettingTasks:
    """The task of each optimiser setting: ``task`` with its spec's swept fields set (a shallow
    copy sharing the data), so that the run trains, and its checkpoint key records, them."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self.made: dict[str, Task] = {}

    def __call__(self, setting: dict[str, Any]) -> Task:
        if not setting:
            return self.task
        label = setting_label(setting)
        if label not in self.made:
            made = copy.copy(self.task)
            made.spec = dataclasses.replace(self.task.spec, **setting).resolved()
            self.made[label] = made
        return self.made[label]


def validate_spec(spec: CompareSpec, data: Any = None) -> Task:
    """Load the task's data and build every configuration's model (on the meta device).

    Writes nothing; a spec, data or model that is refused is refused here, before training.

    Args:
        spec: the comparison spec.
        data: the task's data, prebuilt (tests); ``None``: loaded as the options say.

    Returns:
        The task, ready to train.

    Raises:
        ValueError: a schedule, graph kind or size the model refuses, or data that do not fit.
        FileNotFoundError: a missing ``--text`` / ``--npz`` path.
    """
    import torch

    task = resolve_task(spec.task)(spec, data)
    for heads in spec.heads:
        with torch.device("meta"):  # builds the modules without allocating weights
            task.build_model(heads)
    return task


#: The spec fields ``analyze`` may change: what the analysis reads.
_ANALYSIS_FIELDS = ("analysis_split", "analysis_point", "analysis_cls")


def _with_analysis(spec: CompareSpec, analysis: dict[str, Any]) -> CompareSpec:
    """``spec`` with the analysis options of ``analysis`` (checked by the spec)."""
    if not isinstance(analysis, dict):
        raise bad_type("analysis", f"expected a dict of analysis options, got {analysis!r}")
    other = sorted(set(analysis) - set(_ANALYSIS_FIELDS))
    if other:
        raise bad_value("analysis", f"expected options among {list(_ANALYSIS_FIELDS)}, got {other}")
    return dataclasses.replace(spec, **analysis) if analysis else spec


def _check_task(task: object) -> Task | None:
    """``task`` if it is a :class:`Task` or None (the task's data go in ``data=``)."""
    if task is None or isinstance(task, Task):
        return task
    raise bad_type(
        "task", f"expected a heatformer.lab.tasks.Task or None, got {type(task).__name__}"
    )


def _selected(
    spec: CompareSpec, records: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The records the report shows (with ``select_by``: each configuration's runs at its
    chosen setting, else all) and the selection for ``results.json`` (``None`` without)."""
    if spec.select_by is None:
        return list(records), None
    chosen, by_heads = select_bracketed(records, spec)
    selection = {
        "metric": spec.select_by,
        "split": "validation: the even examples of the evaluation set; every reported metric "
        "is on the odd ones (test)",
        "configurations": by_heads,
    }
    return [dict(r) for r in chosen], selection


def _finish(
    spec: CompareSpec,
    task: Task,
    out_dir: Path,
    records: list[dict[str, Any]],
    ctx: DistContext,
    *,
    wall_time_s: Callable[[], float],
    environment: dict[str, Any] | None,
    extra: dict[str, Any] | None = None,
) -> CompareReport:
    """Write results.json, results.csv and the plots from the run records.

    ``wall_time_s()`` is asked right before ``results.json`` is written (last).
    """
    reported, selection = _selected(spec, records)
    summary = aggregate(reported, spec.heads, task.metric_names, task.analysis_names)
    n_layer, n_head = spec.n_layer, spec.heads_per_layer
    baseline = baseline_heads(spec.heads, n_layer=n_layer, n_head=n_head) or spec.heads[0]
    add_paired(summary, baseline, task.metric_names, task.analysis_names)
    sweeps = find_sweeps(spec.heads, n_layer=n_layer, n_head=n_head)
    results: dict[str, Any] = {
        "spec": spec.to_dict(),
        "task": spec.task,
        "metrics": list(task.metric_names),
        "analysis_metrics": list(task.analysis_names),
        "analysis_on": task.analysis_description(),  # what the per-layer analysis reads
        "std": "sample standard deviation over seeds (ddof=1); 0 for one seed",
        "ci95": "half-width of the 95% Student-t interval of the mean over seeds",
        "baseline": baseline,
        "paired": "differences against the baseline on the seeds both ran (see report.py)",
        "sweeps": [
            {
                "operator": line.operator,
                "axis": line.axis,
                "label": line.label,
                "points": [list(point) for point in line.points],
            }
            for line in sweeps
        ],
        "environment": environment,
        **(extra or {}),
        "seeds": list(spec.seeds),
        "wall_time_s": None,  # filled in last
        "invocations": None,
        "started": None,  # when the first invocation began (the runs' start)
        "selection": selection,
        "primary": primary_endpoints(summary, baseline, spec.primary, sweeps),
        "contrasts": paired_contrasts(summary, spec.contrast, task.metric_names),
        "summary": summary,
        "runs": records,
    }
    plots: list[Path] = []
    if ctx.is_main:
        write_csv(out_dir / "results.csv", records, task.metric_names, task.analysis_names)
        try:
            plots = plot_report(
                out_dir, reported, summary, task.metric_names, task.eval_loss_name,
                task.analysis_names, sweeps,
            )  # fmt: skip
        except ImportError:  # matplotlib is an optional extra
            plots = []
        results["plots"] = [str(p.relative_to(out_dir)) for p in plots]
    results["wall_time_s"] = wall_time_s()
    invocations = read_invocations(out_dir)
    results["invocations"], results["started"] = len(invocations), first_start(invocations)
    if ctx.is_main:
        atomic_write_json(out_dir / RESULTS_NAME, results)
    ctx.barrier()
    return CompareReport(out_dir, results, task.metric_names, task.analysis_names, plots)


def run_compare(
    spec: CompareSpec,
    out_dir: str | Path,
    *,
    resume: bool = False,
    ctx: DistContext | None = None,
    stop: StopSignal | None = None,
    stop_at_step: int | None = None,
    progress: bool = False,
    model_factory: ModelFactory | None = None,
    task: Task | None = None,
    data: Any = None,
    flags: Mapping[str, Any] | None = None,
    log: str = "jsonl",
) -> CompareReport:
    """Train every (head schedule, seed) pair of ``spec`` and write the report.

    Args:
        spec: what to run.
        out_dir: the comparison folder (see the module docstring).
        resume: continue the comparison in ``out_dir`` (same spec required).
        ctx: device and DDP context; default: one process on ``spec.device``.
        stop: a stop flag (set by Ctrl-C via :meth:`StopSignal.installed`).
        stop_at_step: stop every run at this step, as if interrupted (tests).
        progress: report progress on stderr, overall and per run (rank 0 only; see
            :mod:`heatformer.lab.progress`: bars on a terminal, plain lines otherwise).
        model_factory: builds a model from ``(task, heads)``; default the reference
            model of the task.
        task: the task, already made by :func:`validate_spec` (skips loading and checking).
        data: the task's data, prebuilt (tests use tiny ones).
        flags: the running options of this invocation that ``spec`` does not hold (the
            command line's ``{"threads": 1, "sequence_parallel": None, ...}``), recorded in its
            entry of ``invocations.json`` (``"flags"``), where ``--resume`` finds them;
            ``None`` records none.
        log: ``"jsonl"`` or ``"tensorboard"``, checked first: see :mod:`heatformer.lab.metrics`.

    Returns:
        The :class:`CompareReport`.

    Raises:
        TrainingInterrupted: a stop was requested; the current run's checkpoint is saved.
        FolderInUse: another process writes ``out_dir`` (nothing written; see the module
            docstring).
        ValueError, FileNotFoundError: bad spec, data or output folder (nothing written),
            or, when resuming, a checkpoint that cannot be read or belongs to another
            configuration (checked before any training).
    """
    started = time.perf_counter()
    spec = spec.resolved()
    out = Path(out_dir)
    ctx = ctx or DistContext(device=resolve_device(spec.device))
    check_precision(spec.precision, ctx.device)  # fp16: CUDA only
    task = _check_task(task) or validate_spec(spec, data)
    require_log(log)  # before anything is written
    check_output(spec, out, resume=resume)  # a folder that is refused gets no lock file
    with hold_folder(out, ctx, create=not resume):  # checked again under the lock
        prepare_output(spec, out, resume=resume, ctx=ctx)
        return _run_plan(
            spec, task, out, started, ctx=ctx, resume=resume, stop=stop or StopSignal(),
            stop_at_step=stop_at_step, progress=progress, model_factory=model_factory,
            flags=flags, log=log,
        )  # fmt: skip


def _run_plan(
    spec: CompareSpec,
    task: Task,
    out: Path,
    started: float,
    *,
    ctx: DistContext,
    resume: bool,
    stop: StopSignal,
    stop_at_step: int | None,
    progress: bool,
    model_factory: ModelFactory | None,
    flags: Mapping[str, Any] | None,
    log: str,
) -> CompareReport:
    """The runs of :func:`run_compare` and the report, in a folder this process writes."""
    plan = folder_plan(spec, _runs(spec), out)  # the grid's and the extensions decided so far
    task_of = _SettingTasks(task)
    if resume:  # a bad checkpoint is refused before any training, not after the runs before it
        for heads, setting, seed, name in plan:
            if not is_finished(out / "runs" / name):
                load_run_checkpoint(task_of(setting), heads, seed, out / "runs" / name)

    invocation = Invocation(out, ctx, started, flags)
    invocation.save()
    outcome = "failed"
    records: list[dict[str, Any]] = []
    done = sum(is_finished(out / "runs" / name) for *_, name in plan)
    try:
        with Progress(
            len(plan), out.name, initial=done, unit="run", enabled=progress and ctx.is_main
        ) as bar:
            for heads, setting, seed, name in bracketed(spec, plan, records, bar.raise_total):
                run_dir = out / "runs" / name
                finished = is_finished(run_dir)
                if not finished and ctx.any(stop.requested):  # e.g. Ctrl-C during analysis
                    raise TrainingInterrupted(run_dir, 0, spec.steps)
                try:
                    record = train_run(
                        task_of(setting), heads, seed, run_dir, ctx=ctx, stop=stop, log=log,
                        stop_at_step=stop_at_step, progress=progress, model_factory=model_factory,
                    )  # fmt: skip
                except TrainingDiverged as err:
                    if spec.select_by is None:
                        raise
                    record = _diverged(task, heads, seed, run_dir, err, ctx)
                records.append({**record, "setting": setting} if spec.tune else record)
                if not finished:
                    bar.update(1)
                    invocation.save()

        def report_time() -> float:  # recorded, with the time so far, right before results.json
            nonlocal outcome
            outcome = "finished"
            return invocation.save(outcome)

        return _finish(
            spec, task, out, records, ctx, wall_time_s=report_time,
            environment=invocation.entry["environment"],
        )  # fmt: skip
    except TrainingInterrupted:
        outcome = "stopped"
        raise
    except KeyboardInterrupt:
        outcome = "interrupted"
        raise
    finally:
        if outcome != "finished":
            invocation.save(outcome)


def _diverged(
    task: Task, heads: str, seed: int, run_dir: Path, err: TrainingDiverged, ctx: DistContext
) -> dict[str, Any]:
    """The record of a candidate setting whose training diverged, written as its
    ``result.json`` (so it counts as finished): NaN metrics, which selection passes over, and
    ``diverged`` (the step and loss). Only with ``select_by``; else the comparison stops."""
    nan = float("nan")
    final = {name: nan for name in task.metric_names}
    final |= {VALIDATION + name: nan for name in task.metric_names}
    record = {
        "heads": heads, "seed": seed, "run": run_dir.name, "steps": task.spec.steps,
        "num_params": None, "train_loss": [], "evals": [], "final": final, "analysis": {},
        "train_time_s": 0.0, "diverged": {"step": err.step, "loss": err.loss},
    }  # fmt: skip
    if ctx.is_main:
        atomic_write_json(run_dir / RESULT_NAME, record)
    ctx.barrier()
    return record


def analyze(
    out_dir: str | Path,
    *,
    model_factory: ModelFactory | None = None,
    data: Any = None,
    device: str = "cpu",
    progress: bool = False,
    task: Task | None = None,
    analysis: dict[str, Any] | None = None,
) -> CompareReport:
    """Recompute the per-layer analysis of every finished run from its final checkpoint.

    Each run's ``result.json`` gets the new ``analysis`` (rewritten atomically), then
    ``results.json``, ``results.csv`` and the plots (including the per-layer figures)
    are rebuilt. Runs that have not finished are left alone. ``results.json`` keeps the
    training ``environment`` and ``wall_time_s`` and records this one's as
    ``analysis_environment`` and ``analysis_time_s``.

    What the analysis reads is the folder's spec's choice (``analysis_split``,
    ``analysis_point``, ``analysis_cls``) unless ``analysis`` changes it; a change is written
    to ``spec.json`` too (no training number depends on these options), so that the folder's
    spec says what its records' analysis read, for this report and any later one.

    Args:
        out_dir: a comparison folder.
        model_factory: builds a model from ``(task, heads)``; default the task's
            reference model.
        data: the task's data, prebuilt (tests).
        device: where to run the models.
        progress: report progress on stderr (see :mod:`heatformer.lab.progress`).
        task: the task, already made for this folder's spec (skips loading its data).
        analysis: new values of the spec's analysis options, by name (``{"analysis_split":
            "train"}``); ``None`` or empty keeps the folder's.

    Returns:
        The rebuilt :class:`CompareReport`.

    Raises:
        FileNotFoundError: ``out_dir`` holds no comparison.
        FolderInUse: another process writes ``out_dir``.
        ValueError: no run has finished yet, a checkpoint does not match its run, or
            ``analysis`` names another field or a value the spec refuses (named).
    """
    started = time.perf_counter()
    given = _check_task(task)
    out = Path(out_dir)
    folder_spec = load_spec(out)
    changed = _with_analysis(folder_spec, analysis or {})
    spec = changed.resolved()
    if given is not None and changed != folder_spec:  # the same data, this analysis's spec
        given = type(given)(spec, given.data)
    task = given or resolve_task(spec.task)(spec, data)
    ctx = DistContext(device=resolve_device(device))
    with hold_folder(out, ctx):  # it rewrites the run records and the report
        records = []
        plan = folder_plan(spec, _runs(spec), out, finished=True)
        task_of = _SettingTasks(task)
        if not plan:
            raise ValueError(f"{out}: expected at least one finished run to analyze, got none")
        with Progress(len(plan), f"analyze {out.name}", unit="run", enabled=progress) as bar:
            for heads, setting, _seed, name in plan:
                run_dir, run_task = out / "runs" / name, task_of(setting)
                record = analyze_run(run_dir, heads, run_task, ctx.device, model_factory)
                records.append({**record, "setting": setting} if spec.tune else record)
                bar.update(1)
        if changed != folder_spec:  # every record read it: the folder's spec says so now
            atomic_write_json(
                out / SPEC_NAME, {**read_json(out / SPEC_NAME), "spec": changed.to_dict()}
            )
        trained, wall = _trained(out)
        extra = {
            "analysis_environment": environment(1, str(ctx.device)),
            "analysis_time_s": time.perf_counter() - started,
        }
        return _finish(
            spec, task, out, records, ctx, wall_time_s=lambda: wall, environment=trained,
            extra=extra,
        )  # fmt: skip


def _trained(out: Path) -> tuple[dict[str, Any] | None, float]:
    """The training environment and wall time of the comparison in ``out`` (what
    :func:`analyze` keeps of the training invocations, not its own)."""
    previous = read_json(out / RESULTS_NAME) if (out / RESULTS_NAME).is_file() else {}
    invocations = read_invocations(out)
    trained = previous.get("environment") or (
        invocations[-1].get("environment") if invocations else None
    )
    wall = total_time(invocations) if invocations else float(previous.get("wall_time_s") or 0)
    return trained, wall
