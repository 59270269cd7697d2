"""Progress of long work (training, comparisons, analysis, the demo), on stderr.

The one place where heatformer reports progress. :class:`Progress` draws a tqdm bar when the
stream is a terminal; otherwise (stderr redirected to a file or a pipe, a CI log) it writes
plain lines, one each time another tenth of the work is done and at least every 30 s, and
never a carriage return::

    c00-attention4-s0: step 150/300 (50%), loss 2.31, 12 s

A disabled :class:`Progress` (``enabled=False``, e.g. ``--no-progress`` or a DDP rank other
than 0) writes nothing. This module imports neither torch nor tqdm until a bar is drawn.

Examples:
    >>> import io
    >>> stream = io.StringIO()
    >>> with Progress(4, "run", stream=stream) as bar:
    ...     for _ in range(4):
    ...         bar.update(1, loss=2.5)
    >>> print(stream.getvalue().replace("0 s", "T"), end="")
    run: step 1/4 (25%), loss 2.5, T
    run: step 2/4 (50%), loss 2.5, T
    run: step 3/4 (75%), loss 2.5, T
    run: step 4/4 (100%), loss 2.5, T
"""

from __future__ import annotations

import math
import sys
import time
from types import TracebackType
from typing import Any, TextIO

__all__ = ["Progress", "is_terminal"]


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is an interactive terminal (where a redrawn bar makes sense)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


class Progress:
    """A progress report of ``total`` units of work: a tqdm bar, or plain periodic lines.

    Args:
        total: units of work (steps, runs).
        desc: what is being done, the start of every line (``"c00-attention4-s0"``).
        enabled: report at all (``False``: a no-op object).
        initial: units already done (a resumed run starts its count there).
        unit: the word before the count (``"step"``, ``"run"``).
        position: line of the bar on a terminal (0 = top; nested bars use 1).
        leave: keep the bar on the terminal when closed.
        stream: where to write (default: ``sys.stderr`` at construction).
        every_fraction, every_s: on a stream that is not a terminal, a line is written each
            time a further ``every_fraction`` of ``total`` is done (0.1: at 10 %, 20 %, ...)
            and whenever ``every_s`` seconds passed since the last line.
    """

    def __init__(
        self,
        total: int,
        desc: str,
        *,
        enabled: bool = True,
        initial: int = 0,
        unit: str = "step",
        position: int = 0,
        leave: bool = True,
        stream: TextIO | None = None,
        every_fraction: float = 0.1,
        every_s: float = 30.0,
    ) -> None:
        self.total, self.desc, self.unit = max(int(total), 0), desc, unit
        self.n = int(initial)
        self.enabled = bool(enabled)
        self._stream = stream if stream is not None else sys.stderr
        self._every_fraction, self._every_s = every_fraction, every_s
        self._started = self._last_line = time.monotonic()
        self._postfix: dict[str, Any] = {}
        self._mark = self._bucket(self.n)
        self._bar: Any = None
        if self.enabled and is_terminal(self._stream):
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.total, initial=self.n, desc=desc, unit=unit, position=position,
                leave=leave, dynamic_ncols=True, file=self._stream,
            )  # fmt: skip

    def _bucket(self, n: int) -> int:
        if self.total <= 0:
            return 0
        return math.floor(n / self.total / self._every_fraction + 1e-9)

    @property
    def elapsed_s(self) -> float:
        """Seconds since this report started."""
        return time.monotonic() - self._started

    def line(self) -> str:
        """The current state as one line (what a redirected stream receives)."""
        percent = 100.0 * self.n / self.total if self.total else 100.0
        extra = "".join(f", {key} {_format(value)}" for key, value in self._postfix.items())
        return (
            f"{self.desc}: {self.unit} {self.n}/{self.total} ({percent:.0f}%){extra}, "
            f"{self.elapsed_s:.0f} s"
        )

    def update(self, n: int = 1, **postfix: Any) -> None:
        """Count ``n`` more units done; ``postfix`` (e.g. ``loss=2.31``) joins the report."""
        if not self.enabled:
            return
        self.n += n
        self._postfix.update(postfix)
        if self._bar is not None:
            if postfix:
                shown = {key: _format(value) for key, value in self._postfix.items()}
                self._bar.set_postfix(shown, refresh=False)
            self._bar.update(n)
            return
        now = time.monotonic()
        bucket = self._bucket(self.n)
        if bucket > self._mark or now - self._last_line >= self._every_s:
            self._mark, self._last_line = bucket, now
            self._stream.write(self.line() + "\n")
            self._stream.flush()

    def raise_total(self, total: int) -> None:
        """Raise the units of work to ``total`` when more were found (a comparison's runs that
        extend a tuned grid); a smaller ``total`` changes nothing."""
        if total <= self.total:
            return
        self.total = int(total)
        self._mark = self._bucket(self.n)  # the fractions done, of the new total
        if self._bar is not None:
            self._bar.total = self.total
            self._bar.refresh()

    def close(self) -> None:
        """Finish the report (closes the bar)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
