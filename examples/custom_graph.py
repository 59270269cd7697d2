"""A custom graph kind plugged into DiffusionAttention and GPT, without editing the library.

`DilatedBuilder` is a dilated band: query i attends to the keys j with |i - j| a multiple of
`d` and at most `w * d` away (causal: only j <= i), a softmax over those keys. One subclass of
GraphBuilder plus one registry entry, `GRAPHS.register(DilatedBuilder)`, and the kind works
everywhere a graph spec does: `DiffusionAttention(..., graph="dilated[d=2,w=3]")`, model
configs (`GPTConfig(graph=...)`, per-layer schedules such as "dilated[d=2,w=3];softmax"), and
KV-cache generation, because the kind declares `incremental` and implements `decode`.

The script checks the layer against a dense masked-softmax reference, and cached generation
against recomputation.

    python examples/custom_graph.py --tokens 16
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from heatformer.graph_ops import GRAPHS, Graph, GraphBuilder, SoftmaxGraph
from heatformer.models import GPT, DiffusionAttention, GPTConfig, KVCache


def dilated_band(rows: Tensor, cols: Tensor, d: int, w: int) -> Tensor:
    """Bool ``(len(rows), len(cols))``: the absolute positions within the dilated band."""
    gap = (rows.unsqueeze(-1) - cols).abs()
    return (gap % d == 0) & (gap <= w * d)


class DilatedBuilder(GraphBuilder):
    """``"dilated[d=D,w=W]"``: a softmax over every ``D``-th key, up to ``W`` steps away."""

    name = "dilated"
    incremental = True
    examples = ({"d": 2, "w": 3},)

    def __init__(self, d: int = 2, w: int = 4) -> None:
        if d < 1 or w < 0:
            raise ValueError(f"graph: expected d >= 1 and w >= 0, got d={d}, w={w}")
        super().__init__(d=d, w=w)
        self.d, self.w = d, w

    def build(self, q, k, *, key_mask=None, drop_masked_queries=False, causal=False,
              row_block=None) -> Graph:  # fmt: skip
        n = q.shape[-2]
        pos = torch.arange(n, device=q.device)
        mask = dilated_band(pos, pos, self.d, self.w)  # (N, N): fine for an example
        if key_mask is not None:  # (B, N) real keys -> (B, 1, N, N)
            keys = key_mask[:, None, None, :]
            mask = mask & keys & (keys.transpose(-1, -2) if drop_masked_queries else True)
        return SoftmaxGraph(q, k, mask=mask, causal=causal, row_block=row_block)

    def decode(self, q: Tensor, k: Tensor, v: Tensor, *, positions: Tensor, past: int) -> Tensor:
        rows = past + torch.arange(q.shape[-2], device=q.device)  # positions of the queries
        allowed = dilated_band(rows, positions, self.d, self.w) & (positions <= rows[:, None])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)

    def cache_keep(self) -> tuple[int, int]:
        return 0, self.w * self.d + 1  # older keys are never attended again


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16, help="sequence length (default 16)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    GRAPHS.register(DilatedBuilder)  # the one registry entry, checked once

    layer = DiffusionAttention(32, 4, "attention:2,laplacian:2", graph="dilated[d=2,w=3]",
                               causal=True)  # fmt: skip
    print(layer)
    x = torch.randn(2, args.tokens, 32)  # (B, N, D)
    q, k, v = layer.project_qkv(x)  # (B, H, N, Dh) each
    pos = torch.arange(args.tokens)
    allowed = dilated_band(pos, pos, 2, 3) & (pos <= pos.unsqueeze(-1))
    scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~allowed, -math.inf)
    pv = torch.softmax(scores, -1) @ v  # the dense masked-softmax reference
    reference = torch.cat([pv[:, :2], v[:, 2:] - pv[:, 2:]], dim=1)
    error = (layer.diffuse(q, k, v) - reference).abs().max()
    print(f"dilated layer vs dense masked softmax: max error {error:.2e}")
    edges = int(layer.graphs(x).to_sparse().num_edges) // (2 * 4)
    print(f"edges per graph: {edges} (dense causal: {args.tokens * (args.tokens + 1) // 2})")

    gpt = GPT(
        GPTConfig(
            vocab_size=32,
            block_size=48,
            n_layer=2,
            n_head=4,
            n_embd=32,
            heads="attention:2,laplacian:2",
            graph="dilated[d=2,w=3];softmax",
        )
    )
    gpt.eval()  # fmt: skip
    prompt = torch.randint(0, 32, (2, 6))
    cached = gpt.generate(prompt, 20, top_k=1, use_cache=True)
    recomputed = gpt.generate(prompt, 20, top_k=1, use_cache=False)
    caches = [KVCache() for _ in gpt.blocks]
    with torch.no_grad():  # the whole sequence through the cache, in two chunks
        chunked = torch.cat([gpt(cached[:, :10], caches), gpt(cached[:, 10:], caches)], dim=1)
        full = gpt(cached)
    print(f"chunked cached logits vs full forward: max error {(chunked - full).abs().max():.2e}")
    print(f"GPT graphs: {[block.attn.graph_kind.spec for block in gpt.blocks]}")
    print(f"cached generation equals recomputation: {torch.equal(cached, recomputed)}")
    print(f"keys kept per layer after {cached.shape[1]} tokens: {[c.length for c in caches]}")


if __name__ == "__main__":
    main()
