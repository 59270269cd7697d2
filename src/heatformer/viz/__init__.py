"""Plots and teaching demos: attention graphs, heat flow, spectra, frequency responses.

Needs the optional ``viz`` extra (``pip install heatformer[viz]``, i.e. matplotlib; Pillow, a
matplotlib dependency, writes the GIFs). matplotlib is imported only when a plot is made, and
every figure is drawn on an Agg canvas without pyplot, so nothing opens a window and no global
state changes. Every drawing function returns the :class:`matplotlib.figure.Figure` (the
path, for a GIF) and writes it when given ``save=PATH``.

- :func:`draw_attention_graph`, :func:`plot_attention_matrix`, :func:`plot_topk_pruning` --
  one attention graph as a graph (layouts in :data:`LAYOUTS`) or a matrix, and top-k pruning.
- :func:`heat_diffusion_frames`, :func:`plot_heat_diffusion`, :func:`animate_heat_diffusion`
  -- heat flow ``exp(-tL) x`` of a signal over time.
- :func:`plot_spectra` -- Laplacian spectra for each normalization.
- :func:`plot_frequency_responses`, :func:`plot_operator_outputs` -- what each operator does
  to each frequency, and to a signal.
- :func:`plot_per_layer` -- a token-geometry metric across layers, one line per model.

Each ``plot_*`` computes its numbers from a graph, then draws them with a ``draw_*`` (or
``write_*``) function that takes the numbers instead: :func:`draw_topk_pruning`,
:func:`draw_heat_strip`, :func:`write_heat_gif`, :func:`draw_spectra`,
:func:`draw_frequency_responses` and :func:`draw_operator_outputs` (the last two on a given
axes), with :func:`frequency_responses` and :func:`operator_outputs` beside
:func:`heat_diffusion_frames` for the numbers. :mod:`heatformer.viz.figures`
(:func:`new_figure`, :func:`save_figure`, :func:`require_matplotlib`) composes them into a
figure of one's own.

The teaching demo behind ``heatformer demo`` draws its page with these functions but trains
models, so it lives above ``viz``, beside the command line: :mod:`heatformer.lab.demo`.
"""

from heatformer.viz._common import token_labels
from heatformer.viz._layouts import LAYOUTS
from heatformer.viz.diffusion import (
    animate_heat_diffusion,
    draw_heat_strip,
    heat_diffusion_frames,
    plot_heat_diffusion,
    write_heat_gif,
)
from heatformer.viz.figures import new_figure, require_matplotlib, save_figure
from heatformer.viz.graphs import (
    draw_attention_graph,
    draw_topk_pruning,
    find_collection,
    plot_attention_matrix,
    plot_topk_pruning,
    topk_title,
)
from heatformer.viz.layers import plot_per_layer
from heatformer.viz.spectra import (
    default_operators,
    draw_frequency_responses,
    draw_operator_outputs,
    draw_spectra,
    frequency_responses,
    operator_outputs,
    plot_frequency_responses,
    plot_operator_outputs,
    plot_spectra,
)

__all__ = [
    "LAYOUTS",
    "animate_heat_diffusion",
    "default_operators",
    "draw_attention_graph",
    "draw_frequency_responses",
    "draw_heat_strip",
    "draw_operator_outputs",
    "draw_spectra",
    "draw_topk_pruning",
    "find_collection",
    "frequency_responses",
    "heat_diffusion_frames",
    "new_figure",
    "operator_outputs",
    "plot_attention_matrix",
    "plot_frequency_responses",
    "plot_heat_diffusion",
    "plot_operator_outputs",
    "plot_per_layer",
    "plot_spectra",
    "plot_topk_pruning",
    "require_matplotlib",
    "save_figure",
    "token_labels",
    "topk_title",
    "write_heat_gif",
]
