"""The KV cache of incremental decoding: the keys and values a graph kind still needs."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch import Tensor

from heatformer import checks

__all__ = ["KVCache"]


@dataclass
class KVCache:
    """Keys and values of the tokens seen so far, for incremental decoding.

    A graph kind that needs only some past keys (:meth:`~heatformer.graph_ops.GraphBuilder.
    cache_keep`: e.g. a window's first ``g`` and last ``w`` tokens) keeps only those;
    :attr:`positions` records the absolute position of every cached key.

    One cache serves one layer: the first layer that decodes with it owns it, and any other
    layer is refused (two layers appending to one cache would each attend to the other's keys).

    Attributes:
        k: ``(B, H, T, Dh)`` keys, or None before the first call.
        v: ``(B, H, T, Dh)`` values, or None.
        positions: ``(T,)`` absolute positions of the cached keys, or None.
        position: tokens processed so far (the absolute position of the next one).
    """

    k: Tensor | None = None
    v: Tensor | None = None
    positions: Tensor | None = None
    position: int = 0
    _owner: weakref.ref[object] | None = field(default=None, init=False, repr=False, compare=False)
    #: :attr:`positions` on the host, as ``[start, stop)`` runs in slot order (see :meth:`trim`)
    _spans: list[tuple[int, int]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    def claim(self, layer: object) -> None:
        """Bind the cache to ``layer`` at its first use; refuse any other layer after that.

        Raises:
            ValueError: the cache already serves another layer (``cache``).
        """
        owner = None if self._owner is None else self._owner()
        if self._owner is None:
            self._owner = weakref.ref(layer)
        elif owner is not layer:
            raise checks.bad_value(
                "cache",
                f"expected a KVCache of this layer's own, got one that holds the keys of "
                f"{'a layer gone since' if owner is None else f'another {type(owner).__name__}'}"
                "; give every layer its own, e.g. caches = [KVCache() for _ in model.blocks]",
            )

    @property
    def length(self) -> int:
        """Number of cached positions ``T``."""
        return 0 if self.k is None else int(self.k.shape[-2])

    def append(self, k: Tensor, v: Tensor) -> None:
        """Add the new tokens' keys and values."""
        n = int(k.shape[-2])
        new = torch.arange(self.position, self.position + n, device=k.device)
        self.k = k if self.k is None else torch.cat([self.k, k], dim=-2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=-2)
        self.positions = new if self.positions is None else torch.cat([self.positions, new])
        spans = self._spans
        if spans and spans[-1][1] == self.position:
            spans[-1] = (spans[-1][0], self.position + n)
        elif n:
            spans.append((self.position, self.position + n))
        self.position += n

    def trim(self, first: int, last: int | None) -> None:
        """Keep the keys of the first ``first`` tokens and of the last ``last`` (None: all).

        Decided on the host from :attr:`_spans`, the positions as ``[start, stop)`` runs in
        slot order (kept beside :attr:`positions`): no read of a device tensor."""
        if last is None or self.k is None or self.v is None or self.positions is None:
            return
        recent = self.position - last  # keep p < first or p >= recent
        if first >= recent:
            return
        kept: list[tuple[int, int]] = []  # position runs
        slots: list[tuple[int, int]] = []  # the cache slots that hold them
        offset = 0
        for a, b in self._spans:
            for lo, hi in ((a, min(b, first)), (max(a, recent), b)):
                if lo < hi:
                    kept.append((lo, hi))
                    slots.append((offset + lo - a, offset + hi - a))
            offset += b - a
        if offset != self.length:  # a cache made from tensors, not by append: read them
            keep = (self.positions < first) | (self.positions >= recent)
            index = keep.nonzero().squeeze(-1)
            self.k, self.v = self.k.index_select(-2, index), self.v.index_select(-2, index)
            self.positions = self.positions.index_select(0, index)
            return
        if sum(hi - lo for lo, hi in kept) == offset:
            return
        device = self.k.device
        index = torch.cat([torch.arange(lo, hi, device=device) for lo, hi in slots])
        self.k, self.v = self.k.index_select(-2, index), self.v.index_select(-2, index)
        self.positions = self.positions.index_select(0, index)
        self._spans = kept
