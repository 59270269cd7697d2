r"""A drop-in for :class:`torch.nn.MultiheadAttention` with one diffusion operator per head.

:func:`convert` replaces every :class:`~torch.nn.MultiheadAttention` inside a module
(``nn.TransformerEncoder``, ``nn.TransformerDecoderLayer``, your own model) by a
:class:`MultiheadDiffusionAttention` with the same constructor attributes, forward signature
and weights. With every head ``"attention"`` it computes what ``nn.MultiheadAttention``
computes, forward and backward, with padding and causal masks.

State dicts: a converted module has ``nn.MultiheadAttention``'s keys, so an unconverted
checkpoint loads into it (its heads are kept), plus -- unless every head is plain attention on
the ``"softmax"`` graph -- ``<name>.heatformer_record``, the record of its heads (see
:mod:`heatformer.integrations._record`). An unconverted module refuses that key in
``strict`` loading, and a converted one with other heads refuses the record;
:func:`load_state_dict` converts a module as a state dict records and loads it, learned head
parameters included.

Masks follow ``nn.MultiheadAttention``: ``key_padding_mask`` ``(B, S)`` and ``attn_mask``
``(L, S)`` or ``(B * H, L, S)``, boolean (``True`` = *not* allowed) or additive float of
``0`` and ``-inf`` (or ``finfo.min``). A causal ``attn_mask`` (or ``is_causal=True`` with
one) and padding reach every graph kind as a causal flag and a ``(B, S)`` key mask; any other
pattern stays a dense mask, which only the ``"softmax"`` kind takes. A fully masked query row
is a node without out-edges: its output is 0 (``nn.MultiheadAttention`` gives NaN there).

Cross-attention (``key`` is not ``query``, as in ``nn.TransformerDecoderLayer.multihead_attn``)
has a rectangular graph: attention heads work there, heads that add ``I' v`` (Laplacian) or
need the square graph (heat, PPR, polynomial) are refused, so give such modules their own
spec in a per-module schedule.

Example:
    >>> import torch
    >>> layer = torch.nn.TransformerEncoderLayer(16, 4, batch_first=True)
    >>> layer = convert(layer, "attention:2,laplacian:2")
    >>> type(layer.self_attn).__name__
    'MultiheadDiffusionAttention'
    >>> layer(torch.randn(2, 5, 16)).shape
    torch.Size([2, 5, 16])
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from heatformer import checks
from heatformer.graph_ops import DiffusionOperator, GraphBuilder
from heatformer.graph_ops._precision import attention_scores
from heatformer.integrations._convert import Adapter
from heatformer.integrations._heads import HeadOperators, heads_for
from heatformer.integrations._record import RecordedHeads
from heatformer.models.attention import check_layer_sizes, check_multihead_attention
from heatformer.models.masks import AttentionMask, allowed_from

__all__ = ["MultiheadDiffusionAttention", "convert", "load_state_dict"]


class MultiheadDiffusionAttention(RecordedHeads):
    r""":class:`torch.nn.MultiheadAttention` with one diffusion operator per head.

    Args:
        embed_dim, num_heads, dropout, bias, batch_first, device, dtype: as in
            :class:`torch.nn.MultiheadAttention` (``dropout`` drops attention weights, inside
            the fused call of attention and ``"rw"`` Laplacian heads; other heads refuse it).
        heads: a head spec (``"attention:6,laplacian:2"``) or one operator per head.
        graph: the graph kind (``"softmax"``, ``"topk[k=32]"``, ...).
        add_bias_kv, add_zero_attn, kdim, vdim: accepted for the signature; anything but the
            defaults is refused (no diffusion counterpart).

    Shape:
        As :class:`torch.nn.MultiheadAttention`: ``query`` ``(L, B, E)`` (``(B, L, E)`` with
        ``batch_first``, ``(L, E)`` unbatched), ``key``/``value`` ``(S, B, E)``; output of
        the same layout as ``query``, and the weights ``(B, L, S)`` (``(B, H, L, S)`` with
        ``average_attn_weights=False``) when ``need_weights``: the graph ``P`` of every head,
        whatever its operator.
    """

    #: ``nn.TransformerEncoderLayer`` and ``nn.TransformerEncoder`` skip the call to their
    #: ``self_attn`` in inference and run torch's fused kernel of plain attention on its
    #: ``in_proj_weight`` when ``self_attn._qkv_same_embed_dim`` is true; False keeps them
    #: calling this module (the projection is still packed as in ``nn.MultiheadAttention``).
    _qkv_same_embed_dim = False
    restore = "heatformer.integrations.torch.load_state_dict(module, state_dict)"

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        *,
        heads: str | Sequence[DiffusionOperator | str] = "attention",
        graph: str | GraphBuilder = "softmax",
    ) -> None:
        super().__init__()
        check_layer_sizes(embed_dim, num_heads, dropout)
        if kdim not in (None, embed_dim) or vdim not in (None, embed_dim):
            raise checks.bad_value("kdim", "kdim/vdim different from embed_dim are not supported")
        if add_bias_kv or add_zero_attn:
            raise checks.bad_value("add_bias_kv", "add_bias_kv and add_zero_attn are not supported")
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.kdim = self.vdim = embed_dim
        self.head_dim = embed_dim // num_heads
        self.dropout = float(dropout)
        self.batch_first = bool(batch_first)
        self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim, **factory))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * embed_dim, **factory)) if bias else None
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.heads = HeadOperators(heads, num_heads, graph=graph, head_dim=self.head_dim, **factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """As :class:`torch.nn.MultiheadAttention`: Xavier-uniform in-projection, zero biases."""
        nn.init.xavier_uniform_(self.in_proj_weight)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
        if self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)

    @classmethod
    def from_mha(
        cls,
        mha: nn.MultiheadAttention,
        heads: str | Sequence[DiffusionOperator | str] = "attention",
        *,
        graph: str | GraphBuilder = "softmax",
    ) -> MultiheadDiffusionAttention:
        """The same layer with diffusion heads: ``mha``'s attributes and a copy of its weights.

        Raises:
            ValueError: ``kdim``/``vdim`` different from ``embed_dim``, ``add_bias_kv``,
                ``add_zero_attn``.
        """
        check_multihead_attention(mha)
        w = mha.in_proj_weight
        layer = cls(
            mha.embed_dim, mha.num_heads, mha.dropout, bias=mha.in_proj_bias is not None,
            batch_first=mha.batch_first, device=w.device, dtype=w.dtype, heads=heads, graph=graph,
        )  # fmt: skip
        missing, unexpected = layer.load_state_dict(mha.state_dict(), strict=False)
        if unexpected or any(not key.startswith("heads.") for key in missing):
            raise checks.bad_value(  # pragma: no cover - nn.MultiheadAttention's own keys
                "mha", f"weights did not carry over: missing {missing}, unexpected {unexpected}"
            )
        layer.train(mha.training)
        return layer

    # ---- masks ------------------------------------------------------------------------------

    def _mask(
        self,
        attn_mask: Tensor | None,
        key_padding_mask: Tensor | None,
        b: int,
        n_q: int,
        n_k: int,
        device: torch.device,
    ) -> AttentionMask:
        key_mask = None
        if key_padding_mask is not None:
            key_mask = _allowed("key_padding_mask", key_padding_mask)
            if tuple(key_mask.shape) != (b, n_k):
                raise checks.bad_value(
                    "key_padding_mask",
                    f"expected shape ({b}, {n_k}), got {tuple(key_padding_mask.shape)}",
                )
        if attn_mask is None:
            return AttentionMask(key_mask)
        allowed = _allowed("attn_mask", attn_mask)
        if allowed.dim() == 2 and tuple(allowed.shape) == (n_q, n_k):
            tri = torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril()
            if n_q == n_k and torch.equal(allowed, tri):
                return AttentionMask(key_mask, causal=True)
            dense = allowed[None, None]  # (1, 1, L, S)
        elif allowed.dim() == 3 and tuple(allowed.shape) == (b * self.num_heads, n_q, n_k):
            dense = allowed.view(b, self.num_heads, n_q, n_k)
        else:
            raise checks.bad_value(
                "attn_mask",
                f"expected shape ({n_q}, {n_k}) or ({b * self.num_heads}, {n_q}, {n_k}), got "
                f"{tuple(attn_mask.shape)}",
            )
        if key_mask is not None:
            dense = dense & key_mask[:, None, None, :]  # (B, H or 1, L, S)
        return AttentionMask(dense=dense)

    # ---- forward ----------------------------------------------------------------------------

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """As :meth:`torch.nn.MultiheadAttention.forward` (see the class docstring)."""
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, Tensor) or t.dim() not in (2, 3) or t.shape[-1] != self.embed_dim:
                got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise checks.bad_value(
                    name, f"expected a (.., {self.embed_dim}) tensor of 2 or 3 dims, got {got}"
                )
        if is_causal and attn_mask is None:
            raise checks.bad_value(
                "attn_mask",
                "is_causal=True is a hint that attn_mask is causal; expected the mask as well "
                "(nn.Transformer.generate_square_subsequent_mask), got None",
            )
        self_attention = key is query and value is query
        batched = query.dim() == 3
        if not batched:  # (L, E) -> (1, L, E)
            query, key, value = (t.unsqueeze(0) for t in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:  # (L, B, E) -> (B, L, E)
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        b, n_q, _ = query.shape
        n_k = int(key.shape[1])
        q, k, v = self._project(query, key, value, self_attention)  # (B, H, *, Dh) each
        mask = self._mask(attn_mask, key_padding_mask, b, n_q, n_k, query.device)
        dropout = self.dropout if self.training else 0.0
        y = self.heads(q, k, v, mask, dropout=dropout, cross=not self_attention)  # (B, H, L, Dh)
        out: Tensor = self.out_proj(y.transpose(1, 2).reshape(b, n_q, self.embed_dim))
        weights = None
        if need_weights:
            weights = self._weights(q, k, mask, self_attention)  # (B, H, L, S)
            if average_attn_weights:
                weights = weights.mean(dim=1)
        if not batched:
            return out.squeeze(0), None if weights is None else weights.squeeze(0)
        if not self.batch_first:
            out = out.transpose(0, 1)
        return out, weights

    def _project(
        self, query: Tensor, key: Tensor, value: Tensor, self_attention: bool
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``(B, L, E)`` inputs -> ``q`` ``(B, H, L, Dh)``, ``k``, ``v`` ``(B, H, S, Dh)``."""
        e, h, dh = self.embed_dim, self.num_heads, self.head_dim
        if self_attention:
            qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias)  # (B, L, 3E)
            q, k, v = qkv.view(*query.shape[:2], 3, h, dh).permute(2, 0, 3, 1, 4).unbind(0)
            return q, k, v
        w = self.in_proj_weight.split(e)
        bias = (None, None, None) if self.in_proj_bias is None else self.in_proj_bias.split(e)
        outs = []
        for x, wi, bi in zip((query, key, value), w, bias, strict=True):
            outs.append(F.linear(x, wi, bi).view(*x.shape[:2], h, dh).transpose(1, 2))
        return outs[0], outs[1], outs[2]

    def _weights(self, q: Tensor, k: Tensor, mask: AttentionMask, self_attention: bool) -> Tensor:
        """The dense graph of every head ``(B, H, L, S)`` (``N x N``: only when asked); scores
        and softmax in float32 for half inputs, rounded to their dtype once."""
        if self_attention:
            return self.heads.graph(q, k, mask).to_dense()
        scores = attention_scores(q, k, 1.0 / math.sqrt(self.head_dim))  # (B, H, L, S)
        allowed = mask.allowed(q.shape[-2], k.shape[-2], q.device)
        if allowed is None:
            return torch.softmax(scores, dim=-1).to(q.dtype)
        scores = scores.masked_fill(~allowed, float("-inf"))
        return torch.softmax(scores, dim=-1).nan_to_num(0.0).to(q.dtype)

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, "
            f"batch_first={self.batch_first}"
        )


def _allowed(name: str, mask: Tensor) -> Tensor:
    """A bool tensor, ``True`` = may attend, from an ``nn.MultiheadAttention`` mask: bool with
    ``True`` = not allowed (the opposite of SDPA's polarity), or additive float
    (:func:`~heatformer.models.masks.allowed_from`)."""
    if isinstance(mask, Tensor) and mask.dtype == torch.bool:
        return ~mask
    return allowed_from(mask, name)


def _attention_modules(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every ``nn.MultiheadAttention`` inside ``module``, converted or
    not (``""``: ``module`` itself)."""
    if not isinstance(module, nn.Module):
        raise checks.bad_type("module", f"expected an nn.Module, got {type(module).__name__}")
    found: list[tuple[str, nn.Module]] = [
        (n, m)
        for n, m in module.named_modules()
        if isinstance(m, (nn.MultiheadAttention, MultiheadDiffusionAttention))
    ]
    if not found:
        raise checks.bad_value(
            "module", f"found no nn.MultiheadAttention inside {type(module).__name__}"
        )
    return found


def _converted(name: str, mha: nn.Module, spec: str, kind: str) -> nn.Module:
    """A :class:`MultiheadDiffusionAttention` for an ``nn.MultiheadAttention``; for a converted
    one, the :class:`HeadOperators` to give it (its own when built from ``spec`` and
    ``kind``)."""
    if isinstance(mha, MultiheadDiffusionAttention):
        return heads_for(mha.heads, spec, kind, mha.num_heads, mha)
    if not isinstance(mha, nn.MultiheadAttention):  # pragma: no cover - found by type
        raise checks.bad_type("module", f"expected an nn.MultiheadAttention, got {mha!r}")
    return MultiheadDiffusionAttention.from_mha(mha, spec, graph=kind)


def _install(
    module: nn.Module, found: Sequence[tuple[str, nn.Module]], made: list[nn.Module]
) -> nn.Module:
    """Put the converted modules in place; returns ``module``, or its replacement when it is
    an attention module itself."""
    if not made:
        return module
    root = module
    for (name, old), new in zip(found, made, strict=True):
        if isinstance(new, HeadOperators):
            old.heads = new
        elif not name:
            root = new
        else:
            module.set_submodule(name, new)
    for sub in root.modules():
        if isinstance(sub, nn.TransformerEncoder):
            sub.use_nested_tensor = False
    return root


_ADAPTER = Adapter(find=_attention_modules, make=_converted, install=_install)


def convert(
    module: nn.Module,
    heads: str | Sequence[str],
    *,
    graph: str | GraphBuilder | Sequence[str] = "softmax",
) -> nn.Module:
    """Replace every :class:`torch.nn.MultiheadAttention` inside ``module`` (in place).

    Modules converted before keep their weights and get the new heads; a module whose heads
    were built from the same spec and graph kind keeps them, learned parameters included.

    Args:
        module: any module; an ``nn.MultiheadAttention`` itself is returned converted.
        heads: one head spec for every attention module, or one per module in module order
            (``"attention:2,laplacian:2;attention:4"``, or a list), e.g. to keep a decoder's
            cross-attention plain.
        graph: the graph kind of every module, or one per module.

    Returns:
        ``module`` (or its replacement when it was an ``nn.MultiheadAttention``). Every
        ``nn.TransformerEncoder`` inside it stops converting padded batches to nested tensors
        (``use_nested_tensor = False``), which only torch's own attention kernel reads.

    Raises:
        ValueError: no ``nn.MultiheadAttention`` inside ``module``; a spec that does not fit.
    """
    return _ADAPTER.convert(module, heads, graph)


def load_state_dict(
    module: nn.Module, state_dict: Mapping[str, Any], *, strict: bool = True
) -> nn.Module:
    """Load a converted module's state dict, converting ``module`` as it records.

    Every attention module the state dict records (``<name>.heatformer_record``) is
    converted to the recorded heads and graph kind first; then ``load_state_dict(state_dict,
    strict=strict)`` loads every weight, learned head parameters included, so the module
    equals the one saved to the last bit::

        torch.save(converted.state_dict(), "encoder.pt")
        encoder = nn.TransformerEncoder(layer, num_layers=2)   # the same architecture
        encoder = load_state_dict(encoder, torch.load("encoder.pt"))

    Args:
        module: a module of the saved architecture, converted or not.
        state_dict: from ``converted.state_dict()``; without records it loads as into an
            unconverted module.
        strict: as in :meth:`torch.nn.Module.load_state_dict`.

    Returns:
        ``module``, or its replacement when it is a recorded ``nn.MultiheadAttention`` itself.

    Raises:
        ValueError: a recorded module that ``module`` does not have, or one that cannot be
            rebuilt from its record.
    """
    return _ADAPTER.load_state_dict(module, state_dict, strict=strict)
