"""``heatformer demo-ops``: every operator on a random attention graph, as a table."""

from __future__ import annotations

import argparse
from typing import Any

import heatformer
from heatformer.lab.cli._options import OptionParser

OPS_HELP = "operators on a random attention graph (a quick look)"


def add_ops_arguments(parser: OptionParser) -> None:
    """Options of ``heatformer demo-ops``."""
    parser.add_argument("--nodes", type=int, default=64, help="tokens N (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


def run_ops(args: argparse.Namespace) -> int:
    """Apply every operator to a signal on a random causal attention graph; print a table."""
    import torch

    from heatformer import checks
    from heatformer.graph_ops import SoftmaxGraph, laplacian, resolve_operator

    if args.nodes < 2:
        raise checks.bad_value("nodes", f"expected at least 2, got {args.nodes}")
    gen = torch.Generator().manual_seed(args.seed)
    n, d = args.nodes, 16
    q = torch.randn(1, n, d, generator=gen, dtype=torch.float64)
    k = torch.randn(1, n, d, generator=gen, dtype=torch.float64)
    x = torch.randn(1, n, 8, generator=gen, dtype=torch.float64)
    graph = SoftmaxGraph(q, k)
    specs: list[tuple[str, dict[str, Any]]] = [
        ("attention", {}),
        ("laplacian", {}),
        ("heat", {"t": 0.5}),
        ("heat", {"t": 2.0}),
        ("ppr", {"alpha": 0.2}),
    ]

    def spread(y: torch.Tensor) -> float:  # mean squared distance to the sequence mean
        return float(((y - y.mean(-2, keepdim=True)) ** 2).sum(-1).mean())

    def energy(y: torch.Tensor) -> float:  # Dirichlet energy tr(y^T L_sym y) / tr(y^T y)
        return float((y * laplacian(graph, y, "sym")).sum() / (y * y).sum())

    print(
        f"heatformer {heatformer.__version__}: operators on a random attention graph "
        f"(N={n}, seed={args.seed})"
    )
    print(f"{'operator':<22}{'token spread':>14}{'Dirichlet energy':>18}")
    print(f"{'input x':<22}{spread(x):>14.4f}{energy(x):>18.4f}")
    for name, kwargs in specs:
        op = resolve_operator(name, **kwargs)
        y = op(graph, x)
        label = name + "".join(f" {k}={v:g}" for k, v in kwargs.items())
        print(f"{label:<22}{spread(y):>14.4f}{energy(y):>18.4f}")
    print("Averaging (attention, heat, ppr) shrinks the spread and the energy (low-pass);")
    print("the Laplacian head keeps the high-frequency part (high-pass).")
    return 0
