"""Direct contrasts between two compared configurations, neither of them the baseline.

The report compares every configuration with the baseline (:func:`~heatformer.lab.report.
add_paired`); a study that asks "Laplacian heads or centring heads?" needs the two against each
other. A contrast ``"A - B"`` (``CompareSpec.contrast``, ``--contrast``; ``A`` and ``B`` two of
the compared head schedules, e.g. ``"attention:2,laplacian:2 - attention:2,center:2"``) gets
the same statistics as a comparison with the baseline, with ``B`` in the baseline's place:
``metric(A, seed) - metric(B, seed)`` over the seeds both ran, their mean, 95 % interval and
paired t-test (:func:`~heatformer.lab.report.add_paired` on the two rows), per final metric and
per layer of the analysis. The contrasts of a study are one family per metric: their p-values
are Holm-adjusted together (``p_adjusted``, :func:`~heatformer.lab.report.holm`) and
``ci_simultaneous`` is the Bonferroni interval, as for the many-to-one comparisons
(:func:`~heatformer.lab.report.many_to_one`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from heatformer.checks import bad_type, bad_value
from heatformer.lab.report.inference import holm
from heatformer.lab.report.stats import add_paired, one_sample_t
from heatformer.lab.report.tables import _aligned, _signed

__all__ = ["check_contrasts", "format_contrast_table", "paired_contrasts", "parse_contrast"]

#: what joins the two schedules of a contrast (spaces around it in the canonical form)
_MINUS = "-"


def parse_contrast(text: str, heads: Sequence[str]) -> tuple[str, str]:
    """``(A, B)`` of the contrast ``"A - B"``: two distinct schedules of ``heads``.

    The text is cut at the one ``-`` whose two sides, stripped, are both among ``heads`` (a
    schedule may hold a ``-`` of its own: ``skip[init=-1]``).

    Args:
        text: the contrast, ``"A - B"``.
        heads: the compared schedules.

    Returns:
        The two schedules, as ``heads`` writes them.

    Raises:
        TypeError: naming ``contrast``, for a text that is not a str.
        ValueError: naming ``contrast``, when no cut (or more than one) gives two compared
            schedules, or both sides are the same.

    Example:
        >>> heads = ["attention:4", "attention:2,center:2", "attention:2,skip[init=-1]:2"]
        >>> parse_contrast("attention:2,skip[init=-1]:2 - attention:2,center:2", heads)
        ('attention:2,skip[init=-1]:2', 'attention:2,center:2')
    """
    if not isinstance(text, str):
        raise bad_type("contrast", f"expected a str 'A - B', got {type(text).__name__}")
    cuts = [i for i, char in enumerate(text) if char == _MINUS]
    pairs = {
        (text[:i].strip(), text[i + 1 :].strip())
        for i in cuts
        if text[:i].strip() in heads and text[i + 1 :].strip() in heads
    }
    if len(pairs) != 1:
        raise bad_value(
            "contrast",
            f"expected 'A - B' with A and B two of the compared schedules {list(heads)}, got "
            f"{text!r}",
        )
    ((a, b),) = pairs
    if a == b:
        raise bad_value("contrast", f"expected two different schedules, got {a!r} twice")
    return a, b


def check_contrasts(contrasts: object, heads: Sequence[str]) -> tuple[str, ...]:
    """The contrasts in their canonical form ``"A - B"``, each checked by
    :func:`parse_contrast`, none twice.

    Raises:
        TypeError: naming ``contrast``, for something not a sequence of str.
        ValueError: naming ``contrast``: a contrast :func:`parse_contrast` refuses, or one
            given twice.
    """
    if isinstance(contrasts, str) or not isinstance(contrasts, (tuple, list)):
        raise bad_type(
            "contrast", f"expected a list of 'A - B' strings, got {type(contrasts).__name__}"
        )
    out = tuple(" - ".join(parse_contrast(text, heads)) for text in contrasts)
    if len(set(out)) != len(out):
        raise bad_value("contrast", f"expected distinct contrasts, got {list(out)}")
    return out


def paired_contrasts(
    summary: Sequence[dict[str, Any]],
    contrasts: Sequence[str],
    metric_names: Sequence[str],
    analysis_names: Sequence[str] | None = None,
    level: float = 0.95,
) -> list[dict[str, Any]]:
    """The paired differences ``A - B`` of every contrast, Holm-adjusted over the contrasts.

    Args:
        summary: the output of :func:`~heatformer.lab.report.aggregate`.
        contrasts: ``"A - B"`` strings, as :func:`check_contrasts` gives them.
        metric_names: final metrics.
        analysis_names: per-layer analysis metrics; ``None``: every one the two rows have.
        level: the family's confidence level (``ci_simultaneous``).

    Returns:
        One dict per contrast, in the order given: ``contrast``, ``a``, ``b``, ``seeds``
        (those both ran; empty when none, or when a side has no runs) and, with seeds,
        ``final`` (``{metric: {"mean", "ci95", "p", "n", "values", "p_adjusted",
        "ci_simultaneous"}}``) and ``analysis`` (``{metric: {"mean": [per layer], "ci95":
        [...]}}``), as :func:`~heatformer.lab.report.add_paired` gives them against the
        baseline.
    """
    rows = {row["heads"]: row for row in summary}
    out: list[dict[str, Any]] = []
    for text in contrasts:
        try:
            a, b = parse_contrast(text, list(rows))
        except ValueError:  # a side without runs (yet): no pairs
            a, _, b = text.partition(" - ")
        entry: dict[str, Any] = {"contrast": text, "a": a, "b": b, "seeds": []}
        if a in rows and b in rows:
            first = dict(rows[a])  # add_paired writes its "paired" here, not in the summary
            names = list(first["analysis"]) if analysis_names is None else analysis_names
            add_paired([first, rows[b]], b, metric_names, names)
            paired = first.get("paired")
            if paired:
                entry.update(seeds=paired["seeds"], final=paired["final"])
                entry["analysis"] = paired["analysis"]
        out.append(entry)
    _adjust(out, metric_names, level)
    return out


def _adjust(contrasts: list[dict[str, Any]], metric_names: Sequence[str], level: float) -> None:
    """Holm over the contrasts with seeds, per metric; the Bonferroni interval of the family."""
    tested = [c for c in contrasts if c.get("final")]
    m = len(tested)
    for name in metric_names:
        family = [c["final"][name] for c in tested]
        for d, p in zip(family, holm([d["p"] for d in family]), strict=True):
            d["p_adjusted"] = p
            d["ci_simultaneous"] = one_sample_t(d["values"], 1 - (1 - level) / m)["ci95"]


def format_contrast_table(contrasts: Sequence[dict[str, Any]], metric_names: Sequence[str]) -> str:
    """The contrasts: ``Δ mean [95 % interval]``, the p-value and the Holm-adjusted one.

    Args:
        contrasts: the output of :func:`paired_contrasts`.
        metric_names: the metrics to show.

    Returns:
        The table under its title, lines joined with newlines; ``""`` without contrasts.
    """
    if not contrasts:
        return ""
    header = ["contrast A - B", "pairs"]
    for name in metric_names:
        header += [f"Δ{name} [95% CI]", "p", "p_holm"]
    lines: list[list[str]] = []
    for c in contrasts:
        cells = [c["contrast"], str(len(c["seeds"]))]
        for name in metric_names:
            d = (c.get("final") or {}).get(name)
            if d is None:
                cells += ["-", "-", "-"]
                continue
            digits = 4 if abs(d["mean"]) < 10 or not math.isfinite(d["mean"]) else 2
            interval = (
                f" [{_signed(d['mean'] - d['ci95'], digits)}, "
                f"{_signed(d['mean'] + d['ci95'], digits)}]"
                if math.isfinite(d["ci95"])
                else ""
            )
            cells += [f"{_signed(d['mean'], digits)}{interval}", _p(d["p"]), _p(d["p_adjusted"])]
        lines.append(cells)
    count = sum(1 for c in contrasts if c.get("final"))
    family = "1 contrast" if count == 1 else f"the {count} contrasts"
    title = f"contrasts A - B (same seeds; paired t-test; p_holm: Holm over {family}):"
    return "\n".join([title, *_aligned(header, lines)])


def _p(p: float) -> str:
    return "-" if not math.isfinite(p) else f"{p:.3f}"
