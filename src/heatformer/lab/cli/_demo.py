"""``heatformer demo``: the command-line face of :func:`heatformer.lab.demo.build_demo`.

The options are defined here, without importing :mod:`heatformer.viz` (which imports torch);
:func:`run_demo` imports it when the command runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from heatformer.lab.cli._options import OptionParser

if TYPE_CHECKING:
    from heatformer.lab.demo import DemoResult

DEMO_HELP = (
    "teaching demo: attention graphs of a small trained GPT, as pictures, a web page and an "
    "interactive page"
)

#: The default ``--text``; the same as :data:`heatformer.lab.demo.DEFAULT_TEXT` (a test checks
#: it), repeated here so that parsing the options needs no torch.
DEFAULT_TEXT = "def add(a, b): return a + b"


def add_demo_arguments(parser: OptionParser) -> None:
    """Options of ``heatformer demo``."""
    parser.add_argument(
        "--out", default="heatformer-demo", help="output folder (default heatformer-demo)"
    )
    parser.add_argument(
        "--text",
        default=DEFAULT_TEXT,
        help=f"sentence to look at, 2-64 bytes (default {DEFAULT_TEXT!r})",
    )
    parser.add_argument(
        "--steps", type=int, default=200, help="training steps per model (default 200)"
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--layer", type=int, default=0, help="layer shown in the single-head pictures (default 0)"
    )
    parser.add_argument(
        "--no-compare", action="store_true",
        help="train only the model with Laplacian heads (skips the token-geometry picture)",
    )  # fmt: skip
    parser.add_argument(
        "--hf-model", metavar="DIR", default=None,
        help="draw a local transformers checkpoint folder's own attention instead (offline; "
        "needs a tokenizer in DIR and the hf extra; nothing is trained: --steps, --seed and "
        "--no-compare do not apply)",
    )  # fmt: skip
    parser.add_argument(
        "--heads", default=None,
        help="with --hf-model: convert the model to this head spec first, e.g. "
        "'attention:10,laplacian:2' (default: its own heads)",
    )  # fmt: skip
    parser.add_argument("--no-gif", action="store_true", help="skip the animated GIF")
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress report (training, pictures)"
    )


def run_demo(args: argparse.Namespace) -> int:
    """Build the demo; print where the page is. Returns the exit code."""
    try:
        from heatformer.viz import require_matplotlib

        require_matplotlib()
    except ImportError as err:
        print(f"heatformer demo: error: {err}", file=sys.stderr)
        return 2
    if args.heads is not None and args.hf_model is None:
        print("heatformer demo: error: --heads applies only with --hf-model", file=sys.stderr)
        return 2
    if args.hf_model is not None:
        return _run_hf_demo(args)
    from heatformer.lab.demo import build_demo

    result = build_demo(
        args.out, text=args.text, steps=args.steps, seed=args.seed, layer=args.layer,
        compare=not args.no_compare, gif=not args.no_gif, progress=not args.no_progress,
    )  # fmt: skip
    return _print_result(result)


def _run_hf_demo(args: argparse.Namespace) -> int:
    from heatformer.lab.demo import build_hf_demo

    try:
        result = build_hf_demo(
            args.out, args.hf_model, text=args.text, layer=args.layer, heads=args.heads,
            gif=not args.no_gif, progress=not args.no_progress,
        )  # fmt: skip
    except ImportError as err:  # transformers missing: the message names the extra
        print(f"heatformer demo: error: {err}", file=sys.stderr)
        return 2
    return _print_result(result)


def _print_result(result: DemoResult) -> int:
    """Print what the demo wrote (each trained model's first and last loss, the pictures, the
    pages); returns the exit code 0."""
    for name, (first, last) in result.losses.items():
        print(f"{name:<26} training loss {first:.3f} -> {last:.3f} bits/byte")
    print(f"wrote {len(result.files)} pictures in {result.seconds:.1f} s")
    print(f"open {result.index_html.resolve()}")
    if result.explore_html is not None:
        print(f"play with it: {result.explore_html.resolve()} (interactive, offline)")
    return 0
