"""``seg_score`` of the ``masked`` task: Python token categories of source bytes, and how well
each window's top principal components separate them."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch

from heatformer.lab.tasks._python_tokens import CATEGORIES, UNKNOWN, byte_categories
from heatformer.lab.tasks._segmentation import SEG_RANK, segmentation_score, window_scores

#: one letter per category id, from UNKNOWN (-1): u, then layout, keyword, identifier, operator,
#: number, string, comment
LETTERS = "uLKIONSC"
PY312 = sys.version_info >= (3, 12)


def _letters(source: bytes) -> str:
    return "".join(LETTERS[i + 1] for i in byte_categories(source).tolist())


# hand-labelled: each byte's letter written out under its byte
SNIPPETS = [
    (b"if x1 > 2:  # go\n", "KKLIILOLNOLLCCCCL"),
    (b"def f(a=None):\n", "KKKLIOIOKKKKOOL"),
    (b"match = case_\n", "IIIIILOLIIIIIL"),  # soft keywords are identifiers
    (b"y = 0x1F + 1.5e3j\n", "ILOLNNNNLOLNNNNNNL"),
    (b"s = rb'a\\n'\n", "ILOLSSSSSSSL"),
    (b'"""doc\nstring"""\n', "SSSSSSSSSSSSSSSSL"),
    (b"class A:\n    pass  # x\n", "KKKKKLIOLLLLLKKKKLLCCCL"),
    (b"a = b \\\n  + c\n", "ILOLILLLLLOLIL"),  # a line continuation is layout
    ("é = 'ü'  # ü\n".encode(), "IILOLSSSSLLCCCCL"),  # every byte of a character
    (b"x = 1", "ILOLN"),  # no final newline
    (b"", ""),
]


@pytest.mark.parametrize(("source", "expected"), SNIPPETS)
def test_bytes_get_their_tokens_category(source: bytes, expected: str) -> None:
    assert len(expected) == len(source)
    assert _letters(source) == expected


def test_f_strings_are_strings_and_their_expressions_keep_their_tokens() -> None:
    source = b'return f"{a!r}" + 1\n'
    whole = "KKKKKKLSSSSSSSSLOLNL"  # Python 3.11: one STRING token
    parts = "KKKKKKLSSOIOIOSLOLNL"  # 3.12+: FSTRING_START, the braces' tokens, FSTRING_END
    assert _letters(source) == (parts if PY312 else whole)


def test_categories_are_int8_deterministic_and_named() -> None:
    source = b"import os\n\n\ndef main():\n    return os.sep  # done\n" * 20
    first, again = byte_categories(source), byte_categories(source)
    assert first.dtype == torch.int8 and first.shape == (len(source),)
    assert torch.equal(first, again)
    assert CATEGORIES == (
        "layout", "keyword", "identifier", "operator", "number", "string", "comment"
    )  # fmt: skip
    assert set(first.tolist()) == {0, 1, 2, 3, 6}  # no number, no string here
    with pytest.raises(TypeError, match="source: expected bytes, got str"):
        byte_categories("x = 1")  # type: ignore[arg-type]


def test_the_stream_is_tokenized_once_and_windows_cut_from_it() -> None:
    first = b'def f():\n    """Say\n    # not a comment\n    """\n    return 1\n'
    second = b"x = 2  # a comment\n"
    stream = byte_categories(first + second)
    # files one after the other: each file's categories, as if tokenized alone
    assert torch.equal(stream, torch.cat([byte_categories(first), byte_categories(second)]))
    # a window that starts inside the docstring: its bytes are string, the "#" too
    start = first.index(b"# not")
    window = stream[start : start + 15]
    assert window.tolist() == [CATEGORIES.index("string")] * 15
    assert _letters(first[start:])[:15] == "CCCCCCCCCCCCCCC"  # what the window alone would say


def test_an_indentation_error_leaves_its_line_unknown_and_tokenizing_goes_on() -> None:
    source = b"def f():\n    pass\n  x = 1\nz = 3\n"
    assert _letters(source) == "KKKLIOOOLLLLLKKKKL" + "u" * 8 + "ILOLNL"


def test_an_input_that_ends_inside_a_string_leaves_the_rest_unknown() -> None:
    source = b'x = 1\ny = """cut by --max-bytes\nmore\n'
    # unknown from the end of the last token (the "="), the space before the string too
    assert _letters(source) == "ILOLNL" + "ILO" + "u" * (len(source) - 9)
    assert _letters(b"x = (1,\n 2\n") == "ILOLONOLLNL"  # an open bracket: its tokens are known


def test_bytes_that_are_not_utf8_or_error_tokens_are_unknown() -> None:
    assert _letters(b"x\xff = 1\n") == "IuLOLNL"
    assert _letters(b"x = 1 $ 2\n") == ("ILOLNLOLNL" if PY312 else "ILOLNLuLNL")
    assert UNKNOWN == -1


# ------------------------------------------------------------------------- the score


def _reference(x: torch.Tensor, labels: torch.Tensor, rank: int) -> list[float]:
    """Each window's score from scikit-learn: PCA, NearestCentroid under LeaveOneOut, and the
    adjusted balanced accuracy, on the categories with two tokens or more."""
    decomposition = pytest.importorskip("sklearn.decomposition")
    from sklearn.metrics import balanced_accuracy_score
    from sklearn.model_selection import LeaveOneOut, cross_val_predict
    from sklearn.neighbors import NearestCentroid

    out = []
    for states, ids in zip(x.double().numpy(), labels.numpy(), strict=True):
        pca = decomposition.PCA(n_components=min(rank, *states.shape), svd_solver="full")
        z = pca.fit_transform(states)
        values, counts = np.unique(ids[ids >= 0], return_counts=True)
        keep = np.isin(ids, values[counts >= 2])
        if (counts >= 2).sum() < 2:
            out.append(math.nan)
            continue
        guess = cross_val_predict(NearestCentroid(), z[keep], ids[keep], cv=LeaveOneOut())
        out.append(balanced_accuracy_score(ids[keep], guess, adjusted=True))
    return out


@pytest.mark.parametrize("rank", [1, SEG_RANK, 8])
def test_scores_equal_scikit_learns_probe_window_by_window(rank: int) -> None:
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(6, 40, 10, generator=g) * torch.linspace(3, 0.3, 10)  # distinct PCs
    labels = torch.randint(0, 5, (6, 40), generator=g)
    labels[:, :4] = UNKNOWN
    labels[0, 4:] = torch.arange(36) % 2 * 2  # two classes only, ids 0 and 2
    labels[1, 4:] = 1  # one class: no score
    labels[2, 5:] = torch.randint(0, 2, (35,), generator=g)
    labels[2, 4] = 4  # a category of one token: left out
    x[3] += 4 * torch.nn.functional.one_hot(labels[3].clamp(min=0), 10)  # partly separable
    scores = window_scores(x, labels, rank=rank)
    reference = _reference(x, labels, rank)
    assert scores.dtype == torch.float64 and math.isnan(scores[1]) and math.isnan(reference[1])
    assert scores.tolist() == pytest.approx(reference, abs=1e-12, nan_ok=True)
    assert segmentation_score(x, labels, rank=rank) == pytest.approx(
        np.nanmean(reference), abs=1e-12
    )


def test_separated_clusters_score_one_and_random_categories_chance() -> None:
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (16, 64), generator=g)
    centres = 10 * torch.randn(4, 32, generator=g)  # 4 means span 3 dims: the top 3 PCs
    x = centres[labels] + torch.randn(16, 64, 32, generator=g)
    assert segmentation_score(x, labels) == 1.0
    random = torch.randint(0, 7, (64, 128), generator=g)
    noise = torch.randn(64, 128, 32, generator=g)
    chance = window_scores(noise, random)
    # mean over 64 windows of SD ~0.05 each: within 4 SD of 0 (leave-one-out leans below)
    assert abs(float(chance.mean())) < 4 * float(chance.std()) / 8
    assert segmentation_score(torch.zeros(3, 128, 8), random[:3]) == 0.0  # collapsed: chance


def test_only_the_top_components_count() -> None:
    g = torch.Generator().manual_seed(1)
    labels = torch.randint(0, 2, (8, 256), generator=g)
    x = torch.randn(8, 256, 6, generator=g) * torch.tensor([6.0, 6, 6, 6, 1, 1])
    x[..., 5] += 8 * labels  # the categories differ along the 6th axis: variance 17 < 36
    assert segmentation_score(x, labels, rank=SEG_RANK) < 0.2
    assert segmentation_score(x, labels, rank=6) > 0.95


def test_the_score_ignores_rotation_shift_scale_and_token_order() -> None:
    g = torch.Generator().manual_seed(2)
    labels = torch.randint(0, 4, (5, 50), generator=g)
    x = torch.randn(5, 50, 12, generator=g) + 0.5 * torch.randn(4, 12, generator=g)[labels]
    scores = window_scores(x, labels)
    rotation, _ = torch.linalg.qr(torch.randn(12, 12, generator=g))
    moved = 3.0 * x @ rotation + torch.randn(5, 1, 12, generator=g)
    assert window_scores(moved, labels).tolist() == pytest.approx(scores.tolist(), abs=1e-9)
    order = torch.randperm(50, generator=g)
    shuffled = window_scores(x[:, order], labels[:, order])
    assert shuffled.tolist() == pytest.approx(scores.tolist(), abs=1e-9)
    assert 0.2 < float(scores.mean()) < 0.8  # neither chance nor perfect


def test_windows_without_two_categories_have_no_score_and_bad_input_is_named() -> None:
    x = torch.randn(2, 6, 3)
    assert math.isnan(segmentation_score(x, torch.zeros(2, 6, dtype=torch.long)))
    assert math.isnan(segmentation_score(x, torch.full((2, 6), UNKNOWN)))
    with pytest.raises(ValueError, match=r"labels: expected states \(B, N, D\) and labels"):
        window_scores(x, torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="rank: expected an int >= 1, got 0"):
        window_scores(x, torch.zeros(2, 6, dtype=torch.long), rank=0)
    with pytest.raises(ValueError, match="labels: expected ids >= -1, got -100"):
        window_scores(x, torch.full((2, 6), -100))
