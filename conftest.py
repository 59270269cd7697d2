"""Collection settings for the whole run (tests/ and the doctests of src/heatformer).

Integrations need their optional library: a module whose library is missing is not
collected for doctests (its tests skip by themselves). Everything runs offline.
"""

from __future__ import annotations

import importlib.util
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # read when huggingface_hub is imported

collect_ignore: list[str] = []
if importlib.util.find_spec("transformers") is None:
    collect_ignore.append("src/heatformer/integrations/hf.py")
