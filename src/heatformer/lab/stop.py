"""How a training run stops: on request, within seconds, with a completed step saved.

:class:`StopSignal` turns SIGINT/SIGTERM into a flag; inside the regions the training loop
(:func:`~heatformer.lab.trainer.train_run`) marks interruptible
(:meth:`StopSignal.interruptible`: drawing the batch, the forward and backward passes, an
evaluation, the final analysis) the handler also raises :class:`StopRequested` at the next
Python bytecode, i.e. within one torch operation. The loop then saves the last completed step
and raises :class:`TrainingInterrupted`. The optimizer step and the checkpoint writes are never
interrupted:

- a step cut short is discarded: its gradients are dropped and the data generator, the
  torch RNG states and the model's persistent buffers are put back as they were before it
  (:func:`step_restorer`), so the checkpoint holds the last completed step, exactly;
- an evaluation cut short (or skipped because the stop came first) is done first when
  the run resumes, so the record is the same as an uninterrupted run's;
- an analysis cut short is redone on resume (the final checkpoint is already saved).

Under DDP (``torchrun``) nothing is interrupted mid-step: the ranks meet in collectives
inside a step, and a rank that left one would leave the others waiting. There the flag is
all-reduced after each optimizer step, as before, and every rank stops at the same step
boundary (skipping that step's evaluation); a step or evaluation longer than the launcher's
own grace period (``torchrun`` kills its workers 30 s after forwarding a signal, by default)
ends with the workers killed and the run resumes from its last periodic checkpoint.

A second Ctrl-C (more than 2 s after the first) stops at once (a plain
:class:`KeyboardInterrupt`, e.g. while a checkpoint is written); the run then resumes
from its last saved checkpoint.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import torch

__all__ = [
    "StopRequested",
    "StopSignal",
    "TrainingInterrupted",
    "step_restorer",
]


class TrainingInterrupted(Exception):
    """A run stopped on request after saving a checkpoint; resume it later.

    Attributes:
        run_dir: the run folder.
        step: the last completed step (saved in the checkpoint).
        steps: the run's total number of steps.
    """

    def __init__(self, run_dir: Path, step: int, steps: int) -> None:
        super().__init__(f"stopped at step {step}/{steps}; checkpoint saved in {run_dir}")
        self.run_dir = run_dir
        self.step = step
        self.steps = steps


class StopRequested(KeyboardInterrupt):
    """A stop signal raised inside a region that :meth:`StopSignal.interruptible` marks.

    The training loop catches it, saves the last completed step and raises
    :class:`TrainingInterrupted`. It is a :class:`KeyboardInterrupt` (not an
    :class:`Exception`), so that no ``except Exception`` on its way swallows it, and so that
    one that escaped a caller's own region still ends the command as an interrupt.
    """


class StopSignal:
    """A stop request set by SIGINT/SIGTERM (while :meth:`installed`) or by code.

    Examples:
        >>> stop = StopSignal()
        >>> stop.requested
        False
        >>> stop.request("test")
        >>> stop.requested, stop.reason
        (True, 'test')
    """

    #: Seconds after the first signal during which repeats are ignored: a Ctrl-C reaches
    #: a ``torchrun`` worker twice (from the terminal and forwarded by the launcher).
    grace_s = 2.0

    def __init__(self) -> None:
        self.requested = False
        self.reason = ""
        self._first_signal: float | None = None
        self._armed = False  # inside an interruptible region: the handler raises

    def request(self, reason: str = "stop requested") -> None:
        """Ask the training loop to stop (after the current step, or at once inside an
        :meth:`interruptible` region when the request comes from a signal)."""
        if not self.requested:
            self.requested, self.reason = True, reason

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if self._first_signal is None:
            self._first_signal = now
        elif signum == signal.SIGINT and now - self._first_signal > self.grace_s:
            raise KeyboardInterrupt  # a second, deliberate Ctrl-C: stop now
        self.request(signal.Signals(signum).name)
        if self._armed:
            self._armed = False  # one raise per region, even if its exit is interrupted
            raise StopRequested(self.reason)

    @contextlib.contextmanager
    def interruptible(self, enabled: bool = True) -> Iterator[None]:
        """A region where a stop signal raises :class:`StopRequested` at once.

        On entry a stop already requested raises at once; inside, the signal handler of
        :meth:`installed` raises it at the next Python bytecode (torch operations return to
        Python between layers, so within one operation). The caller catches it and restores
        what the region changed; code that must not be cut (an optimizer step, a checkpoint
        write) stays outside. Regions do not nest.

        Args:
            enabled: ``False`` makes the region an ordinary block (under DDP, where a rank
                must not leave a collective alone): a signal only sets the flag.

        Raises:
            StopRequested: a stop was requested before or inside the region.

        Examples:
            >>> stop = StopSignal()
            >>> with stop.interruptible():
            ...     stop.request("test")  # set by code: read on entry to the next region
            >>> try:
            ...     with stop.interruptible():
            ...         print("not reached")
            ... except StopRequested as err:
            ...     print(f"stopped: {err}")
            stopped: test
        """
        if not enabled:
            yield
            return
        if self.requested:
            raise StopRequested(self.reason)
        self._armed = True
        try:
            yield
        finally:
            self._armed = False

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopSignal]:
        """Route SIGINT and SIGTERM to :meth:`request` inside the ``with`` block.

        Outside the main thread (where Python cannot install handlers) this does
        nothing and Ctrl-C raises :class:`KeyboardInterrupt` as usual.
        """
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for sig in previous:
                signal.signal(sig, self._handle)
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def step_restorer(
    generator: torch.Generator, device: torch.device, buffers: list[torch.Tensor]
) -> Callable[[], None]:
    """A function that puts back what a training step changes besides the weights and the
    optimizer: the data generator, the torch RNG states and the checkpointed ``buffers``
    (e.g. running statistics), as they are now."""
    data_state, cpu_state = generator.get_state(), torch.get_rng_state()
    cuda_state = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    saved = [b.detach().clone() for b in buffers]

    def restore() -> None:
        generator.set_state(data_state)
        torch.set_rng_state(cpu_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state(cuda_state, device)
        with torch.no_grad():
            for buffer, value in zip(buffers, saved, strict=True):
                buffer.copy_(value)

    return restore
