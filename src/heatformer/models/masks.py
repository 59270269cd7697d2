r"""Attention masks: which keys each query may attend, in the compact form graph kinds take.

An :class:`AttentionMask` is what a :class:`~heatformer.models.routing.HeadRouter` takes: a
key mask ``(B, T)`` (padding), the causal order with the absolute positions of queries and
keys (a KV cache), or -- any other pattern, given by a host library -- a dense boolean mask,
which only a graph kind that :attr:`~heatformer.graph_ops.GraphBuilder.takes_dense_mask`
takes. Polarity as in SDPA: ``True`` = may attend.

:func:`allowed_from` is the one parser of the masks other libraries pass (boolean, or additive
float of ``0`` and ``-inf`` / ``finfo.min``) and :meth:`AttentionMask.from_additive` the one
way an SDPA-style ``attn_mask`` becomes an :class:`AttentionMask`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import cast

import torch
from torch import Tensor

from heatformer import checks

__all__ = ["AttentionMask", "allowed_from"]


def allowed_from(mask: object, argument: str) -> Tensor:
    """``True`` = may attend, from a boolean mask (SDPA's polarity, returned as it is) or an
    additive float one.

    An additive mask holds ``0`` (attend) and ``-inf`` or any value at most
    ``finfo(dtype).min / 2`` (blocked: transformers writes ``finfo.min``). Any other value is
    an attention bias, which no diffusion operator can apply.

    Args:
        mask: the mask, any shape.
        argument: the argument that holds it, for error messages.

    Returns:
        A bool tensor of the mask's shape.

    Raises:
        TypeError: ``mask`` is not a tensor, or neither bool nor floating point.
        ValueError: an additive mask with values other than 0 and blocked.

    Example:
        >>> allowed_from(torch.tensor([0.0, float("-inf")]), "attn_mask")
        tensor([ True, False])
    """
    if not isinstance(mask, Tensor):
        raise checks.bad_type(argument, f"expected a tensor, got {type(mask).__name__}")
    if mask.dtype == torch.bool:
        return mask
    if not mask.is_floating_point():
        raise checks.bad_type(argument, f"expected a bool or float mask, got {mask.dtype}")
    allowed = mask == 0
    blocked = mask <= torch.finfo(mask.dtype).min / 2
    if not bool((allowed | blocked).all()):  # the caller's mask, read at the boundary
        raise checks.bad_value(
            argument,
            "expected a boolean mask, or an additive one of 0 (attend) and -inf / finfo.min "
            "(blocked); got other values (an attention bias), which a diffusion operator "
            "cannot apply",
        )
    return allowed


@dataclass(frozen=True)
class AttentionMask:
    """Which keys each query may attend, in the compact form graph kinds take.

    Query ``i`` sits at absolute position ``q_offset + i``, key ``j`` at ``kv_offset + j``.
    Query ``i`` may attend key ``j`` when ``key_mask[b, j]`` (a real token), and, when
    ``causal``, ``kv_offset + j <= q_offset + i``. ``dense`` is any other pattern, given by the
    caller as it is; only a graph kind that
    :attr:`~heatformer.graph_ops.GraphBuilder.takes_dense_mask` takes it.

    Attributes:
        key_mask: ``(B, T)`` bool, ``True`` = a real key; None = every key.
        causal: forbid keys after the query.
        q_offset, kv_offset: absolute positions of the first query and the first key.
        dense: ``(B or 1, H or 1, Nq, T)`` bool, ``True`` = may attend (SDPA polarity); when
            given, it is the whole mask (``key_mask`` and ``causal`` are ignored).
    """

    key_mask: Tensor | None = None
    causal: bool = False
    q_offset: int = 0
    kv_offset: int = 0
    dense: Tensor | None = None

    @classmethod
    def from_additive(
        cls,
        mask: object,
        causal: bool = False,
        *,
        shape: tuple[int, int, int, int],
        argument: str = "attn_mask",
        q_offset: int = 0,
        kv_offset: int = 0,
    ) -> AttentionMask:
        """The mask an SDPA-style ``attn_mask`` says: boolean (``True`` = may attend) or
        additive float (see :func:`allowed_from`), of at most 4 dims broadcastable to
        ``shape``.

        A mask of shape ``(B, 1, 1, T)`` only drops keys: it becomes the compact ``key_mask``
        (which every graph kind takes), with ``causal`` as given. Any other pattern is the
        ``dense`` mask (not expanded; the causal order folded in when ``causal``).

        Args:
            mask: the mask.
            causal: the causal order applies on top of the mask.
            shape: ``(B, H, Nq, T)`` of the scores it masks.
            argument: the argument that holds the mask, for error messages.
            q_offset, kv_offset: absolute positions of the first query and the first key.

        Raises:
            TypeError: not a tensor, or neither bool nor floating point.
            ValueError: an attention bias (see :func:`allowed_from`), or a shape that does not
                broadcast to ``shape``.
        """
        allowed = allowed_from(mask, argument)
        b, _, n_q, n_k = shape
        try:
            if allowed.dim() > 4 or torch.broadcast_shapes(allowed.shape, shape) != shape:
                raise RuntimeError
        except RuntimeError:
            raise checks.bad_value(
                argument,
                f"expected a mask broadcastable to {shape}, got {tuple(allowed.shape)}",
            ) from None
        allowed = allowed.reshape(*([1] * (4 - allowed.dim())), *allowed.shape)  # 4-D
        if tuple(allowed.shape) == (b, 1, 1, n_k):  # (B, 1, 1, T): keys only
            key_mask = allowed.reshape(b, n_k)  # (B, T)
            return cls(key_mask, bool(causal), q_offset=q_offset, kv_offset=kv_offset)
        if causal:
            order = cls(causal=True, q_offset=q_offset, kv_offset=kv_offset)
            allowed = allowed & cast(Tensor, order.allowed(n_q, n_k, allowed.device))
        return cls(dense=allowed, q_offset=q_offset, kv_offset=kv_offset)

    def allowed(self, n_q: int, n_k: int, device: torch.device) -> Tensor | None:
        """Bool ``(B or 1, 1 or H, n_q, n_k)``, ``True`` = may attend; None = every key.

        Forms ``n_q x n_k`` for a causal mask: used where queries are few (decoding) or where
        SDPA needs the whole mask (attention dropout).
        """
        if self.dense is not None:
            return self.dense
        allowed: Tensor | None = None
        if self.causal:
            rows = self.q_offset + torch.arange(n_q, device=device)
            cols = self.kv_offset + torch.arange(n_k, device=device)
            allowed = (cols <= rows.unsqueeze(-1))[None, None]  # (1, 1, n_q, n_k)
        if self.key_mask is not None:
            keys = self.key_mask[:, None, None, :]  # (B, 1, 1, n_k)
            allowed = keys if allowed is None else allowed & keys
        return allowed

    def heads(self, index: slice | Tensor) -> AttentionMask:
        """The mask of the heads ``index`` selects: a dense mask with one pattern per head
        ``(B, H, Nq, T)`` keeps those heads' patterns; any other mask is the same for all."""
        if self.dense is None or self.dense.shape[1] == 1:
            return self
        return replace(self, dense=self.dense[:, index])
