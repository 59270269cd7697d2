"""A custom diffusion operator plugged into DiffusionAttention.

`TwoHop` mixes one and two steps of attention, y = (1 - a) P x + a P^2 x, with a learnable
mixing weight a = sigmoid(logit). Anything that subclasses DiffusionOperator and implements
`forward(graph, x)` can be a head; `frequency_response` (here (1-a)(1-lam) + a(1-lam)^2) lets
heatformer.viz plot it. The script checks the head against a dense reference and trains `a`
for a few steps on a toy target (gradients reach the operator's own parameter).

    python examples/custom_operator.py --steps 50
"""

from __future__ import annotations

import argparse

import torch
from torch import Tensor, nn

from heatformer.graph_ops import Attention, DiffusionOperator, Graph, Laplacian
from heatformer.models import DiffusionAttention


class TwoHop(DiffusionOperator):
    """``(1 - a) P x + a P^2 x`` with ``a = sigmoid(logit)`` learnable."""

    name = "twohop"

    def __init__(self, mix: float = 0.5) -> None:
        super().__init__()
        self.logit = nn.Parameter(torch.logit(torch.tensor(mix)))

    @property
    def mix(self) -> Tensor:
        return torch.sigmoid(self.logit)

    def forward(self, graph: Graph, x: Tensor) -> Tensor:
        one = graph.propagate(x)  # P x, one fused SDPA call on a SoftmaxGraph
        two = graph.propagate(one)  # P^2 x
        a = self.mix.to(x.dtype)
        return (1 - a) * one + a * two

    def frequency_response(self, lam: Tensor) -> Tensor:
        a = self.mix.to(lam.dtype)
        return (1 - a) * (1 - lam) + a * (1 - lam) ** 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="training steps (default 100)")
    parser.add_argument("--tokens", type=int, default=12, help="sequence length (default 12)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    twohop = TwoHop(mix=0.5)
    layer = DiffusionAttention(32, 4, operators=[twohop, twohop, Attention(), Laplacian()],
                               causal=True)  # fmt: skip
    print(layer)
    x = torch.randn(2, args.tokens, 32)  # (B, N, D)

    # the two TwoHop heads against a dense reference built from the attention matrix
    q, k, v = layer.project_qkv(x)  # (B, H, N, Dh) each
    y = layer.diffuse(q, k, v)  # (B, H, N, Dh)
    p = layer.graphs(x).to_dense()  # (B, H, N, N)
    a = float(twohop.mix.detach())
    reference = (1 - a) * p[:, :2] @ v[:, :2] + a * p[:, :2] @ p[:, :2] @ v[:, :2]
    print(f"TwoHop heads vs dense reference: max error {(y[:, :2] - reference).abs().max():.2e}")

    # gradients reach the operator's parameter: fit a toy target
    target = torch.randn(2, args.tokens, 32)
    opt = torch.optim.Adam(layer.parameters(), lr=0.05)
    before = float(twohop.mix.detach())
    first = last = 0.0
    for step in range(args.steps):
        loss = ((layer(x) - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = float(loss.detach()) if step == 0 else first
        last = float(loss.detach())
    print(f"mix a: {before:.3f} -> {float(twohop.mix.detach()):.3f}")
    print(f"loss: {first:.4f} -> {last:.4f}")


if __name__ == "__main__":
    main()
