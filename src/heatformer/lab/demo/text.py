"""The teaching page's words: every section's text, written from the data and its facts.

Each function returns the HTML text of one part of ``index.html``
(:func:`~heatformer.lab.demo.write_demo`). What a sentence says about the model -- causal or
bidirectional, bytes or word pieces, real or complex eigenvalues, one spectrum panel or two,
what the heads read, what top-k keeps -- is chosen from the
:class:`~heatformer.lab.demo.facts.PageFacts` that :func:`~heatformer.lab.demo.facts.demo_facts`
measured, never assumed; the rest is the mathematics that holds for every attention graph.
A text refers to another section as ``{ref:key}``.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from torch import Tensor

from heatformer.lab.demo.data import DemoData
from heatformer.lab.demo.facts import ZERO_ENTRY, PageFacts, WalkFacts
from heatformer.viz import token_labels

__all__ = [
    "MERGED_SPECTRUM_TITLE",
    "eigenvector_text",
    "geometry_text",
    "graph_text",
    "heat_text",
    "intro_text",
    "laplacian_text",
    "matrices_text",
    "meta_text",
    "spectrum_text",
    "tokenrank_text",
    "topk_text",
    "walk_text",
]

#: The title of the one spectrum panel of the random-walk and combinatorial Laplacians, when
#: every out-degree is 1.
MERGED_SPECTRUM_TITLE = "random walk = combinatorial  $L = I - P$  (out-degrees 1)"


def _dtype(facts: PageFacts) -> str:
    return str(facts.source_dtype).removeprefix("torch.")


def _code(label: str) -> str:
    return f"<code>{html.escape(label if label.strip() else repr(label))}</code>"


def intro_text(data: DemoData, *, explore: bool) -> str:
    """The paragraph under the title: the sentence, the layer and heads the pictures show."""
    lap = data.laplacian_head
    return (
        "What a small transformer's attention looks like as a graph, on the sentence "
        f"<code>{html.escape(data.text)}</code>. Pictures of layer {data.layer} (layers are "
        "numbered from 0: layer 0 is the first block); the attention head is head "
        f"{data.attention_head}" + (f", the Laplacian head head {lap}." if lap is not None else ".")
    ) + (
        ' <b><a href="explore.html">Play with it</a></b>: the interactive page (sliders for '
        "<i>t</i> and the number of steps, any layer, head, token and operator)."
        if explore
        else ""
    )


def meta_text(data: DemoData, facts: PageFacts) -> str:
    """The line under the intro: the run, and the training losses in bits per token."""
    losses = "; ".join(
        f"<code>{html.escape(k)}</code> training loss {a:.2f} → {b:.2f} bits/{facts.token_unit}"
        for k, (a, b) in data.losses.items()
    )
    return " ".join(p for p in (html.escape(data.meta), losses) if p)


def graph_text(facts: PageFacts) -> str:
    """Section "Attention is a graph": the head of the pictures, causal or bidirectional."""
    if facts.row_stochastic:
        rows = "(a softmax row: the weights of a node's out-edges sum to 1)"
    else:
        low, high = facts.out_degrees
        rows = f"(the weights of a node's out-edges sum to {low:.3g} to {high:.3g} here)"
    if facts.head_causal:
        direction = (
            "This head is causal (every weight above the diagonal is zero), so every arrow "
            "points back to an earlier token or to the token itself (attention keeps self-loops)."
        )
    else:
        direction = (
            "This head is bidirectional: a query reads keys before and after it, so arrows "
            "point both ways, and to the token itself (attention keeps self-loops)."
        )
    return (
        "Every token is a node. Query <i>i</i> sends an edge to each key <i>j</i> it attends "
        f"to, with weight <code>P[i, j]</code> {rows}, drawn thicker and darker for larger "
        "weights. The arrow <i>i</i> → <i>j</i> says who reads from whom: query <i>i</i> reads "
        "key <i>j</i>, so the value of <i>j</i> travels the other way, from key <i>j</i> to "
        "query <i>i</i> (this is why the influence view of {ref:heat} moves against the arrows). "
        f"{direction} The node colour (colour bar) is the in-degree "
        "<code>Σ<sub>i</sub> P[i, j]</code>, the total attention a token receives; tokens "
        "that collect much of it are <i>attention sinks</i>. An attention head's output is "
        "the average <code>P v</code> of the values over each node's out-edges."
    )


def matrices_text(data: DemoData, facts: PageFacts) -> str:
    """Section "every head as a matrix": causal, bidirectional or mixed; what heads read."""
    units, total = f"{facts.token_unit}s", facts.num_heads
    if facts.direction == "causal":
        triangle = (
            "the upper triangle is empty because the model is causal: in all "
            f"{total} heads every weight above the diagonal is zero (no query reads a later "
            f"{facts.token_unit})"
        )
    elif facts.direction == "bidirectional":
        triangle = (
            "no triangle is empty: the model is bidirectional, and in all "
            f"{total} heads queries read later {units} as well as earlier ones"
        )
    else:
        triangle = (
            f"{facts.num_causal} of the {total} heads are causal (an empty upper triangle: no "
            f"query reads a later {facts.token_unit}), the other {total - facts.num_causal} "
            "read both ways"
        )
    return (
        "Row <i>i</i> is query <i>i</i>, column <i>j</i> key <i>j</i> (axis labels), one colour "
        f"scale for all heads (colour bar); {triangle}. A Laplacian head has an attention graph "
        "just like an attention head; only what it does with it differs "
        "({ref:laplacian-head}). " + _habits_text(data, facts)
    )


def _habits_text(data: DemoData, facts: PageFacts) -> str:
    """What the heads read (:data:`~heatformer.lab.demo.facts.HABITS`), with their counts."""
    unit, labels = facts.token_unit, data.labels
    keys = {
        "self": f"the {unit} itself",
        "previous": f"the previous {unit}",
        "next": f"the next {unit}",
        "first": f"the first token ({_code(labels[0])})",
        "last": f"the last token ({_code(labels[-1])})",
    }
    counts = facts.habit_counts()
    read = [f"{keys[h]} in {c}" for h, c in counts.items() if h in keys]
    parts = []
    if read:
        listed = ", ".join(read[:-1]) + (" and " if len(read) > 1 else "") + read[-1]
        parts.append(
            "for most queries (more than half), the key with the largest weight is "
            f"{listed} of the {facts.num_heads} heads"
        )
    if counts.get("spread"):
        spread = ("all " if counts["spread"] == facts.num_heads else "") + _heads(counts["spread"])
        parts.append(f"in {spread} most queries spread their weight (no key holds half)")
    if counts.get("other"):
        verb = "follows" if counts["other"] == 1 else "follow"
        parts.append(f"{_heads(counts['other'])} {verb} none of these patterns")
    return "What the heads read: " + "; ".join(parts) + "."


def _heads(count: int) -> str:
    return f"{count} head" + ("" if count == 1 else "s")


def spectrum_text(facts: PageFacts) -> str:
    """Section "Its Laplacian spectrum": real or complex eigenvalues, one panel or two."""
    n, count = facts.num_nodes, facts.complex_eigenvalues
    if count:
        why = (
            ""
            if facts.head_causal
            else "it is bidirectional, so <code>P</code> is not triangular, and "
        )
        eigen = (
            f", and this head has them: {why}{count} of its {n} come in conjugate pairs off the "
            "real axis (the first panel is the complex plane, with that circle)"
        )
    elif facts.head_causal:
        eigen = (
            "; but this head is causal, so <code>P</code> is lower-triangular and its "
            "eigenvalues are its diagonal, <code>1 − P[i, i]</code>, real and in [0, 1]"
        )
    else:
        eigen = (
            f"; this bidirectional head's {n} happen to be real (no imaginary part above "
            f"√ε = {facts.imag_tol:.1e}, the rounding of its {_dtype(facts)} weights)"
        )
    return (
        "The random-walk Laplacian of an attention graph is <code>L = I − P</code>. Its "
        "eigenvalue 0 belongs to the constant signal (<code>P 1 = 1</code>): smooth signals "
        "have small eigenvalues, rough ones large. A directed graph usually has complex "
        f"eigenvalues, inside the disk <code>|λ − 1| ≤ 1</code>{eigen}. The symmetric "
        "normalization (of <code>W<sub>s</sub> = (W + Wᵀ)/2</code>) has real eigenvalues in "
        "[0, 2]. " + _panels_text(facts)
    )


def _panels_text(facts: PageFacts) -> str:
    """Whether the combinatorial Laplacian has its own spectrum panel, and why."""
    if facts.row_stochastic:
        return (
            "The combinatorial Laplacian <code>D − W</code> equals <code>I − P</code> here, "
            "since every out-degree of the graph is 1 (<code>D = I</code>, to within "
            f"<i>N</i> ε = {facts.sum_tol:.1e}, the rounding of its {_dtype(facts)} weights): "
            "the two spectra are the same, so one panel shows both."
        )
    low, high = facts.out_degrees
    return (
        "The combinatorial Laplacian <code>D − W</code> has its own panel: this graph's "
        f"out-degrees are not all 1 (they range from {low:.3g} to {high:.3g})."
    )


def _totals(frames: Tensor) -> str:
    return ", ".join(f"{float(v):.2f}" for v in frames.sum(-1))


def heat_text(data: DemoData, facts: PageFacts) -> str:
    """Section "Heat flow": both views, which way each moves on this head."""
    src = data.labels[data.source]
    times = ", ".join(f"{t:g}" for t in data.heat_times)
    if facts.head_causal:
        influence, mass = "to later tokens only (the head is causal)", "back to earlier tokens"
    else:
        influence = "to earlier and later tokens alike (the head is bidirectional)"
        mass = "to earlier and later tokens"
    return (
        f"Put 1 on token <i>j</i> = {data.source} ({_code(src)}) and 0 elsewhere, then let it "
        "diffuse for a time <i>t</i>. There are two ways to do this on a directed graph, and "
        "only one of them conserves the total. <b>Influence view</b> (first strip): "
        "<code>u(t) = exp(−tL) e<sub>j</sub></code>, the output of a heat head with time "
        "<i>t</i> (<code>du/dt = −L u</code>). Entry <i>i</i> is how much of token <i>j</i>'s "
        "value token <i>i</i>'s output holds. Every output is a weighted average of values "
        "(the rows of <code>exp(−tL)</code> sum to 1), so constants stay constant; but its "
        "columns do not sum to 1, and the total <code>Σ<sub>i</sub> u<sub>i</sub>(t)</code> is "
        f"<b>not conserved</b>: at <i>t</i> = {times} it is {_totals(data.heat)}. It counts "
        "how many outputs listen to token <i>j</i>; it is not an amount of heat. It moves "
        f"against the arrows, from key to query, {influence}, along the strong edges first. "
        "<b>Mass view</b> (second strip): <code>m(t) = exp(−tLᵀ) e<sub>j</sub></code> "
        "(<code>dm/dt = −Lᵀ m</code>): a unit of mass on token <i>j</i> flows along the "
        f"arrows, from query to key, {mass}, and piles up on the sinks. Since "
        "<code>1ᵀ Lᵀ = (L 1)ᵀ = 0</code>, its total is <b>conserved</b>: "
        f"{_totals(data.mass)}. This is the heat of a physics course. Heat is low-pass: it "
        "smooths. heatformer computes <code>exp(−tL) x</code> without any matrix, as the "
        "positive series <code>e<sup>−t</sup> Σ<sub>k</sub> t<sup>k</sup>/k! P<sup>k</sup> "
        "x</code>; the mass view of token <i>j</i> is row <i>j</i> of the same kernel, since "
        "<code>exp(−tLᵀ) = exp(−tL)ᵀ</code>. The animation is the influence view, and its title "
        "says so. Where a colour bar says <i>colour ∝ √value</i>, colour follows the square "
        "root of the value, so that faint values far from the source show."
    )


def laplacian_text() -> str:
    """Section "A Laplacian head is high-pass" (true of every attention graph)."""
    return (
        "Left: an operator <code>f(L)</code> multiplies the part of a signal along a "
        "Laplacian eigenvector with eigenvalue λ by <code>f(λ)</code> (the eigenvalues of "
        "{ref:spectrum}). Attention <code>P = I − L</code> has <code>f(λ) = 1 − λ</code>: it "
        "keeps the smooth part (λ near 0) and damps the rough part (low-pass, like the heat "
        "kernel <code>exp(−tL)</code> of {ref:heat}). A Laplacian head outputs "
        "<code>(I − P) v = v − P v</code>, <code>f(λ) = λ</code>: it removes the common part "
        "and keeps what makes a token differ from its neighbours (high-pass). The ticks are "
        "the real parts of this head's eigenvalues. Right: one channel of the head's values "
        "<code>v</code> and both outputs; the two outputs add up to <code>v</code>."
    )


def topk_text(facts: PageFacts) -> str:
    """Section "Top-k pruning": the edges and the weight each pruned graph keeps."""
    kept = "; ".join(
        f"top-{t.k} keeps {t.edges} of them and on average {t.weight_kept:.0%} of a query's "
        "weight (before renormalizing)"
        for t in facts.topk
    )
    here = f"Here the full graph has {facts.edges} edges" + (f"; {kept}. " if kept else ". ")
    return (
        "Each query keeps only its <i>k</i> heaviest edges, renormalized to sum 1. The graph "
        "then has at most <i>N k</i> edges instead of up to <i>N²</i>, so a diffusion step "
        "costs <i>O(N k)</i>: this is how heatformer runs heat and Laplacian heads on long "
        f"sequences (a sparse matrix product per step). {here}Matrices: query <i>i</i> (rows) "
        "by key <i>j</i> (columns); nodes coloured by in-degree, as in {ref:graph}."
    )


def geometry_text(data: DemoData) -> str:
    """Section "Token geometry": what was measured, and how little one seed says."""
    last = ", ".join(
        f"{v[-1]:.2f} for <code>{html.escape(k)}</code>" for k, v in (data.per_layer or {}).items()
    )
    return (
        "The share of the token variance that lies within a sequence (the rest is between "
        "sequences), of the embedding and of the output of each layer (layer <i>i</i> is block "
        "<i>i</i>, as in the pictures above and in <code>heatformer compare</code>), on "
        "held-out windows. Averaging (attention, heat) pulls the tokens of a sequence "
        "together; Laplacian heads push them apart (Zhang &amp; Papyan, 2026). Here, after "
        f"the last layer: {last}. <b>One seed, so no error bars</b>: tiny models trained for "
        "seconds, and a gap of a few hundredths between the lines can be noise (the y-axis "
        "shows the whole range 0 to 1; run again with another <code>--seed</code>, or "
        "<code>heatformer compare</code> with several seeds for mean ± std). Measure, don't "
        "assume."
    )


def _quoted(labels: Sequence[str], i: int) -> str:
    return f"token {i} ‘{labels[i]}’"


def _walk_head(walk: WalkFacts) -> str:
    return f"layer {walk.layer}, head {walk.head} ({walk.operator})"


def _walk_of(walk: WalkFacts) -> str:
    """The chain, named as the page states it: ``P`` itself, or ``P = D⁻¹W``."""
    if walk.rows_sum_to_one:
        return "P (the attention matrix itself: its rows sum to 1)"
    return "P = D⁻¹W (the weights with each row divided by its sum)"


def tokenrank_text(labels: Sequence[str], walk: WalkFacts, *, drawn: bool) -> str:
    """What TokenRank is on one head, and where its ``π`` lies (plain text).

    ``labels`` are the node labels as the page shows them; ``drawn``: the page draws ``π`` on
    the graph (the interactive page), so the text says how.
    """
    name = _walk_head(walk)
    if walk.empty_node is not None:
        return (
            f"TokenRank of {name}: none. {_quoted(labels, walk.empty_node)} has no out-edges (a "
            "query that attends to nothing), so P = D⁻¹W is not a stochastic matrix, there is "
            "no random walk, and heatformer refuses its stationary distribution."
        )
    if not walk.unique:
        return (
            f"TokenRank of {name}: none. The random walk on {_walk_of(walk)} has several closed "
            "classes (groups of tokens that never attend outside themselves), so its stationary "
            "distribution is not unique, and heatformer refuses it."
        )
    text = (
        f"TokenRank of {name}: the stationary distribution π of the random walk on "
        f"{_walk_of(walk)}, πP = π with Σπ = 1: the left eigenvector of P for λ₁ = 1 (its "
        "Perron vector), computed by heatformer.analysis.stationary_distribution."
    )
    if drawn:
        text += (
            " Node area ∝ π, and the colour shows π too (colour bar); a node with π = 0 has no "
            "area: only its label is drawn."
        )
    if walk.on_first:
        why = (
            "This head is causal, so every walk drains back to token 0 and stays there"
            if walk.causal
            else "Every walk ends on token 0"
        )
        return (
            f"{text} {why}: π = e₀, all of the mass on {_quoted(labels, 0)}, none on the other "
            "tokens, so this π ranks nothing."
        )
    top = [f"‘{labels[i]}’ (token {i}, π = {v:.3f})" for i, v in walk.top]
    listed = ", ".join(top[:-1]) + (" and " if len(top) > 1 else "") + top[-1]
    n = walk.num_nodes
    rest = (
        "every token has π > 0"
        if walk.support == n
        else f"{n - walk.support} of the {n} tokens have π = 0: the walk leaves them for good"
    )
    return (
        f"{text} The walk spends the largest shares of its time on {listed} (uniform would be "
        f"1/N = {1 / n:.3f}); {rest}."
    )


def _complex(z: complex) -> str:
    if z.imag == 0:
        return f"{z.real:.4f}"
    sign = "+" if z.imag > 0 else "−"
    return f"{z.real:.4f} {sign} {abs(z.imag):.4g}i"


def eigenvector_text(labels: Sequence[str], walk: WalkFacts, *, drawn: bool) -> str:
    """``λ₂`` of one head, its eigenvector ``v₂`` and its sign convention (plain text).

    ``drawn``: the page colours the nodes by ``v₂`` (the interactive page).
    """
    name = _walk_head(walk)
    if walk.lambda2 is None or walk.peak is None:
        why = "one token has one eigenvalue" if walk.empty_node is None else "there is no walk"
        return f"λ₂ of {name}: none, {why}."
    lam = walk.lambda2
    text = (
        f"Second eigenvector of {name}: P v₂ = λ₂ v₂ with λ₂ = {_complex(lam)}, the eigenvalue "
        "of P second largest in modulus (λ₁ = 1 belongs to the constant vector), computed by "
        "heatformer.analysis.leading_eigenvectors. The spectral gap 1 − |λ₂| = "
        f"{1 - abs(lam):.4g} sets how fast repeated attention Pᵗ x forgets x: what is left "
        "besides its constant part shrinks about as |λ₂|ᵗ."
    )
    if walk.self_weight_token is not None:
        m = walk.self_weight_token
        text += (
            " This head is causal: P is lower-triangular, its eigenvalues are its diagonal, and "
            f"λ₂ is the self-weight P[{m}, {m}] of {_quoted(labels, m)}, the largest after token "
            "0's (which is 1)."
        )
    if not walk.lambda2_real:
        text += " λ₂ is complex, its conjugate is λ₃ (the same modulus), and v₂ is complex too."
    elif walk.vector_complex or lam.imag != 0:
        text += (
            f" λ₂'s imaginary part is below √ε = {walk.imag_tol:.1e}, the rounding of the "
            f"{str(walk.source_dtype).removeprefix('torch.')} weights: real, to their precision."
        )
    if walk.lambda2_repeated:
        text += (
            f" λ₂ is repeated (λ₁ or λ₃ lies within √ε = {walk.imag_tol:.1e} of it): its "
            "eigenvectors "
            "are not unique, and v₂ is the one numpy's eigensolver returns, not a property of "
            "the head."
        )
    turned = "its phase turned" if walk.vector_complex else "its sign chosen"
    real = "the real part of " if walk.vector_complex else ""
    pos, neg, zero = walk.signs
    counts = f"{pos} positive, {neg} negative" + (
        f" and {zero} zero (within {ZERO_ENTRY:.0e})" if zero else ""
    )
    text += (
        f" v₂ is scaled to unit length, {turned} so that its largest entry, on "
        f"{_quoted(labels, walk.peak)}, is {'real and ' if walk.vector_complex else ''}positive; "
        f"the entries of {real}v₂: {counts}."
    )
    if drawn:
        text += f" Node colour: {real}v₂, red positive, blue negative."
    return text


def walk_text(data: DemoData, facts: PageFacts, *, explore: bool) -> str:
    """Section "The random walk on this head": TokenRank and ``λ₂`` of the head of
    {ref:graph}, in words (the interactive page draws them)."""
    labels = token_labels(data.labels, facts.num_nodes)
    words = (
        html.escape(tokenrank_text(labels, facts.walk, drawn=False))
        + " "
        + html.escape(eigenvector_text(labels, facts.walk, drawn=False))
    )
    where = (
        ' <a href="explore.html">The interactive page</a> draws both on the graph, π as node '
        "area and v₂ as node colour, for every head of every layer."
        if explore
        else ""
    )
    return f"The head of {{ref:graph}} read as a random walk. {words}{where}"
