"""The ``train``, ``compare`` and ``analyze`` subcommands of the ``heatformer`` command.

Each subcommand is an ``(add_arguments, run)`` pair registered in
:data:`heatformer.lab.cli.COMMANDS`. ``run`` prints (this is the command line, not the
library) and returns the exit code; bad input raises ``ValueError`` /
``FileNotFoundError``, which :func:`heatformer.lab.cli.main` turns into one line on stderr
and exit status 2. ``--resume DIR`` and ``analyze DIR`` take the folder's lock
(:class:`~heatformer._atomic.FolderLock`) before torch is imported, so a second process on the
folder is refused at once, with exit status 2 and a line naming the holder's pid and host.
A stop saves a checkpoint and prints how to resume: Ctrl-C and SIGTERM exit with status
130, a planned stop (``--stop-at-step``) with status 0 (so ``torchrun`` does not report it
as a failure). A run resumed with another number of processes gets a note on stderr
(:class:`~heatformer.lab.resume.WorldSizeChanged`). A resume runs as the invocation
before it: the spec comes from ``DIR/spec.json`` and the running flags it does not hold
(:data:`KEPT_FLAGS`: ``--threads``, ...) from the last invocation's record in
``DIR/invocations.json``, unless given again; the printed resume command spells them out.

Defining the options needs only :mod:`heatformer.lab.spec` and
:mod:`heatformer.lab.tasks`, which import no torch; the runner, the data and the
models are imported inside the ``run`` functions. The flags of the task options (``--seq-len``,
``--text``, ...) are made from the registered tasks' options; one the chosen task does not take
is refused by the spec, naming the tasks that take it. ``--config FILE`` reads a study file
under the flags (:mod:`heatformer.lab.cli._config`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from heatformer._atomic import FolderLock
from heatformer.checks import bad_value, check_folder, check_positive_int, topk_and_graph
from heatformer.lab.cli._config import check_one_run, overridden, read_study
from heatformer.lab.cli._flags import add_analysis_reading, add_bracket, add_common, add_contrast
from heatformer.lab.cli._options import OptionParser, speaks
from heatformer.lab.cli._plan import add_plan_flag
from heatformer.lab.cli._report import plan_line, preflight, print_report
from heatformer.lab.cli._resume import KEPT_FLAGS, folder_of, resume_command, take_kept_flags
from heatformer.lab.presets import PRESETS, one_run_presets
from heatformer.lab.spec import SPEC_NAME, CompareSpec, parse_seeds
from heatformer.lab.tasks import TASKS, options_by_name

if TYPE_CHECKING:
    from heatformer.lab.distributed import DistContext
    from heatformer.lab.stop import TrainingInterrupted

__all__ = [
    "add_analyze_args",
    "add_compare_args",
    "add_train_args",
    "run_analyze",
    "run_compare_command",
    "run_train",
]

#: The CompareSpec fields set by a flag whose argparse ``dest`` is the field's name (``--layers``
#: stores ``n_layer``); a field without a flag is skipped. ``heads`` and ``seeds`` are read by
#: each command; the task options' flags come from the tasks
#: (:func:`heatformer.lab.cli._flags.add_task_options`).
_SPEC_FLAGS = tuple(
    f.name for f in dataclasses.fields(CompareSpec) if f.name not in {"heads", "seeds"}
)


def add_train_args(parser: OptionParser) -> None:
    """Flags of ``heatformer train``."""
    parser.add_argument(
        "--heads",
        help="head schedule, e.g. 'attention:6,laplacian:2', or one per layer separated by "
        "';': 'attention:4;attention:2,laplacian:2' (default 'attention')",
    )
    parser.add_argument("--seed", type=int, help="seed of the weights and batch order (default 0)")
    parser.add_argument(
        "--preset",
        choices=sorted(one_run_presets()),
        help="named settings of one run; explicit flags override them",
    )
    add_common(parser)
    parser.epilog = (
        "examples:\n"
        "  heatformer train --task chars --heads attention:6,laplacian:2 --steps 500\n"
        "  heatformer train --preset mqar-reference\n"
        "  torchrun --nproc_per_node 2 -m heatformer train --task digits --batch-size 64\n"
        "  torchrun --nproc_per_node 2 -m heatformer train --task chars --seq-len 65536 \\\n"
        "      --graph 'window[w=128]' --sequence-parallel 2"
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def add_compare_args(parser: OptionParser) -> None:
    """Flags of ``heatformer compare``."""
    parser.add_argument(
        "--heads",
        action="append",
        help="a head schedule to compare (repeat the flag); 'attention:6,laplacian:2' for "
        "every layer or 'attention:4;attention:2,laplacian:2' per layer (';' between layers)",
    )
    parser.add_argument(
        "--sweep",
        action="append",
        metavar="OP=K0..K1[@LAYERS]",
        help="a family of head schedules (repeat the flag): 'laplacian=0..4' puts k = 0..4 "
        "Laplacian heads in every layer, the rest attention; 'laplacian=0..4@2,3' only in "
        "layers 2 and 3; 'laplacian=2@each' 2 heads in one layer at a time. Added before the "
        "--heads; the report plots each metric against k with 95%% intervals and paired "
        "differences against k = 0. An optimiser field instead of OP sweeps it for every "
        "schedule: 'lr=1e-3,2e-3,4e-3' (also weight_decay, min_lr_ratio, grad_clip, "
        "warmup_steps, dropout; several make a grid), each schedule reported at its setting "
        "chosen by --select-by",
    )
    parser.add_argument(
        "--select-by",
        metavar="METRIC",
        help="with an optimiser --sweep: pick each schedule's setting by the best mean of METRIC "
        "(e.g. val_loss) over seeds on the validation half of the evaluation set (its even "
        "examples); the report gives the chosen runs' metrics on the test half (the odd ones)",
    )
    add_bracket(parser)
    parser.add_argument(
        "--primary",
        action="append",
        metavar="METRIC[@LAYER]",
        help="a declared primary endpoint (repeat the flag): a final metric (val_bpc; bpc "
        "works too) or a per-layer one at a layer (within_seq_frac@last, nc1@-1). The report "
        "tests each against the baseline: Holm-adjusted paired differences with simultaneous "
        "intervals, effect sizes in seed-SD units, equivalence (TOST) when not significant, "
        "and the trend across k of a sweep",
    )
    add_contrast(parser)
    add_plan_flag(parser)
    parser.add_argument(
        "--seeds", help="number of seeds (3 -> 0,1,2) or a comma list (0,5,7); default 1"
    )
    parser.add_argument(
        "--preset", choices=sorted(PRESETS), help="named settings; explicit flags override them"
    )
    add_common(parser)
    parser.epilog = (
        "examples:\n"
        "  heatformer compare --preset demo\n"
        "  heatformer compare --task chars --heads attention:8 --heads attention:6,laplacian:2"
        " \\\n      --heads attention:6,heat:2 --seeds 3 --steps 500\n"
        "  heatformer compare --task digits --recipe deit3 --sweep laplacian=0..4 "
        "--heads attention:2,mean:2 --seeds 5\n"
        "  heatformer compare --resume runs/demo-20260101-120000"
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def add_analyze_args(parser: OptionParser) -> None:
    """Flags of ``heatformer analyze``."""
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a folder made by compare or train")
    parser.add_argument("--device", default="cpu", help="auto | cpu | cuda[:N] (default cpu)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_analysis_reading(
        parser.group(
            "what the analysis reads",
            "default: the folder's spec.json; a flag given here is written there too",
        )
    )


# ---------------------------------------------------------------------------- helpers


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The spec fields and task options set explicitly on the command line, by name
    (``--bf16``, deprecated, as ``precision="bf16"``).

    Raises:
        ValueError: ``--bf16`` with another ``--precision`` (naming ``precision``).
    """
    values = {
        name: getattr(args, name) for name in _SPEC_FLAGS if getattr(args, name, None) is not None
    }
    if args.no_analysis:
        values["analysis"] = False
    if args.bf16:  # the deprecated synonym of --precision bf16
        if values.get("precision", "bf16") != "bf16":
            raise bad_value(
                "precision",
                f"expected bf16 with --bf16 (its deprecated synonym), got {values['precision']}: "
                "drop --bf16",
            )
        values["precision"] = "bf16"
    for name, by_task in options_by_name().items():
        value = getattr(args, name, None)
        if value is not None:
            if any(f.metadata["path"] for f in by_task.values()):
                value = str(Path(value).expanduser().resolve())
            values[name] = value
    return values


def _build_spec(args: argparse.Namespace, *, compare: bool) -> CompareSpec:
    """The spec of the command line: the ``--preset``'s values, under the ``--config`` file's,
    under the flags given (field by field, option by option); validated once, when made."""
    values: dict[str, Any] = {}
    if args.preset:
        values.update(PRESETS[args.preset])
    if args.config is None:
        return _spec_from(args, values, compare=compare)
    study = read_study(args.config, flags=vars(args))
    with study.naming(overridden(args, _given(args), compare=compare)):  # errors name its keys
        return _spec_from(args, study.over(values), compare=compare)


def _spec_from(args: argparse.Namespace, values: dict[str, Any], *, compare: bool) -> CompareSpec:
    """The spec of ``values`` (a preset's, a study file's) with the flags given over them."""
    given = _given(args)
    if args.topk is not None:  # the shorthand, resolved here: the spec knows graphs only
        if "graph" in given:  # also --graph softmax, the spec's default
            raise topk_and_graph(args.topk, given["graph"])
        check_positive_int("topk", args.topk)
        given["graph"] = f"topk[k={args.topk}]"
    options = dict(values.pop("options", {}))
    if "task" in given and given["task"] != values.get("task") and given["task"] in TASKS:
        taken = options_by_name()  # a preset's options for another task: those this one takes
        options = {k: v for k, v in options.items() if given["task"] in taken.get(k, {})}
    for name in options_by_name():  # a flag the task does not take is refused by the spec
        if name in given:
            options[name] = given.pop(name)
    values.update(given)
    values["options"] = options
    if compare:
        from heatformer.lab.tuning import is_tune_sweep

        tune = [text for text in args.sweep or () if is_tune_sweep(text)]
        if tune:
            values["tune"] = tuple(tune)
        sweeps = [text for text in args.sweep or () if text not in tune]
        if args.heads or sweeps:
            swept = tuple(dict.fromkeys(_sweep_heads(args, values, sweeps)))  # k = 0 once
            # a --heads schedule a sweep already has counts once; two equal --heads are refused
            values["heads"] = swept + tuple(h for h in args.heads or () if h not in swept)
        if args.seeds is not None:
            values["seeds"] = parse_seeds(args.seeds)
    else:
        if args.heads is not None:
            values["heads"] = (args.heads,)
        if args.seed is not None:
            values["seeds"] = (args.seed,)
        check_one_run(values)
    return CompareSpec(**values)


def _sweep_heads(
    args: argparse.Namespace, values: dict[str, Any], sweeps: list[str]
) -> tuple[str, ...]:
    """The schedules of the head ``sweeps``, for the model sizes the flags (or preset) give."""
    from heatformer.lab.sweep import expand_sweep
    from heatformer.models.heads import infer_num_heads

    if not sweeps:
        return ()
    n_head = values.get("n_head")
    if n_head is None:
        n_head = infer_num_heads(args.heads[0]) if args.heads else 4
    check_positive_int("n_head", n_head)
    n_layer = values.get("n_layer", CompareSpec.n_layer)
    check_positive_int("n_layer", n_layer)
    out: tuple[str, ...] = ()
    for text in sweeps:
        out += expand_sweep(text, n_head=n_head, n_layer=n_layer)
    return out


def _default_out(spec: Any, ctx: Any) -> Path:
    label = spec.name or spec.task
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if ctx.distributed:  # one folder for every rank: rank 0's clock decides
        import torch.distributed as dist

        box = [stamp]
        dist.broadcast_object_list(box, src=0)
        stamp = box[0]
    return Path("runs") / f"{label}-{stamp}"


def _writer_of(folder: Path | None) -> contextlib.AbstractContextManager[object]:
    """The lock of the comparison folder ``folder``, taken before torch is imported.

    A second process on a folder is refused at once (:class:`~heatformer._atomic.FolderInUse`,
    exit status 2), not after loading torch and the data, and the lock is held for the whole
    command; the runner, which takes it too, finds it held. Nothing is locked here for a
    folder that holds no ``spec.json`` (the runner refuses it without leaving a lock file)
    or under ``torchrun`` (rank 0 takes the lock in the runner, when every rank can hear of a
    refusal).
    """
    if folder is None or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return contextlib.nullcontext()
    if not (folder / SPEC_NAME).is_file():
        return contextlib.nullcontext()
    return FolderLock(folder)


def _execute(args: argparse.Namespace, command: str) -> int:
    resume_dir = folder_of(args)
    # a loop of symbolic links, as the folder or its runs/, is refused here, before torch
    if resume_dir is not None:
        check_folder("resume", resume_dir, inside=("runs",))
    elif args.out is not None:
        check_folder("out", args.out, inside=("runs",))
    with _writer_of(resume_dir), _topk_named(args):  # first: the checks below import torch
        return _execute_in(args, command, resume_dir)


@contextlib.contextmanager
def _topk_named(args: argparse.Namespace) -> Iterator[None]:
    """An error about the graph kind names ``--topk`` when the user wrote ``--topk K`` (the
    shorthand for ``--graph topk[k=K]``, resolved in :func:`_build_spec`)."""
    try:
        yield
    except ValueError as err:
        if getattr(args, "topk", None) is None or getattr(err, "argument", None) != "graph":
            raise
        raise bad_value("topk", str(getattr(err, "detail", err))) from None


def _spec_of(
    args: argparse.Namespace, command: str, resume_dir: Path | None, saved: CompareSpec | None
) -> CompareSpec:
    """The command's spec, resolved: the flags', or ``saved``, the one saved in ``resume_dir``
    (where flags that would change it are refused)."""
    for dest in ("threads", "stop_at_step", "sequence_parallel"):
        if getattr(args, dest) is not None:
            check_positive_int(dest, getattr(args, dest))
    if args.dist_timeout is not None and not args.dist_timeout > 0:
        raise bad_value("dist_timeout", f"expected seconds > 0, got {args.dist_timeout}")
    if saved is not None:
        extra = sorted(set(_given(args)) - {"device"} | ({"topk"} if args.topk else set()))
        if command == "compare" and (args.heads or args.sweep or args.seeds or args.preset):
            extra += ["heads/sweep/seeds/preset"]
        if command == "train" and (args.heads is not None or args.seed is not None or args.preset):
            extra += ["heads/seed/preset"]
        if args.config is not None:
            extra += ["config"]
        if extra:
            raise bad_value(
                "resume", f"continues the spec saved in {resume_dir}; drop the flags {extra}"
            )
        spec = saved
        if args.device is not None:
            spec = dataclasses.replace(spec, device=args.device)
    else:
        spec = _build_spec(args, compare=command == "compare")
    spec = spec.resolved()
    return spec


def _execute_in(args: argparse.Namespace, command: str, resume_dir: Path | None) -> int:
    from heatformer.lab.compare import load_spec, run_compare, validate_spec
    from heatformer.lab.distributed import setup_distributed
    from heatformer.lab.resume import WorldSizeChanged
    from heatformer.lab.stop import StopSignal, TrainingInterrupted
    from heatformer.lab.trainer import TrainingDiverged

    saved = None
    if resume_dir is not None:
        saved = load_spec(resume_dir)
        take_kept_flags(args, command, resume_dir, saved)
    spec = _spec_of(args, command, resume_dir, saved)
    if args.bf16 and speaks():
        print(
            f"heatformer {command}: note: --bf16 is deprecated: it is --precision bf16 (which "
            "spec.json records)",
            file=sys.stderr,
            flush=True,
        )
    log = _log_of(args)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)

    ctx = setup_distributed(
        spec.device, sequence_parallel=args.sequence_parallel or 1, timeout_s=args.dist_timeout
    )
    try:
        from heatformer.lab.step import check_precision

        check_precision(spec.precision, ctx.device)  # fp16: CUDA only, refused before anything
        out = resume_dir or (Path(args.out) if args.out else _default_out(spec, ctx))
        task = validate_spec(spec)
        if preflight(args, command, spec, task, ctx, out):
            return 0  # a dry run: nothing trained, nothing written
        if ctx.is_main:
            print(f"heatformer {command}: {plan_line(spec, ctx)} -> {out}", flush=True)
        stop = StopSignal()
        launcher = "torchrun ... -m heatformer" if ctx.distributed else "heatformer"
        device = (saved or spec).device  # the one in spec.json
        hint = f"resume with: {resume_command(launcher, command, out, args, device)}"
        flags = {dest: getattr(args, dest) for dest in KEPT_FLAGS} | {"device": spec.device}
        try:
            with stop.installed(), _notes(command, WorldSizeChanged):
                report = run_compare(
                    spec,
                    out,
                    resume=resume_dir is not None,
                    ctx=ctx,
                    stop=stop,
                    stop_at_step=args.stop_at_step,
                    progress=not args.no_progress,
                    task=task,
                    flags=flags,
                    log=log,
                )
        except TrainingInterrupted as err:
            return _stopped(command, err, stop.reason, ctx, hint)
        except TrainingDiverged as err:  # main() prints a ValueError as one line, status 2
            raise ValueError(f"{err}; the runs finished before it are kept in {out}") from None
        except KeyboardInterrupt:
            if ctx.is_main:
                print(
                    f"heatformer {command}: interrupted; runs continue from their last "
                    f"checkpoint; {hint}",
                    file=sys.stderr,
                )
            return 130
        except RuntimeError as err:  # a collective failed: another process died or hung
            if not ctx.distributed:
                raise
            return _collective_failed(command, err, ctx, hint)
        if ctx.is_main:
            print_report(report)
        return 0
    finally:
        ctx.close()


def _log_of(args: argparse.Namespace) -> str:
    """The ``--log`` of the command (default ``jsonl``), its package checked before anything
    is written.

    Raises:
        ValueError: ``--log`` is not one of :data:`~heatformer.lab.metrics.LOGS`, or is
            ``tensorboard`` without the ``tensorboard`` package (the message: ``--log
            tensorboard needs tensorboard: pip install 'heatformer[tensorboard]' ...``).
    """
    from heatformer.lab.metrics import require_log

    log = "jsonl" if args.log is None else args.log
    try:
        return require_log(log)
    except ImportError as err:
        raise ValueError(f"{err} (or leave --log out: metrics.jsonl only)") from None


def _stopped(
    command: str, err: TrainingInterrupted, reason: str, ctx: DistContext, hint: str
) -> int:
    """The exit status of a command whose run stopped (``reason``: the stop's), after rank 0
    says where on stderr: 0 for a planned stop (``--stop-at-step``: a clean exit, under
    ``torchrun`` too), else 130."""
    if reason.startswith("--stop-at-step"):
        if ctx.is_main:
            print(
                f"heatformer {command}: stopped at step {err.step} as requested "
                f"(--stop-at-step), checkpoint of run {err.run_dir.name} saved; {hint}",
                file=sys.stderr,
            )
        return 0
    if ctx.is_main:
        where = (
            f"stopped at step {err.step}/{err.steps}, checkpoint saved"
            if err.step
            else "not started"
        )
        print(
            f"heatformer {command}: {reason or 'stopped'}: run {err.run_dir.name} {where}; {hint}",
            file=sys.stderr,
        )
    return 130


def _collective_failed(command: str, err: RuntimeError, ctx: DistContext, hint: str) -> int:
    """Exit status 1 after this process's line on stderr: a collective operation failed (under
    ``torchrun``), so another process died or stopped answering."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    print(
        f"heatformer {command}: error: process {ctx.rank} of {ctx.world_size}: a "
        f"collective operation failed, so another process died or stopped answering "
        f"(within --dist-timeout) ({first}); runs continue from their last checkpoint; "
        f"{hint}",
        file=sys.stderr,
        flush=True,
    )
    return 1


@contextlib.contextmanager
def _notes(command: str, kind: type[Warning]) -> Iterator[None]:
    """Show warnings of ``kind`` as ``heatformer COMMAND: note: ...`` lines on stderr."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", kind)
        shown = warnings.showwarning

        def show(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: TextIO | None = None,
            line: str | None = None,
        ) -> None:
            if issubclass(category, kind):
                print(f"heatformer {command}: note: {message}", file=sys.stderr, flush=True)
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


# ---------------------------------------------------------------------------- commands


def run_train(args: argparse.Namespace) -> int:
    """``heatformer train``: one head schedule, one seed."""
    return _execute(args, "train")


def run_compare_command(args: argparse.Namespace) -> int:
    """``heatformer compare``: several head schedules × seeds, same budget."""
    return _execute(args, "compare")


def run_analyze(args: argparse.Namespace) -> int:
    """``heatformer analyze RUN_DIR``: recompute the per-layer analysis from checkpoints."""
    with _writer_of(Path(args.run_dir)):
        from heatformer.lab.compare import analyze

        reading = {
            name: getattr(args, name)
            for name in ("analysis_split", "analysis_point", "analysis_cls")
            if getattr(args, name) is not None
        }
        report = analyze(
            args.run_dir, device=args.device, progress=not args.no_progress, analysis=reading
        )
        print_report(report)
    return 0
