"""The teaching demo's numbers: trained models, attention graphs, heat flows, spectra.

Everything the demo page shows is computed here into one :class:`DemoData` of tensors,
strings and numbers, which :mod:`heatformer.lab.demo.page` draws without a model (and which
:meth:`DemoData.to_dict` turns into plain lists for JSON). :func:`compute_demo` trains the
demo's two tiny byte-level GPTs on a built-in corpus (the source of a few standard-library
modules, so no download) with the experiment trainer (:func:`train_tiny_gpt`), reads the attention
of the one with Laplacian heads with :func:`heatformer.analysis.snapshot_attention` and the
token geometry of both with :func:`heatformer.analysis.collect_token_states`;
:func:`demo_from_snapshots` computes the rest from any attention snapshots (the random walk on
every head, TokenRank and ``λ₂``, by :mod:`~heatformer.lab.demo.walk`). Nothing here imports
matplotlib.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from heatformer.analysis import (
    LayerSnapshot,
    collect_token_states,
    snapshot_attention,
    within_sequence_variance,
)
from heatformer.checks import NORMALIZATIONS, bad_type, bad_value, check_times
from heatformer.graph_ops import (
    Attention,
    DenseGraph,
    DiffusionOperator,
    HeatKernel,
    Laplacian,
    heat_kernel,
    spectrum,
)
from heatformer.graph_ops.interop import single_graph
from heatformer.lab.demo.data import DemoData
from heatformer.lab.demo.walk import head_walks
from heatformer.viz import frequency_responses, heat_diffusion_frames, operator_outputs, topk_title

if TYPE_CHECKING:
    from heatformer.lab.tasks.base import Task
    from heatformer.lab.tasks.chars import CharsTask

__all__ = [
    "CORPUS_MODULES",
    "DEFAULT_TEXT",
    "DEMO_HEADS",
    "DEMO_LAYERS",
    "check_demo_arguments",
    "compute_demo",
    "demo_corpus",
    "demo_from_snapshots",
    "mass_frames",
    "train_tiny_gpt",
]

#: The sentence the demo looks at (the corpus is Python source, so a line of Python).
DEFAULT_TEXT = "def add(a, b): return a + b"

#: Standard-library modules whose source is the demo's training corpus.
CORPUS_MODULES = (
    "argparse", "collections", "dataclasses", "enum", "functools", "json.decoder", "string",
    "textwrap", "typing",
)  # fmt: skip

#: The two model configurations trained by the demo: name -> head spec.
DEMO_HEADS = {"attention:4": "attention:4", "attention:2,laplacian:2": "attention:2,laplacian:2"}

#: Layers of the demo GPTs (the ``layer`` of :func:`build_demo` indexes them).
DEMO_LAYERS = 2


def demo_corpus(modules: Sequence[str] = CORPUS_MODULES, max_bytes: int = 400_000) -> bytes:
    """The demo's built-in training text: the source code of a few stdlib modules (UTF-8).

    Args:
        modules: importable module names whose source is concatenated.
        max_bytes: cap on the returned length.

    Raises:
        ValueError: the sources could not be read (e.g. a Python without ``.py`` files).
    """
    chunks = []
    for name in modules:
        try:
            chunks.append(inspect.getsource(importlib.import_module(name)))
        except (ImportError, OSError, TypeError):
            continue
    text = "".join(chunks).encode("utf-8")[:max_bytes]
    if len(text) < 10_000:
        raise bad_value(
            "modules",
            f"expected readable Python sources of at least 10000 bytes, got {len(text)} from "
            f"{list(modules)}",
        )
    return text


def _byte_ids(text: str | bytes) -> Tensor:
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return torch.tensor(list(data), dtype=torch.long)


def train_tiny_gpt(
    corpus: str | bytes,
    *,
    heads: str,
    steps: int = 200,
    seed: int = 0,
    block_size: int = 64,
    batch_size: int = 16,
    n_layer: int = 2,
    n_head: int = 4,
    n_embd: int = 64,
    lr: float = 3e-3,
    max_seconds: float | None = None,
    progress: bool = False,
    run_dir: str | os.PathLike[str] | None = None,
) -> tuple[nn.Module, list[float]]:
    """Train a tiny byte-level :class:`~heatformer.models.GPT` with the experiment trainer.

    The corpus becomes a ``chars`` task (its last tenth is the validation bytes) and the run is
    :func:`heatformer.lab.trainer.train_run` -- warm-up and cosine schedule, gradient clipping,
    atomic checkpoints -- so a demo run stopped by its time budget keeps what it trained, and a
    ``run_dir`` that already holds the finished run is read back instead of trained again.

    Args:
        corpus: training text (bytes or str, read as UTF-8 bytes; vocabulary 256).
        heads: the head spec, e.g. ``"attention:2,laplacian:2"``.
        steps: optimizer steps.
        seed: seeds the initialization and the batches.
        block_size, batch_size, n_layer, n_head, n_embd: model and batch sizes.
        lr: peak learning rate.
        max_seconds: stop early after this much wall time (``None``: no limit); the model of
            the last completed step is returned.
        progress: report the steps on stderr (:mod:`heatformer.lab.progress`).
        run_dir: the run folder (checkpoint and result); default a temporary one.

    Returns:
        ``(model in eval mode, training loss of every completed step)``; the losses are
        cross-entropies in nats per byte (:func:`heatformer.lab.tasks.bits_per_char` turns
        them into bits).
    """
    from heatformer.lab.checkpoint import load_checkpoint
    from heatformer.lab.resume import CHECKPOINT_NAME
    from heatformer.lab.spec import CompareSpec
    from heatformer.lab.tasks.chars import Chars

    _check_steps(steps)
    chars = _demo_corpus_task(corpus, block_size)
    spec = CompareSpec(
        task="chars", heads=(heads,), seeds=(seed,), steps=steps, batch_size=batch_size, lr=lr,
        n_layer=n_layer, n_head=n_head, n_embd=n_embd, eval_every=steps, analysis=False,
        device="cpu", options={"seq_len": block_size, "eval_size": 8},
    )  # fmt: skip
    task = Chars(spec, data=chars)
    with contextlib.ExitStack() as stack:
        if run_dir is not None:
            folder = Path(run_dir)
        else:  # the run's folder name is what its progress lines say
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="heatformer-"))
            folder = Path(scratch) / f"demo {heads}"
        _train_within(task, heads, seed, folder, max_seconds=max_seconds, progress=progress)
        saved = load_checkpoint(folder / CHECKPOINT_NAME)
        model = task.build_model(heads)
        if saved is not None:
            model.load_state_dict(saved["model"])
        losses = [float(v) for v in saved["train_loss"]] if saved is not None else []
    model.eval()
    return model, losses


def _demo_corpus_task(corpus: str | bytes, block_size: int) -> CharsTask:
    """The demo corpus as ``chars`` data: its last tenth (at least a window) is validation."""
    from heatformer.lab.tasks.chars import CharsTask

    data = _byte_ids(corpus).to(torch.uint8)
    cut = data.numel() - max(block_size + 2, data.numel() // 10)
    if cut <= block_size + 1:
        raise bad_value(
            "corpus", f"expected more than {2 * block_size + 4} bytes, got {data.numel()}"
        )
    return CharsTask(
        train=data[:cut], val=data[cut:], train_files=("<demo corpus>",),
        val_files=("<demo corpus>",), source="<demo corpus>",
    )  # fmt: skip


def _train_within(
    task: Task, heads: str, seed: int, folder: Path, *, max_seconds: float | None, progress: bool
) -> None:
    """:func:`~heatformer.lab.trainer.train_run` in ``folder``, stopped (its last completed step
    checkpointed) after ``max_seconds`` of wall time."""
    from heatformer.lab.stop import StopSignal, TrainingInterrupted
    from heatformer.lab.trainer import train_run

    stop = StopSignal()
    timer = None
    if max_seconds is not None:
        timer = threading.Timer(max_seconds, stop.request, args=("time budget",))
        timer.daemon = True
        timer.start()
    try:
        train_run(task, heads, seed, folder, stop=stop, progress=progress)
    except TrainingInterrupted:
        pass  # the time budget: the checkpoint holds the last completed step
    finally:
        if timer is not None:
            timer.cancel()


def _within_share(model: nn.Module, corpus: bytes, block_size: int) -> list[float]:
    """Within-sequence share of the token variance after the embedding and each block."""
    data = _byte_ids(corpus[-(32 * block_size + 1) :])
    windows = data[: (data.numel() // block_size) * block_size].view(-1, block_size)[:32]
    names = [f"blocks.{i}" for i in range(len(model.blocks))]  # type: ignore[arg-type]
    states = collect_token_states(model, windows, ["drop", *names])
    shares = []
    for h in states.values():
        h = h.to(torch.float64)
        total = ((h - h.mean((0, 1))) ** 2).sum(-1).mean()
        shares.append(float(within_sequence_variance(h) / total))
    return shares


def _check_steps(steps: object) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise bad_value("steps", f"expected a positive int, got {steps!r}")


def check_demo_arguments(*, text: str, layer: int, steps: int) -> None:
    """Refuse a bad ``text``, ``layer`` or ``steps`` of :func:`compute_demo` before any work.

    Raises:
        TypeError: ``layer`` is not an int.
        ValueError: ``text`` is not 2 to 64 bytes of UTF-8, ``layer`` is not an index into the
            :data:`DEMO_LAYERS` layers, ``steps`` is not a positive int.
    """
    raw = text.encode("utf-8")
    if not 2 <= len(raw) <= 64:
        raise bad_value("text", f"expected 2 to 64 bytes of UTF-8, got {len(raw)}")
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise bad_type("layer", f"expected an int, got {type(layer).__name__}")
    if not -DEMO_LAYERS <= layer < DEMO_LAYERS:
        raise bad_value("layer", f"expected an index into {DEMO_LAYERS} layers, got {layer}")
    _check_steps(steps)


#: Diffusion times of the heat-flow strip and of the animation.
HEAT_TIMES = (0.0, 0.5, 1.0, 2.0, 4.0)
ANIMATION_TIMES = tuple(torch.linspace(0.0, 6.0, 25).tolist())

#: The values of ``k`` of the top-k picture (``None``: the full graph); those below the
#: number of tokens are drawn (see :func:`topk_ks`).
TOPK_KS = (None, 4, 2)


def topk_ks(num_nodes: int) -> tuple[int | None, ...]:
    """The ``k`` of the top-k picture for ``num_nodes`` tokens: the full graph, then each ``k``
    of :data:`TOPK_KS` that prunes (``k < N``; top-``N`` is the full graph), or ``N − 1``
    when none does (2 tokens; one token: the full graph alone).

    Example:
        >>> topk_ks(27), topk_ks(4), topk_ks(2), topk_ks(1)
        ((None, 4, 2), (None, 2), (None, 1), (None,))
    """
    ks = tuple(k for k in TOPK_KS if k is not None and k < num_nodes)
    if not ks and num_nodes > 1:
        ks = (num_nodes - 1,)
    return (None, *ks)


def mass_frames(graph: DenseGraph, source: int, times: Sequence[float]) -> Tensor:
    """The mass view ``exp(−t Lᵀ) e_source`` of the heat flow at ``times``, ``(T, N)``.

    ``exp(−t Lᵀ) = exp(−t L)ᵀ``, so the mass view of token ``j`` is row ``j`` of the heat
    kernel matrix, computed with :func:`~heatformer.graph_ops.heat_kernel` on the identity
    (``"rw"``, exact). With ``L = I − P`` and ``P`` row-stochastic, ``1ᵀ Lᵀ = 0``: the total
    ``Σ_i m_i(t)`` stays 1 at every ``t`` (the influence view's total does not).

    Args:
        graph: one unbatched graph (``N`` nodes).
        source: the token that holds the unit of mass at ``t = 0``.
        times: diffusion times ``t >= 0``.
    """
    eye = torch.eye(graph.num_nodes, dtype=graph.dtype, device=graph.device)  # (N, N)
    rows = [heat_kernel(graph, eye, t, method="exact")[source] for t in check_times(times)]
    return torch.stack(rows).to("cpu", torch.float64)  # (T, N)


def _first_head(ops: Sequence[DiffusionOperator], kind: type) -> int | None:
    for h, op in enumerate(ops):
        if type(op) is kind:
            return h
    return None


def _check_snapshots(
    layers: Sequence[LayerSnapshot], *, layer: int, text: str, tokens: Sequence[str] | None
) -> int:
    """The number of nodes ``N`` of ``layers[layer]``, after the checks of
    :func:`demo_from_snapshots` on ``layers``, ``layer``, ``text`` and ``tokens``."""
    if not layers:
        raise bad_value("layers", "expected at least one LayerSnapshot")
    if not -len(layers) <= layer < len(layers):
        raise bad_value("layer", f"expected an index into {len(layers)} layers, got {layer}")
    n = layers[layer].graph.num_nodes
    if tokens is not None:
        if len(tokens) != n or not all(isinstance(t, str) for t in tokens):
            raise bad_value("tokens", f"expected {n} strings (one per node), got {tokens!r}")
    elif len(text) != n:
        raise bad_value("text", f"expected {n} characters (one per node), got {len(text)}")
    return n


def demo_from_snapshots(
    layers: Sequence[LayerSnapshot],
    *,
    text: str,
    layer: int = 0,
    source: int | None = None,
    per_layer: Mapping[str, Sequence[float]] | None = None,
    losses: Mapping[str, tuple[float, float]] | None = None,
    meta: str = "",
    tokens: Sequence[str] | None = None,
    token_unit: str | None = None,
) -> DemoData:
    """Compute everything the demo page shows from attention snapshots (no model needed).

    Args:
        layers: one :class:`~heatformer.analysis.LayerSnapshot` per layer, e.g. from
            :func:`~heatformer.analysis.snapshot_attention` (or random graphs), all with the
            same heads and tokens.
        text: the sentence (one token per character, ``len(text)`` is ``N``, unless
            ``tokens`` are given).
        layer: which layer the single-head pictures use.
        source: the token that receives the drop of heat (default: the token after the first
            that receives the most attention in the attention head).
        per_layer: ``{config: [within-sequence variance share per layer]}``, or ``None``.
        losses: ``{config: (first, last)}`` training losses, in bits per token.
        meta: a line of text about the run.
        tokens: the ``N`` token labels, when tokens are not single characters of ``text``
            (a subword tokenizer's).
        token_unit: what a token is, for the page's text (``"byte"``, ``"word piece"``, ...);
            default ``"character"``, or ``"token"`` when ``tokens`` are given.

    Returns:
        The :class:`DemoData`; its ``source_dtype`` is the least precise
        :attr:`~heatformer.analysis.LayerSnapshot.weight_dtype` of the layers.

    Raises:
        ValueError: no layers, layers of different shapes, ``layer`` or ``source`` out of
            range, ``text`` not of ``N`` characters (or ``tokens`` not ``N`` labels).
    """
    n = _check_snapshots(layers, layer=layer, text=text, tokens=tokens)
    snap = layers[layer]
    att = _first_head(snap.operators, Attention)
    att = 0 if att is None else att
    lap = _first_head(snap.operators, Laplacian)
    source = _source(snap, att, n, source)
    dense = [s.graph.to_dense().detach().to("cpu", torch.float64) for s in layers]
    if any(d.shape != dense[layer].shape for d in dense):
        shapes = [tuple(d.shape) for d in dense]
        raise bad_value("layers", f"expected graphs of one shape (H, N, N), got {shapes}")
    head = _head(snap, att)  # the head of the single-head pictures
    filter_head = lap if lap is not None else att
    heat_times, animation_times = check_times(HEAT_TIMES), check_times(ANIMATION_TIMES)
    topk = {topk_title(k): (head if k is None else head.topk(k)).to_dense() for k in topk_ks(n)}
    attention = torch.stack(dense)  # (L, H, N, N)
    return DemoData(
        text=text,
        layer=layer % len(layers),
        attention_head=att,
        laplacian_head=lap,
        filter_head=filter_head,
        source=source,
        operators=tuple(tuple(op.name for op in s.operators) for s in layers),
        attention=attention,
        spectra={name: spectrum(head, name) for name in NORMALIZATIONS},
        heat_times=tuple(heat_times),
        heat=heat_diffusion_frames(head, source, heat_times),  # (T, N)
        mass=mass_frames(head, source, heat_times),  # (T, N)
        animation_times=tuple(animation_times),
        animation=heat_diffusion_frames(head, source, animation_times),  # (T', N)
        **_filter_panels(snap, filter_head),
        topk=topk,
        **head_walks(attention),  # TokenRank, lambda_2 and v_2 of every head
        per_layer=None if per_layer is None else {k: tuple(v) for k, v in per_layer.items()},
        losses=dict(losses or {}),
        meta=meta,
        tokens=tuple(tokens or ()),
        source_dtype=str(_least_precise(s.weight_dtype for s in layers)).removeprefix("torch."),
        token_unit=token_unit or ("character" if tokens is None else "token"),
    )


def _head(snap: LayerSnapshot, h: int) -> DenseGraph:
    """Head ``h`` of the snapshot as one unbatched float64 graph on the CPU."""
    return DenseGraph(single_graph(snap.graph, h).to("cpu", torch.float64))


def _source(snap: LayerSnapshot, att: int, n: int, source: int | None) -> int:
    """The token that receives the drop of heat: ``source`` checked, or by default the most
    attended token (in head ``att``) after the first (often a sink) and before the end."""
    if source is None:
        received = snap.graph.in_degree()[att]  # (N,)
        return 1 + int(received[1 : max(2, n - 2)].argmax()) if n > 3 else 0
    if not -n <= source < n:
        raise bad_value("source", f"expected a token index in [0, {n}), got {source}")
    return source


def _filter_panels(snap: LayerSnapshot, filter_head: int) -> dict[str, Any]:
    """The filter section's fields of :class:`DemoData`: frequency responses on ``lam``, the
    eigenvalues of head ``filter_head``, one channel of its values and the operators' outputs."""
    filters = {  # section 5, left: what each head does to each frequency
        "attention head: P = I − L": Attention(),
        "Laplacian head: L = I − P": Laplacian(),
        "heat head t=1: exp(−L)": HeatKernel(t=1.0),
    }
    # section 5, right: what each head outputs from the channel v, in the text's notation
    outputs = {"attention head: P v": Attention(), "Laplacian head: (I − P) v": Laplacian()}
    lam = torch.linspace(0.0, 2.0, 201, dtype=torch.float64)
    filter_graph = DenseGraph(snap.graph.to_dense()[filter_head].detach().to(torch.float64))
    channel = snap.values[filter_head, :, 0].detach().to("cpu", torch.float64)  # (N,)
    return {
        "lam": lam,
        "responses": frequency_responses(filters, lam),
        "eigenvalues": spectrum(filter_graph, "rw").cpu(),
        "channel": channel,
        "outputs": operator_outputs(snap.graph, channel, outputs, index=filter_head),
    }


def _least_precise(dtypes: Iterable[torch.dtype]) -> torch.dtype:
    """The floating dtype of the largest machine epsilon among ``dtypes``."""
    return max(dtypes, key=lambda dtype: torch.finfo(dtype).eps)


@contextlib.contextmanager
def _torch_threads(num_threads: int | None) -> Iterator[None]:
    previous = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def compute_demo(
    *,
    text: str = DEFAULT_TEXT,
    steps: int = 200,
    seed: int = 0,
    layer: int = 0,
    corpus: str | bytes | None = None,
    compare: bool = True,
    max_train_seconds: float | None = 15.0,
    num_threads: int | None = 1,
    progress: bool = False,
) -> DemoData:
    """Train the demo's GPTs briefly and compute everything its page shows on ``text``.

    :func:`heatformer.lab.demo.build_demo` calls this, then draws the page with
    :func:`~heatformer.lab.demo.write_demo`.

    Args:
        text: the sentence, 2 to 64 bytes of UTF-8 (one token per byte).
        steps: training steps per model.
        seed: seeds training and batches.
        layer: the layer of the single-head pictures.
        corpus: training text (default :func:`demo_corpus`).
        compare: also train an attention-only model and measure the token geometry of both.
        max_train_seconds: stop training a model early after this many seconds.
        num_threads: torch CPU threads meanwhile (restored afterwards); ``None`` leaves the
            setting alone.
        progress: report the training steps on stderr (:mod:`heatformer.lab.progress`).

    Returns:
        The :class:`~heatformer.lab.demo.DemoData`.

    Raises:
        ValueError: as :func:`check_demo_arguments` (checked before any training).
    """
    from heatformer.lab.tasks.chars import bits_per_char

    check_demo_arguments(text=text, layer=layer, steps=steps)
    raw = text.encode("utf-8")
    labels = [chr(b) if b < 128 else "·" for b in raw]
    data = demo_corpus() if corpus is None else corpus
    data_bytes = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    with _torch_threads(num_threads):
        configs = DEMO_HEADS if compare else {"attention:2,laplacian:2": "attention:2,laplacian:2"}
        models: dict[str, nn.Module] = {}
        losses: dict[str, tuple[float, float]] = {}
        done = steps
        for name, heads in configs.items():
            model, curve = train_tiny_gpt(
                data_bytes, heads=heads, steps=steps, seed=seed, n_layer=DEMO_LAYERS,
                max_seconds=max_train_seconds, progress=progress,
            )  # fmt: skip
            models[name] = model
            last = sum(curve[-10:]) / len(curve[-10:])
            losses[name] = (bits_per_char(curve[0]), bits_per_char(last))  # bits per byte
            done = min(done, len(curve))
        main = models["attention:2,laplacian:2"]
        layers = snapshot_attention(main, _byte_ids(raw).unsqueeze(0))
        per_layer = (
            {name: _within_share(m, data_bytes, 64) for name, m in models.items()}
            if compare
            else None
        )
        return demo_from_snapshots(
            layers, text="".join(labels), layer=layer, per_layer=per_layer, losses=losses,
            token_unit="byte",
            meta=f"Two-layer byte-level GPTs (4 heads, width 64) trained for {done} steps "
            f"(seed {seed}) on the source of {len(CORPUS_MODULES)} standard-library modules.",
        )  # fmt: skip
