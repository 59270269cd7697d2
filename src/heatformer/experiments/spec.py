"""What a comparison runs: :class:`CompareSpec`, head schedules, seeds and presets.

A comparison trains several head configurations (``heads``) with several seeds each,
under one budget: the same steps, batch size, learning rate, schedule, data and seeds
for every configuration. Everything that determines the numbers lives in one frozen
:class:`CompareSpec`, which is stored as ``spec.json`` in the run folder, so
``--resume`` and ``heatformer analyze`` rebuild exactly what ran.

Head schedules are strings, turned into model arguments only here (the CLI/config
boundary):

- ``"attention:6,laplacian:2"`` -- the same heads in every layer; the counts sum to the
  number of heads per layer. A bare ``"attention"`` means all heads. Operator
  parameters go in brackets: ``"attention:6,heat[t=0.5]:2"`` (see
  :mod:`heatformer.models.heads`).
- ``"attention:4;attention:2,laplacian:2"`` -- one spec per layer, separated by ``;``
  (here 2 layers: plain attention below, two Laplacian heads above); ``|`` works too.
  The number of layer specs must equal ``n_layer``.

This module imports no torch at import time (the models and the data are imported inside
the functions that need them): the command line reads the defaults of :class:`CompareSpec`
and the :data:`PRESETS` for its help pages before torch is loaded.

Examples:
    >>> split_layers("attention:4;attention:2,laplacian:2")
    ('attention:4', 'attention:2,laplacian:2')
    >>> infer_num_heads("attention:6,heat:2")
    8
    >>> parse_seeds("3"), parse_seeds("4,7")
    ((0, 1, 2), (4, 7))
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "PRESETS",
    "TASK_DEFAULT_ANALYSIS_SIZE",
    "TASK_DEFAULT_SEQ_LEN",
    "CompareSpec",
    "check_heads",
    "infer_num_heads",
    "parse_seeds",
    "run_name",
    "split_layers",
]

#: Sequence length used when a spec leaves ``seq_len`` unset (digits has no sequence).
TASK_DEFAULT_SEQ_LEN: dict[str, int] = {"chars": 128, "recall": 128}

#: Sequences (images) in the fixed analysis batch when a spec leaves ``analysis_size``
#: unset: next-token groups need many tokens but few sequences; Neural Collapse needs
#: several examples per class (digits: the whole test split, 360 images).
TASK_DEFAULT_ANALYSIS_SIZE: dict[str, int] = {"chars": 32, "digits": 512, "recall": 256}

#: Heads per layer when the schedule gives no counts (a bare ``"attention"``).
_DEFAULT_NUM_HEADS = 4


@dataclass(frozen=True)
class CompareSpec:
    """Everything that determines the numbers of a comparison.

    Attributes mirror the command-line flags of ``heatformer compare``. ``None`` in
    ``seq_len``, ``n_head``, ``eval_every``, ``ckpt_every`` and ``warmup_steps`` means
    "derive it" (see :meth:`resolved`).
    """

    task: str = "chars"  # "chars", "digits" or "recall"
    heads: tuple[str, ...] = ("attention",)  # one head schedule per configuration
    seeds: tuple[int, ...] = (0,)  # every configuration runs with every seed
    steps: int = 500  # optimizer steps per run
    batch_size: int = 32  # global batch (split across DDP ranks)
    lr: float = 1e-3  # peak AdamW learning rate
    weight_decay: float = 0.01  # AdamW weight decay
    warmup_steps: int | None = None  # linear warm-up; None: min(100, steps // 10)
    min_lr_ratio: float = 0.1  # cosine decay ends at lr * min_lr_ratio
    grad_clip: float = 1.0  # max global gradient norm, 0 to disable
    eval_every: int | None = None  # None: max(1, steps // 10)
    ckpt_every: int | None = None  # None: same as eval_every
    seq_len: int | None = None  # None: TASK_DEFAULT_SEQ_LEN[task]
    n_layer: int = 4  # transformer blocks
    n_head: int | None = None  # heads per layer; None: the sum of the schedule's counts
    n_embd: int = 128  # model width D
    topk: int | None = None  # sparsify every attention graph to k <= N edges per query
    dropout: float = 0.0
    patch_size: int = 2  # digits (ViT) only
    text: str | None = None  # chars: a text file or folder (None: Python's stdlib)
    npz: str | None = None  # digits: an .npz with images/labels (None: sklearn digits)
    max_bytes: int = 2_000_000  # chars: corpus cap
    eval_size: int = 128  # chars: validation windows; recall: validation examples
    analysis: bool = True  # per-layer token-geometry metrics after training
    analysis_size: int | None = None  # analysis batch; None: TASK_DEFAULT_ANALYSIS_SIZE
    device: str = "auto"  # "auto", "cpu" or "cuda" (or "cuda:1")
    bf16: bool = False  # bfloat16 autocast
    compile: bool = False  # torch.compile the model
    name: str = field(default="", compare=False)  # a label for reports only

    # ------------------------------------------------------------------ validation

    def __post_init__(self) -> None:
        from heatformer.experiments.data import TASK_NAMES

        if self.task not in TASK_NAMES:
            raise ValueError(f"task: expected one of {list(TASK_NAMES)}, got {self.task!r}")
        if not self.heads:
            raise ValueError("heads: expected at least one head schedule, got none")
        if len(set(self.heads)) != len(self.heads):
            raise ValueError(f"heads: expected distinct schedules, got {list(self.heads)}")
        for heads in self.heads:
            check_heads(heads, n_layer=self.n_layer, n_head=self.n_head)
            num_heads = self.heads_per_layer(heads)
            if isinstance(self.n_embd, int) and self.n_embd % num_heads:
                raise ValueError(
                    f"n_embd: expected a multiple of the {num_heads} heads per layer of "
                    f"{heads!r}, got {self.n_embd}"
                )
        if not self.seeds:
            raise ValueError("seeds: expected at least one seed, got none")
        if len(set(self.seeds)) != len(self.seeds) or any(s < 0 for s in self.seeds):
            raise ValueError(f"seeds: expected distinct non-negative ints, got {list(self.seeds)}")
        for name in ("steps", "batch_size", "n_layer", "n_embd", "eval_size", "patch_size"):
            _positive_int(name, getattr(self, name))
        for name in ("eval_every", "ckpt_every", "seq_len", "n_head", "topk", "analysis_size"):
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name))
        if self.topk is not None and self.task in TASK_DEFAULT_SEQ_LEN:  # digits: the harness
            seq_len = self.seq_len if self.seq_len is not None else TASK_DEFAULT_SEQ_LEN[self.task]
            if self.topk > seq_len:  # the model would quietly keep every edge
                raise ValueError(
                    f"topk: expected at most seq_len ({seq_len}) edges per query, got {self.topk}"
                )
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise ValueError(f"warmup_steps: expected an int >= 0, got {self.warmup_steps}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr: expected a positive float, got {self.lr}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio: expected a float in [0, 1], got {self.min_lr_ratio}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout: expected a float in [0, 1), got {self.dropout}")
        for name in ("weight_decay", "grad_clip"):  # NaN fails both comparisons
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name}: expected a finite float >= 0, got {value}")
        if self.text is not None and self.task != "chars":
            raise ValueError(
                f"text: only the 'chars' task reads a text corpus, got task {self.task!r}"
            )
        if self.npz is not None and self.task != "digits":
            raise ValueError(f"npz: only the 'digits' task reads an .npz, got task {self.task!r}")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"device: expected 'auto', 'cpu' or 'cuda[:N]', got {self.device!r}")

    # ------------------------------------------------------------------ derived

    def resolved(self) -> CompareSpec:
        """A copy with every derived field (``None`` above) filled in."""
        eval_every = self.eval_every or max(1, self.steps // 10)
        seq_len = self.seq_len
        if seq_len is None and self.task in TASK_DEFAULT_SEQ_LEN:
            seq_len = TASK_DEFAULT_SEQ_LEN[self.task]
        return dataclasses.replace(
            self,
            eval_every=eval_every,
            ckpt_every=self.ckpt_every or eval_every,
            warmup_steps=(
                self.warmup_steps if self.warmup_steps is not None else min(100, self.steps // 10)
            ),
            seq_len=seq_len,
            analysis_size=self.analysis_size or TASK_DEFAULT_ANALYSIS_SIZE[self.task],
        )

    def heads_per_layer(self, heads: str) -> int:
        """Heads per layer for the schedule ``heads``: ``n_head`` or the inferred count."""
        return self.n_head if self.n_head is not None else infer_num_heads(heads)

    def lr_at(self, step: int) -> float:
        """Learning rate of optimizer step ``step`` (0-based): linear warm-up, cosine decay.

        Args:
            step: the step about to be taken, ``0 <= step < steps``.

        Returns:
            ``lr * (step + 1) / warmup`` during warm-up, then a cosine from ``lr`` down to
            ``lr * min_lr_ratio`` at the last step.
        """
        warmup = self.warmup_steps if self.warmup_steps is not None else min(100, self.steps // 10)
        if step < warmup:
            return self.lr * (step + 1) / warmup
        span = max(1, self.steps - warmup - 1)
        progress = min(1.0, (step - warmup) / span)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine)

    # ------------------------------------------------------------------ (de)serialization

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists)."""
        out = dataclasses.asdict(self)
        out["heads"] = list(self.heads)
        out["seeds"] = list(self.seeds)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompareSpec:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError``.

        Args:
            data: a dict as written by :meth:`to_dict`.

        Returns:
            The spec.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"spec: unknown fields {unknown}; expected a subset of {sorted(known)}"
            )
        values = dict(data)
        for key in ("heads", "seeds"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)

    def fingerprint(self) -> dict[str, Any]:
        """The fields a checkpoint must agree with to be resumed (numbers-determining)."""
        out = self.resolved().to_dict()
        for key in ("name", "heads", "seeds", "device", "compile", "analysis", "analysis_size"):
            out.pop(key)
        return out


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")


def split_layers(heads: str) -> str | tuple[str, ...]:
    """Split a head schedule at ``;`` (or ``|``) outside brackets into one spec per layer.

    Args:
        heads: ``"attention:6,laplacian:2"`` (every layer) or
            ``"attention:4;attention:2,laplacian:2"`` (one spec per layer).

    Returns:
        The stripped string when it names one spec for every layer, else the tuple of
        layer specs.

    Raises:
        ValueError: an empty layer spec (``"a;;b"``).
    """
    from heatformer.models.heads import split_layers as split_layer_specs

    layers = tuple(split_layer_specs(heads))
    if len(layers) == 1:
        return layers[0]
    if any(not part for part in layers):
        raise ValueError(f"heads: expected a non-empty spec between every ';', got {heads!r}")
    return layers


def check_heads(heads: str, *, n_layer: int, n_head: int | None = None) -> None:
    """Check a head schedule: syntax, operator names and parameters, layers, head counts.

    Each layer spec is finally parsed by :func:`heatformer.models.parse_heads`, exactly
    as the model will parse it, so a schedule that passes here builds.

    Args:
        heads: a head schedule (see the module docstring).
        n_layer: number of layers of the model.
        n_head: heads per layer, or ``None`` to infer it from the counts.

    Raises:
        ValueError: bad syntax, an unknown operator (valid names listed), bad operator
            parameters, a per-layer schedule whose length is not ``n_layer``, counts that
            do not sum to ``n_head``, or layers with different head totals.
    """
    from heatformer.models import parse_heads
    from heatformer.models.heads import count_heads

    if not isinstance(heads, str) or not heads.strip():
        raise ValueError(f"heads: expected a non-empty schedule string, got {heads!r}")
    layers = split_layers(heads)
    specs = (layers,) if isinstance(layers, str) else layers
    if not isinstance(layers, str) and len(specs) != n_layer:
        raise ValueError(
            f"heads: expected {n_layer} layer specs separated by ';' (n_layer={n_layer}), "
            f"got {len(specs)} in {heads!r}"
        )
    totals = set()
    for spec in specs:
        total = count_heads(spec)
        if total is not None:
            totals.add(total)
    if len(totals) > 1:
        raise ValueError(
            f"heads: expected the same number of heads in every layer, got {sorted(totals)} "
            f"in {heads!r}"
        )
    if n_head is not None and totals and totals != {n_head}:
        raise ValueError(
            f"heads: expected head counts summing to n_head={n_head}, got {totals.pop()} "
            f"in {heads!r}"
        )
    num_heads = n_head if n_head is not None else infer_num_heads(heads)
    for spec in specs:
        parse_heads(spec, num_heads)


def infer_num_heads(heads: str) -> int:
    """Heads per layer implied by a schedule's counts (4 when it gives no counts).

    Args:
        heads: a head schedule.

    Returns:
        The sum of the counts of the first layer spec with counts, else 4.
    """
    from heatformer.models.heads import count_heads

    layers = split_layers(heads)
    for spec in (layers,) if isinstance(layers, str) else layers:
        total = count_heads(spec)
        if total is not None:
            return total
    return _DEFAULT_NUM_HEADS


def parse_seeds(text: str) -> tuple[int, ...]:
    """Parse ``--seeds``: a count (``"3"`` -> 0, 1, 2) or a comma list (``"4,7"``).

    Args:
        text: the flag's value.

    Returns:
        The seeds.

    Raises:
        ValueError: not a positive count or a list of non-negative ints.
    """
    text = text.strip()
    try:
        if "," in text:
            seeds = tuple(int(part) for part in text.split(",") if part.strip())
            if not seeds or any(seed < 0 for seed in seeds):
                raise ValueError
            return seeds
        count = int(text)
    except ValueError:
        raise ValueError(
            f"seeds: expected a count (e.g. 3) or a comma list (e.g. 0,5,7), got {text!r}"
        ) from None
    if count < 1:
        raise ValueError(f"seeds: expected a count >= 1, got {count}")
    return tuple(range(count))


def run_name(index: int, heads: str, seed: int) -> str:
    """Folder name of one run: ``c00-attention4+laplacian2-s0``.

    Args:
        index: position of the configuration in ``spec.heads``.
        heads: its head schedule.
        seed: the seed.

    Returns:
        A file-system-safe name, unique within a comparison.
    """
    slug = heads.replace(";", "__").replace(",", "+").replace(":", "")
    slug = re.sub(r"[^A-Za-z0-9_+.=-]", "", slug)[:60]
    return f"c{index:02d}-{slug}-s{seed}"


#: Named settings for ``heatformer compare --preset NAME``; explicit flags override them.
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
        "seq_len": 64,
        "n_layer": 2,
        "n_embd": 64,
        "eval_every": 50,
        "eval_size": 64,
        "name": "demo",
    },
}
