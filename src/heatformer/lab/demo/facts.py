"""What the teaching page may say, measured on its data: the facts behind every sentence.

The page's words (:mod:`heatformer.lab.demo.text`) state nothing about the model that
:func:`demo_facts` has not measured on the :class:`~heatformer.lab.demo.DemoData`: whether the
attention is causal (every weight above the diagonal zero) or bidirectional, whether the
out-degrees are 1 (so the combinatorial and random-walk Laplacians coincide), how many of the
head's Laplacian eigenvalues are complex, what each head mostly reads, how many edges top-k
keeps and how much weight, what a token is (a byte, a word piece...), and of every head's
random walk (:func:`walk_facts`): whether heatformer found its TokenRank ``π`` and where ``π``
lies, ``λ₂`` (real, complex or repeated) and the signs of its eigenvector ``v₂``.

Tolerances come from the dtype the model computed the weights in
(:attr:`DemoData.source_dtype <heatformer.lab.demo.DemoData>`, machine epsilon ``ε``; float32:
``ε = 1.19e-7``), not from the float64 copy the page holds:

- a weight is **zero** when it is at most ``ε``: a masked weight is exactly 0, and a visible
  key's softmax weight falls below ``ε`` only when its score is ``ln(1/ε)`` (float32: 15.9)
  below the row's largest;
- a row **sums to 1** when ``|Σⱼ P[i, j] − 1| ≤ N ε``: rounding each of the ``N`` weights costs
  at most ``ε/2`` of the total and the normalizing sum of ``N`` terms at most ``(N − 1) ε/2``
  (the bound of recursive summation), ``(N + 1) ε/2 ≤ N ε`` in all (measured on MiniLM's
  float32 attention: ``1.6e-7`` for ``N = 12``; a ``1e-9`` test on the float64 copy called
  every real page's out-degrees "not all 1");
- an eigenvalue is **complex** when ``|Im λ| > √ε``: rounding the weights by ``ε`` can split a
  double real eigenvalue into a pair ``λ ± i√ε``, so smaller imaginary parts may be rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from heatformer.checks import bad_value
from heatformer.lab.demo.compute import topk_ks
from heatformer.lab.demo.data import DemoData
from heatformer.viz import topk_title

__all__ = [
    "HABITS",
    "ZERO_ENTRY",
    "PageFacts",
    "TopkFacts",
    "WalkFacts",
    "demo_facts",
    "source_dtype",
    "walk_facts",
]

#: The habits of a head, in the order they are tested (the first that holds names the head):
#: the key that holds the largest weight (strictly: no tie) is the token itself, the previous
#: token, the next, the first or the last, for more than half of the queries that see more
#: than one key;
#: ``"spread"``: for more than half of them no key holds half the weight; ``"other"``: none.
HABITS = ("self", "previous", "next", "first", "last", "spread", "other")

#: An entry of ``v₂`` whose real part is at most this in modulus counts as zero (neither sign):
#: float64 rounding of a unit vector's entries, far below what a colour shows.
ZERO_ENTRY = 1e-9


@dataclass(frozen=True)
class TopkFacts:
    """One pruned graph of the top-k picture.

    Attributes:
        k: edges kept per query.
        edges: its edges (non-zero weights).
        weight_kept: the share of a query's weight its ``k`` heaviest edges held before they
            were renormalized, averaged over the queries.
    """

    k: int
    edges: int
    weight_kept: float


@dataclass(frozen=True)
class WalkFacts:
    """The random walk on one head's ``P = D⁻¹W``, as the page states it.

    Attributes:
        layer, head: which head of which layer; operator: its operator's name.
        num_nodes: ``N``.
        source_dtype: the dtype the model computed the weights in (tolerances as
            :class:`PageFacts`').
        causal: every weight above the diagonal is zero (at most ``ε``).
        empty_node: the first node without an out-edge (``P`` is then not stochastic and the
            walk is not defined), else ``None``.
        rows_sum_to_one: every row sums to 1 within ``N ε``, so ``P = W``.
        unique: heatformer found the stationary distribution (``π`` of
            :attr:`DemoData.tokenrank <heatformer.lab.demo.DemoData>` is not all zero).
        top: up to three ``(token, π)`` of the largest ``π > 0``, by decreasing ``π``.
        support: how many tokens have ``π > 0``.
        on_first: ``π = e₀``: all of the mass on token 0 (``π₀ ≥ 1 − 10⁻¹²``).
        lambda2: ``λ₂``, the eigenvalue of ``P`` second largest in modulus (``None``: one
            token, or no walk).
        lambda2_real: ``|Im λ₂| ≤ √ε``.
        lambda2_repeated: ``λ₁`` or ``λ₃`` lies within ``√ε`` of ``λ₂``.
        self_weight_token: for a causal head, the token ``m ≥ 1`` whose self-weight
            ``P[m, m]`` is ``λ₂`` within ``√ε`` (the eigenvalues of a triangular ``P`` are its
            diagonal), else ``None``.
        peak: the token of ``v₂``'s entry of largest modulus (real and positive by convention).
        signs: how many entries of ``Re v₂`` are positive, negative and zero
            (:data:`ZERO_ENTRY`).
        vector_complex: ``v₂`` has an imaginary part above :data:`ZERO_ENTRY`.
    """

    layer: int
    head: int
    operator: str
    num_nodes: int
    source_dtype: torch.dtype
    causal: bool
    empty_node: int | None
    rows_sum_to_one: bool
    unique: bool
    top: tuple[tuple[int, float], ...]
    support: int
    on_first: bool
    lambda2: complex | None
    lambda2_real: bool
    lambda2_repeated: bool
    self_weight_token: int | None
    peak: int | None
    signs: tuple[int, int, int]
    vector_complex: bool

    @property
    def imag_tol(self) -> float:
        """``√ε`` of :attr:`source_dtype`: the tolerance of "real" and "repeated"."""
        return math.sqrt(torch.finfo(self.source_dtype).eps)


@dataclass(frozen=True)
class PageFacts:
    """The facts the page's text is written from (see the module docstring for tolerances).

    Attributes:
        source_dtype: the dtype the model computed the weights in.
        num_nodes: ``N``, the tokens.
        causal: ``(L, H)``: whether each head's weights above the diagonal are all zero.
        head_causal: the same for the head of the single-head pictures.
        out_degrees: ``(smallest, largest)`` row sum of that head.
        row_stochastic: every row of that head sums to 1 (or to 0: a fully masked query).
        complex_eigenvalues: how many eigenvalues of that head's random-walk Laplacian are
            complex.
        habits: ``(L, H)``: the habit of every head, one of :data:`HABITS`.
        edges: the edges of that head's full graph (non-zero weights).
        topk: the pruned graphs of the top-k picture.
        token_unit: what a token is (``"byte"``, ``"word piece"``...).
        walk: the random walk on that head's ``P`` (:func:`walk_facts`).
    """

    source_dtype: torch.dtype
    num_nodes: int
    causal: tuple[tuple[bool, ...], ...]
    head_causal: bool
    out_degrees: tuple[float, float]
    row_stochastic: bool
    complex_eigenvalues: int
    habits: tuple[tuple[str, ...], ...]
    edges: int
    topk: tuple[TopkFacts, ...]
    token_unit: str
    walk: WalkFacts

    @property
    def eps(self) -> float:
        """``ε``, the machine epsilon of :attr:`source_dtype`: the tolerance of a zero weight."""
        return torch.finfo(self.source_dtype).eps

    @property
    def sum_tol(self) -> float:
        """``N ε``: the tolerance of a row sum."""
        return self.num_nodes * self.eps

    @property
    def imag_tol(self) -> float:
        """``√ε``: the largest imaginary part of an eigenvalue counted as real."""
        return math.sqrt(self.eps)

    @property
    def num_causal(self) -> int:
        """How many heads (of all layers) are causal."""
        return sum(sum(row) for row in self.causal)

    @property
    def num_heads(self) -> int:
        """How many heads all layers have together."""
        return sum(len(row) for row in self.causal)

    @property
    def direction(self) -> str:
        """``"causal"`` (every head), ``"bidirectional"`` (no head) or ``"mixed"``."""
        if self.num_causal == self.num_heads:
            return "causal"
        return "bidirectional" if self.num_causal == 0 else "mixed"

    def habit_counts(self) -> dict[str, int]:
        """``{habit: heads}`` for every habit of :data:`HABITS` that some head has, in order."""
        flat = [h for row in self.habits for h in row]
        return {h: flat.count(h) for h in HABITS if h in flat}


def source_dtype(data: DemoData) -> torch.dtype:
    """The floating dtype named by ``data.source_dtype``.

    Raises:
        ValueError: the name is not a floating torch dtype.
    """
    dtype = getattr(torch, data.source_dtype, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        expected = "expected the name of a floating torch dtype"
        raise bad_value("source_dtype", f"{expected}, got {data.source_dtype!r}")
    return dtype


def demo_facts(data: DemoData) -> PageFacts:
    """Measure on ``data`` every fact the page's text states.

    Args:
        data: the demo's numbers.

    Returns:
        The :class:`PageFacts`.

    Raises:
        ValueError: ``data.source_dtype`` is not a floating dtype's name.
    """
    dtype = source_dtype(data)
    eps = torch.finfo(dtype).eps
    n = data.attention.shape[-1]
    upper = torch.ones(n, n, dtype=torch.bool).triu(1)  # (N, N): j > i
    causal = data.attention.masked_fill(~upper, 0.0).amax((-2, -1)) <= eps  # (L, H)
    head = data.attention[data.layer, data.attention_head]  # (N, N)
    out = head.sum(-1)  # (N,)
    row_stochastic = bool(((out - 1).abs().le(n * eps) | out.abs().le(n * eps)).all())
    rw = data.spectra["rw"]
    imag = rw.imag.abs() if rw.is_complex() else torch.zeros_like(rw)
    full = data.topk[topk_title(None)]  # (N, N)
    topk = tuple(
        TopkFacts(
            k=k,
            edges=int((data.topk[topk_title(k)] > eps).sum()),
            weight_kept=float(full.topk(k, dim=-1).values.sum(-1).mean()),
        )
        for k in topk_ks(n)
        if k is not None
    )
    return PageFacts(
        source_dtype=dtype,
        num_nodes=n,
        causal=tuple(tuple(bool(c) for c in row) for row in causal),
        head_causal=bool(causal[data.layer, data.attention_head]),
        out_degrees=(float(out.min()), float(out.max())),
        row_stochastic=row_stochastic,
        complex_eigenvalues=int((imag > math.sqrt(eps)).sum()),
        habits=tuple(tuple(_habit(w, eps) for w in layer) for layer in data.attention),
        edges=int((full > eps).sum()),
        topk=topk,
        token_unit=data.token_unit,
        walk=walk_facts(data, data.layer, data.attention_head),
    )


def _habit(weight: Tensor, eps: float) -> str:
    """The habit (one of :data:`HABITS`) of one head's ``(N, N)`` weights."""
    n = weight.shape[-1]
    rows = (weight > eps).sum(-1) > 1  # (N,): queries that see more than one key
    if n < 2:
        return "other"
    top = weight.topk(2, dim=-1)  # (N, 2): the two largest weights of each query
    # the key of each query's largest weight; -1 where that weight is tied (no key is "the" one)
    best = torch.where(top.values[:, 0] > top.values[:, 1], top.indices[:, 0], -1)  # (N,)
    i = torch.arange(n)
    targets = {
        "self": (i, rows),
        "previous": (i - 1, rows & (i >= 1)),
        "next": (i + 1, rows & (i <= n - 2)),
        "first": (torch.zeros_like(i), rows & (i >= 1)),
        "last": (torch.full_like(i, n - 1), rows & (i <= n - 2)),
    }
    for name, (key, asked) in targets.items():
        if 2 * int((best.eq(key) & asked).sum()) > int(asked.sum()) > 0:
            return name
    spread = weight.amax(-1) < 0.5  # (N,): no key holds half the weight
    if 2 * int((spread & rows).sum()) > int(rows.sum()) > 0:
        return "spread"
    return "other"


def walk_facts(data: DemoData, layer: int, head: int) -> WalkFacts:
    """Measure the random walk of head ``head`` of layer ``layer`` on ``data``: the head's
    weights and the walk that :mod:`~heatformer.lab.demo.walk` computed of them.

    Raises:
        ValueError: ``data.source_dtype`` is not a floating dtype's name.
    """
    dtype = source_dtype(data)
    eps = torch.finfo(dtype).eps
    w = data.attention[layer, head]  # (N, N)
    n = w.shape[-1]
    out = w.sum(-1)  # (N,)
    empty = (out <= 0).nonzero()
    pi = data.tokenrank[layer, head]  # (N,)
    unique = bool(pi.sum() > 0)
    order = pi.argsort(descending=True, stable=True)
    values = data.walk_eigenvalues[layer, head]  # (K,)
    lambda2 = complex(values[1]) if len(empty) == 0 and len(values) >= 2 else None
    v = data.walk_eigenvector[layer, head]  # (N,)
    tol = math.sqrt(eps)
    causal = bool(w.triu(1).abs().max() <= eps) if n > 1 else True
    return WalkFacts(
        layer=layer,
        head=head,
        operator=data.operators[layer][head],
        num_nodes=n,
        source_dtype=dtype,
        causal=causal,
        empty_node=int(empty[0]) if len(empty) else None,
        rows_sum_to_one=bool((out - 1).abs().le(n * eps).all()),
        unique=unique,
        top=tuple((int(i), float(pi[i])) for i in order[:3] if pi[i] > 0),
        support=int((pi > 0).sum()),
        on_first=unique and float(pi[0]) >= 1 - 1e-12,
        lambda2=lambda2,
        lambda2_real=lambda2 is not None and abs(lambda2.imag) <= tol,
        lambda2_repeated=lambda2 is not None
        and any(abs(complex(z) - lambda2) <= tol for i, z in enumerate(values) if i != 1),
        self_weight_token=_self_weight_token(w, lambda2, tol) if causal else None,
        peak=int((v.abs() * 1e12).round().argmax()) if lambda2 is not None else None,
        signs=(
            int((v.real > ZERO_ENTRY).sum()),
            int((v.real < -ZERO_ENTRY).sum()),
            int((v.real.abs() <= ZERO_ENTRY).sum()),
        ),
        vector_complex=bool((v.imag.abs() > ZERO_ENTRY).any()),
    )


def _self_weight_token(w: Tensor, lambda2: complex | None, tol: float) -> int | None:
    """The token ``m >= 1`` of the largest self-weight ``P[m, m]`` of the weights ``w`` when
    that is ``λ₂`` within ``tol`` (a causal ``P``'s eigenvalues are its diagonal), else
    ``None`` (also without a walk: ``λ₂`` is then ``None``)."""
    if lambda2 is None or w.shape[-1] < 2:
        return None
    p = w / w.sum(-1, keepdim=True)  # (N, N): every row has an out-edge when lambda2 is known
    m = 1 + int(p.diagonal()[1:].argmax())
    return m if abs(complex(float(p[m, m])) - lambda2) <= tol else None
