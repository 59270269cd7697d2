"""Model files and trained runs: what :func:`save_model` writes and :func:`load_model` reads.

A *model file* is a ``torch.save`` dict that holds, beside whatever else its writer keeps:

- ``"kind"``: the model's class, ``"GPT"``, ``"ViT"`` or ``"SequenceClassifier"``;
- ``"config"``: its config as a dict (:func:`dataclasses.asdict`);
- ``"state_dict"``: its weights;
- optionally ``"step"`` and ``"steps"``: the optimizer steps the weights were trained for and
  the steps the training was to make; ``step < steps`` is a training cut short, which
  :func:`load_model` loads with an :class:`UnfinishedTraining` warning.

:func:`model_file_keys` gives the first three for a model, so that the checkpoint of any
training loop (optimizer state and all) is a model file too. The checkpoints of the
``heatformer`` command are: a run of ``heatformer train`` or ``compare`` lives in a *run folder*
``OUT/runs/RUN/`` that holds ``checkpoint.pt`` (and ``result.json`` once finished), and that
checkpoint holds the keys of a model file beside the run's own (``torch.save`` writes the
weights, which two of its keys share, once). :func:`load_model` takes the file, the run folder,
or ``OUT`` when it holds one run.

Files are read with ``torch.load(weights_only=True)`` (tensors, numbers, strings and containers;
no code runs) and memory-mapped: what a checkpoint holds besides the weights (optimizer moments,
RNG states) is not copied into memory when the model is loaded on a device.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from heatformer import checks
from heatformer._atomic import atomic_write, is_temporary
from heatformer.models.transformer import GPT, SequenceClassifier, ViT

__all__ = ["UnfinishedTraining", "load_model", "model_file_keys", "save_model"]

#: the file of a run folder (``heatformer.lab.resume.CHECKPOINT_NAME``)
_CHECKPOINT = "checkpoint.pt"
#: the folder of an output folder that holds its run folders
_RUNS = "runs"
#: how the ``"format"`` of a run's checkpoint starts (``heatformer.lab.checkpoint``)
_RUN_FORMAT = "heatformer-run-checkpoint"
#: run folders named in the error for a folder of several runs
_LISTED = 8

_MODELS: dict[str, type[GPT | ViT | SequenceClassifier]] = {
    "GPT": GPT,
    "ViT": ViT,
    "SequenceClassifier": SequenceClassifier,
}


class UnfinishedTraining(UserWarning):
    """A model loaded from a training cut short: its weights are those of ``step`` of ``steps``.

    Issued by :func:`load_model` for a file whose ``"step"`` is below its ``"steps"``: the
    checkpoint of a run that was stopped (Ctrl-C, ``--stop-at-step``) or whose loss diverged,
    which holds its last saved step. The warning carries the numbers
    (``caught.message.step`` in :func:`warnings.catch_warnings`); resuming the run finishes it.

    Attributes:
        path: the file loaded.
        step: the optimizer steps the weights were trained for.
        steps: the steps the training was to make.
    """

    def __init__(self, path: Path, step: int, steps: int) -> None:
        super().__init__(
            f"{path}: expected the weights of a finished training, got those of step {step} "
            f"of {steps} (a run that was stopped or diverged; resume it to finish it)"
        )
        self.path = path
        self.step = step
        self.steps = steps


def model_file_keys(model: nn.Module) -> dict[str, Any] | None:
    """The keys of a model file for ``model``: ``{"kind", "config", "state_dict"}``.

    With them in a training loop's own checkpoint, :func:`load_model` reads that checkpoint:
    ``torch.save({**model_file_keys(model), "optimizer": opt.state_dict(), "step": s,
    "steps": total}, path)``.

    Args:
        model: a model.

    Returns:
        The kind, the config as a dict and ``model.state_dict()`` (the model's tensors, not
        copies); ``None`` when ``model`` is not a :class:`GPT`, :class:`ViT` or
        :class:`SequenceClassifier` (a subclass is not one either: its config does not
        rebuild it).

    Example:
        >>> from heatformer.models import GPT, GPTConfig
        >>> keys = model_file_keys(GPT(GPTConfig(vocab_size=11, n_layer=1, n_embd=8, n_head=2)))
        >>> keys["kind"], keys["config"]["heads"], len(keys["state_dict"]) > 0
        ('GPT', 'attention', True)
        >>> model_file_keys(torch.nn.Linear(2, 2)) is None
        True
    """
    kind = type(model).__name__
    if _MODELS.get(kind) is not type(model):
        return None
    config = dataclasses.asdict(model.config)
    return {"kind": kind, "config": config, "state_dict": model.state_dict()}


def save_model(model: nn.Module, path: str | os.PathLike[str]) -> None:
    """Save weights and config (atomically: a temp file, then ``os.replace``).

    Args:
        model: a :class:`GPT`, :class:`ViT` or :class:`SequenceClassifier`.
        path: destination file.

    Raises:
        TypeError: ``model`` is another module.
    """
    payload = model_file_keys(model)
    if payload is None:
        raise checks.bad_type(
            "model", f"expected one of {sorted(_MODELS)}, got {type(model).__name__}"
        )
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, lambda handle: torch.save(payload, handle))


def load_model(
    path: str | os.PathLike[str], map_location: str | torch.device | None = "cpu"
) -> GPT | ViT | SequenceClassifier:
    """Load a trained model: a model file, a run's checkpoint, or a run folder.

    The model is rebuilt from its config as trained (sizes, head schedule, graph kinds) and
    gets the saved weights. A config saved while configs had a ``topk`` field loads: its
    ``"topk": None`` is dropped; a ``topk`` value is refused, naming the graph kind to write
    instead. A field added since is read as such a model computed (the config class's
    ``upgraded``: a mean-pooling :class:`ViT` saved before ``pool_norm`` keeps its norm before
    the mean).

    Args:
        path: a file of :func:`save_model`; a checkpoint that holds the keys of one (the
            ``checkpoint.pt`` of a ``heatformer train``/``compare`` run, or a training loop's
            own, see :func:`model_file_keys`); a run folder (``OUT/runs/RUN``, which holds
            ``checkpoint.pt``); or the output folder ``OUT`` of ``heatformer train`` or
            ``compare`` when it holds one run.
        map_location: the device to put the model on (``"cpu"``, ``"cuda"``, a
            :class:`torch.device`); ``None``: the device its weights were saved from.

    Returns:
        The :class:`GPT`, :class:`ViT` or :class:`SequenceClassifier`, in eval mode.

    Raises:
        FileNotFoundError: nothing at ``path``, or a run folder without a checkpoint yet.
        ValueError: ``path`` is a folder of several runs (the message lists them) or a folder
            of neither kind; a file that ``torch.load`` cannot read with ``weights_only=True``;
            a file without a model's keys (the message says what it holds: e.g. the
            checkpoint of a run whose model is not one of the three kinds, or of a run
            written before run checkpoints held them); a config with a ``topk`` value.

    Warns:
        UnfinishedTraining: the file holds a training cut short (``step < steps``).

    Example:
        >>> import tempfile
        >>> from heatformer.models import GPT, GPTConfig, save_model
        >>> config = GPTConfig(vocab_size=11, n_layer=2, n_embd=8, n_head=2,
        ...                    heads=("attention:2", "attention:1,laplacian:1"))
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     save_model(GPT(config), f"{folder}/gpt.pt")
        ...     model = load_model(f"{folder}/gpt.pt")
        >>> model.config == config, model.training
        (True, False)
    """
    file = _model_file(Path(path))
    device = None if map_location is None else torch.device(map_location)
    payload = _read(file, "cpu" if device is not None else None)
    kind = payload.get("kind")
    if kind not in _MODELS:
        raise checks.bad_value("path", _not_a_model(file, payload))
    step, steps = payload.get("step"), payload.get("steps")
    if isinstance(step, int) and isinstance(steps, int) and step < steps:
        warnings.warn(UnfinishedTraining(file, step, steps), stacklevel=2)
    cls = _MODELS[kind]
    fields = cls.config_class.upgraded(_config_fields(file, payload["config"]))
    config: Any = cls.config_class(**fields)
    model = cls(config)
    state = payload["state_dict"]
    model.load_state_dict(state)
    if device is None:  # where the weights were saved from
        device = next((t.device for t in state.values() if isinstance(t, torch.Tensor)), None)
    return model.to(device).eval()


# ---- reading -----------------------------------------------------------------------------


def _model_file(path: Path) -> Path:
    """The file ``path`` names: itself, its ``checkpoint.pt`` (a run folder), or that of the
    one run folder in ``path/runs`` (the output folder of ``heatformer train``)."""
    path = checks.check_folder("path", path, inside=(_RUNS,))
    if path.is_file():
        return path
    if not path.is_dir():
        raise checks.ArgumentFileNotFoundError(
            "path", f"expected a model file, a run's checkpoint or a run folder, got {path}, "
            "which does not exist"
        )  # fmt: skip
    if (path / _CHECKPOINT).is_file():
        return path / _CHECKPOINT
    if not (path / _RUNS).is_dir():
        raise checks.ArgumentFileNotFoundError(
            "path", f"expected a run folder (holding {_CHECKPOINT}) or the output folder of "
            f"heatformer train or compare (holding {_RUNS}/), got {path}, which holds neither "
            "(a run holds its checkpoint from its first save on)"
        )  # fmt: skip
    runs = sorted(p for p in (path / _RUNS).iterdir() if p.is_dir() and not is_temporary(p))
    if len(runs) == 1:
        return _model_file(runs[0])
    if not runs:
        raise checks.ArgumentFileNotFoundError(
            "path", f"expected an output folder with a run, got {path}, whose {_RUNS}/ is empty"
        )
    listed = ", ".join(str(run) for run in runs[:_LISTED])
    more = f" and {len(runs) - _LISTED} more" if len(runs) > _LISTED else ""
    raise checks.bad_value(
        "path",
        f"expected one run's folder, got {path}, which holds {len(runs)} runs: pass one of "
        f"{listed}{more}",
    )


def _read(file: Path, map_location: str | None) -> dict[str, Any]:
    """``file``'s dict, read with ``weights_only=True`` and memory-mapped when it can be."""
    try:
        payload = torch.load(file, map_location=map_location, weights_only=True, mmap=True)
    except Exception:  # not a zip archive (torch.save's legacy format, or no torch file at all)
        payload = _load_plain(file, map_location)
    if not isinstance(payload, dict):
        raise checks.bad_value(
            "path", f"expected a heatformer model file, got {file}, which holds a "
            f"{type(payload).__name__}"
        )  # fmt: skip
    return payload


def _load_plain(file: Path, map_location: str | None) -> Any:
    try:
        return torch.load(file, map_location=map_location, weights_only=True)
    except Exception as err:  # unpickling errors come in many types
        raise checks.bad_value(
            "path", f"expected a heatformer model file, got {file}, which torch.load cannot "
            f"read with weights_only=True ({type(err).__name__}: {_first_line(err)})"
        ) from None  # fmt: skip


def _first_line(err: Exception) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else ""


def _not_a_model(file: Path, payload: dict[str, Any]) -> str:
    """Why ``payload`` (no known ``"kind"``) is not a model file, and what to do instead."""
    kind = payload.get("kind")
    if kind is not None or not str(payload.get("format", "")).startswith(_RUN_FORMAT):
        return f"{file} is not a heatformer model file (kind={kind!r})"
    cls = payload.get("model_class")
    why = (
        f"its model is a {cls}, not one of {sorted(_MODELS)}"
        if cls
        else "it was written before run checkpoints held a model's kind and config"
    )
    return (
        f"{file} is a run's checkpoint without a model's kind and config ({why}): build the "
        "model as the run did and load_state_dict(torch.load(path, weights_only=True)"
        "['model'])"
    )


def _config_fields(file: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The config's fields as its class takes them (``heads`` a tuple, no ``topk``)."""
    fields = dict(config)
    topk = fields.pop("topk", None)
    if topk is not None:
        raise checks.bad_value(
            "path",
            f"{file} holds a config with topk={topk}, the removed shorthand for "
            f"graph='topk[k={topk}]': expected graph='topk[k={topk}]' in its config instead "
            f"(it has graph={fields.get('graph')!r})",
        )
    if isinstance(fields.get("heads"), list):
        fields["heads"] = tuple(fields["heads"])
    return fields
