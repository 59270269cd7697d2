"""Every resolver of a name suggests the closest valid one (one helper, ``heatformer._suggest``):
operators, graph kinds, tasks, heat methods, and the command line's options."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from heatformer.checks import ArgumentError, check_choice
from heatformer.graph_ops import DenseGraph, heat_kernel, resolve_graph, resolve_operator
from heatformer.lab.cli import main
from heatformer.lab.spec import CompareSpec
from heatformer.lab.tasks import resolve_task
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
        (
            lambda: resolve_operator("laplacian", normalization="sim"),
            "normalization",
            "expected one of ['rw', 'sym', 'combinatorial'], got 'sim' (did you mean 'sym'?)",
        ),
        (
            lambda: CompareSpec(analysis_point="post-ln"),
            "analysis_point",
            "got 'post-ln' (did you mean 'post_ln'?)",
        ),
    ],
    ids=["operator", "alias", "head-spec", "graph", "task", "method", "normalization", "option"],
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
        resolve_operator("wavelet")  # ("diffusion" is close to "diff" now)
    assert "did you mean" not in str(info.value)


@pytest.mark.parametrize("value", [None, 3, b"rw", ["rw"], "RW", ""])
def test_check_choice_refuses_what_is_not_one_of_the_choices(value: object) -> None:
    with pytest.raises(ValueError) as info:
        check_choice("normalization", value, ("rw", "sym"), context=" in a test")
    assert isinstance(info.value, ArgumentError) and info.value.argument == "normalization"
    assert str(info.value).startswith(
        f"normalization: expected one of ['rw', 'sym'], got {value!r} in a test"
    )
    if not isinstance(value, str):  # nothing to compare with the names
        assert "did you mean" not in str(info.value)


def test_check_choice_returns_a_choice_and_lists_them_in_the_order_given() -> None:
    assert check_choice("method", "series", iter(["auto", "series"])) == "series"
    with pytest.raises(ValueError, match=r"expected one of \['z', 'a'\], got 'b'"):
        check_choice("x", "b", ["z", "a"])


def test_the_command_line_suggests_as_the_library(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--heads", "laplacain:2", "--task", "char"]) == 2
    err = capsys.readouterr().err
    assert (
        "--task: expected one of ['chars', 'digits', 'induction', 'listops', 'masked', 'mqar', "
        "'parity', 'passkey', 'recall', 'selective_copy', 'stdlib'], got 'char'" in err
    )
    assert "got 'char' (did you mean 'chars'?)" in err
    assert main(["compare", "--heads", "laplacain:2"]) == 2
    assert "(did you mean 'laplacian'?)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--seeds", "3"])
    assert "unrecognized arguments: --seeds 3 (did you mean --seed?)" in capsys.readouterr().err
