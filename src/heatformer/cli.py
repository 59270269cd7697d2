"""The ``heatformer`` command.

Subcommands are registered in :data:`COMMANDS` (name -> (help, add_arguments, run)); each
``run`` returns the process exit code. Errors in user input (``ValueError``, ``TypeError``,
``FileNotFoundError``) print one clear line to stderr, naming the option, and exit with
status 2; other file-system errors print one line and exit with status 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import heatformer
from heatformer.experiments import commands as _experiments
from heatformer.viz import _cli as _demo_cli

AddArgs = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]


def _ops_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=64, help="tokens N (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


def _ops_run(args: argparse.Namespace) -> int:
    """Apply every operator to a signal on a random causal attention graph; print a table."""
    import torch

    from heatformer.graph_ops import SoftmaxGraph, laplacian, resolve_operator

    if args.nodes < 2:
        raise ValueError(f"--nodes: expected at least 2, got {args.nodes}")
    gen = torch.Generator().manual_seed(args.seed)
    n, d = args.nodes, 16
    q = torch.randn(1, n, d, generator=gen, dtype=torch.float64)
    k = torch.randn(1, n, d, generator=gen, dtype=torch.float64)
    x = torch.randn(1, n, 8, generator=gen, dtype=torch.float64)
    graph = SoftmaxGraph(q, k)
    specs: list[tuple[str, dict[str, float]]] = [
        ("attention", {}),
        ("laplacian", {}),
        ("heat", {"t": 0.5}),
        ("heat", {"t": 2.0}),
        ("ppr", {"alpha": 0.2}),
    ]

    def spread(y: torch.Tensor) -> float:  # mean squared distance to the sequence mean
        return float(((y - y.mean(-2, keepdim=True)) ** 2).sum(-1).mean())

    def energy(y: torch.Tensor) -> float:  # Dirichlet energy tr(y^T L_sym y) / tr(y^T y)
        return float((y * laplacian(graph, y, "sym")).sum() / (y * y).sum())

    print(
        f"heatformer {heatformer.__version__}: operators on a random attention graph "
        f"(N={n}, seed={args.seed})"
    )
    print(f"{'operator':<22}{'token spread':>14}{'Dirichlet energy':>18}")
    print(f"{'input x':<22}{spread(x):>14.4f}{energy(x):>18.4f}")
    for name, kwargs in specs:
        op = resolve_operator(name, **kwargs)
        y = op(graph, x)
        label = name + "".join(f" {k}={v:g}" for k, v in kwargs.items())
        print(f"{label:<22}{spread(y):>14.4f}{energy(y):>18.4f}")
    print("Averaging (attention, heat, ppr) shrinks the spread and the energy (low-pass);")
    print("the Laplacian head keeps the high-frequency part (high-pass).")
    return 0


COMMANDS: dict[str, tuple[str, AddArgs, Run]] = {
    "demo-ops": ("operators on a random attention graph (a quick look)", _ops_args, _ops_run),
    "demo": (_demo_cli.DEMO_HELP, _demo_cli.add_demo_arguments, _demo_cli.run_demo),
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
}


def _build_parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="heatformer",
        description="Attention matrices as graphs: diffusion heads for transformers.",
    )
    parser.add_argument(
        "--version", action="version", version=f"heatformer {heatformer.__version__}"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers = {}
    for name, (help_text, add_args, _) in COMMANDS.items():
        subparsers[name] = sub.add_parser(name, help=help_text, description=help_text)
        add_args(subparsers[name])
    return parser, subparsers


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    return _build_parsers()[0]


#: Argument names used by the library that differ from the option's dest.
_ALIASES = {"text_path": "text", "npz_path": "npz", "out_dir": "out", "seeds": "seed"}


def _name_the_option(message: str, parser: argparse.ArgumentParser) -> str:
    """``"n_embd: expected ..."`` -> ``"--embd: expected ..."`` for the subcommand's options.

    Library errors name the argument (``steps``, ``n_embd``, ``text_path``); on the command
    line the user typed an option, so the message should name that. Messages that do not
    start with the name of one of the subcommand's options are returned unchanged.
    """
    name, sep, rest = message.partition(": ")
    if not sep or not name.isidentifier():
        return message
    flags = {
        action.dest: next(o for o in action.option_strings if o.startswith("--"))
        for action in parser._actions
        if any(o.startswith("--") for o in action.option_strings)
    }
    dest = name if name in flags else _ALIASES.get(name, "")
    return f"{flags[dest]}: {rest}" if dest in flags else message


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``heatformer`` console script."""
    parser, subparsers = _build_parsers()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return COMMANDS[args.command][2](args)
    except (ValueError, TypeError, FileNotFoundError) as err:
        message = _name_the_option(str(err), subparsers[args.command])
        print(f"heatformer {args.command}: error: {message}", file=sys.stderr)
        return 2
    except OSError as err:  # the file system refused (disk full, permissions): no traceback
        print(f"heatformer {args.command}: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"heatformer {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
