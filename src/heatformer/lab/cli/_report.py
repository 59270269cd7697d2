"""What ``heatformer train`` and ``compare`` print besides progress: the preflight (memory check,
``--dry-run`` plan and time estimate) and the report of a finished comparison.

Split from :mod:`heatformer.lab.cli._experiments`, which calls :func:`preflight` before training and
:func:`print_report` after it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["plan_line", "preflight", "print_report"]


def plan_line(spec: Any, ctx: Any) -> str:
    """``"3 configuration(s) x 2 optimiser setting(s) x 8 seed(s) = 48 run(s) of 500 steps on
    'chars' (cpu, 1 process(es))"``; with sequence parallelism ``"(cpu, 4 process(es), every
    sequence split over 2)"``."""
    from heatformer.lab.bracket import plan_note
    from heatformer.lab.tuning import settings

    grid = len(settings(spec.tune))
    runs = len(spec.heads) * grid * len(spec.seeds)
    tuned = f" x {grid} optimiser setting(s){plan_note(spec)}" if spec.tune else ""
    split = getattr(ctx, "sequence_parallel", 1)
    split_words = f", every sequence split over {split}" if split > 1 else ""
    return (
        f"{len(spec.heads)} configuration(s){tuned} x {len(spec.seeds)} seed(s) = {runs} "
        f"run(s) of {spec.steps} steps on {spec.task!r} ({ctx.device}, {ctx.world_size} "
        f"process(es){split_words})"
    )


def preflight(
    args: argparse.Namespace, command: str, spec: Any, task: Any, ctx: Any, out: Path
) -> bool:
    """The memory check before training (refused unless ``--force``) and, with ``--dry-run``,
    the plan, its estimated time and memory; returns whether it was a dry run."""
    from heatformer.lab.preflight import (
        available_memory,
        check_memory,
        estimate_memory,
        evaluations_per_run,
        plan_time,
        time_steps,
    )

    schedules = list(dict.fromkeys(spec.heads))
    local = max(1, spec.batch_size // ctx.world_size)
    estimates = [estimate_memory(task, heads, batch_size=local) for heads in schedules]
    worst = max(estimates, key=lambda e: e.total)
    available = available_memory(ctx.device)
    if not args.force:
        check_memory(worst, available, seq_len=getattr(spec.options, "seq_len", None))
    if not args.dry_run:
        return False
    from heatformer.lab.bracket import plan_note
    from heatformer.lab.tuning import settings

    say = print if ctx.is_main else (lambda *a, **k: None)
    grid = len(settings(spec.tune))  # every setting runs as long (the sizes do not change)
    runs, evals = len(spec.heads) * grid * len(spec.seeds), evaluations_per_run(spec)
    tuned = f" x {grid} optimiser setting(s){plan_note(spec)}" if spec.tune else ""
    micro = spec.grad_accum
    per = " per process" if ctx.world_size > 1 else ""
    of = f" of {micro} micro-batches of {local // micro}{per}" if micro > 1 else ""
    import torch

    say(
        f"heatformer {command}: dry run: {len(spec.heads)} configuration(s){tuned} x "
        f"{len(spec.seeds)} seed(s) = {runs} run(s) x {spec.steps} steps{of}, {evals} "
        f"evaluation(s) per run, on {spec.task!r} ({ctx.device}, {ctx.world_size} process(es), "
        f"{torch.get_num_threads()} thread(s)); would write {out}",
        flush=True,
    )
    times = {}
    for heads, estimate in zip(schedules, estimates, strict=True):
        t = times[heads] = time_steps(task, heads, ctx.device)
        say(
            f"  {heads}: {t.step:.3g} s/step, {t.evaluation:.3g} s/evaluation"
            + (f", {t.analysis:.3g} s analysis" if spec.analysis else "")
            + f"; peak memory {estimate.describe()}",
            flush=True,
        )
    free = f", {available[0] / 1e9:.1f} GB available ({available[1]})" if available else ""
    minutes = grid * plan_time(spec, times) / 60
    say(
        f"estimated time: {minutes:.1f} min for {runs} run(s) (from 2 timed "
        f"steps after a warm-up, one evaluation{' and one analysis' if spec.analysis else ''} "
        "per configuration)"
    )
    say(f"estimated peak memory: {worst.describe()}{free}")
    say("dry run: nothing trained, nothing written")
    return True


def print_report(report: Any) -> None:
    """Print the tables of a finished comparison: the summary, the paired differences, the
    learned polynomial filters (when some configuration has polynomial heads), the untied skip
    heads' drift from their start (when some has them), the spec's contrasts A - B, the
    selection of each configuration's setting and the primary endpoints; where the files are."""
    from heatformer.lab.report import (
        format_contrast_table,
        format_drift_table,
        format_endpoints,
        format_filter_table,
        format_paired_table,
        format_table,
    )
    from heatformer.lab.tuning import format_selection

    results = report.results
    print()
    print(format_table(report.summary, report.metric_names))
    print()
    paired = format_paired_table(report.summary, report.metric_names)
    if paired and len(results["seeds"]) > 1:
        print(paired)
        print()
    filters = format_filter_table(report.summary)
    if filters:
        print(filters)
        print()
    drift = format_drift_table(report.summary)
    contrasts = format_contrast_table(results.get("contrasts") or [], report.metric_names)
    for table in (drift, contrasts):
        if table:
            print(table)
            print()
    if results.get("selection"):
        print(format_selection(results["selection"]["configurations"]))
        print()
    if results.get("primary"):
        print(format_endpoints(results["primary"]))
        print()
    plan = results["spec"].get("plan")
    if plan:  # its verdicts (its margins, its families across studies): heatformer plan
        print(
            f"plan {plan['path']} (sha256 {plan['sha256'][:16]}, study {plan['study']}): its "
            f"verdicts: heatformer plan {plan['path']} {report.out_dir} [its other studies]\n"
        )
    line = f"mean ± sample std over seeds {results['seeds']}"
    if results.get("selection"):
        line += " (test half, each configuration at its chosen setting)"
    if any(row["analysis"] for row in report.summary):  # not after --no-analysis
        line += "; analysis columns: last layer, per-layer values in results.json and plots/"
        if results.get("analysis_on"):
            line += f"\ngeometry on {results['analysis_on']}"
    print(line)
    print(f"report: {report.out_dir / 'results.json'}")
    print(f"        {report.out_dir / 'results.csv'}")
    if report.plots:
        print(f"        {report.out_dir / 'plots'}/ ({len(report.plots)} PNG figures)")
