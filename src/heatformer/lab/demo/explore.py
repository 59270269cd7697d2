"""The demo's interactive page: one self-contained, offline ``explore.html``.

:func:`explorer_data` computes, with heatformer's own operators and in float64, everything the
page can show for every head of every layer: the matrices of the attention, Laplacian and
personalized-PageRank operators and of the heat kernel at each time of :data:`EXPLORE_TIMES`
(operators applied to the identity, so column ``j`` is the influence view ``op e_j`` and row
``j`` the mass view ``opᵀ e_j``), the totals of both views, the Dirichlet energy of the heat
flow from every token, the eigenvectors of the symmetrized graph's Laplacian, and the random
walk on ``P`` that :mod:`~heatformer.lab.demo.walk` computed (TokenRank ``π``, ``λ₂`` and its
eigenvector ``v₂``, with the words :mod:`~heatformer.lab.demo.text` writes of each head's
:func:`~heatformer.lab.demo.facts.walk_facts`).
:func:`write_explorer` embeds that as JSON in a page together with ``explore.js`` (package
data, shipped with heatformer), which draws it: sliders for ``t`` and for the number of Euler
steps or series terms (the step-by-step diffusion, computed in the browser from ``P``),
pickers for layer, head, source token and operator, both views with their totals, the
eigenvectors on the graph, the energy against ``t``, TokenRank as node area and ``v₂`` as node
colour, and the weight of an edge on hover. No
CDN, no server: the file opens from disk.
"""

from __future__ import annotations

import html
import itertools
import json
import math
import os
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from heatformer.checks import bad_value
from heatformer.graph_ops import (
    Attention,
    DenseGraph,
    Laplacian,
    PersonalizedPageRank,
    heat_kernel,
    laplacian,
    laplacian_matrix,
)
from heatformer.lab.demo.data import DemoData
from heatformer.lab.demo.facts import walk_facts
from heatformer.lab.demo.text import eigenvector_text, tokenrank_text
from heatformer.viz import token_labels

__all__ = ["EXPLORE_ALPHA", "EXPLORE_DIGITS", "EXPLORE_TIMES", "explorer_data", "write_explorer"]

#: The diffusion times of the ``t`` slider (the heat kernel is precomputed at each).
EXPLORE_TIMES = tuple(0.25 * i for i in range(17))  # 0, 0.25, ..., 4

#: The teleport probability of the personalized-PageRank operator of the page.
EXPLORE_ALPHA = 0.15

#: Decimals kept of the heat, Laplacian, PPR and eigenvector matrices in the page's JSON,
#: stored as ints in units of ``10**-EXPLORE_DIGITS`` (``P``, totals and energies are exact).
EXPLORE_DIGITS = 6


def _micro(x: Tensor, digits: int = EXPLORE_DIGITS) -> Any:
    """Nested lists of ``x`` in units of ``10**-digits``, rounded to ints (compact JSON)."""
    return torch.round(x.detach().to("cpu", torch.float64) * 10.0**digits).to(torch.int64).tolist()


def _exact(x: Tensor) -> Any:
    """Nested lists of ``x`` to 12 decimals (float64 noise below that only costs bytes)."""
    return (torch.round(x.detach().to("cpu", torch.float64) * 1e12) / 1e12).tolist()


def _one_head(weight: Tensor, times: tuple[float, ...], alpha: float) -> dict[str, Any]:
    """The page's numbers for one head: ``weight`` is its ``(N, N)`` attention matrix."""
    graph = DenseGraph(weight.to(torch.float64))
    n = graph.num_nodes
    eye = torch.eye(n, dtype=torch.float64)  # (N, N): column j is e_j
    with torch.no_grad():
        ops = {
            "attention": Attention()(graph, eye),  # P
            "laplacian": Laplacian()(graph, eye),  # I - P
            "ppr": PersonalizedPageRank(alpha=alpha, method="solve")(graph, eye),
        }
        heat = torch.stack(
            [heat_kernel(graph, eye, t, method="exact") for t in times]
        )  # (T, N, N): exp(-tL)
        sym = graph.symmetrize()  # W_s = (P + P^T) / 2
        lap_s = laplacian_matrix(sym, "combinatorial")  # (N, N): D_s - W_s
        evals, evecs = torch.linalg.eigh(lap_s)  # columns: eigenvectors, smooth first
        peak = evecs.abs().argmax(0)  # (N,) a sign convention: the largest entry positive
        evecs = evecs * torch.sign(evecs.gather(0, peak.unsqueeze(0)))
        influence = heat  # (T, N, N): column j is u(t) from token j
        mass = heat.transpose(-1, -2)  # (T, N, N): column j is m(t) = exp(-tL^T) e_j
        energy = {  # E(x) = x^T L_s x = 1/2 sum_ik W_s[i, k] (x_i - x_k)^2, one per column
            name: (views * laplacian(sym, views, "combinatorial")).sum(-2)  # (T, N)
            for name, views in (("influence", influence), ("mass", mass))
        }
    totals: dict[str, dict[str, Any]] = {
        name: {"influence": _exact(m.sum(-2)), "mass": _exact(m.sum(-1))} for name, m in ops.items()
    }
    totals["heat"] = {"influence": _exact(heat.sum(-2)), "mass": _exact(heat.sum(-1))}
    return {
        "attention": _exact(ops.pop("attention")),  # exact: the browser's Euler steps use it
        **{name: _micro(m) for name, m in ops.items()},
        "heat": _micro(heat),
        "totals": totals,
        "energy": {name: _exact(e) for name, e in energy.items()},
        "eigenvalues": _exact(evals),
        "eigenvectors": _micro(evecs.T),  # row k: eigenvector k
    }


def explorer_data(
    data: DemoData,
    *,
    times: tuple[float, ...] = EXPLORE_TIMES,
    alpha: float = EXPLORE_ALPHA,
) -> dict[str, Any]:
    """The numbers of the interactive page, for every head of every layer of ``data``.

    Args:
        data: the demo's :class:`~heatformer.lab.demo.DemoData` (its ``attention``, labels,
            operators, and the layer, head and source the page opens with).
        times: the diffusion times of the ``t`` slider (``>= 0``, increasing, starting at 0).
        alpha: the personalized-PageRank teleport probability, in (0, 1).

    Returns:
        A dict that ``json.dumps`` takes as it is: ``labels``, ``text``, ``operators``,
        ``layer``, ``head``, ``source``, ``times``, ``alpha``, ``digits`` and ``heads``, where
        ``heads[l][h]`` holds ``attention``, ``laplacian``, ``ppr`` (``(N, N)`` operator
        matrices ``op I``), ``heat`` (``(T, N, N)``, ``exp(−tL)`` at each time), ``totals``
        (``{operator: {"influence": column sums, "mass": row sums}}``, ``(N,)`` or
        ``(T, N)`` for heat), ``energy`` (``{view: (T, N)}`` Dirichlet energies
        ``xᵀ L_s x`` of the heat flow from each token, ``L_s = D_s − W_s`` of
        ``W_s = (P + Pᵀ)/2``), ``eigenvalues`` and ``eigenvectors`` (row ``k``) of ``L_s``,
        and ``walk`` (:func:`_walk`: ``pi``, ``lambda2``, ``vector`` and their texts).
        ``attention`` (``P``), totals, energies and eigenvalues are floats to 12 decimals; the
        other matrices are ints in units of ``10**-digits`` (:data:`EXPLORE_DIGITS`), to keep the
        page small.

    Raises:
        ValueError: bad ``times`` or ``alpha``.
    """
    ts = tuple(float(t) for t in times)
    if not ts or ts[0] != 0.0 or any(not b > a for a, b in itertools.pairwise(ts)):
        raise bad_value("times", f"expected increasing times starting at 0, got {list(times)}")
    if not all(math.isfinite(t) for t in ts):
        raise bad_value("times", f"expected finite times, got {list(times)}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise bad_value("alpha", f"expected a number in (0, 1), got {alpha!r}")
    layers, heads, n = data.attention.shape[:3]
    head = data.attention_head
    return {
        "labels": token_labels(data.labels, n),
        "text": data.text,
        "operators": [list(row) for row in data.operators],
        "layer": data.layer,
        "head": head,
        "source": data.source % n,
        "times": list(ts),
        "alpha": float(alpha),
        "digits": EXPLORE_DIGITS,
        "heads": [
            [
                {**_one_head(data.attention[li, h], ts, float(alpha)), "walk": _walk(data, li, h)}
                for h in range(heads)
            ]
            for li in range(layers)
        ],
    }


def _walk(data: DemoData, layer: int, head: int) -> dict[str, Any]:
    """The random walk on one head as the page draws it: ``pi`` (TokenRank, ``(N,)``, or
    ``None`` where heatformer refused it), ``lambda2`` (``[re, im]`` or ``None``), ``vector``
    (the real part of ``v₂``, ``(N,)``, or ``None``), ``peak`` (the token of its largest entry)
    and the words of both views (``pi_text``, ``vector_text``), from the head's
    :func:`~heatformer.lab.demo.facts.walk_facts`."""
    facts = walk_facts(data, layer, head)
    labels = token_labels(data.labels, facts.num_nodes)
    lam = facts.lambda2
    return {
        "pi": _exact(data.tokenrank[layer, head]) if facts.unique else None,
        "lambda2": None if lam is None else [lam.real, lam.imag],
        "vector": None if lam is None else _exact(data.walk_eigenvector[layer, head].real),
        "peak": facts.peak,
        "pi_text": tokenrank_text(labels, facts, drawn=True),
        "vector_text": eigenvector_text(labels, facts, drawn=True),
    }


_CSS = """
body { font-family: system-ui, sans-serif; margin: 1em auto; max-width: 1280px; padding: 0 1em;
       color: #222; line-height: 1.4; }
h1 { font-size: 1.4em; margin: 0.2em 0; } h2 { font-size: 1.05em; margin: 0.6em 0 0.2em; }
#controls { display: flex; flex-wrap: wrap; gap: 0.6em 1.4em; align-items: center;
            padding: 0.6em; background: #f6f6f6; border: 1px solid #ddd; }
#controls label { white-space: nowrap; }
.views { display: grid; grid-template-columns: 1fr; gap: 0.4em; }
.panel { border: 1px solid #e4e4e4; padding: 0.4em 0.6em; }
.total { font-weight: 600; } .note { color: #555; font-size: 0.9em; }
svg { width: 100%; height: auto; display: block; }
table { border-collapse: collapse; font-size: 0.8em; }
td, th { padding: 0 0.5em; text-align: right; border-bottom: 1px solid #eee; }
#tip { position: fixed; pointer-events: none; background: #ffd; border: 1px solid #aa8;
       padding: 2px 6px; font-size: 0.85em; display: none; }
code { background: #f0f0f0; padding: 0 0.2em; }
"""


def _script() -> str:
    return resources.files("heatformer.lab.demo").joinpath("explore.js").read_text("utf-8")


def write_explorer(
    out_dir: str | os.PathLike[str], data: DemoData, *, name: str = "explore.html"
) -> Path:
    """Write the interactive page: :func:`explorer_data` as JSON plus ``explore.js``, inline.

    Args:
        out_dir: the folder (created).
        data: the demo's :class:`~heatformer.lab.demo.DemoData`.
        name: the file name.

    Returns:
        The path of the written page.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = json.dumps(explorer_data(data), allow_nan=False, separators=(",", ":"))
    payload = payload.replace("</", "<\\/")  # never ends the script element early
    page = "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            "<title>heatformer: heat flow on attention graphs (interactive)</title>",
            f"<style>{_CSS}</style></head><body>",
            '<div id="app"></div><div id="tip"></div>',
            f'<script type="application/json" id="demo-data">{payload}</script>',
            f"<script>{_script()}</script>",
            f"<noscript>This page needs JavaScript; the static page is "
            f'<a href="index.html">index.html</a> ({html.escape(data.text)}).</noscript>',
            "</body></html>",
        ]
    )
    path = out / name
    path.write_text(page + "\n", encoding="utf-8")
    return path
