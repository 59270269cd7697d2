"""``listops``: every label agrees with an evaluator written here from LRA's definition, the
lengths, depths and argument counts stay within the arguments, the tree shape is LRA's
(``VALUE_P = 0.25``, uniform operators and argument counts), and bad arguments name themselves."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from heatformer.datasets.lra import LISTOPS_VOCAB, listops

#: a parsed tree: a digit, or (operator string, children)
Tree = int | tuple[str, list["Tree"]]
PAD = 15


def _parse(row: list[int]) -> Tree:
    """The tree of one example's token ids (padding stripped), by recursive descent; every
    token is used exactly once."""
    words = [LISTOPS_VOCAB[t] for t in row]
    position = 0

    def node() -> Tree:
        nonlocal position
        word = words[position]
        position += 1
        if word.isdigit():
            return int(word)
        assert word in ("[MIN", "[MAX", "[MED", "[SM"), word
        children = []
        while words[position] != "]":
            children.append(node())
        position += 1
        return word, children

    tree = node()
    assert position == len(words), "tokens after the root's end"
    return tree


def _value(tree: Tree) -> int:
    """LRA's ``to_value``: MIN, MAX, ``int(np.median)``, sum mod 10."""
    if isinstance(tree, int):
        return tree
    operator, children = tree
    args = [_value(child) for child in children]
    if operator == "[MIN":
        return min(args)
    if operator == "[MAX":
        return max(args)
    if operator == "[MED":
        return int(np.median(args))
    if operator == "[SM":
        return int(np.sum(args)) % 10
    raise AssertionError(operator)


def _depth(tree: Tree) -> int:
    return 1 if isinstance(tree, int) else 1 + max(_depth(child) for child in tree[1])


def _arg_counts(tree: Tree) -> list[int]:
    if isinstance(tree, int):
        return []
    return [len(tree[1])] + [n for child in tree[1] for n in _arg_counts(child)]


def _lengths(inputs: torch.Tensor) -> torch.Tensor:
    return (inputs != PAD).sum(dim=1)


def _trees(inputs: torch.Tensor) -> list[Tree]:
    lengths = _lengths(inputs)
    # padding only after the expression
    assert all((r[n:] == PAD).all() and (r[:n] != PAD).all() for r, n in zip(inputs, lengths))
    return [_parse(row[:n].tolist()) for row, n in zip(inputs, lengths)]


def test_vocabulary_is_lras_tokens() -> None:
    assert LISTOPS_VOCAB[:10] == tuple(str(v) for v in range(10))  # a value is its token
    assert set(LISTOPS_VOCAB[10:15]) == {"[MIN", "[MAX", "[MED", "[SM", "]"}
    assert LISTOPS_VOCAB[PAD] == "<pad>"
    assert len(set(LISTOPS_VOCAB)) == len(LISTOPS_VOCAB) == 16


@pytest.mark.parametrize(
    ("min_length", "max_length", "max_depth", "max_args"),
    [(40, 160, 10, 10), (4, 40, 3, 4), (1, 17, 3, 3), (30, 31, 6, 5)],
)
def test_labels_lengths_depths_and_arguments(
    min_length: int, max_length: int, max_depth: int, max_args: int
) -> None:
    n = 300
    inputs, labels = listops(n, 7, min_length, max_length, max_depth, max_args)
    assert inputs.shape == labels.shape == (n, max_length)
    assert inputs.dtype == labels.dtype == torch.int64
    assert ((inputs >= 0) & (inputs < len(LISTOPS_VOCAB))).all()
    lengths = _lengths(inputs)
    assert ((lengths >= min_length) & (lengths <= max_length)).all()
    trees = _trees(inputs)
    # one scored position per example, at its last token, holding the tree's value
    scored = labels != -100
    assert torch.equal(scored.sum(dim=1), torch.ones(n, dtype=torch.int64))
    assert torch.equal(scored.float().argmax(dim=1), lengths - 1)
    assert labels.amax(dim=1).tolist() == [_value(tree) for tree in trees]
    assert max(_depth(tree) for tree in trees) <= max_depth
    counts = [c for tree in trees for c in _arg_counts(tree)]
    assert counts == [] or 2 <= min(counts) <= max(counts) <= max_args


def test_lengths_reach_both_ends_of_a_narrow_range() -> None:
    inputs, _ = listops(200, 0, min_length=30, max_length=33, max_depth=6, max_args=5)
    assert set(_lengths(inputs).tolist()) == {30, 31, 32, 33}


def test_tree_shape_is_lras() -> None:
    """With ``max_depth=3`` and ``max_args=3`` every tree (at most 17 tokens) is kept, so the
    frequencies are LRA's unconditioned ones: the root is a digit with probability
    ``1 - VALUE_P = 0.75``; an operator root has 2 or 3 arguments, equally likely, and is each
    operator equally often; a root with two digit arguments (4 tokens) has probability
    ``0.25 * 1/2 * 0.75**2``."""
    n = 4000
    inputs, _ = listops(n, 11, min_length=1, max_length=17, max_depth=3, max_args=3)
    lengths = _lengths(inputs)
    tolerance = 4 * np.sqrt(0.25 * 0.75 / n)
    assert abs((lengths == 1).float().mean().item() - 0.75) < tolerance
    assert abs((lengths == 4).float().mean().item() - 0.25 * 0.5 * 0.75**2) < tolerance
    roots = [tree for tree in _trees(inputs) if not isinstance(tree, int)]
    operators = Counter(operator for operator, _ in roots)
    assert set(operators) == {"[MIN", "[MAX", "[MED", "[SM"}
    share = 1 / 4
    assert all(abs(c / len(roots) - share) < 4 * np.sqrt(share * (1 - share) / len(roots))
               for c in operators.values())  # fmt: skip
    two = sum(len(children) == 2 for _, children in roots) / len(roots)
    assert abs(two - 0.5) < 4 * np.sqrt(0.25 / len(roots))


def test_deterministic_per_seed() -> None:
    first = listops(50, 3, 20, 80)
    again = listops(50, 3, 20, 80)
    other = listops(50, 4, 20, 80)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], other[0])


def test_labels_are_not_degenerate() -> None:
    _, labels = listops(400, 5, 64, 256)
    counts = Counter(labels.amax(dim=1).tolist())
    assert set(counts) <= set(range(10))
    assert len(counts) >= 8
    assert max(counts.values()) < 0.5 * 400


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"min_length": 10, "max_length": 5}, "min_length"),
        ({"min_length": 2, "max_length": 3}, "max_length"),  # trees are 1 token or >= 4
        ({"min_length": 5, "max_length": 6, "max_args": 2}, "max_length"),  # 1 mod 3 only
        ({"min_length": 2, "max_length": 50, "max_depth": 1}, "min_length"),  # one digit
        ({"min_length": 8000, "max_length": 16000}, "min_length"),  # LRA's trees are shorter
        ({"min_length": 0}, "min_length"),
        ({"max_length": -1}, "max_length"),
        ({"num_examples": 0}, "num_examples"),
        ({"num_examples": -3}, "num_examples"),
        ({"max_depth": 0}, "max_depth"),
        ({"max_args": 1}, "max_args"),
        ({"seed": -1}, "seed"),
        ({"min_length": 4.0}, "min_length"),
    ],
)
def test_bad_arguments_name_themselves(kwargs: dict[str, object], argument: str) -> None:
    call: dict[str, object] = {"num_examples": 2, "seed": 0, "min_length": 8, "max_length": 32}
    with pytest.raises(ValueError) as info:
        listops(**{**call, **kwargs})  # type: ignore[arg-type]
    assert getattr(info.value, "argument", None) == argument
    assert str(info.value).startswith(f"{argument}: expected")


def test_seed_of_the_wrong_kind() -> None:
    with pytest.raises(TypeError, match="seed"):
        listops(2, "0", 8, 32)  # type: ignore[arg-type]
