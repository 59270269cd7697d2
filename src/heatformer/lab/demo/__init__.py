"""The teaching demo: attention graphs of a small trained transformer, as pictures and a page.

:func:`build_demo` trains two tiny byte-level GPTs for a few hundred steps on a built-in
corpus (the source code of a few Python standard-library modules, so it needs no download),
one with four attention heads and one with two attention and two Laplacian heads, reads the
attention graphs of the second on a sentence, and writes PNG pictures, an animated GIF, an
``index.html`` that explains what each picture teaches and an interactive ``explore.html``.
The whole demo runs in well under a minute on one CPU core; ``heatformer demo`` is the
command.

Computing and drawing are apart:

- :mod:`~heatformer.lab.demo.compute` computes everything the page shows (trained models,
  graphs, heat flows, spectra, numbers) into a :class:`DemoData`
  (:func:`compute_demo`, or :func:`demo_from_snapshots` for given attention snapshots);
- :mod:`~heatformer.lab.demo.data` holds :class:`DemoData`, plain tensors and numbers that
  :meth:`DemoData.to_dict` turns into lists for JSON; :mod:`~heatformer.lab.demo.walk` computes
  its random walk of every head with :mod:`heatformer.analysis` (TokenRank ``π``, ``λ₂`` and
  its eigenvector ``v₂``);
- :mod:`~heatformer.lab.demo.page` draws the pictures and ``index.html`` from a
  :class:`DemoData` alone (:func:`write_demo`); its words come from
  :mod:`~heatformer.lab.demo.text`, which says of the model only what
  :mod:`~heatformer.lab.demo.facts` measured on the data (:func:`demo_facts`: causal or
  bidirectional, bytes or word pieces, real or complex eigenvalues, which panels coincide,
  with tolerances from the dtype the model computed its weights in);
- :mod:`~heatformer.lab.demo.explore` computes the interactive page's numbers from it with
  the library's operators (:func:`explorer_data`) and writes ``explore.html``, one offline
  file with those numbers as JSON and the packaged ``explore.js`` inline
  (:func:`write_explorer`; :func:`write_demo` calls it).

:func:`build_demo` and :func:`render_demo` chain the two; :func:`build_hf_demo` draws the
same page from a local transformers checkpoint's own attention (:mod:`heatformer.lab.demo.hf`,
``heatformer demo --hf-model DIR``).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from heatformer.analysis import LayerSnapshot, snapshot_attention
from heatformer.lab.demo.compute import (
    CORPUS_MODULES,
    DEFAULT_TEXT,
    DEMO_HEADS,
    DEMO_LAYERS,
    check_demo_arguments,
    compute_demo,
    demo_corpus,
    demo_from_snapshots,
    mass_frames,
    train_tiny_gpt,
)
from heatformer.lab.demo.data import DemoData
from heatformer.lab.demo.explore import explorer_data, write_explorer
from heatformer.lab.demo.facts import PageFacts, demo_facts
from heatformer.lab.demo.hf import build_hf_demo, compute_hf_demo
from heatformer.lab.demo.page import DemoResult, check_writable, demo_pictures, write_demo
from heatformer.viz import require_matplotlib

__all__ = [
    "CORPUS_MODULES",
    "DEFAULT_TEXT",
    "DEMO_HEADS",
    "DEMO_LAYERS",
    "DemoData",
    "DemoResult",
    "LayerSnapshot",
    "PageFacts",
    "build_demo",
    "build_hf_demo",
    "compute_demo",
    "compute_hf_demo",
    "demo_corpus",
    "demo_facts",
    "demo_from_snapshots",
    "demo_pictures",
    "explorer_data",
    "mass_frames",
    "render_demo",
    "snapshot_attention",
    "train_tiny_gpt",
    "write_demo",
    "write_explorer",
]


def render_demo(
    out_dir: str | os.PathLike[str],
    layers: Sequence[LayerSnapshot],
    *,
    text: str,
    layer: int = 0,
    source: int | None = None,
    per_layer: Mapping[str, Sequence[float]] | None = None,
    losses: Mapping[str, tuple[float, float]] | None = None,
    meta: str = "",
    gif: bool = True,
    progress: bool = False,
) -> DemoResult:
    """Write the demo's pictures and ``index.html`` for given attention snapshots.

    :func:`demo_from_snapshots` computes the numbers, then :func:`write_demo` draws them.

    Args:
        out_dir: output folder (created).
        layers: one :class:`~heatformer.analysis.LayerSnapshot` per layer, e.g. from
            :func:`~heatformer.analysis.snapshot_attention` (or random graphs, to try the
            pictures without a model).
        text: the sentence (one token per character; ``len(text)`` must be ``N``).
        layer: which layer the single-head pictures use.
        source: the token that receives the drop of heat (default: the token after the first
            that receives the most attention in the attention head).
        per_layer: ``{config: [within-sequence variance share per layer]}`` for the last
            picture (skipped when ``None``).
        losses: ``{config: (first, last)}`` training losses, shown on the page.
        meta: a line of text about the run, shown under the title (HTML-escaped).
        gif: also write the animated GIF of the heat flow.
        progress: report the pictures written on stderr (:mod:`heatformer.lab.progress`).

    Returns:
        The :class:`DemoResult`.

    Raises:
        ValueError: as :func:`demo_from_snapshots`.
    """
    require_matplotlib()
    start = time.perf_counter()
    data = demo_from_snapshots(
        layers, text=text, layer=layer, source=source, per_layer=per_layer, losses=losses,
        meta=meta,
    )  # fmt: skip
    result = write_demo(out_dir, data, gif=gif, progress=progress)
    return dataclasses.replace(result, seconds=time.perf_counter() - start)


def build_demo(
    out_dir: str | os.PathLike[str],
    *,
    text: str = DEFAULT_TEXT,
    steps: int = 200,
    seed: int = 0,
    layer: int = 0,
    corpus: str | bytes | None = None,
    compare: bool = True,
    gif: bool = True,
    max_train_seconds: float | None = 15.0,
    num_threads: int | None = 1,
    progress: bool = False,
) -> DemoResult:
    """Train small GPTs briefly, look at their attention on ``text``, write the pictures + page.

    :func:`compute_demo` computes the numbers, then :func:`write_demo` draws them.

    Args:
        out_dir: output folder (created); ``index.html`` is the page.
        text: the sentence, 2 to 64 bytes of UTF-8 (one token per byte).
        steps: training steps per model.
        seed: seeds training and batches.
        layer: the layer shown in the single-head pictures.
        corpus: training text (default :func:`demo_corpus`).
        compare: also train an attention-only model and plot the token geometry of both.
        gif: also write the heat-flow GIF.
        max_train_seconds: stop training a model early after this many seconds.
        num_threads: torch CPU threads while the demo computes (1 is fastest for these tiny
            models; restored afterwards); ``None`` leaves the setting alone.
        progress: report the training steps and the pictures on stderr
            (:mod:`heatformer.lab.progress`; ``heatformer demo`` turns it on).

    Returns:
        The :class:`DemoResult`.

    Raises:
        ValueError: ``text`` of the wrong length, ``layer`` not an index into the
            :data:`DEMO_LAYERS` layers, ``steps`` not positive, or an ``out_dir`` that
            cannot be created or written (all checked before any training).
    """
    require_matplotlib()
    start = time.perf_counter()
    check_demo_arguments(text=text, layer=layer, steps=steps)
    check_writable(Path(out_dir))
    data = compute_demo(
        text=text, steps=steps, seed=seed, layer=layer, corpus=corpus, compare=compare,
        max_train_seconds=max_train_seconds, num_threads=num_threads, progress=progress,
    )  # fmt: skip
    result = write_demo(out_dir, data, gif=gif, progress=progress)
    return dataclasses.replace(result, seconds=time.perf_counter() - start)
