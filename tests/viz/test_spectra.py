"""Spectra and frequency responses: the curves are the formulas, the points the eigenvalues."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import viz_helpers as vh
from heatformer.graph_ops import (
    Attention,
    DiffusionOperator,
    Graph,
    HeatKernel,
    Laplacian,
    PersonalizedPageRank,
    Polynomial,
    laplacian_matrix,
    spectrum,
)
from heatformer.viz import (
    default_operators,
    draw_frequency_responses,
    draw_operator_outputs,
    draw_spectra,
    frequency_responses,
    new_figure,
    operator_outputs,
    plot_frequency_responses,
    plot_operator_outputs,
    plot_spectra,
)

LAM = torch.linspace(0.0, 2.0, 41, dtype=torch.float64)


def _labelled_lines(ax):
    return [line for line in ax.get_lines() if not line.get_label().startswith("_")]


@pytest.mark.parametrize(
    ("op", "formula"),
    [
        (Attention(), lambda lam: 1 - lam),
        (Laplacian(), lambda lam: lam),
        (Laplacian(step=0.5), lambda lam: 0.5 * lam),
        (HeatKernel(t=2.0), lambda lam: np.exp(-2.0 * lam)),
        (PersonalizedPageRank(alpha=0.2), lambda lam: 0.2 / (1 - 0.8 * (1 - lam))),
        (Polynomial([1.0, -1.0, 0.25]), lambda lam: 1 - lam + 0.25 * lam**2),
    ],
)
def test_curves_equal_the_formulas(op: DiffusionOperator, formula) -> None:
    fig = plot_frequency_responses({"op": op}, lam=LAM)
    (line,) = _labelled_lines(fig.axes[0])
    np.testing.assert_allclose(line.get_xdata(), LAM.numpy())
    np.testing.assert_allclose(line.get_ydata(), formula(LAM.numpy()), rtol=1e-6, atol=1e-12)


def test_default_operators_names_and_per_head_times(tmp_path) -> None:
    fig = plot_frequency_responses(save=tmp_path / "f.png", num=11)
    labels = [line.get_label() for line in _labelled_lines(fig.axes[0])]
    assert labels == list(default_operators())
    heads = plot_frequency_responses([HeatKernel(t=[0.5, 1.0, 4.0]), "laplacian"], lam=LAM)
    lines = _labelled_lines(heads.axes[0])
    assert len(lines) == 4
    for line, t in zip(lines, (0.5, 1.0, 4.0)):
        np.testing.assert_allclose(line.get_ydata(), np.exp(-t * LAM.numpy()), rtol=1e-6)


def test_spectrum_ticks() -> None:
    ev = torch.tensor([0.0, 0.3, 1.1])
    fig = plot_frequency_responses([Attention()], eigenvalues=ev)
    ticks = [line for line in fig.axes[0].get_lines() if line.get_label() == "graph spectrum"]
    np.testing.assert_allclose(ticks[0].get_xdata(), ev.numpy())


def _eigenvalues(graph: Graph, index: int, normalization: str) -> np.ndarray:
    return np.linalg.eigvals(laplacian_matrix(graph, normalization)[index].numpy())


def test_spectra_of_a_causal_graph_are_real_and_sorted(tmp_path) -> None:
    graph = vh.random_attention(n=8, causal=True)
    fig = plot_spectra(graph, 1, save=tmp_path / "s.png")
    assert len(fig.axes) == 3
    for ax, name in zip(fig.axes, ("rw", "sym", "combinatorial")):
        (line,) = _labelled_lines(ax) or ax.get_lines()[:1]
        expected = np.sort(_eigenvalues(graph, 1, name).real)
        np.testing.assert_allclose(line.get_ydata(), expected, atol=1e-8)
    vh.assert_png(tmp_path / "s.png")


def test_complex_spectrum_in_the_disk() -> None:
    graph = vh.random_attention(n=10, causal=False)
    fig = plot_spectra(graph, 0, normalizations=("rw",))
    ax = fig.axes[0]
    points = ax.collections[0].get_offsets()
    ev = _eigenvalues(graph, 0, "rw")
    got = sorted((round(float(x), 8), round(float(y), 8)) for x, y in points)
    want = sorted((round(float(z.real), 8), round(float(z.imag), 8)) for z in ev)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert any(abs(y) > 1e-6 for _, y in got)  # a directed graph: complex eigenvalues
    assert all(abs(z - 1) <= 1 + 1e-9 for z in ev)
    assert [line.get_label() for line in _labelled_lines(ax)] == ["|λ − 1| = 1"]


def test_spectra_rejects_unknown_normalization() -> None:
    with pytest.raises(ValueError, match="normalization"):
        plot_spectra(vh.random_attention(), 0, normalizations=("lap",))


def test_operator_outputs_split_the_signal() -> None:
    graph = vh.random_attention(n=8, causal=True)
    x = torch.randn(8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    fig = plot_operator_outputs(graph, x, {"P": Attention(), "I - P": Laplacian()}, index=0)
    inp, att, lap = _labelled_lines(fig.axes[0])
    assert [inp.get_label(), att.get_label(), lap.get_label()] == ["input x", "P", "I - P"]
    np.testing.assert_allclose(att.get_ydata() + lap.get_ydata(), x.numpy(), atol=1e-12)
    dense = graph.to_dense()[0].numpy()
    np.testing.assert_allclose(att.get_ydata(), dense @ x.numpy(), atol=1e-12)
    assert math.isclose(float(np.asarray(inp.get_ydata())[3]), float(x[3]))
    named = plot_operator_outputs(graph, x, [Attention()], index=0, signal_label="values v")
    assert _labelled_lines(named.axes[0])[0].get_label() == "values v"


def test_frequency_responses_are_the_curves_of_the_plot() -> None:
    ops = {"P": Attention(), "heads": HeatKernel(t=[0.5, 2.0])}
    curves = frequency_responses(ops, LAM)
    assert curves["heads"].shape == (2, LAM.numel())
    assert frequency_responses(ops, LAM.float())["P"].dtype == torch.float64
    lines = _labelled_lines(plot_frequency_responses(ops, lam=LAM).axes[0])
    np.testing.assert_allclose(lines[0].get_ydata(), curves["P"].numpy())
    np.testing.assert_allclose(lines[2].get_ydata(), curves["heads"][1].numpy())
    with pytest.raises(ValueError, match="lam: expected a 1-D tensor"):
        frequency_responses(ops, LAM[None])


def test_given_curves_and_outputs_share_one_figure() -> None:
    graph = vh.random_attention(n=6, causal=True)
    x = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    outputs = operator_outputs(
        graph, x, {"attention": Attention(), "laplacian": "laplacian"}, index=1
    )
    dense = graph.to_dense()[1].numpy()
    np.testing.assert_allclose(outputs["attention"].numpy(), dense @ x.numpy(), atol=1e-12)
    fig = new_figure((10.0, 4.0))
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    curves = {"P": 1 - LAM, "L": LAM}
    assert draw_frequency_responses(LAM, curves, ax=left, title="f") is fig
    assert draw_operator_outputs(x, outputs, ax=right, signal_label="v") is fig
    assert [line.get_label() for line in _labelled_lines(left)] == ["P", "L"]
    assert left.get_title() == "f"
    inp, *outs = _labelled_lines(right)
    assert [inp.get_label(), *(o.get_label() for o in outs)] == ["v", "attention", "laplacian"]
    np.testing.assert_allclose(outs[1].get_ydata(), outputs["laplacian"].numpy())
    with pytest.raises(ValueError, match=r"curves: expected 'P' of shape \(41,\)"):
        draw_frequency_responses(LAM, {"P": LAM[:3]})
    with pytest.raises(ValueError, match=r"outputs: expected 'y' of shape \(6,\)"):
        draw_operator_outputs(x, {"y": x[:2]})
    with pytest.raises(ValueError, match=r"signal: expected shape \(6,\)"):
        operator_outputs(graph, x[:5], [Attention()], index=1)


def test_given_spectra_with_a_title_of_ones_own() -> None:
    graph = vh.random_attention(n=7, causal=True)
    spectra = {name: spectrum(graph, name)[0] for name in ("sym", "rw")}
    fig = draw_spectra(spectra, titles={"rw": "mine"})
    assert [ax.get_title() for ax in fig.axes] == [
        plot_spectra(graph, 0).axes[1].get_title(),
        "mine",
    ]
    (line,) = fig.axes[0].get_lines()[:1]
    np.testing.assert_allclose(
        line.get_ydata(), np.sort(_eigenvalues(graph, 0, "sym").real), atol=1e-8
    )
    with pytest.raises(ValueError, match="spectra: expected at least one"):
        draw_spectra({})
    with pytest.raises(ValueError, match="normalization"):
        draw_spectra({"lap": spectra["rw"]})
