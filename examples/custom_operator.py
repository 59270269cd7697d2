"""Custom diffusion operators plugged into DiffusionAttention, without editing the library.

`TwoHop` mixes one and two steps of attention, y = (1 - a) P x + a P^2 x, with a learnable
mixing weight a = sigmoid(logit). Anything that subclasses DiffusionOperator and implements
`forward(graph, x)` can be a head; `frequency_response` (here (1-a)(1-lam) + a(1-lam)^2) lets
heatformer.viz plot it. The script checks the head against a dense reference and trains `a`
for a few steps on a toy target (gradients reach the operator's own parameter).

`LazyWalk` is a *fusable* operator: a lazy random walk y = (1 - a) P x + a x. It declares
`affine_coefficients() = (1 - a, a)`, so a layer serves it from the one fused attention call
with the attention and Laplacian heads, and a causal GPT generates with the KV cache. One
registry entry, `OPERATORS.register(LazyWalk)`, makes it usable in head specs
("attention:2,lazy[a=0.3]:2").

    python examples/custom_operator.py --steps 50
"""

from __future__ import annotations

import argparse

import torch
from torch import Tensor, nn

from heatformer.graph_ops import (
    OPERATORS,
    Attention,
    DiffusionOperator,
    Graph,
    GraphLaplacian,
    Laplacian,
)
from heatformer.models import GPT, DiffusionAttention, GPTConfig


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


class LazyWalk(DiffusionOperator):
    """The lazy random walk ``(1 - a) P x + a x`` (``I' x`` on nodes with out-edges)."""

    name = "lazy"
    examples = ({}, {"a": 0.3})  # what the test-suite's matrix would run

    def __init__(self, a: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= a <= 1.0:
            raise ValueError(f"a: expected a laziness in [0, 1], got {a}")
        self.register_buffer("a", torch.tensor(float(a), dtype=torch.float64), persistent=False)

    def forward(self, graph: Graph, x: Tensor) -> Tensor:
        walk = GraphLaplacian(graph, "rw")
        a = self.a.to(x.dtype)
        return (1 - a) * walk.adjacency(x) + a * walk.identity(x)

    def affine_coefficients(self) -> tuple[Tensor, Tensor]:
        return 1 - self.a, self.a  # y = (1 - a) P v + a v: served by the fused SDPA call

    def frequency_response(self, lam: Tensor) -> Tensor:
        return 1 - (1 - self.a.to(lam.dtype)) * lam


def fusable_operator_demo(tokens: int) -> None:
    """LazyWalk on the fused path, against a dense reference, and with the KV cache."""
    OPERATORS.register(LazyWalk)  # the one registry entry (checked): now a head-spec name
    layer = DiffusionAttention(32, 4, "attention:1,lazy[a=0.3]:2,laplacian:1", causal=True)
    x = torch.randn(2, tokens, 32)
    q, k, v = layer.project_qkv(x)
    p = layer.graphs(x).to_dense()  # (B, H, N, N)
    reference = 0.7 * p[:, 1:3] @ v[:, 1:3] + 0.3 * v[:, 1:3]
    error = (layer.diffuse(q, k, v)[:, 1:3] - reference).abs().max()
    print(f"fused heads: {len(layer.fused_heads)} of {layer.num_heads}")
    print(f"LazyWalk heads vs dense reference: max error {error:.2e}")
    torch.manual_seed(1)
    gpt = GPT(GPTConfig(vocab_size=32, block_size=32, n_layer=2, n_head=4, n_embd=32,
                        heads="attention:2,lazy[a=0.3]:2")).eval()  # fmt: skip
    prompt = torch.randint(0, 32, (2, 5))
    cached = gpt.generate(prompt, 12, top_k=1, use_cache=True)
    recomputed = gpt.generate(prompt, 12, top_k=1, use_cache=False)
    print(f"GPT with LazyWalk heads: supports_cache={gpt.supports_cache}, "
          f"cached generation equals recomputation: {torch.equal(cached, recomputed)}")  # fmt: skip


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
    print(f"TwoHop is fused: {twohop.affine_coefficients() is not None}")
    fusable_operator_demo(args.tokens)


if __name__ == "__main__":
    main()
