"""A task whose training step or evaluation stalls on demand, for the tests of stops.

``slow-recall`` is the ``recall`` task under another name; with ``HEATFORMER_TEST_STALL`` set to
``train:K`` (or ``eval:K``) in the environment, the K-th forward pass of its model in training
(or eval) mode writes the file ``HEATFORMER_TEST_MARKER`` and then stalls for 60 s in short
sleeps, as a long torch computation would. Run as a script, this module is the ``heatformer``
command with that task registered::

    HEATFORMER_TEST_STALL=eval:1 HEATFORMER_TEST_MARKER=/tmp/m python tests/stop_helpers.py \\
        train --task slow-recall ...
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from torch import nn

from heatformer.lab.tasks.recall import Recall

STALL_S = 60.0


class SlowRecall(Recall):
    """The ``recall`` task whose model stalls once where ``HEATFORMER_TEST_STALL`` says."""

    name = "slow-recall"

    def build_model(self, heads: str) -> nn.Module:
        model = super().build_model(heads)
        stall = os.environ.get("HEATFORMER_TEST_STALL")
        if not stall:
            return model
        phase, at_call = stall.split(":")
        marker = Path(os.environ["HEATFORMER_TEST_MARKER"])
        calls = {"n": 0}

        def hook(module: nn.Module, args: object) -> None:
            if module.training != (phase == "train"):
                return
            calls["n"] += 1
            if calls["n"] == int(at_call):
                marker.write_text(f"{phase} {at_call}\n")
                for _ in range(int(STALL_S / 0.01)):  # many short operations
                    time.sleep(0.01)

        model.blocks[0].register_forward_pre_hook(hook)
        return model


if __name__ == "__main__":
    from heatformer.lab.command import main
    from heatformer.lab.tasks import register_task

    register_task(SlowRecall)
    sys.exit(main(sys.argv[1:]))
