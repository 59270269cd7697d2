"""Per-layer metric plots: one line per configuration, the values as given."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import viz_helpers as vh
from heatformer.viz import plot_per_layer


def test_one_line_per_configuration(tmp_path) -> None:
    values = {"attention:4": [1.0, 0.6, 0.3], "laplacian:4": torch.tensor([1.0, 0.9, 0.85, 0.8])}
    fig = plot_per_layer(values, ylabel="variance", logy=True, save=tmp_path / "l.png")
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == list(values)
    np.testing.assert_allclose(lines[0].get_ydata(), [1.0, 0.6, 0.3])
    np.testing.assert_allclose(lines[1].get_xdata(), [0, 1, 2, 3])
    assert ax.get_yscale() == "log" and ax.get_ylabel() == "variance"
    vh.assert_png(tmp_path / "l.png")


@pytest.mark.parametrize(
    ("values", "kwargs", "message"),
    [
        ({}, {}, "non-empty mapping"),
        ({"a": []}, {}, "at least one value"),
        ({"a": [1.0, float("nan")]}, {}, "finite"),
        ({"a": [1.0, 0.0]}, {"logy": True}, "logy needs positive"),
    ],
)
def test_bad_values(values: dict, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plot_per_layer(values, **kwargs)
