"""One process of a pooled gloo group (:class:`sequence_parallel_helpers.GroupPool`).

``python _group_worker.py RANK WORLD STORE_FILE PATHS``: imports torch, joins a gloo group
through a file store (loopback only), then serves calls until its stdin closes: each line is
``{"fn": "module:function", "args": [...], "out": PREFIX}``; it runs ``function(rank, world,
*args)``, saves the result with ``torch.save`` to ``PREFIX.RANK`` and answers one JSON line on
stdout, ``{"ok": true}`` or ``{"ok": false, "error": traceback}``. ``PATHS`` (``os.pathsep``
separated) are put first on ``sys.path`` for the ``module`` names. The import of torch and
the group's set-up, seconds per process on a loaded machine, are paid once for many calls.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import sys
import traceback


def main() -> None:
    rank, world, store = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    sys.path[:0] = [p for p in sys.argv[4].split(os.pathsep) if p]
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    print(json.dumps({"ok": True, "ready": True}), flush=True)
    for line in sys.stdin:
        call = json.loads(line)
        try:
            module, name = call["fn"].split(":")
            result = getattr(importlib.import_module(module), name)(rank, world, *call["args"])
            torch.save(result, f"{call['out']}.{rank}")
            reply = {"ok": True}
        except Exception:
            reply = {"ok": False, "error": traceback.format_exc()}
        print(json.dumps(reply), flush=True)
    # stdin closed: the pool is done with the group; leave without tearing it down (every rank
    # leaves at once, and an orderly teardown costs seconds per process)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
