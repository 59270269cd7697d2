"""The teaching demo on a real checkpoint: the pictures of a local transformers model's attention.

``heatformer demo --hf-model DIR`` draws the demo page from the attention of any transformers
checkpoint folder with a tokenizer (a ``save_pretrained`` folder: ``config.json``, the weights
and ``tokenizer.json`` or the tokenizer's vocabulary files), offline: nothing is trained and
nothing is downloaded. :func:`compute_hf_demo` tokenizes the sentence, reads every layer with
:func:`heatformer.integrations.hf.attention_snapshots` and hands the snapshots to
:func:`~heatformer.lab.demo.demo_from_snapshots`; the nodes are the tokenizer's tokens.
Needs the ``hf`` extra (``pip install 'heatformer[hf]'``).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import time
from pathlib import Path
from typing import Any

import torch

from heatformer.checks import bad_type, bad_value
from heatformer.lab.demo.compute import DEFAULT_TEXT, demo_from_snapshots
from heatformer.lab.demo.data import DemoData
from heatformer.lab.demo.page import DemoResult, check_writable, write_demo
from heatformer.viz import require_matplotlib

__all__ = [
    "MAX_TOKENS",
    "TOKENIZER_FILES",
    "TOKEN_UNITS",
    "build_hf_demo",
    "compute_hf_demo",
    "load_checkpoint_folder",
    "token_unit",
]

#: Files of which a checkpoint folder needs one to hold a tokenizer (transformers 5 makes an
#: empty tokenizer out of a folder with none, which would give no tokens).
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "tokenizer.model", "spiece.model")

#: The longest sentence the pictures stay readable for, in tokens.
MAX_TOKENS = 64


def load_checkpoint_folder(model_dir: str | os.PathLike[str]) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from a local checkpoint folder, offline, in eval mode.

    The model is the checkpoint's base model (``AutoModel``: e.g. ``GPT2Model`` for a
    ``GPT2LMHeadModel`` folder), in float32 with transformers' ``"sdpa"`` attention; a folder
    saved from a converted model (its ``config.json`` has a ``"heatformer"`` entry) loads with
    its recorded heads and their learned parameters
    (:func:`heatformer.integrations.hf.from_pretrained`).

    Raises:
        ValueError: ``model_dir`` is not a folder, has no ``config.json`` or one transformers
            cannot read (the message names it), or has no tokenizer.
        ImportError: transformers is not installed.
    """
    # its ImportError names the extra
    hf: Any = importlib.import_module("heatformer.integrations.hf")
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    folder = Path(model_dir)
    if not (folder / "config.json").is_file():
        raise bad_value(
            "hf_model",
            f"expected a transformers checkpoint folder with a config.json, got {str(folder)!r}",
        )
    try:  # first: the tokenizer reads config.json too, and would be blamed for it
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as err:
        where = str(folder / "config.json")
        raise bad_value(
            "hf_model", f"expected a config.json that transformers can read, got {where!r} ({err})"
        ) from err
    no_tokenizer = (
        f"expected a folder with a tokenizer ({', '.join(TOKENIZER_FILES)}) to turn the text into "
        f"tokens, got none in {str(folder)!r}; for an image model, read its attention with "
        "heatformer.integrations.hf.attention_snapshots"
    )
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise bad_value("hf_model", no_tokenizer)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, config=config, local_files_only=True)
    except (OSError, ValueError, TypeError) as err:
        raise bad_value("hf_model", f"{no_tokenizer} ({err})") from err
    options: dict[str, Any] = {"config": config, "local_files_only": True, "dtype": torch.float32}
    if getattr(config, hf.CONFIG_ENTRY, None) is not None:  # saved converted: with its heads
        model = hf.from_pretrained(AutoModel, folder, **options)
    else:
        model = AutoModel.from_pretrained(folder, attn_implementation="sdpa", **options)
    return model.eval(), tokenizer


#: What a token is, by the class name of a fast tokenizer's model (``tokenizers.models``).
TOKEN_UNITS = {
    "WordPiece": "word piece", "BPE": "subword token", "Unigram": "subword token",
    "WordLevel": "word",
}  # fmt: skip


def token_unit(tokenizer: Any) -> str:
    """What one of ``tokenizer``'s tokens is, for the page's text: ``"word piece"`` (BERT's
    WordPiece), ``"subword token"`` (BPE, Unigram), ``"word"`` (a word-level vocabulary), or
    ``"token"`` when the tokenizer does not say (a slow tokenizer without a backend)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    model = getattr(backend, "model", None)
    return TOKEN_UNITS.get(type(model).__name__, "token")


def _labels(tokenizer: Any, ids: list[int]) -> list[str]:
    """A readable label per token: its text, or the raw token where that is blank."""
    labels = []
    for i in ids:
        text = tokenizer.decode([i])
        labels.append(text if text.strip() else str(tokenizer.convert_ids_to_tokens(i)))
    return labels


def compute_hf_demo(
    model_dir: str | os.PathLike[str],
    *,
    text: str = DEFAULT_TEXT,
    layer: int = 0,
    heads: str | None = None,
) -> DemoData:
    """Everything the demo page shows, from a local checkpoint's attention on ``text``.

    Args:
        model_dir: a transformers checkpoint folder with a tokenizer.
        text: the sentence; 2 to :data:`MAX_TOKENS` tokens (special tokens the tokenizer
            adds, like BERT's ``[CLS]`` and ``[SEP]``, included).
        layer: the layer of the single-head pictures.
        heads: a head spec to convert the model to first
            (:func:`heatformer.integrations.hf.convert`, e.g. ``"attention:10,laplacian:2"``:
            the pictures of the high-pass head then show a Laplacian head); ``None``: the
            model's own heads (all attention, or the heads a converted folder recorded).

    Returns:
        The :class:`~heatformer.lab.demo.DemoData`; its nodes are the tokens.

    Raises:
        ValueError: as :func:`load_checkpoint_folder`; ``text`` not 2 to :data:`MAX_TOKENS`
            tokens; ``layer`` not an index into the model's layers; a bad ``heads`` spec.
        TypeError: ``text`` is not a string.
    """
    from heatformer.integrations import hf

    if not isinstance(text, str):
        raise bad_type("text", f"expected a str, got {type(text).__name__}")
    model, tokenizer = load_checkpoint_folder(model_dir)
    batch = tokenizer(text, return_tensors="pt")
    ids = [int(i) for i in batch["input_ids"][0]]
    if not 2 <= len(ids) <= MAX_TOKENS:
        raise bad_value("text", f"expected 2 to {MAX_TOKENS} tokens, got {len(ids)} from {text!r}")
    if heads is not None:
        hf.convert(model, heads)
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")}
    layers = hf.attention_snapshots(model, **inputs)
    n_heads = layers[0].graph.batch_shape[0] if layers else 0
    name = getattr(model.config, "model_type", type(model).__name__)
    return demo_from_snapshots(
        layers, text=text, layer=layer, tokens=_labels(tokenizer, ids),
        token_unit=token_unit(tokenizer),
        meta=f"The {name} checkpoint {Path(model_dir).name} ({len(layers)} layers, {n_heads} "
        f"heads), its pretrained attention on {len(ids)} tokens; nothing was trained here.",
    )  # fmt: skip


def build_hf_demo(
    out_dir: str | os.PathLike[str],
    model_dir: str | os.PathLike[str],
    *,
    text: str = DEFAULT_TEXT,
    layer: int = 0,
    heads: str | None = None,
    gif: bool = True,
    progress: bool = False,
) -> DemoResult:
    """Write the demo's pictures and ``index.html`` for a local checkpoint's attention.

    :func:`compute_hf_demo` computes the numbers, then :func:`write_demo` draws them.

    Args:
        out_dir: output folder (created); ``index.html`` is the page.
        model_dir: a transformers checkpoint folder with a tokenizer.
        text, layer, heads: as :func:`compute_hf_demo`.
        gif: also write the heat-flow GIF.
        progress: report the pictures written on stderr.

    Returns:
        The :class:`DemoResult` (no training losses).

    Raises:
        ValueError: as :func:`compute_hf_demo`, or an ``out_dir`` that cannot be written.
    """
    require_matplotlib()
    start = time.perf_counter()
    check_writable(Path(out_dir))
    data = compute_hf_demo(model_dir, text=text, layer=layer, heads=heads)
    result = write_demo(out_dir, data, gif=gif, progress=progress)
    return dataclasses.replace(result, seconds=time.perf_counter() - start)
