"""The ``heatformer`` console script's first lines: SIGTERM is kept from here on.

Importing the command's modules takes 0.2-0.5 s (argparse tables, the task registry); a SIGTERM
in that time used to kill the process silently (status -15). This module imports nothing of
heatformer's before it holds the signal: a SIGTERM that comes while :mod:`heatformer.lab.cli`
loads is kept and reported by the command as any other (one line, status 130).
"""

from __future__ import annotations

import importlib.util
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

#: what the lab needs beyond the library, by import name: the ``lab`` extra of setup.cfg
LAB_MODULES = ("scipy", "sklearn", "tqdm", "matplotlib", "networkx")


def missing_lab_modules() -> list[str]:
    """The :data:`LAB_MODULES` that cannot be imported here (none with the ``lab`` extra)."""
    missing = []
    for name in LAB_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ImportError:  # a parent package that fails to import, or an import blocked
            found = False
        if not found:
            missing.append(name)
    return missing


def _import_cli() -> Any:
    from heatformer.lab import cli

    return cli


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``heatformer`` console script and of ``python -m heatformer``."""
    pending: list[int] = []

    def keep(signum: int, frame: FrameType | None) -> None:
        pending.append(signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, keep)
    missing = missing_lab_modules()
    if missing:  # the library alone is installed: one line, before anything fails inside
        print(
            f"heatformer: the command is the lab's and needs its extra (missing: "
            f"{', '.join(missing)}): pip install 'heatformer[lab]'",
            file=sys.stderr,
        )
        return 2
    cli = _import_cli()
    code: int = cli.main(argv, sigterm_pending=bool(pending))
    return code
