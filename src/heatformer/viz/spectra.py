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
from heatformer.viz._common import axes_or_new, finish_figure, single_graph, token_labels
from heatformer.viz.figures import PathLike, new_figure, save_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "default_operators",
    "draw_frequency_responses",
    "draw_operator_outputs",
    "draw_spectra",
    "frequency_responses",
    "operator_outputs",
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
    return draw_spectra({name: spectrum(one, name) for name in normalizations}, save=save)


def draw_spectra(
    spectra: Mapping[str, Tensor],
    *,
    titles: Mapping[str, str] | None = None,
    imag_tol: float = 1e-9,
    save: PathLike | None = None,
) -> Figure:
    """Given Laplacian spectra side by side, one axes each: the figure of :func:`plot_spectra`.

    A spectrum with an imaginary part above ``imag_tol`` is drawn in the complex plane (one
    scatter; for ``"rw"`` with the circle ``|lam - 1| = 1``), any other as its sorted real
    parts against their rank (one line).

    Args:
        spectra: ``{normalization: eigenvalues}``, keys among ``"rw"``, ``"sym"``,
            ``"combinatorial"``, values ``(N,)`` real or complex tensors (e.g. from
            :func:`~heatformer.graph_ops.spectrum`); one axes each, in order.
        titles: ``{normalization: title}`` for the axes whose default title (the formula of
            that Laplacian) should change.
        imag_tol: the largest imaginary part still drawn as a real spectrum.
        save: write the figure to this path.

    Returns:
        A :class:`~matplotlib.figure.Figure` with one axes per spectrum.

    Raises:
        ValueError: no spectra, or a key that is not a normalization.
    """
    import numpy as np

    if len(spectra) == 0:
        raise bad_value("spectra", "expected at least one of ['rw', 'sym', 'combinatorial']")
    for name in spectra:
        check_normalization(name)
    fig = new_figure((4.2 * len(spectra), 3.8))
    for c, (name, ev) in enumerate(spectra.items()):
        ev = torch.as_tensor(ev).detach().cpu()  # (N,)
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
    curves = frequency_responses(ops, lam)
    return draw_frequency_responses(
        lam, curves, eigenvalues=eigenvalues, ax=ax, title=title, save=save
    )


def frequency_responses(
    operators: Mapping[str, DiffusionOperator | str] | Sequence[DiffusionOperator | str],
    lam: Tensor,
) -> dict[str, Tensor]:
    """The factor ``f(lam)`` each operator applies to a Laplacian eigenvector (the numbers
    of :func:`plot_frequency_responses`).

    Args:
        operators: ``{label: operator}``, or a list of operators or names (labelled by their
            ``repr``).
        lam: the eigenvalues to evaluate at, a 1-D tensor.

    Returns:
        ``{label: f(lam)}``, float64 on the CPU, without gradients: shape ``lam.shape``, or
        ``(H, len(lam))`` for an operator with one diffusion time per head.

    Raises:
        ValueError: no operators, ``lam`` not a 1-D tensor.

    Example:
        >>> import torch
        >>> from heatformer.graph_ops import Laplacian
        >>> frequency_responses({"L": Laplacian()}, torch.tensor([0.0, 1.0, 2.0]))
        {'L': tensor([0., 1., 2.], dtype=torch.float64)}
    """
    ops = _operators(operators)
    if not ops:
        raise bad_value("operators", "expected at least one operator")
    if not isinstance(lam, Tensor) or lam.dim() != 1:
        raise bad_value("lam", f"expected a 1-D tensor of eigenvalues, got {lam!r}")
    lam = lam.detach().to(torch.float64).cpu()
    with torch.no_grad():
        return {
            label: op.frequency_response(lam).detach().to(torch.float64).cpu()
            for label, op in ops.items()
        }


def draw_frequency_responses(
    lam: Tensor,
    curves: Mapping[str, Tensor],
    *,
    eigenvalues: Tensor | None = None,
    ax: Axes | None = None,
    title: str | None = None,
    save: PathLike | None = None,
) -> Figure:
    """Given frequency responses, one line each, on one axes: what
    :func:`plot_frequency_responses` draws, for curves computed elsewhere.

    Args:
        lam: the eigenvalues, a 1-D tensor: the x-axis.
        curves: ``{label: f(lam)}``, each of shape ``lam.shape`` (one line) or
            ``(..., len(lam))`` (one line per row, labelled ``"label [h]"``), e.g. from
            :func:`frequency_responses`.
        eigenvalues: a graph's (real parts of) eigenvalues, drawn as ticks on the axis.
        ax: draw into this axes instead of a new figure.
        title: axes title.
        save: write the figure to this path.

    Returns:
        The :class:`~matplotlib.figure.Figure` (the one holding ``ax`` when given). The axes
        has one labelled line per curve (in order), a ``"graph spectrum"`` line when
        ``eigenvalues`` is given, and an unlabelled zero line.

    Raises:
        ValueError: ``lam`` not a 1-D tensor, a curve whose last size is not ``len(lam)``.
    """
    if not isinstance(lam, Tensor) or lam.dim() != 1:
        raise bad_value("lam", f"expected a 1-D tensor of eigenvalues, got {lam!r}")
    lam = lam.detach().to(torch.float64).cpu()
    for label, y in curves.items():
        if y.dim() == 0 or y.shape[-1] != lam.numel():
            raise bad_value(
                "curves",
                f"expected {label!r} of shape ({lam.numel()},) or (H, {lam.numel()}), "
                f"got {tuple(y.shape)}",
            )
    fig, ax = axes_or_new(ax, (6.4, 4.2))
    x = lam.numpy()
    for label, y in curves.items():
        y = y.detach().to("cpu", torch.float64)
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
    outputs = operator_outputs(one, x, operators)
    return draw_operator_outputs(
        x, outputs, tokens=tokens, ax=ax, title=title, save=save, signal_label=signal_label
    )


def _signal_of(signal: Tensor | Sequence[float], n: int | None) -> Tensor:
    """``signal`` as a float64 CPU tensor of shape ``(n,)`` (any ``(N,)`` for ``n=None``),
    or a ``ValueError``."""
    x = torch.as_tensor(
        signal.detach().cpu() if isinstance(signal, Tensor) else signal, dtype=torch.float64
    )
    if x.dim() != 1 or (n is not None and x.shape != (n,)):
        raise bad_value("signal", f"expected shape ({n or 'N'},), got {tuple(x.shape)}")
    return x


def operator_outputs(
    graph: Graph | Tensor,
    signal: Tensor | Sequence[float],
    operators: Mapping[str, DiffusionOperator | str] | Sequence[DiffusionOperator | str],
    *,
    index: tuple[int, ...] | int | None = None,
) -> dict[str, Tensor]:
    """What each operator makes of a signal on one graph (the numbers of
    :func:`plot_operator_outputs`).

    Args:
        graph: any heatformer graph or an ``(..., N, N)`` weight tensor.
        signal: ``(N,)`` signal (e.g. one channel of the values ``v``).
        operators: ``{label: operator}`` or a list of operators or names.
        index: which graph of the batch.

    Returns:
        ``{label: op(graph, signal)}``, each ``(N,)`` float64 on the CPU, without gradients.

    Raises:
        ValueError: bad ``index``, ``signal`` not of shape ``(N,)``.

    Example:
        >>> import torch
        >>> from heatformer.graph_ops import Attention, Laplacian
        >>> w = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
        >>> out = operator_outputs(w, [1.0, 3.0], {"P": Attention(), "I - P": Laplacian()})
        >>> out["P"], out["I - P"]
        (tensor([2., 2.], dtype=torch.float64), tensor([-1.,  1.], dtype=torch.float64))
    """
    one = single_graph(graph, index)
    x = _signal_of(signal, one.num_nodes).unsqueeze(-1)  # (N, 1)
    with torch.no_grad():
        return {label: op(one, x).squeeze(-1) for label, op in _operators(operators).items()}


def draw_operator_outputs(
    signal: Tensor | Sequence[float],
    outputs: Mapping[str, Tensor],
    *,
    tokens: Sequence[str] | str | bytes | None = None,
    signal_label: str = "input x",
    ax: Axes | None = None,
    title: str | None = None,
    save: PathLike | None = None,
) -> Figure:
    """A signal on the tokens and given outputs, one line each, on one axes: what
    :func:`plot_operator_outputs` draws, for outputs computed elsewhere.

    Args:
        signal: the ``(N,)`` input, drawn dashed.
        outputs: ``{label: (N,) values}``, one line each, e.g. from :func:`operator_outputs`.
        tokens: x-axis labels.
        signal_label: the legend's name of the input line.
        ax: draw into this axes instead of a new figure.
        title: axes title.
        save: write the figure to this path.

    Returns:
        The :class:`~matplotlib.figure.Figure` (the one holding ``ax`` when given); its axes
        has the input line first, then one line per output.

    Raises:
        ValueError: ``signal`` not 1-D, an output not of the signal's shape.
    """
    import numpy as np

    x = _signal_of(signal, None)
    n = x.shape[0]
    for label, y in outputs.items():
        if tuple(y.shape) != (n,):
            raise bad_value("outputs", f"expected {label!r} of shape ({n},), got {tuple(y.shape)}")
    labels = token_labels(tokens, n)
    fig, ax = axes_or_new(ax, (max(6.4, 0.25 * n + 2), 3.8))
    pos = np.arange(n)
    ax.plot(pos, x.numpy(), color="0.55", lw=1.2, ls="--", marker=".", label=signal_label)
    for label, y in outputs.items():
        y = y.detach().to("cpu", torch.float64)
        ax.plot(pos, y.numpy(), lw=1.8, marker="o", ms=3, label=label)
    ax.axhline(0.0, color="0.85", lw=0.6, zorder=0)
    step = max(1, n // 40)
    ax.set_xticks(pos[::step], labels[::step], fontsize=8)
    ax.set_xlabel("token")
    ax.legend(fontsize=8)
    return finish_figure(fig, ax, title, save)
