"""Named settings of ``heatformer compare --preset NAME`` and ``heatformer train --preset NAME``:
:data:`PRESETS`, and :func:`one_run_presets`, those ``train`` takes.

A preset is a dict of :class:`~heatformer.lab.spec.CompareSpec` fields (with ``options``, the
task's), under the ``--config`` file and the flags given. This module imports no torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PRESETS", "one_run_presets"]

#: Named settings for ``heatformer compare --preset NAME`` (and ``heatformer train --preset
#: NAME``, those of one run: :func:`one_run_presets`); explicit flags override them.
PRESETS: dict[str, dict[str, Any]] = {
    # attention only vs 2 Laplacian heads vs 2 heat heads, small GPT on the stdlib corpus;
    # about 80 s on 2 CPU cores with --threads 1 (see docs/reproducing.md).
    "demo": {
        "task": "chars",
        "heads": ("attention:4", "attention:2,laplacian:2", "attention:2,heat:2"),
        "seeds": (0, 1, 2),
        "steps": 300,
        "batch_size": 16,
        "lr": 2e-3,
        "n_layer": 2,
        "n_embd": 64,
        "eval_every": 50,
        "options": {"seq_len": 64, "eval_size": 64},
        "name": "demo",
    },
    # Zoology's smallest MQAR setting (its figure 2: sequence length 64, 4 key-value pairs,
    # vocabulary 8,192, 2 attention-only layers of width 64, one head, tied embeddings, token 0
    # as filler, a test set of 3,000), trained on fresh batches; >= 99 % test accuracy in a
    # few minutes on 2 CPU cores (docs/tutorials/benchmarks.md has the measured run).
    "mqar-reference": {
        "task": "mqar",
        "heads": ("attention:1",),
        "seeds": (0,),
        "steps": 6000,
        "batch_size": 64,
        "lr": 3e-3,
        "weight_decay": 0.1,
        "n_layer": 2,
        "n_embd": 64,
        "mlp_ratio": 0,
        "eval_every": 500,
        "options": {
            "seq_len": 64,
            "vocab_size": 8192,
            "num_kv_pairs": 4,
            "random_non_queries": False,
            "tie_embeddings": True,
            "eval_size": 3000,
        },
        "name": "mqar-reference",
    },
}


def one_run_presets() -> list[str]:
    """The :data:`PRESETS` of one run (one head schedule, one seed): those ``heatformer train``
    takes.

    Examples:
        >>> "mqar-reference" in one_run_presets(), "demo" in one_run_presets()
        (True, False)
    """
    return [
        name
        for name, values in PRESETS.items()
        if len(values.get("heads", ("",))) == 1 and len(values.get("seeds", (0,))) == 1
    ]
