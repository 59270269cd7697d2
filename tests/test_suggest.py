"""Every resolver of a name suggests the closest valid one (one helper, ``heatformer._suggest``):
operators, graph kinds, tasks, heat methods, and the command line's options."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from heatformer.checks import ArgumentError
from heatformer.cli import main
from heatformer.experiments.tasks import resolve_task
from heatformer.graph_ops import DenseGraph, heat_kernel, resolve_graph, resolve_operator
from heatformer.models import DiffusionAttention


def _heat(method: str) -> object:
    graph = DenseGraph(torch.full((3, 3), 1 / 3))
    return heat_kernel(graph, torch.ones(3, 1), 1.0, method=method)


@pytest.mark.parametrize(
    ("call", "argument", "expected"),
    [
        (lambda: resolve_operator("laplacain"), "name", "'laplacain' (did you mean 'laplacian'?)"),
        (lambda: resolve_operator("pagernak"), "name", "(did you mean 'pagerank'?)"),
        (
            lambda: DiffusionAttention(16, 4, "laplacain:2,attention:2"),
            "heads",
            "unknown operator 'laplacain' (did you mean 'laplacian'?)",
        ),
        (lambda: resolve_graph("windw[w=4]"), "graph", "in 'windw[w=4]' (did you mean 'window'?)"),
        (lambda: resolve_task("char"), "task", "got 'char' (did you mean 'chars'?)"),
        (lambda: _heat("seris"), "method", "got 'seris' (did you mean 'series'?)"),
    ],
    ids=["operator", "alias", "head-spec", "graph", "task", "method"],
)
def test_a_mistyped_name_gets_the_closest_valid_one(
    call: Callable[[], object], argument: str, expected: str
) -> None:
    with pytest.raises(ValueError) as info:
        call()
    assert isinstance(info.value, ArgumentError) and info.value.argument == argument
    assert expected in str(info.value)


def test_a_name_close_to_nothing_gets_no_suggestion() -> None:
    with pytest.raises(ValueError) as info:
        resolve_operator("diffusion")
    assert "did you mean" not in str(info.value)


def test_the_command_line_suggests_as_the_library(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--heads", "laplacain:2", "--task", "char"]) == 2
    err = capsys.readouterr().err
    assert (
        "--task: expected one of ['chars', 'digits', 'masked', 'recall', 'stdlib'], got 'char'"
        in err
    )
    assert "got 'char' (did you mean 'chars'?)" in err
    assert main(["compare", "--heads", "laplacain:2"]) == 2
    assert "(did you mean 'laplacian'?)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--seeds", "3"])
    assert "unrecognized arguments: --seeds 3 (did you mean --seed?)" in capsys.readouterr().err
