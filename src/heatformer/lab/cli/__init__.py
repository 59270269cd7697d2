"""The ``heatformer`` command.

Subcommands are registered in :data:`COMMANDS` (name -> (help, add_arguments, run)); each
``run`` returns the process exit code. Errors in user input (``ValueError``, ``TypeError``,
``FileNotFoundError``) print one clear line to stderr, naming the option, and exit with
status 2; other file-system errors print one line and exit with status 1. Under ``torchrun``
argparse's usage errors are printed by rank 0 alone
(:func:`~heatformer.lab.cli._options.speaks`), and so are these lines when every rank fails
alike: another rank waits for ``torchrun`` to stop it once rank 0 has failed, and prints its
line itself only if that does not come (an error of its own). It does not exit at once: its
exit would make ``torchrun`` stop rank 0, maybe before rank 0 has said why.

The library names the argument that was wrong on the exception (``err.argument``, see
:mod:`heatformer.checks`); the command line turns it into the option the user typed through
the table its parser kept while the options were added
(:class:`~heatformer.lab.cli._options.OptionParser`): ``n_embd`` -> ``--embd``.

The command line is parsed before torch is imported: this package and the modules that
define the options (:mod:`heatformer.lab.cli._experiments`, :mod:`heatformer.lab.cli._demo`,
:mod:`heatformer.lab.cli._ops`, :mod:`heatformer.lab.cli._plan`) import torch, the models and
the data only inside the ``run`` functions, so ``heatformer --help`` and a mistyped flag
answer at once.

A process that another one keeps out of its run folder
(:class:`~heatformer._atomic.FolderInUse`) prints that line and exits with status 2.
SIGTERM is turned into an interrupt from the first line of :func:`main` on, before torch
is imported: while a run trains it stops the run with a checkpoint (the runner's own
handler), at any other moment it ends the command with one line and status 130, as Ctrl-C
does.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import FrameType

import heatformer
from heatformer._atomic import FolderInUse
from heatformer._suggest import closest
from heatformer.lab.cli import _demo, _experiments, _ops, _plan
from heatformer.lab.cli._heap import fix_mmap_threshold
from heatformer.lab.cli._options import OptionParser, speaks

__all__ = ["COMMANDS", "build_parser", "main"]

AddArgs = Callable[[OptionParser], None]
Run = Callable[[argparse.Namespace], int]


COMMANDS: dict[str, tuple[str, AddArgs, Run]] = {
    "demo-ops": (_ops.OPS_HELP, _ops.add_ops_arguments, _ops.run_ops),
    "demo": (_demo.DEMO_HELP, _demo.add_demo_arguments, _demo.run_demo),
    "train": (
        "train one head configuration on a built-in task",
        _experiments.add_train_args,
        _experiments.run_train,
    ),
    "compare": (
        "compare head configurations x seeds under one budget (the main job)",
        _experiments.add_compare_args,
        _experiments.run_compare_command,
    ),
    "analyze": (
        "recompute per-layer token-geometry metrics of a compare run from its checkpoints",
        _experiments.add_analyze_args,
        _experiments.run_analyze,
    ),
    "plan": (_plan.PLAN_HELP, _plan.add_plan_args, _plan.run_plan),
}


def _build_parsers() -> tuple[OptionParser, dict[str, OptionParser]]:
    parser = OptionParser(
        prog="heatformer",
        description="Attention matrices as graphs: diffusion heads for transformers.",
    )
    parser.add_argument(
        "--version", action="version", version=f"heatformer {heatformer.__version__}"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OptionParser)
    subparsers: dict[str, OptionParser] = {}
    for name, (help_text, add_args, _) in COMMANDS.items():
        subparsers[name] = sub.add_parser(name, help=help_text, description=help_text)
        add_args(subparsers[name])
    return parser, subparsers


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    return _build_parsers()[0]


#: Argument names used by the library that differ from the option's dest.
_ALIASES = {
    "text_path": "text",
    "npz_path": "npz",
    "out_dir": "out",
    "seeds": "seed",
    "operators": "heads",  # a layer refusing its operators: the schedule the user gave
}


def _name_the_option(err: BaseException, options: Mapping[str, str]) -> str:
    """The error's message naming the option the user typed: ``n_embd`` -> ``--embd: ...``.

    Library errors carry the argument's name (``err.argument``: ``steps``, ``n_embd``,
    ``text_path``) and the rest of the message (``err.detail``); on the command line the user
    typed an option, so the message names that. ``options`` is the subcommand's ``dest ->
    option`` table (:attr:`OptionParser.option_of`). An error that names no option of the
    subcommand, or carries no ``.argument`` (a file that cannot be read, a path that holds
    something else), keeps its message: the text is never parsed.
    """
    message = str(err)
    argument, detail = getattr(err, "argument", None), getattr(err, "detail", None)
    if not (isinstance(argument, str) and isinstance(detail, str)):
        return message
    dest = argument if argument in options else _ALIASES.get(argument, "")
    return f"{options[dest]}: {detail}" if dest in options else message


def _unrecognized(extras: Sequence[str], parser: OptionParser) -> str:
    """``"unrecognized arguments: --seeds 3 (did you mean --seed?)"`` for ``parser``'s options.

    Each unknown option (``--name`` or ``--name=value``) gets the closest of the
    subcommand's own options, if one is close (:func:`heatformer._suggest.closest`).
    """
    known = [option[2:] for option in parser.long_options]
    hints = []
    for extra in extras:  # compared without the "--" that every option shares
        if extra.startswith("--"):
            close = closest(extra[2:].partition("=")[0], known)
            hints += [] if close is None else [f"--{close}"]
    message = f"unrecognized arguments: {' '.join(extras)}"
    if hints:
        message += f" (did you mean {' or '.join(dict.fromkeys(hints))}?)"
    return message


#: seconds a ``torchrun`` rank other than 0 waits, after an error, for ``torchrun`` to stop it
#: (which it does once rank 0 has failed too, and said why) before it prints its own error
QUIET_RANK_WAIT_S = 30.0


def _error(line: str) -> None:
    """Print an error line to stderr, once under ``torchrun`` (see the module's docstring)."""
    if not speaks():
        try:
            time.sleep(QUIET_RANK_WAIT_S)
        except KeyboardInterrupt:  # Terminated: torchrun stops this rank, rank 0 has reported
            return
    print(line, file=sys.stderr)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as an interrupt in the running command (see :class:`_Sigterm`)."""


class _Sigterm:
    """The SIGTERM handler of :func:`main`, installed before anything else happens.

    Until :meth:`arm` (while the command line is parsed) a SIGTERM is kept for later; from
    :meth:`arm` on, one raises :class:`Terminated` where the command is, so that the command's
    ``except KeyboardInterrupt`` reports it; after :meth:`disarm` it is kept again (the
    command is over; the process exits with the command's status).
    """

    def __init__(self) -> None:
        self.armed = False
        self.pending = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.pending = True
        if self.armed:
            raise Terminated("terminated (SIGTERM)")

    def arm(self) -> None:
        """Raise from now on; at once for a SIGTERM that came before."""
        self.armed = True
        if self.pending:
            raise Terminated("terminated (SIGTERM)")

    def disarm(self) -> None:
        self.armed = False

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """This handler for SIGTERM inside the block (in the main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGTERM, self)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None, *, sigterm_pending: bool = False) -> int:
    """The ``heatformer`` command (the console script enters through :mod:`heatformer.lab.command`,
    which keeps a SIGTERM that comes while this package loads: ``sigterm_pending``)."""
    sigterm = _Sigterm()
    sigterm.pending = sigterm_pending
    fix_mmap_threshold()  # freed tensors leave the process (see heatformer.lab.cli._heap)
    with sigterm.installed():  # first: a SIGTERM while torch loads is no silent -15
        return _main(argv, sigterm)


def _main(argv: Sequence[str] | None, sigterm: _Sigterm) -> int:
    parser, subparsers = _build_parsers()
    args, extras = parser.parse_known_args(argv)
    if extras:  # reported by the subcommand, whose usage line lists the options it has
        sub = subparsers.get(args.command) if args.command is not None else None
        (sub or parser).error(_unrecognized(extras, sub or parser))
    if args.command is None:
        parser.print_help()
        return 0
    try:
        sigterm.arm()
        return COMMANDS[args.command][2](args)
    except (ValueError, TypeError, FileNotFoundError, FolderInUse) as err:
        message = _name_the_option(err, subparsers[args.command].option_of)
        _error(f"heatformer {args.command}: error: {message}")
        return 2
    except OSError as err:  # the file system refused (disk full, permissions): no traceback
        _error(f"heatformer {args.command}: error: {err}")
        return 1
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (Terminated) outside a run
        print(f"heatformer {args.command}: {err or 'interrupted'}", file=sys.stderr)
        return 130
    finally:
        sigterm.disarm()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
