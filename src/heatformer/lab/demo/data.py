"""The demo's data: everything its page shows, as tensors, strings and numbers.

:class:`DemoData` is what :mod:`heatformer.lab.demo.compute` produces and
:mod:`heatformer.lab.demo.page` draws; :meth:`DemoData.to_dict` turns it into lists, numbers
and strings for JSON (an interactive page can embed it) and :meth:`DemoData.from_dict` reads
that back exactly (floats survive a JSON round trip bit for bit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import Tensor

from heatformer.checks import bad_value
from heatformer.lab.demo.walk import head_walks

__all__ = ["DemoData"]

_TENSORS = (
    "attention", "heat", "mass", "animation", "lam", "eigenvalues", "channel", "tokenrank",
    "walk_eigenvalues", "walk_eigenvector",
)  # fmt: skip
_TENSOR_MAPS = ("spectra", "responses", "outputs", "topk")
#: Fields that data written by an older version lacks, with the value they stand for there.
_LATER: dict[str, Any] = {"tokens": (), "source_dtype": "float64", "token_unit": "character"}
#: Fields that data written before the random walk was shown lacks: computed from its attention
#: (:func:`~heatformer.lab.demo.walk.head_walks`).
_WALK = ("tokenrank", "walk_eigenvalues", "walk_eigenvector")


@dataclass(frozen=True)
class DemoData:
    """Everything the demo page shows, as tensors (float64, CPU), strings and numbers.

    Node ``i`` is token ``i`` of ``text``; ``L`` layers, ``H`` heads, ``N`` tokens. "The
    head" is head ``attention_head`` of layer ``layer``, the one the single-head pictures
    show.

    Attributes:
        text: the sentence, one character per token (``N`` characters).
        layer: the layer of the single-head pictures, in ``[0, L)``.
        attention_head: the first attention head of that layer (else head 0).
        laplacian_head: its first Laplacian head, or ``None``.
        filter_head: the head of the high-pass/low-pass picture (``laplacian_head`` if any,
            else ``attention_head``).
        source: the token that receives the drop of heat.
        operators: ``(L, H)`` operator names, one per head of every layer.
        attention: ``(L, H, N, N)`` attention weights ``P[i, j]`` (query ``i``, key ``j``).
        spectra: ``{normalization: (N,)}`` Laplacian eigenvalues of the head (complex for a
            directed graph).
        heat_times, heat: the heat flow's influence view ``exp(−tL) e_source`` (``"rw"``)
            on the head at ``heat_times``, ``(T, N)``: what a heat head's outputs take from
            the source's value; its total is not conserved.
        mass: the mass view ``exp(−tLᵀ) e_source`` at ``heat_times``, ``(T, N)``: a unit of
            mass on the source flowing along the arrows; its total stays 1.
        animation_times, animation: the same at the animation's times, ``(T', N)``.
        lam, responses: ``{label: f(lam)}`` frequency responses of the attention, Laplacian
            and heat (``t = 1``) operators on the grid ``lam``.
        eigenvalues: ``(N,)`` random-walk Laplacian eigenvalues of ``filter_head``.
        channel, outputs: value channel 0 of ``filter_head``, ``(N,)``, and
            ``{label: (N,)}`` what the attention and the Laplacian operator make of it.
        topk: ``{title: (N, N)}`` the head's graph, full and pruned to the top ``k`` edges
            of every query for each ``k`` of the picture.
        tokenrank: ``(L, H, N)`` TokenRank of every head: the stationary distribution ``π`` of
            the walk on its ``P`` (``π P = π``, ``Σ π = 1``); zeros where heatformer refuses it
            (:mod:`~heatformer.lab.demo.walk`).
        walk_eigenvalues: ``(L, H, K)`` the ``K = min(3, N)`` eigenvalues of every head's ``P``
            largest in modulus (complex), ``λ₁ = 1`` first; zeros for a head without a walk.
        walk_eigenvector: ``(L, H, N)`` the right eigenvector ``v₂`` of ``λ₂`` of every head
            (complex, unit length, its entry of largest modulus real and positive).
        per_layer: ``{configuration: [within-sequence variance share per layer]}``, or
            ``None``.
        losses: ``{configuration: (first, last)}`` training loss in bits per token (per
            byte for the demo's byte-level GPTs).
        meta: a line about the run (plain text).
        tokens: the label of every node when a token is more than one character (a
            subword tokenizer's tokens, ``N`` of them); empty: the characters of ``text``.
        source_dtype: the name of the dtype the model computed the attention weights in
            (``"float32"``); :mod:`~heatformer.lab.demo.facts` judges "zero" and "one" at its
            resolution.
        token_unit: what a token is, for the page's text: ``"byte"``, ``"character"``,
            ``"word piece"``, ``"word"``, ``"subword token"`` or ``"token"``.
    """

    text: str
    layer: int
    attention_head: int
    laplacian_head: int | None
    filter_head: int
    source: int
    operators: tuple[tuple[str, ...], ...]
    attention: Tensor
    spectra: dict[str, Tensor]
    heat_times: tuple[float, ...]
    heat: Tensor
    mass: Tensor
    animation_times: tuple[float, ...]
    animation: Tensor
    lam: Tensor
    responses: dict[str, Tensor]
    eigenvalues: Tensor
    channel: Tensor
    outputs: dict[str, Tensor]
    topk: dict[str, Tensor]
    tokenrank: Tensor
    walk_eigenvalues: Tensor
    walk_eigenvector: Tensor
    per_layer: dict[str, tuple[float, ...]] | None
    losses: dict[str, tuple[float, float]]
    meta: str
    tokens: tuple[str, ...] = ()
    source_dtype: str = "float64"
    token_unit: str = "character"

    @property
    def labels(self) -> list[str]:
        """The label of every node: :attr:`tokens`, else the characters of :attr:`text`."""
        return list(self.tokens) if self.tokens else list(self.text)

    def to_dict(self) -> dict[str, Any]:
        """The data as lists, numbers and strings (``json.dumps`` takes it as is); a complex
        tensor becomes ``{"real": [...], "imag": [...]}``. :meth:`from_dict` reads it back."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DemoData:
        """The :class:`DemoData` of :meth:`to_dict`'s output (e.g. after a JSON round trip).

        Data written by an older version, without the fields added since, is read with their
        values there (no tokens, float64, characters) and the random walk computed from its
        attention.

        Raises:
            ValueError: ``data`` does not have exactly the fields of :class:`DemoData`.
        """
        names = [f.name for f in fields(cls)]
        later = {**_LATER, **dict.fromkeys(_WALK)}
        if sorted({**later, **data}) != sorted(names):  # fields of later versions may be absent
            raise bad_value("data", f"expected the fields {names}, got {sorted(data)}")
        kw = {**_LATER, **data}
        kw["tokens"] = tuple(kw["tokens"])
        for name in _TENSORS:
            if name in kw:
                kw[name] = _tensor(kw[name])
        if any(name not in kw for name in _WALK):
            kw.update({k: v for k, v in head_walks(kw["attention"]).items() if k not in kw})
        for name in _TENSOR_MAPS:
            kw[name] = {k: _tensor(v) for k, v in kw[name].items()}
        kw["operators"] = tuple(tuple(row) for row in kw["operators"])
        kw["heat_times"], kw["animation_times"] = (
            tuple(kw["heat_times"]),
            tuple(kw["animation_times"]),
        )
        if kw["per_layer"] is not None:
            kw["per_layer"] = {k: tuple(v) for k, v in kw["per_layer"].items()}
        kw["losses"] = {k: (float(a), float(b)) for k, (a, b) in kw["losses"].items()}
        return cls(**kw)


def _plain(value: Any) -> Any:
    if isinstance(value, Tensor):
        if value.is_complex():
            return {"real": value.real.tolist(), "imag": value.imag.tolist()}
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def _tensor(value: Any) -> Tensor:
    if isinstance(value, Mapping):
        real = torch.tensor(value["real"], dtype=torch.float64)
        return torch.complex(real, torch.tensor(value["imag"], dtype=torch.float64))
    return torch.tensor(value, dtype=torch.float64)
