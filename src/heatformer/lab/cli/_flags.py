"""The flags ``heatformer train`` and ``compare`` share, grouped as ``--help`` shows them.

The task options' flags (``--seq-len``, ``--text``, ...) are made from the registered tasks'
options (:func:`add_task_options`); the defaults shown are :class:`~heatformer.lab.
CompareSpec`'s. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from heatformer.lab.cli._options import OptionGroup, OptionParser
from heatformer.lab.spec import CompareSpec
from heatformer.lab.tasks import TASKS, options_by_name
from heatformer.lab.tasks._synthetic import yes_no

__all__ = ["add_analysis_reading", "add_bracket", "add_common", "add_contrast", "add_task_options"]


def add_task_options(group: OptionGroup) -> None:
    """One flag per option of the registered tasks (``seq_len`` -> ``--seq-len``).

    A flag several tasks take is one flag; its help names each task and its default (the
    tasks that share a help line and a default, once).
    """
    for name, by_task in options_by_name().items():
        fields = list(by_task.values())

        def default(f: dataclasses.Field[Any]) -> str:
            value = f.default
            if isinstance(value, tuple):  # as the flag takes it: 256,1024
                value = ",".join(str(v) for v in value)
            return "" if value is None else f" (default {value})"

        texts: dict[str, list[str]] = {}  # one text, the tasks that share it
        for task, f in by_task.items():
            texts.setdefault(f"{f.metadata['help']}{default(f)}", []).append(task)
        text = "; ".join(f"{', '.join(tasks)}: {words}" for words, tasks in texts.items())
        first = fields[0].metadata
        group.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=first["parse"],
            metavar=first["metavar"],
            help=text.replace("%", "%%"),
        )


def add_common(parser: OptionParser) -> None:
    """The flags ``train`` and ``compare`` share, in their help groups."""
    d = {f.name: f.default for f in dataclasses.fields(CompareSpec)}
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="a study file: TOML with the spec's fields (steps = 500, heads = [...]) and an "
        "[options] table of the task's options, or a run folder's spec.json (its study again); "
        "the flags given here override it, field by field (see docs/reproducing.md)",
    )
    g = parser.group("task and data")
    g.add_argument("--task", help=f"{' | '.join(TASKS)} (default {d['task']})")
    add_task_options(g)
    _model_flags(parser.group("model"), d)
    _budget_flags(parser.group("budget (the same for every configuration)"), d)
    _running_flags(parser.group("running"))


def add_bracket(parser: OptionParser) -> None:
    """``compare --bracket N``: how far a tuned grid extends past the edge its best lies at."""
    parser.add_argument(
        "--bracket",
        type=int,
        metavar="N",
        help="with an optimiser --sweep: where a schedule's chosen value of a swept field is the "
        "smallest or largest of its grid, extend that schedule's grid past it (by the grid's "
        "own ratio there, or its difference; within the field's bounds) and train the new "
        "settings with every seed, until the chosen value is inside the grid, at most N values "
        f"past each side (default {CompareSpec.bracket}; 0: never); a chosen value still at an "
        "edge is reported 'at the grid edge', not tuned",
    )


def add_contrast(parser: OptionParser) -> None:
    """``compare --contrast 'A - B'``: two compared schedules against each other."""
    parser.add_argument(
        "--contrast",
        action="append",
        metavar="'A - B'",
        help="a direct contrast of two compared schedules (repeat the flag), e.g. "
        "'attention:2,laplacian:2 - attention:2,center:2': the report gives the paired "
        "differences A - B over the seeds both ran (mean, 95%% interval, paired t-test), "
        "Holm-adjusted over the contrasts, as it does against the baseline",
    )


def _model_flags(g: OptionGroup, d: dict[str, Any]) -> None:
    g.add_argument("--layers", dest="n_layer", type=int, help=f"blocks (default {d['n_layer']})")
    g.add_argument(
        "--n-head",
        "--heads-per-layer",
        dest="n_head",
        type=int,
        help="heads per layer (default: the sum of the --heads counts, else 4)",
    )
    g.add_argument("--embd", dest="n_embd", type=int, help=f"width (default {d['n_embd']})")
    g.add_argument(
        "--mlp-ratio",
        type=int,
        metavar="R",
        help=f"MLP hidden width in units of the width; 0: attention-only blocks, as Zoology's "
        f"MQAR models (default {d['mlp_ratio']})",
    )
    g.add_argument(
        "--graph",
        metavar="SPEC",
        help="graph kind of the attention layers: softmax, topk[k=32], or one per layer "
        "separated by ';' as for --heads (default softmax; kinds: heatformer.graph_ops.GRAPHS)",
    )
    g.add_argument(
        "--topk",
        type=int,
        metavar="K",
        help="keep the K strongest edges per query in every attention graph "
        "(shorthand for --graph topk[k=K])",
    )
    g.add_argument("--dropout", type=float, help="dropout (default 0)")
    g.add_argument(
        "--zero-init-proj",
        type=yes_no,
        metavar="yes|no",
        help="zero every attention layer's output projection at initialization, so that each "
        "layer (a Laplacian head with it) starts as nothing, as the paper's LM code does "
        f"(default {'yes' if d['zero_init_proj'] else 'no'})",
    )


def _budget_flags(g: OptionGroup, d: dict[str, Any]) -> None:
    g.add_argument("--steps", type=int, help=f"optimizer steps per run (default {d['steps']})")
    g.add_argument(
        "--batch-size",
        type=int,
        help=f"global batch, split across DDP ranks (default {d['batch_size']})",
    )
    g.add_argument("--lr", type=float, help=f"peak AdamW learning rate (default {d['lr']})")
    g.add_argument("--weight-decay", type=float, help=f"(default {d['weight_decay']})")
    g.add_argument(
        "--warmup-steps",
        type=int,
        help="linear warm-up (default min(100, steps/10)), then cosine decay to lr/10",
    )
    g.add_argument("--grad-clip", type=float, help="max gradient norm, 0 = off (default 1)")
    g.add_argument(
        "--grad-accum",
        type=int,
        metavar="N",
        help="accumulate the gradients of N micro-batches of batch-size/N per step: the "
        "numbers of the whole batch in the memory of one micro-batch (default 1)",
    )
    g.add_argument("--eval-every", type=int, help="evaluate every N steps (default steps/10)")
    g.add_argument("--ckpt-every", type=int, help="checkpoint every N steps (default: eval-every)")
    _analysis_flags(g)


def _analysis_flags(g: OptionGroup) -> None:
    g.add_argument(
        "--no-analysis", action="store_true", help="skip the per-layer token-geometry analysis"
    )
    add_analysis_reading(g)


def add_analysis_reading(g: OptionGroup | OptionParser) -> None:
    """The flags of what the analysis reads (``train``, ``compare``, and ``analyze``, where
    they override the folder's spec); each is ``None`` when not given."""
    g.add_argument(
        "--analysis-split",
        metavar="test|train",
        help="the analysis reads the task's held-out batch (default test) or a training "
        "batch of the same size (train)",
    )
    g.add_argument(
        "--analysis-point",
        metavar="pre_ln|post_ln",
        help="the analysis reads each block's output (default pre_ln) or that output through "
        "the model's final LayerNorm (post_ln)",
    )
    g.add_argument(
        "--no-analysis-cls",
        dest="analysis_cls",
        action="store_false",
        default=None,
        help="leave the cls token out of the analysis (tasks whose model has one: digits)",
    )


def _running_flags(g: OptionGroup) -> None:
    g.add_argument("--out", metavar="DIR", help="output folder (default runs/<name>-<time>)")
    g.add_argument("--name", help="a label for the report and the default --out")
    g.add_argument(
        "--resume",
        nargs="?",
        const=True,
        metavar="DIR",
        help="continue the interrupted job in DIR (or --out): finished runs are "
        "skipped, the interrupted one continues from its checkpoint, with the spec saved in "
        "DIR and the --threads, --sequence-parallel, --dist-timeout and --device of the last "
        "invocation there (a flag given here overrides it)",
    )
    g.add_argument("--device", help="auto | cpu | cuda[:N] (default auto: CUDA if available)")
    g.add_argument(
        "--sequence-parallel",
        type=int,
        metavar="P",
        help="under torchrun: split every sequence over groups of P consecutive processes "
        "(window graph kinds, GPT tasks), data parallel over the groups (default 1)",
    )
    g.add_argument(
        "--dist-timeout",
        type=float,
        metavar="S",
        help="under torchrun: seconds a process waits for the others at a collective before "
        "it fails, e.g. when one died (default: torch's)",
    )
    g.add_argument(
        "--precision",
        metavar="fp32|bf16|fp16",
        help="fp32 (default); bf16: bfloat16 autocast; fp16: float16 autocast with a gradient "
        "scaler (CUDA only)",
    )
    g.add_argument(
        "--bf16",
        action="store_true",
        default=None,
        help="deprecated: the same as --precision bf16",
    )
    g.add_argument("--compile", action="store_true", default=None, help="torch.compile the model")
    g.add_argument(
        "--activation-checkpointing",
        action="store_true",
        default=None,
        help="recompute each block's activations in backward instead of keeping them: "
        "training memory of about one layer, for about one more forward per step",
    )
    g.add_argument(
        "--stop-at-step",
        type=int,
        metavar="K",
        help="stop (saving a checkpoint, as Ctrl-C does) when a run reaches step K",
    )
    g.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="torch CPU threads per process (default: torch's choice; 1 is often "
        "fastest for small models or on a busy machine)",
    )
    g.add_argument(
        "--log",
        metavar="jsonl|tensorboard",
        help="what each run logs in its folder as it trains: jsonl, every step and evaluation "
        "appended to metrics.jsonl (default); tensorboard, that and TensorBoard event files in "
        "tensorboard/ (pip install 'heatformer[tensorboard]')",
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    g.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (runs x steps, evaluations), the time estimated from a few timed "
        "steps of each configuration and the estimated peak memory, then exit; writes nothing",
    )
    g.add_argument(
        "--force",
        action="store_true",
        help="run even when the estimated peak memory exceeds the memory available",
    )
