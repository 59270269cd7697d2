"""Heat-flow frames: the numbers are exp(-tL) x, heat is conserved where it must be."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch

import viz_helpers as vh
from heatformer.graph_ops import laplacian_matrix
from heatformer.viz import (
    animate_heat_diffusion,
    draw_heat_strip,
    find_collection,
    heat_diffusion_frames,
    plot_heat_diffusion,
    write_heat_gif,
)

TIMES = (0.0, 0.3, 1.0, 2.5, 6.0)


def test_frames_conserve_heat_on_symmetric_graph_combinatorial() -> None:
    graph = vh.random_symmetric(n=7)
    frames = heat_diffusion_frames(graph, 2, TIMES, normalization="combinatorial")
    assert frames.shape == (len(TIMES), 7)
    torch.testing.assert_close(frames.sum(-1), torch.ones(len(TIMES), dtype=torch.float64))
    assert bool((frames >= -1e-12).all())  # heat stays non-negative
    assert frames[0].tolist() == [0, 0, 1, 0, 0, 0, 0]
    # and spreads out: the maximum only decreases
    assert all(a >= b - 1e-12 for a, b in zip(frames.amax(-1), frames.amax(-1)[1:]))


@pytest.mark.parametrize("normalization", ["rw", "sym", "combinatorial"])
def test_frames_match_scipy_expm(normalization: str) -> None:
    graph = vh.random_attention(n=6, causal=True)
    x = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    frames = heat_diffusion_frames(graph, x, TIMES, index=1, normalization=normalization)
    lap = laplacian_matrix(graph, normalization)[1].numpy()
    for t, frame in zip(TIMES, frames):
        np.testing.assert_allclose(
            frame.numpy(), scipy.linalg.expm(-t * lap) @ x.numpy(), atol=1e-6
        )


def test_random_walk_keeps_constants() -> None:
    graph = vh.random_attention(n=8)
    frames = heat_diffusion_frames(graph, torch.full((8,), 3.0), TIMES, index=0)
    torch.testing.assert_close(frames, torch.full((len(TIMES), 8), 3.0, dtype=torch.float64))


def test_bad_signal_and_times() -> None:
    graph = vh.random_attention(n=5)
    with pytest.raises(ValueError, match="signal: expected a node index in"):
        heat_diffusion_frames(graph, 5, TIMES, index=0)
    with pytest.raises(ValueError, match=r"signal: expected a node index or shape \(5,\)"):
        heat_diffusion_frames(graph, torch.ones(4), TIMES, index=0)
    with pytest.raises(ValueError, match="times: expected diffusion times >= 0"):
        heat_diffusion_frames(graph, 0, (1.0, -1.0), index=0)
    with pytest.raises(ValueError, match="times: expected at least one"):
        heat_diffusion_frames(graph, 0, (), index=0)


@pytest.mark.parametrize("layout", ["arc", "circular"])
def test_strip_has_one_frame_per_time(layout: str, tmp_path) -> None:
    graph = vh.random_attention(n=9, causal=True)
    fig = plot_heat_diffusion(graph, 3, TIMES, index=0, layout=layout, save=tmp_path / "h.png")
    assert len(fig.axes) == len(TIMES) + 1  # the frames and the colorbar
    frames = heat_diffusion_frames(graph, 3, TIMES, index=0)
    for ax, t, frame in zip(fig.axes, TIMES, frames):
        assert ax.get_title() == f"t = {t:g}"
        np.testing.assert_allclose(find_collection(ax, "nodes").get_array(), frame.numpy())
    vh.assert_png(tmp_path / "h.png")


@pytest.mark.parametrize(("gamma", "note"), [(0.5, "  (colour ∝ √value)"), (1.0, "")])
def test_the_colour_bar_says_when_the_scale_is_not_linear(gamma: float, note: str) -> None:
    graph = vh.random_attention(n=6, causal=True)
    fig = plot_heat_diffusion(graph, 2, TIMES, index=0, gamma=gamma)
    *frames, bar = fig.axes
    assert bar.get_ylabel() == "heat exp(−tL) x  (rw)" + note
    # and the note is true: a quarter of the top value sits halfway up a square-root scale
    nodes = find_collection(frames[0], "nodes")
    top = float(nodes.norm.vmax)
    assert float(nodes.norm(0.25 * top)) == pytest.approx(0.5 if note else 0.25)
    assert min(c for ax in frames for _, c, _ in vh.node_labels(ax)) >= 4.5


def test_gif_has_one_frame_per_time(tmp_path) -> None:
    path = animate_heat_diffusion(
        vh.random_attention(n=7), 0, torch.linspace(0, 3, 6), index=1, save=tmp_path / "a.gif"
    )
    assert path == tmp_path / "a.gif"
    assert vh.gif_frames(path) == 6
    with pytest.raises(ValueError, match=r"save: expected a path ending in \.gif"):
        animate_heat_diffusion(vh.random_attention(n=7), 0, index=1, save=tmp_path / "a.png")


def test_a_strip_of_given_frames_is_the_strip_of_the_plot() -> None:
    graph = vh.random_attention(n=6, causal=True)
    frames = heat_diffusion_frames(graph, 2, TIMES, index=0)
    plotted = plot_heat_diffusion(graph, 2, TIMES, index=0)
    strip = draw_heat_strip(graph.to_dense()[0], TIMES, frames, totals=True, label="u")
    assert len(strip.axes) == len(TIMES) + 1  # the frames and the colour bar
    for ax, same, t, frame in zip(strip.axes, plotted.axes, TIMES, frames):
        colours = find_collection(ax, "nodes").get_array()
        np.testing.assert_allclose(colours, frame.numpy())
        np.testing.assert_allclose(colours, find_collection(same, "nodes").get_array())
        assert ax.get_title() == f"t = {t:g},  total {float(frame.sum()):.4f}"
    assert strip.axes[-1].get_ylabel() == "u  (colour ∝ √value)"
    with pytest.raises(ValueError, match=r"frames: expected shape \(5, 6\)"):
        draw_heat_strip(graph.to_dense()[0], TIMES, frames[:, :4])
    with pytest.raises(ValueError, match="times: expected diffusion times >= 0"):
        draw_heat_strip(graph.to_dense()[0], (-1.0,), frames[:1])


def test_a_gif_of_given_frames(tmp_path) -> None:
    one = vh.random_attention(n=5).to_dense()[1]
    times = (0.0, 1.0, 2.0)
    frames = heat_diffusion_frames(one, 1, times, normalization="sym")
    path = write_heat_gif(one, times, frames, save=tmp_path / "g" / "h.gif", fps=2)
    assert path == tmp_path / "g" / "h.gif"
    assert vh.gif_frames(path) == 3
    with pytest.raises(ValueError, match=r"save: expected a path ending in \.gif"):
        write_heat_gif(one, times, frames, save=tmp_path / "h.png")
    with pytest.raises(ValueError, match="fps: expected a positive int"):
        write_heat_gif(one, times, frames, save=tmp_path / "h.gif", fps=0)
