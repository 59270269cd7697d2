"""What a resume keeps: the folder it continues, the running flags it takes from the last
invocation, and the command that continues a stopped one.

Split from :mod:`heatformer.lab.cli._experiments` along the resume seam: ``spec.json`` holds
what determines the numbers, and :data:`KEPT_FLAGS` are the running flags that change what a
run costs or how its processes wait, which each invocation records in ``invocations.json``.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from heatformer.checks import bad_value
from heatformer.lab.cli._options import speaks
from heatformer.lab.spec import CompareSpec

__all__ = ["KEPT_FLAGS", "folder_of", "resume_command", "take_kept_flags"]

#: The running flags that change what a run costs or computes, or how its processes wait for
#: each other, and that ``spec.json`` does not hold (argparse ``dest`` -> option). Each
#: invocation records them in ``invocations.json`` (its entry's ``"flags"``); ``--resume DIR``
#: takes each one not given on its command line from the last invocation's record, and the
#: printed resume command spells them out. ``--device`` is a spec field, but a resume may
#: override it; the override is kept the same way. ``--log`` changes what a run writes beside
#: its numbers, not the numbers, and is kept too (``--log jsonl`` turns TensorBoard off). Not
#: kept: ``--stop-at-step`` (a resume goes past it), ``--no-progress``, ``--dry-run`` and
#: ``--force``, which change neither.
KEPT_FLAGS = {
    "threads": "--threads",
    "sequence_parallel": "--sequence-parallel",
    "dist_timeout": "--dist-timeout",
    "device": "--device",
    "log": "--log",
}


def folder_of(args: argparse.Namespace) -> Path | None:
    """The folder a command continues: ``--resume DIR``, or ``--out DIR --resume``; ``None``
    without ``--resume``.

    Raises:
        ValueError: ``--resume`` with no folder, or two different folders (naming ``resume``).
    """
    if args.resume is None:
        return None
    if args.resume is True:
        if args.out is None:
            raise bad_value("resume", "expected a folder (--resume DIR or --out DIR --resume)")
        return Path(args.out)
    if args.out is not None and Path(args.out) != Path(args.resume):
        raise bad_value(
            "resume", f"expected one folder, got --resume {args.resume} and --out {args.out}"
        )
    return Path(args.resume)


def take_kept_flags(
    args: argparse.Namespace, command: str, resume_dir: Path, saved: CompareSpec
) -> None:
    """Set each of :data:`KEPT_FLAGS` not given on the command line of ``--resume
    resume_dir`` to its value in the last invocation's record (``--device`` only where that
    differs from ``saved``, the folder's spec), and say so in a note on stderr."""
    from heatformer.lab.folder import read_invocations

    invocations = read_invocations(resume_dir)
    last = invocations[-1].get("flags") if invocations else None
    if not isinstance(last, dict):  # none recorded (a folder of an older heatformer)
        return
    taken = []
    for dest, option in KEPT_FLAGS.items():
        value = last.get(dest)
        if getattr(args, dest) is not None or value is None:
            continue
        if dest == "device" and value == saved.device:
            continue
        setattr(args, dest, value)
        taken.append(f"{option} {_flag_text(value)}")
    if taken and speaks():
        print(
            f"heatformer {command}: note: {' '.join(taken)} as in the last invocation in "
            f"{resume_dir} (a flag given here overrides it)",
            file=sys.stderr,
            flush=True,
        )


def _flag_text(value: object) -> str:
    """A flag's value as the command line takes it back (``20.0`` -> ``20``)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return shlex.quote(str(value))


def resume_command(
    launcher: str, command: str, out: Path, args: argparse.Namespace, saved_device: str
) -> str:
    """The command that continues this invocation in ``out``: ``--resume`` and the
    :data:`KEPT_FLAGS` it ran with (``--device`` where it is not the spec's ``saved_device``)."""
    words = [launcher, command, "--resume", shlex.quote(str(out))]
    for dest, option in KEPT_FLAGS.items():
        value = getattr(args, dest)
        if value is not None and not (dest == "device" and value == saved_device):
            words += [option, _flag_text(value)]
    return " ".join(words)
