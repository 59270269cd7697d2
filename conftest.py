"""Collection settings for the whole run (tests/ and the doctests of src/heatformer).

Integrations need their optional library: a module whose library is missing is not
collected for doctests (its tests skip by themselves). Everything runs offline. The run ends
with what it skipped, counted by reason (:func:`pytest_terminal_summary`).
"""

from __future__ import annotations

import importlib.util
import os
from collections import Counter
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # read when huggingface_hub is imported

collect_ignore: list[str] = []
if importlib.util.find_spec("transformers") is None:
    collect_ignore += [
        "src/heatformer/integrations/hf.py",
        "src/heatformer/integrations/_hf_attention.py",
    ]


def _skip_reason(report: Any) -> str:
    """The reason of a skipped test's report (``longrepr`` is ``(path, line, "Skipped: ...")``)."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else longrepr
    return str(reason).removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """What was skipped and why, one line per reason with its count (``-rs`` would list every
    test location: dozens of lines of "needs a CUDA device")."""
    reasons = Counter(_skip_reason(r) for r in terminalreporter.stats.get("skipped", []))
    if reasons:
        terminalreporter.section("skipped, by reason", sep="-")
        for reason, count in sorted(reasons.items(), key=lambda item: (-item[1], item[0])):
            terminalreporter.line(f"{count:6d}  {reason}")
