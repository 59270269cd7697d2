"""A study's plan on the command line: ``compare --plan FILE`` and ``heatformer plan FILE DIR...``.

``compare --plan FILE`` sets the spec's ``plan`` (:mod:`heatformer.lab.plan`: the file is read,
checked against the comparison and recorded, with its sha256, in ``spec.json`` and
``results.json``); ``heatformer plan FILE DIR...`` prints the plan's verdicts across the
finished comparisons in the folders (:mod:`heatformer.lab.report.plan`). Nothing here imports
torch until a command runs.
"""

from __future__ import annotations

import argparse

from heatformer.lab.cli._options import OptionParser

__all__ = ["PLAN_HELP", "add_plan_args", "add_plan_flag", "run_plan"]

PLAN_HELP = (
    "a study plan's verdicts across the compare folders it names: per claim, Holm over "
    "superiority and equivalence at the plan's margins, power, and whether the plan was "
    "committed before the runs"
)


def add_plan_flag(parser: OptionParser) -> None:
    """``compare --plan FILE``."""
    parser.add_argument(
        "--plan",
        metavar="FILE",
        help="the study's plan (TOML: alpha, [study.NAME] seeds, [[claim]] endpoints, "
        "baseline, configurations, margin, side; see docs/reproducing.md): the comparison, "
        "named as one of its studies (--name or the --config file's name), must have its seeds "
        "and configurations, --primary must be among its endpoints (default: all of them); its "
        "path and sha256 are recorded in spec.json and results.json",
    )


def add_plan_args(parser: OptionParser) -> None:
    """Arguments of ``heatformer plan``."""
    parser.add_argument("plan", metavar="FILE", help="the plan file (TOML)")
    parser.add_argument(
        "folders",
        metavar="DIR",
        nargs="+",
        help="finished compare folders, one per study of the plan (found by the spec's name, "
        "else the folder's); a claim whose studies are not all given is not evaluated",
    )
    parser.add_argument(
        "--json", metavar="OUT", help="also write the evaluation to OUT (JSON, with the sha256)"
    )
    parser.epilog = (
        "example:\n  heatformer plan docs/study/suite-plan.toml runs/study/mqar-ops "
        "runs/study/mqar-window"
    )
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def run_plan(args: argparse.Namespace) -> int:
    """``heatformer plan FILE DIR...``: print the plan's verdicts (and write ``--json``)."""
    from heatformer.lab.checkpoint import atomic_write_json
    from heatformer.lab.plan import read_plan
    from heatformer.lab.report.plan import evaluate_plan, format_plan

    evaluation = evaluate_plan(read_plan(args.plan), args.folders)
    print(format_plan(evaluation))
    if args.json:
        atomic_write_json(args.json, evaluation)
        print(f"evaluation: {args.json}")
    return 0
