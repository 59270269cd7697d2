"""The ``heatformer`` console script's first lines: SIGTERM is kept from here on.

Importing the command's modules takes 0.2-0.5 s (argparse tables, the task registry); a SIGTERM
in that time used to kill the process silently (status -15). This module imports nothing of
heatformer's before it holds the signal: a SIGTERM that comes while :mod:`heatformer.lab.cli`
loads is kept and reported by the command as any other (one line, status 130).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any


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
    cli = _import_cli()
    code: int = cli.main(argv, sigterm_pending=bool(pending))
    return code
