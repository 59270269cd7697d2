"""The head router: a per-head dense mask follows the heads of each group."""

from __future__ import annotations

import torch

from heatformer.models.masks import AttentionMask
from heatformer.models.routing import HeadRouter

F64 = torch.float64


def test_a_per_head_dense_mask_follows_the_heads_of_each_group() -> None:
    """Fused heads and heads with their own graph each take their heads' patterns: the router
    equals one router per head."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 3, generator=gen, dtype=F64) for _ in range(3))
    allowed = torch.rand(2, 4, 5, 5, generator=gen) > 0.4
    allowed |= torch.eye(5, dtype=torch.bool)  # every row has an edge
    spec = ["attention", "heat", "laplacian", "heat"]  # fused heads 0 and 2, heat heads 1, 3
    router = HeadRouter(spec, 4, dtype=F64)
    got = router.diffuse(q, k, v, AttentionMask(dense=allowed))
    for h, name in enumerate(spec):
        one = HeadRouter([name], 1, dtype=F64)
        head = slice(h, h + 1)
        expected = one.diffuse(
            q[:, head], k[:, head], v[:, head], AttentionMask(dense=allowed[:, head])
        )
        torch.testing.assert_close(got[:, head], expected)
