r"""Statistics of an attention matrix without forming it: how much each token is read, how
spread each token's attention is, and its largest logit.

For a graph with weights ``W`` and its walk ``P = D_out^+ W`` (``P = W`` for attention:
``P = softmax(q k^T * scale)``, masked):

.. math::

    \text{in\_degree}_j = \sum_i P_{ij}, \qquad
    \text{entropy}_i = -\sum_j P_{ij} \log P_{ij}, \qquad
    \text{max\_logit}_i = \max_{j \text{ allowed}} \; s_{ij}, \quad s = q k^\top \cdot \text{scale}.

These are what people ask an attention implementation for and do not get from a fused kernel
(FlashAttention and FlexAttention return at most the log-sum-exp; Hugging Face's
``output_attentions`` forces the eager ``N x N`` path). Every graph kind computes them a block
of rows at a time (:meth:`~heatformer.graph_ops.Graph.walk_statistics`): the dense attention
kind from blocks of rows of its logits, the window kind from its band, a top-k (sparse) graph
from its kept weights, explicit weights from blocks of their rows. For a Hugging Face model,
:func:`heatformer.integrations.hf.attention_stats` collects them per layer and head while the
model runs its own (sdpa) attention.

References:
    Zhai, S. et al. (2023). Stabilizing transformer training by preventing attention entropy
    collapse. ICML. (Row entropy of attention.)
    Dehghani, M. et al. (2023). Scaling vision transformers to 22 billion parameters. ICML.
    (Attention logit growth, the largest logit.)
    Xiao, G. et al. (2024). Efficient streaming language models with attention sinks. ICLR.
    (Tokens read by every query: the column sums.)
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from heatformer import checks as V
from heatformer.graph_ops import Graph
from heatformer.graph_ops.protocol import check_graph

__all__ = ["AttentionStats", "attention_stats"]


@dataclass(frozen=True)
class AttentionStats:
    """Per-token statistics of the walk ``P`` of one graph (batched): each ``(..., N)``.

    Attributes:
        in_degree: column sums ``P^T 1``: how much each token is read (its keys' total
            attention). Sums to the number of rows with edges over the last dim.
        entropy: row entropy ``-sum_j P_ij log P_ij`` in nats: 0 for a one-hot row (and a row
            without edges), ``log m`` for a uniform row over ``m`` keys.
        max_logit: the largest allowed logit ``q_i . k_j * scale`` of each row, for a graph
            kind made of logits (dense softmax and window attention); ``-inf`` on a row
            without edges (a fully masked query). None for a kind that holds weights only
            (:class:`~heatformer.graph_ops.DenseGraph`, a top-k
            :class:`~heatformer.graph_ops.SparseGraph`): their logits are not kept.
    """

    in_degree: Tensor
    entropy: Tensor
    max_logit: Tensor | None


def attention_stats(graph: Graph, *, row_block: int | None = None) -> AttentionStats:
    r"""In-degree, row entropy and largest logit of a graph's walk ``P``, never forming ``N x N``.

    Computed by the graph kind a block of rows at a time
    (:meth:`~heatformer.graph_ops.Graph.walk_statistics`): a
    :class:`~heatformer.graph_ops.SoftmaxGraph` reduces blocks of rows of its masked logits
    (``O(N^2 E)`` work, ``O(rows N)`` memory), a :class:`~heatformer.graph_ops.WindowGraph` its
    band (``O(N (w + g))``), a :class:`~heatformer.graph_ops.SparseGraph` (top-k) its kept
    weights (``O(E)``), other graphs their dense rows block by block. The entropy is summed from
    the logits themselves where there are logits (``log z + sum_j P_ij (m_i - s_ij)``,
    non-negative terms only), so a peaked row keeps a small entropy to relative rounding.

    Results are in the graph's dtype (float32 for half precision graphs), on its device: unlike
    the token-geometry metrics, not float64, so that the pass over a model's sequence costs
    what its attention costs (``attention_stats(graph.to(torch.float64))`` for float64). Nothing
    is wrapped in :func:`torch.no_grad`: the statistics are differentiable (an entropy penalty
    is a regulariser), blocks of an attention kind recomputed in backward. Wrap the call in
    ``torch.no_grad()`` for analysis.

    Args:
        graph: any :class:`~heatformer.graph_ops.Graph`, batched over its leading dims
            (``(B, H)``: every head at once); masks and causal order as the graph holds them.
        row_block: query rows per block (default: slabs of about ``SLAB_ELEMENTS`` =
            ``2^24`` entries, at most 256 rows); the window and sparse kinds use their own
            blocks.

    Returns:
        :class:`AttentionStats` with ``in_degree``, ``entropy`` and ``max_logit`` (or None)
        of shape ``(*graph.batch_shape, N)``.

    Raises:
        TypeError: ``graph`` is not a heatformer graph; ``row_block`` not an int.
        ValueError: ``row_block < 1``.

    Shape:
        ``graph`` with batch shape ``(...)`` on ``N`` nodes -> three ``(..., N)`` tensors.

    Equivalent to::

        p = graph.to_dense()                                 # (..., N, N), N x N memory
        p = p / p.sum(-1, keepdim=True).clamp_min(tiny)      # rows without edges stay 0
        in_degree = p.sum(-2)
        entropy = -torch.special.xlogy(p, p).sum(-1)
        max_logit = (q @ k.mT * scale).masked_fill(~allowed, -inf).amax(-1)   # logit kinds

    Example:
        >>> import torch
        >>> from heatformer.graph_ops import SoftmaxGraph
        >>> q = k = torch.zeros(1, 3, 2, dtype=torch.float64)   # uniform over allowed keys
        >>> stats = attention_stats(SoftmaxGraph(q, k, causal=True))
        >>> stats.in_degree        # key 0 is read by every query: 1 + 1/2 + 1/3
        tensor([[1.8333, 0.8333, 0.3333]], dtype=torch.float64)
        >>> stats.entropy          # log 1, log 2, log 3
        tensor([[0.0000, 0.6931, 1.0986]], dtype=torch.float64)
        >>> stats.max_logit
        tensor([[0., 0., 0.]], dtype=torch.float64)
    """
    graph = check_graph(graph)
    V.check_positive_int("row_block", row_block, optional=True)
    in_degree, entropy, max_logit = graph.walk_statistics(row_block)
    return AttentionStats(in_degree, entropy, max_logit)
