r"""Laplacian spectra and the frequency responses of diffusion operators.

An operator ``f(L)`` multiplies the component of a signal along a Laplacian eigenvector with
eigenvalue ``lam`` by ``f(lam)`` (:meth:`~heatformer.graph_ops.DiffusionOperator.
frequency_response`). Small ``lam`` are smooth ("low-frequency") signals, large ``lam``
rough ones. Attention ``P = I - L_rw`` has ``f(lam) = 1 - lam`` and heat ``e^{-t lam}``:
both keep low frequencies (low-pass, smoothing); the Laplacian head ``L`` has ``f(lam) = lam``:
it removes the constant and keeps the rough part (high-pass).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from heatformer.checks import NORMALIZATIONS, bad_value, check_normalization
from heatformer.graph_ops import (
    Attention,
    DiffusionOperator,
    Graph,
    HeatKernel,
    Laplacian,
    PersonalizedPageRank,
    Polynomial,
    resolve_operator,
    spectrum,
)
from heatformer.viz._common import (
    PathLike,
    axes_or_new,
    finish_figure,
    new_figure,
    save_figure,
    single_graph,
    token_labels,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "default_operators",
    "plot_frequency_responses",
    "plot_operator_outputs",
    "plot_spectra",
]

_TITLES = {
    "rw": r"random walk  $L = I - D^{-1} W$",
    "sym": r"symmetric  $L = I - D^{-1/2} W_s D^{-1/2}$",
    "combinatorial": r"combinatorial  $L = D - W$",
}


def plot_spectra(
    graph: Graph | Tensor,
    index: tuple[int, ...] | int | None = None,
    *,
    normalizations: Sequence[str] = NORMALIZATIONS,
    save: PathLike | None = None,
) -> Figure:
    """The Laplacian spectrum of one graph for each normalization, one axes each.

    A real spectrum (symmetric Laplacian) is drawn as the sorted eigenvalues against their
    rank (one line). A complex spectrum (``"rw"`` or ``"combinatorial"`` of a directed
    attention graph) is drawn in the complex plane (one scatter), with the circle
    ``|lam - 1| = 1`` for ``"rw"``: the eigenvalues of ``I - P`` for a row-stochastic ``P``
    lie inside it.

    Args:
        graph: any heatformer graph or an ``(..., N, N)`` weight tensor (small: the dense
            Laplacian is diagonalized).
        index: which graph of the batch.
        normalizations: which Laplacians, a subset of ``("rw", "sym", "combinatorial")``.
        save: write the figure to this path.

    Returns:
        A :class:`~matplotlib.figure.Figure` with one axes per normalization.
    """
    if len(normalizations) == 0:
        raise bad_value("normalizations", "expected at least one of ['rw', 'sym', 'combinatorial']")
    for name in normalizations:
        check_normalization(name)
    one = single_graph(graph, index)
    return _draw_spectra({name: spectrum(one, name) for name in normalizations}, save=save)


def _draw_spectra(
    spectra: Mapping[str, Tensor],
    *,
    titles: Mapping[str, str] | None = None,
    imag_tol: float = 1e-9,
    save: PathLike | None,
) -> Figure:
    """The figure of :func:`plot_spectra` for given eigenvalues, ``{normalization: (N,)}``;
    ``titles`` replaces the default title of some normalizations; a spectrum is drawn in the
    complex plane when an imaginary part exceeds ``imag_tol``, else sorted along a line."""
    import numpy as np

    fig = new_figure((4.2 * len(spectra), 3.8))
    for c, (name, ev) in enumerate(spectra.items()):
        ax = fig.add_subplot(1, len(spectra), c + 1)
        if ev.is_complex() and float(ev.imag.abs().max()) > imag_tol:
            ax.scatter(ev.real.numpy(), ev.imag.numpy(), s=18, color="C0", label="eigenvalues")
            if name == "rw":
                theta = np.linspace(0.0, 2 * np.pi, 200)
                ax.plot(1 + np.cos(theta), np.sin(theta), color="0.6", lw=0.8, ls="--",
                        label="|λ − 1| = 1")  # fmt: skip
            ax.set_xlabel("Re λ")
            ax.set_ylabel("Im λ")
            ax.set_aspect("equal", adjustable="datalim")
            ax.legend(fontsize=7, loc="upper left")
        else:
            values = (ev.real if ev.is_complex() else ev).numpy()
            ax.plot(np.arange(values.size), np.sort(values), "o-", ms=3, color="C0")
            ax.set_xlabel("rank")
            ax.set_ylabel("λ")
        ax.axhline(0.0, color="0.85", lw=0.6, zorder=0)
        ax.set_title((titles or {}).get(name, _TITLES[name]), fontsize=9)
    save_figure(fig, save)
    return fig


def default_operators() -> dict[str, DiffusionOperator]:
    """A labelled set of operators to compare: attention, Laplacian, heat, PPR, a polynomial."""
    return {
        "attention  1 − λ": Attention(),
        "laplacian  λ": Laplacian(),
        "heat t=1  e^(−λ)": HeatKernel(t=1.0),
        "heat t=4  e^(−4λ)": HeatKernel(t=4.0),
        "ppr α=0.15": PersonalizedPageRank(alpha=0.15),
        "polynomial  (1 − λ/2)²": Polynomial([1.0, -1.0, 0.25]),
    }


def _label(op: DiffusionOperator) -> str:
    extra = op.extra_repr()
    return f"{op.name} {extra}" if extra else op.name


def _operators(
    operators: Mapping[str, DiffusionOperator | str] | Sequence[DiffusionOperator | str] | None,
) -> dict[str, DiffusionOperator]:
    if operators is None:
        return default_operators()
    if isinstance(operators, Mapping):
        return {str(k): resolve_operator(v) for k, v in operators.items()}
    if isinstance(operators, (str, DiffusionOperator)):
        operators = [operators]
    ops = [resolve_operator(v) for v in operators]
    return {_label(op): op for op in ops}


def plot_frequency_responses(
    operators: Mapping[str, DiffusionOperator | str]
    | Sequence[DiffusionOperator | str]
    | None = None,
    *,
    lam: Tensor | None = None,
    lam_max: float = 2.0,
    num: int = 201,
    eigenvalues: Tensor | None = None,
    ax: Axes | None = None,
    title: str | None = "frequency responses f(λ)",
    save: PathLike | None = None,
) -> Figure:
    """The factor ``f(lam)`` each operator applies to a Laplacian eigenvector, one line each.

    Each curve is the operator's own
    :meth:`~heatformer.graph_ops.DiffusionOperator.frequency_response`, so a custom operator
    that implements it is drawn the same way. An operator with one diffusion time per head
    (``HeatKernel(t=[...])``) gives one line per time.

    Args:
        operators: ``{label: operator}``, or a list of operators or names (labelled by their
            ``repr``); default :func:`default_operators`.
        lam: the eigenvalues to evaluate at (1-D); default ``num`` points in ``[0, lam_max]``.
        lam_max: right end of the default grid (2 bounds the ``"rw"`` and ``"sym"`` spectra).
        num: points of the default grid.
        eigenvalues: a graph's (real parts of) eigenvalues, drawn as ticks on the axis, to see
            which frequencies a real graph has.
        ax: draw into this axes instead of a new figure.
        title: axes title.
        save: write the figure to this path.

    Returns:
        The :class:`~matplotlib.figure.Figure`. Its axes has one labelled line per operator
        (in order), a ``"graph spectrum"`` line when ``eigenvalues`` is given, and an
        unlabelled zero line.

    Example:
        >>> from heatformer.graph_ops import Attention, Laplacian
        >>> fig = plot_frequency_responses({"P": Attention(), "I - P": Laplacian()}, num=3)
        >>> [line.get_ydata().tolist() for line in fig.axes[0].get_lines()[:2]]
        [[1.0, 0.0, -1.0], [0.0, 1.0, 2.0]]
    """
    ops = _operators(operators)
    if not ops:
        raise bad_value("operators", "expected at least one operator")
    if lam is None:
        if isinstance(num, bool) or not isinstance(num, int) or num < 2:
            raise bad_value("num", f"expected an int >= 2, got {num!r}")
        lam = torch.linspace(0.0, float(lam_max), num, dtype=torch.float64)
    elif not isinstance(lam, Tensor) or lam.dim() != 1:
        raise bad_value("lam", f"expected a 1-D tensor of eigenvalues, got {lam!r}")
    lam = lam.detach().to(torch.float64).cpu()
    curves = _frequency_responses(ops, lam)
    return _draw_frequency_responses(
        lam, curves, eigenvalues=eigenvalues, ax=ax, title=title, save=save
    )


def _frequency_responses(
    operators: Mapping[str, DiffusionOperator], lam: Tensor
) -> dict[str, Tensor]:
    """``{label: f(lam)}`` of each operator, float64 on the CPU (the curves of
    :func:`plot_frequency_responses`): shape ``lam.shape``, or ``(H, len(lam))`` for an
    operator with one diffusion time per head."""
    with torch.no_grad():
        return {
            label: op.frequency_response(lam).detach().to(torch.float64).cpu()
            for label, op in operators.items()
        }


def _draw_frequency_responses(
    lam: Tensor,
    curves: Mapping[str, Tensor],
    *,
    eigenvalues: Tensor | None,
    ax: Axes | None,
    title: str | None,
    save: PathLike | None,
) -> Figure:
    """The figure of :func:`plot_frequency_responses` for given curves ``{label: f(lam)}``."""
    fig, ax = axes_or_new(ax, (6.4, 4.2))
    x = lam.numpy()
    for label, y in curves.items():
        if y.dim() == 1:
            ax.plot(x, y.numpy(), lw=2, label=label)
        else:  # one curve per head (e.g. a time per head)
            for h, row in enumerate(y.reshape(-1, lam.numel())):
                ax.plot(x, row.numpy(), lw=1.5, label=f"{label} [{h}]")
    if eigenvalues is not None:
        ev = eigenvalues.detach().cpu()
        ev = (ev.real if ev.is_complex() else ev).to(torch.float64).reshape(-1)
        lo, hi = ax.get_ylim()
        ax.plot(ev.numpy(), [lo + 0.02 * (hi - lo)] * ev.numel(), "|", ms=14, color="0.25",
                label="graph spectrum")  # fmt: skip
    ax.axhline(0.0, color="0.7", lw=0.8, zorder=0)
    ax.set_xlabel("Laplacian eigenvalue λ  (0 = smooth, large = rough)")
    ax.set_ylabel("gain f(λ)")
    ax.legend(fontsize=8)
    return finish_figure(fig, ax, title, save)


def plot_operator_outputs(
    graph: Graph | Tensor,
    signal: Tensor | Sequence[float],
    operators: Mapping[str, DiffusionOperator | str] | Sequence[DiffusionOperator | str],
    *,
    index: tuple[int, ...] | int | None = None,
    tokens: Sequence[str] | str | bytes | None = None,
    signal_label: str = "input x",
    ax: Axes | None = None,
    title: str | None = None,
    save: PathLike | None = None,
) -> Figure:
    """A signal on the tokens and what each operator makes of it on one graph, one line each.

    Shows in the token domain what :func:`plot_frequency_responses` shows in the frequency
    domain: attention and heat smooth the signal; the Laplacian keeps its rough part.

    Args:
        graph: any heatformer graph or an ``(..., N, N)`` weight tensor.
        signal: ``(N,)`` signal (e.g. one channel of the values ``v``).
        operators: ``{label: operator}`` or a list of operators or names.
        index: which graph of the batch.
        tokens: x-axis labels.
        signal_label: the legend's name of the input line, in the notation of the text
            beside the figure (e.g. ``"values v"``).
        ax: draw into this axes instead of a new figure.
        title: axes title.
        save: write the figure to this path.

    Returns:
        The :class:`~matplotlib.figure.Figure`; its axes has the input line first, then one
        line per operator (values ``op(graph, signal)``).
    """
    one = single_graph(graph, index)
    x = _signal_of(signal, one.num_nodes)
    outputs = _operator_outputs(one, x, _operators(operators))
    return _draw_operator_outputs(
        x, outputs, tokens=tokens, ax=ax, title=title, save=save, signal_label=signal_label
    )


def _signal_of(signal: Tensor | Sequence[float], n: int) -> Tensor:
    """``signal`` as a float64 CPU tensor of shape ``(n,)``, or a ``ValueError``."""
    x = torch.as_tensor(
        signal.detach().cpu() if isinstance(signal, Tensor) else signal, dtype=torch.float64
    )
    if x.shape != (n,):
        raise bad_value("signal", f"expected shape ({n},), got {tuple(x.shape)}")
    return x


def _operator_outputs(
    one: Graph, x: Tensor, operators: Mapping[str, DiffusionOperator]
) -> dict[str, Tensor]:
    """``{label: op(one, x)}`` for an unbatched graph and a signal ``x`` of shape ``(N,)``."""
    with torch.no_grad():
        return {label: op(one, x.unsqueeze(-1)).squeeze(-1) for label, op in operators.items()}


def _draw_operator_outputs(
    x: Tensor,
    outputs: Mapping[str, Tensor],
    *,
    tokens: Sequence[str] | str | bytes | None,
    ax: Axes | None,
    title: str | None,
    save: PathLike | None,
    signal_label: str = "input x",
) -> Figure:
    """The figure of :func:`plot_operator_outputs` for given outputs ``{label: (N,)}``."""
    import numpy as np

    n = x.shape[0]
    labels = token_labels(tokens, n)
    fig, ax = axes_or_new(ax, (max(6.4, 0.25 * n + 2), 3.8))
    pos = np.arange(n)
    ax.plot(pos, x.numpy(), color="0.55", lw=1.2, ls="--", marker=".", label=signal_label)
    for label, y in outputs.items():
        ax.plot(pos, y.numpy(), lw=1.8, marker="o", ms=3, label=label)
    ax.axhline(0.0, color="0.85", lw=0.6, zorder=0)
    step = max(1, n // 40)
    ax.set_xticks(pos[::step], labels[::step], fontsize=8)
    ax.set_xlabel("token")
    ax.legend(fontsize=8)
    return finish_figure(fig, ax, title, save)
