"""Reference models built from :class:`DiffusionAttention`: block, GPT, ViT, sequence classifier.

Read top to bottom in dependency order: MLP, block, models (saved and loaded by
:mod:`heatformer.models.files`). Every model is built from a frozen dataclass config of
:mod:`heatformer.models.configs` (``Model.from_config(cfg)``), whose ``heads`` and ``graph``
fields give each layer its head spec and graph kind.
"""

from __future__ import annotations

from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from heatformer import checks
from heatformer.graph_ops import Graph, SequenceShard
from heatformer.models.attention import KVCache, check_shard
from heatformer.models.blocks import MLP, TransformerBlock, _blocks, _init_weights
from heatformer.models.configs import (
    GPTConfig,
    SequenceClassifierConfig,
    ViTConfig,
)

__all__ = [
    "GPT",
    "MLP",
    "GPTConfig",
    "SequenceClassifier",
    "SequenceClassifierConfig",
    "TransformerBlock",
    "ViT",
    "ViTConfig",
]


def _check_idx(idx: Tensor, config: GPTConfig | SequenceClassifierConfig, offset: int = 0) -> None:
    """A ``(B, N)`` LongTensor of token ids in ``[0, vocab_size)`` (an embedding lookup outside
    it is an opaque error), ``offset + N`` of them at most ``block_size``."""
    block_size, vocab_size = config.block_size, config.vocab_size
    if not isinstance(idx, Tensor) or idx.dtype != torch.long or idx.dim() != 2:
        raise checks.bad_type(
            "idx",
            f"expected a (B, N) LongTensor of token ids, got "
            f"{getattr(idx, 'dtype', type(idx).__name__)} {tuple(getattr(idx, 'shape', ()))}",
        )
    if offset + idx.shape[1] > block_size:
        raise checks.bad_value(
            "idx",
            f"expected at most block_size = {block_size} tokens, got a sequence of "
            f"{offset + idx.shape[1]}",
        )
    if idx.numel() == 0:
        return
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= vocab_size:
        raise checks.bad_value(
            "idx", f"expected token ids in [0, vocab_size={vocab_size}), got ids in [{lo}, {hi}]"
        )


def _check_logits_at(logits_at: Tensor, idx: Tensor) -> None:
    """A ``(B, M)`` LongTensor on the device of ``idx`` with its batch (its values are not read:
    no host sync)."""
    if (
        not isinstance(logits_at, Tensor)
        or logits_at.dtype != torch.long
        or logits_at.dim() != 2
        or logits_at.shape[0] != idx.shape[0]
        or logits_at.device != idx.device
    ):
        what = getattr(logits_at, "dtype", type(logits_at).__name__)
        shape = tuple(getattr(logits_at, "shape", ()))
        raise checks.bad_type(
            "logits_at",
            f"expected a (B, M) LongTensor of positions with the batch B = {idx.shape[0]} and "
            f"device {idx.device} of idx, got {what} {shape} on "
            f"{getattr(logits_at, 'device', None)}",
        )


def _run_blocks(
    blocks: nn.ModuleList,
    x: Tensor,
    key_mask: Tensor | None,
    graphs: list[Graph] | None,
    shard: SequenceShard | None = None,
) -> Tensor:
    """``x`` through every block; with ``graphs``, each layer's attention graph (batch
    ``(B, H)``, as its graph kind builds it: implicit, never ``N x N``) is appended first;
    with ``shard``, ``x`` is this process's block of a sequence split over processes."""
    for block in blocks:
        block = cast(TransformerBlock, block)
        if graphs is not None:  # the graph of the block's own attention input
            graphs.append(block.attn.graphs(block.ln1(x), key_mask))
        x = block(x, key_mask, shard=shard)
    return x


# ---- models ----------------------------------------------------------------------------------


class _ConfigModel(nn.Module):
    """Models built from a frozen config; ``from_config`` and save/load use it."""

    config_class: ClassVar[type]
    #: ``forward`` takes ``shard=`` (a sequence split over processes, sequence parallelism)
    shards: ClassVar[bool] = False

    def __init__(self, config: Any) -> None:
        """Keep ``config``, a ``config_class`` (else ``TypeError`` naming ``config``)."""
        super().__init__()
        if not isinstance(config, self.config_class):
            raise checks.bad_type(
                "config", f"expected {self.config_class.__name__}, got {type(config).__name__}"
            )
        self.config = config

    @classmethod
    def from_config(cls, config: Any) -> _ConfigModel:
        """Build the model from its config."""
        return cls(config)

    def num_parameters(self) -> int:
        """Number of parameters."""
        return sum(p.numel() for p in self.parameters())


class GPT(_ConfigModel):
    """A causal language model (nanoGPT layout) with diffusion heads; with
    ``GPTConfig(causal=False)`` the same layout as a bidirectional encoder (every token attends
    to every token), the model of masked-token prediction, which does not :meth:`generate`.

    Shape:
        ``forward(idx)``: ``(B, N)`` token ids, ``N <= block_size`` -> logits ``(B, N, V)``;
        ``forward(idx_local, shard=shard)``: this process's ``(B, n_local)`` block of the
        sequence -> its ``(B, n_local, V)`` logits (see :meth:`forward`).

    Example:
        >>> import torch
        >>> model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, heads="attention:1,laplacian:1"))
        >>> model(torch.zeros(1, 5, dtype=torch.long)).shape
        torch.Size([1, 5, 256])
    """

    config_class = GPTConfig
    config: GPTConfig
    shards = True

    def __init__(self, config: GPTConfig) -> None:
        super().__init__(config)
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_emb = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = _blocks(config, causal=config.causal)
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        _init_weights(self, config.n_layer)
        if config.tie_embeddings:  # one (vocab_size, n_embd) parameter, saved once
            self.head.weight = self.tok_emb.weight

    def forward(
        self,
        idx: Tensor,
        caches: list[KVCache] | None = None,
        *,
        return_graphs: bool = False,
        shard: SequenceShard | None = None,
        logits_at: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, list[Graph]]:
        """Logits ``(B, N, vocab_size)``; with ``caches`` (one per layer) ``idx`` holds only
        the new tokens.

        With ``logits_at``, a ``(B, M)`` LongTensor of positions of ``idx`` (``0 <= p < N``),
        only the logits at those positions: ``(B, M, vocab_size)``, row ``(b, m)`` that of
        position ``logits_at[b, m]`` of sequence ``b`` (the same numbers as
        ``logits.gather(1, ...)``, the output layer run on ``B M`` rows instead of ``B N``).
        A task scored at a few positions per sequence (MQAR: 4 of 64) trains its output
        layer, ``n_embd x vocab_size``, on those alone. The positions are not read on the
        host (no sync): one outside ``[0, N)`` fails in :func:`torch.gather`.

        With ``return_graphs``, also the attention graph of every layer, batched over
        ``(B, H)`` (``graphs[i].propagate(v)`` is ``P v`` of layer ``i``; implicit graphs,
        never ``N x N``): ``(logits, graphs)``. Not with ``caches``.

        With ``shard`` (a :class:`~heatformer.graph_ops.SequenceShard`: sequence parallelism),
        ``idx`` is this process's ``(B, shard.local_nodes)`` block of a sequence of
        ``shard.num_nodes <= block_size`` tokens split over the processes of ``shard.group``,
        which all call the model together; token ``i`` of the block sits at position
        ``shard.start + i``, every layer's graph is its kind's sharded one, and the logits are
        those rows of the one-process logits (``shard.gather(logits)`` is all of them). Every
        graph kind must shard (:attr:`~heatformer.graph_ops.GraphBuilder.shards`: the window
        kind; dense softmax and exact top-k need every key). Not with ``caches`` (no process
        holds every key; :meth:`generate` runs on one process), ``return_graphs`` or
        ``logits_at``.

        Raises:
            ValueError: ``caches`` not one :class:`KVCache` per layer (a cache is bound to the
                layer that first decodes with it; see :meth:`KVCache.claim`); with ``shard``:
                ``caches``, ``return_graphs``, a sequence longer than ``block_size``, ``idx``
                of another length than the shard, or a graph kind that does not shard.
            TypeError: ``logits_at`` not a ``(B, M)`` LongTensor with the batch of ``idx``
                (``ValueError`` with ``shard``).
        """
        if shard is not None:
            self._check_shard(idx, shard, caches, return_graphs, logits_at)
        if caches and len(caches) != len(self.blocks):
            raise checks.bad_value(
                "caches", f"expected one KVCache per layer ({len(self.blocks)}), got {len(caches)}"
            )
        offset = caches[0].position if caches else shard.start if shard is not None else 0
        _check_idx(idx, self.config, offset)
        if logits_at is not None:
            _check_logits_at(logits_at, idx)
        checks.check_bool("return_graphs", return_graphs)
        if return_graphs and caches:
            raise checks.bad_value(
                "return_graphs", "expected False together with caches (a cached step's graph "
                "is a slice of the full one; run the whole sequence instead)",
            )  # fmt: skip
        pos = torch.arange(offset, offset + idx.shape[1], device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))  # (B, N, D)
        graphs: list[Graph] | None = [] if return_graphs else None
        if caches:
            for i, block in enumerate(self.blocks):
                x = block(x, cache=caches[i])
        else:
            x = _run_blocks(self.blocks, x, None, graphs, shard)
        if logits_at is not None:  # (B, N, D) -> (B, M, D)
            x = x.gather(1, logits_at.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
        logits: Tensor = self.head(self.ln_f(x))
        return (logits, graphs) if graphs is not None else logits

    def _check_shard(
        self,
        idx: Tensor,
        shard: SequenceShard,
        caches: list[KVCache] | None,
        return_graphs: bool,
        logits_at: Tensor | None,
    ) -> None:
        """:meth:`forward`'s refusals with ``shard`` (see its Raises)."""
        if isinstance(idx, Tensor) and idx.dim() == 2:  # else _check_idx says what idx is
            check_shard(shard, idx.shape[1], "idx")
        if caches or return_graphs or logits_at is not None:
            raise checks.bad_value(
                "caches" if caches else "return_graphs" if return_graphs else "logits_at",
                "expected no KV cache and no graphs with a sharded sequence (no process "
                "holds every key; generate and analyse on one process)",
            )
        if shard.num_nodes > self.config.block_size:
            raise checks.bad_value(
                "shard",
                f"expected a sequence of at most block_size = {self.config.block_size} "
                f"tokens, got {shard.num_nodes}",
            )

    @property
    def supports_cache(self) -> bool:
        """Whether KV-cached generation is exact (every layer causal, dense, attention or
        rw-Laplacian heads); otherwise :meth:`generate` recomputes."""
        return all(cast(TransformerBlock, b).attn.supports_cache for b in self.blocks)

    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Sample ``max_new_tokens`` tokens after the prompt ``idx`` ``(B, N)``.

        With ``use_cache`` and a cacheable model (:attr:`supports_cache`), keys and values are
        cached per layer and each step processes one token; the output equals recomputation.
        Otherwise (heat/PPR/polynomial heads, top-k graphs, or when the context would exceed
        ``block_size``) every step recomputes the full (cropped) context: the documented
        fallback, exact by construction.

        Args:
            idx: ``(B, N)`` prompt token ids.
            max_new_tokens: tokens to append.
            temperature: softmax temperature ``> 0``.
            top_k: sample only among the ``top_k`` most likely tokens.
            use_cache: use the KV cache when exact.
            generator: random generator for reproducible sampling.

        Returns:
            ``(B, N + max_new_tokens)`` token ids.

        Raises:
            ValueError: a bidirectional model (``GPTConfig(causal=False)``, names ``config``).
        """
        if not self.config.causal:
            raise checks.bad_value(
                "config", "expected a causal GPT to generate, got GPTConfig(causal=False)"
            )
        if not temperature > 0:
            raise checks.bad_value("temperature", f"expected > 0, got {temperature}")
        if top_k is not None and not 1 <= top_k <= self.config.vocab_size:
            raise checks.bad_value("top_k", f"expected 1..{self.config.vocab_size}, got {top_k}")
        _check_idx(idx[:, -self.config.block_size :], self.config)
        cached = (
            use_cache
            and self.supports_cache
            and idx.shape[1] + max_new_tokens <= self.config.block_size
        )
        caches = [KVCache() for _ in self.blocks] if cached else None
        pending = idx
        for _ in range(max_new_tokens):
            if caches is not None:
                logits = self(pending, caches)[:, -1]
            else:
                logits = self(idx[:, -self.config.block_size :])[:, -1]
            logits = logits / temperature
            if top_k is not None:
                kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
            pending = nxt
        return idx


class ViT(_ConfigModel):
    """Vision transformer: patch embedding, non-causal diffusion blocks, cls or mean pooling.

    With ``ViTConfig(layer_scale_init=1e-6, norm_eps=1e-6, qk_norm=True, qk_norm_eps=1e-6,
    pos_embed_cls=False)`` it is the DeiT-3 recipe (Touvron et al., 2022) and, with the same
    weights, computes what timm's ``VisionTransformer`` (``no_embed_class=True``,
    ``init_values=1e-6``, LayerNorm eps 1e-6) computes; ``pool="mean"`` (or ``"avg"``) is timm's
    ``global_pool="avg"`` with ``class_token=False``: the mean of the tokens, then the norm
    (its ``fc_norm``; ``pool_norm="before"``: the norm of every token, then the mean, timm's
    ``fc_norm=False``, the order of a config saved before ``pool_norm``), ``drop_path`` its
    ``drop_path_rate``.

    Equivalent to::

        x = patches(images) (+ pos if not pos_embed_cls); x = [cls; x] (+ pos if pos_embed_cls)
        for each block: x = x + dp(ls1(attn(ln1(x)))); x = x + dp(ls2(mlp(ln2(x))))
        pooled = ln_f(x)[:, 0] ("cls") | ln_f(x.mean(1)) ("mean") | ln_f(x).mean(1) ("before")
        head(pooled)

    Shape:
        ``forward(images)``: ``(B, C, H, W)`` -> logits ``(B, num_classes)``.

    Example:
        >>> import torch
        >>> model = ViT(ViTConfig(n_layer=1, n_head=2, n_embd=16))
        >>> model(torch.zeros(3, 1, 8, 8)).shape
        torch.Size([3, 10])
    """

    config_class = ViTConfig
    config: ViTConfig

    def __init__(self, config: ViTConfig) -> None:
        super().__init__(config)
        num_patches = (config.image_size // config.patch_size) ** 2
        self.patch = nn.Conv2d(
            config.in_channels, config.n_embd, config.patch_size, stride=config.patch_size
        )
        extra = 1 if config.pool == "cls" else 0
        self.cls = nn.Parameter(torch.zeros(1, 1, config.n_embd)) if extra else None
        # with pos_embed_cls=False the cls token gets no position embedding (timm's
        # no_embed_class): one position per patch
        positions = num_patches + (extra if config.pos_embed_cls else 0)
        self.pos = nn.Parameter(torch.zeros(1, positions, config.n_embd))
        self.drop = nn.Dropout(config.dropout)
        self.blocks = _blocks(config, causal=False)
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.norm_eps, bias=config.bias)
        self.head = nn.Linear(config.n_embd, config.num_classes)
        _init_weights(self, config.n_layer)
        nn.init.normal_(self.pos, std=0.02)

    def forward(
        self, images: Tensor, *, return_graphs: bool = False
    ) -> Tensor | tuple[Tensor, list[Graph]]:
        """Logits ``(B, num_classes)``; with ``return_graphs`` also every layer's attention
        graph (batch ``(B, H)``, over the cls token and the patches): ``(logits, graphs)``."""
        checks.check_bool("return_graphs", return_graphs)
        c, s = self.config.in_channels, self.config.image_size
        if not isinstance(images, Tensor) or tuple(images.shape[1:]) != (c, s, s):
            got = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
            raise checks.bad_value("images", f"expected shape (B, {c}, {s}, {s}), got {got}")
        x = self.patch(images).flatten(2).transpose(1, 2)  # (B, P, D)
        if not self.config.pos_embed_cls:  # positions on the patches only
            x = x + self.pos
        if self.cls is not None:
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1 + P, D)
        if self.config.pos_embed_cls:
            x = x + self.pos
        x = self.drop(x)
        graphs: list[Graph] | None = [] if return_graphs else None
        x = _run_blocks(self.blocks, x, None, graphs)
        if self.cls is None and self.config.pool_norm == "after":  # timm's order (fc_norm)
            pooled = self.ln_f(x.mean(1))  # (B, D)
        else:
            x = self.ln_f(x)
            pooled = x[:, 0] if self.cls is not None else x.mean(1)  # (B, D)
        logits: Tensor = self.head(pooled)
        return (logits, graphs) if graphs is not None else logits


class SequenceClassifier(_ConfigModel):
    """One label per token sequence (e.g. associative recall): embed, blocks, pool, classify.

    Shape:
        ``forward(idx, key_mask=None)``: ``(B, N)`` -> logits ``(B, num_classes)``;
        ``key_mask`` ``(B, N)`` bool, ``True`` = real token.
    """

    config_class = SequenceClassifierConfig
    config: SequenceClassifierConfig

    def __init__(self, config: SequenceClassifierConfig) -> None:
        super().__init__(config)
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        extra = 1 if config.pool == "cls" else 0
        self.pos_emb = nn.Embedding(config.block_size + extra, config.n_embd)
        self.cls = nn.Parameter(torch.zeros(1, 1, config.n_embd)) if extra else None
        self.drop = nn.Dropout(config.dropout)
        self.blocks = _blocks(config, causal=config.causal)
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.head = nn.Linear(config.n_embd, config.num_classes)
        _init_weights(self, config.n_layer)

    def forward(
        self, idx: Tensor, key_mask: Tensor | None = None, *, return_graphs: bool = False
    ) -> Tensor | tuple[Tensor, list[Graph]]:
        """Logits ``(B, num_classes)``; with ``return_graphs`` also every layer's attention
        graph (batch ``(B, H)``, the cls token included, padded keys masked):
        ``(logits, graphs)``."""
        checks.check_bool("return_graphs", return_graphs)
        _check_idx(idx, self.config)
        x = self.tok_emb(idx)  # (B, N, D)
        cls_last = self.config.causal  # a causal cls token must come last to see the sequence
        if self.cls is not None:  # the cls token is always a real token
            cls = self.cls.expand(x.shape[0], -1, -1)
            x = torch.cat([x, cls] if cls_last else [cls, x], dim=1)  # (B, N + 1, D)
            if key_mask is not None:
                key_mask = F.pad(key_mask, (0, 1) if cls_last else (1, 0), value=True)
        x = self.drop(x + self.pos_emb(torch.arange(x.shape[1], device=idx.device)))
        graphs: list[Graph] | None = [] if return_graphs else None
        x = _run_blocks(self.blocks, x, key_mask, graphs)
        # the final LayerNorm acts on each token alone: "cls" and "last" normalize the one
        # token they read (backward then keeps a (B, D) input, not the (B, N, D) states)
        if self.config.pool == "cls":
            pooled = self.ln_f(x[:, -1] if cls_last else x[:, 0])
        elif self.config.pool == "mean":
            x = self.ln_f(x)
            if key_mask is None:
                pooled = x.mean(1)
            else:
                w = key_mask.to(x.dtype).unsqueeze(-1)  # (B, N, 1)
                pooled = (x * w).sum(1) / w.sum(1).clamp_min(1.0)
        else:
            if key_mask is None:
                pooled = self.ln_f(x[:, -1])
            else:  # last real token of each sequence
                last = (key_mask.long() * torch.arange(x.shape[1], device=x.device)).argmax(1)
                pooled = self.ln_f(x[torch.arange(x.shape[0], device=x.device), last])
        logits: Tensor = self.head(pooled)
        return (logits, graphs) if graphs is not None else logits
