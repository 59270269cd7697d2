r"""The polynomial filters of a model's heads: their coefficients and the band they pass.

A head whose operator is parameterized by polynomial coefficients
(:meth:`~heatformer.graph_ops.DiffusionOperator.polynomial_coefficients`: ``polynomial`` heads,
learnable or fixed, e.g. ``polynomial[init=ppr,alpha=0.2,order=8,learnable=true]``, whose
:math:`\gamma_k` start at :math:`\alpha (1 - \alpha)^k`) applies

.. math::

    y = \sum_{k=0}^{K} \gamma_k P^k v \quad (\text{adjacency basis}), \qquad
    y = \sum_{k=0}^{K} c_k L^k v \quad (\text{laplacian basis}),

to its values. On an eigenvector of the random-walk Laplacian :math:`L = I - P` with eigenvalue
:math:`\lambda` (an eigenvalue :math:`\mu = 1 - \lambda` of :math:`P`) it multiplies by the
response

.. math::

    g(\lambda) = \sum_{k=0}^{K} \gamma_k (1 - \lambda)^k
    \quad\text{or}\quad g(\lambda) = \sum_{k=0}^{K} c_k \lambda^k .

The response is read on the real segment :math:`\lambda \in [0, 2]`, the spectrum of a
``"rw"`` or ``"sym"`` Laplacian of a symmetric graph (an attention graph's ``P`` has complex
eigenvalues too, in the unit disk; GPR-GNN reads learned coefficients the same way):
:math:`\lambda = 0` is the smoothest signal (the constant, :math:`g(0) = \sum_k \gamma_k`),
:math:`\lambda = 1` is :math:`\mu = 0` (:math:`g(1) = \gamma_0`), :math:`\lambda = 2` the
roughest (:math:`\mu = -1`, :math:`g(2) = \sum_k (-1)^k \gamma_k`).

**The label** (:func:`filter_response`). The segment is cut into three equal bands, low
:math:`[0, 2/3]`, middle :math:`[2/3, 4/3]` and high :math:`[4/3, 2]` (:data:`BANDS`), and each
band's share of the response's energy :math:`E_b = \int_b g(\lambda)^2 \, d\lambda` is
computed exactly (``g^2`` is a polynomial). The filter is ``"low-pass"``, ``"band"`` or
``"high-pass"`` (:data:`PASSBANDS`) after the band with the largest share; shares equal to
within a relative ``1e-9`` go to the lower band (attention's :math:`g = 1 - \lambda` is
symmetric about :math:`\lambda = 1` and is called low-pass); a filter whose coefficients are
all zero has shares ``(0, 0, 0)`` and the label ``"none"``. A PageRank start is low-pass, a
Laplacian step :math:`g = \lambda` high-pass, :math:`g = 1 - (1 - \lambda)^2` band.
(:attr:`Polynomial.passband <heatformer.graph_ops.Polynomial.passband>` is the two-way reading
:math:`|g(0)| \ge |g(2)|` of the ends only.)

References:
    Chien, E., Peng, J., Li, P. & Milenkovic, O. (2021). Adaptive universal generalized
    PageRank graph neural network (GPR-GNN). ICLR.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from heatformer.checks import bad_type, bad_value, check_choice
from heatformer.graph_ops import DiffusionOperator

__all__ = [
    "BANDS",
    "PASSBANDS",
    "FilterResponse",
    "HeadFilter",
    "filter_response",
    "head_operator_groups",
    "polynomial_filters",
]

#: the labels of :func:`filter_response`, one per band of :data:`BANDS`
PASSBANDS = ("low-pass", "band", "high-pass")
#: the three equal bands of the random-walk Laplacian's eigenvalues ``lam`` in ``[0, 2]``
BANDS = ((0.0, 2.0 / 3.0), (2.0 / 3.0, 4.0 / 3.0), (4.0 / 3.0, 2.0))
#: the bases of a polynomial filter (``Polynomial``'s ``basis``)
_BASES = ("adjacency", "laplacian")
#: shares within this relative distance of the largest count as tied (the lower band wins)
_TIE = 1e-9


@dataclass(frozen=True)
class FilterResponse:
    """What a polynomial filter passes (:func:`filter_response`).

    Attributes:
        gains: ``(g(0), g(1), g(2))``, the response at the smoothest signal, at ``mu = 0`` and
            at the roughest.
        energy: the shares of ``int g(lam)^2 dlam`` on the low, middle and high thirds of
            ``[0, 2]`` (:data:`BANDS`), summing to 1 (``(0, 0, 0)`` for the zero filter).
        label: ``"low-pass"``, ``"band"`` or ``"high-pass"`` (:data:`PASSBANDS`): the band of
            the largest share, ties to the lower band; ``"none"`` for the zero filter.
    """

    gains: tuple[float, float, float]
    energy: tuple[float, float, float]
    label: str


def filter_response(
    coefficients: Sequence[float] | Tensor | np.ndarray, basis: str = "adjacency"
) -> FilterResponse:
    r"""The response of the polynomial filter ``coefficients`` on ``lam`` in ``[0, 2]``, and
    its label (the rule in the module docstring).

    Args:
        coefficients: ``gamma_0 .. gamma_K``, a non-empty 1-D sequence, array or tensor of
            finite numbers (read in float64, detached).
        basis: ``"adjacency"`` (``g(lam) = sum_k gamma_k (1 - lam)^k``, powers of ``P``) or
            ``"laplacian"`` (``g(lam) = sum_k c_k lam^k``, powers of ``L``).

    Returns:
        A :class:`FilterResponse`.

    Raises:
        TypeError: naming ``coefficients``, for something not a sequence of numbers.
        ValueError: naming ``coefficients`` (not 1-D, empty, not finite) or ``basis``.

    Example:
        >>> r = filter_response([0.5, 0.25, 0.125])  # PageRank's start, alpha = 0.5
        >>> r.gains, r.label
        ((0.875, 0.5, 0.375), 'low-pass')
        >>> filter_response([0.0, 1.0], basis="laplacian").label  # L = I - P
        'high-pass'
    """
    c = _coefficients(coefficients)
    basis = check_choice("basis", basis, _BASES)
    # g as a polynomial in z: z = 1 - lam (adjacency) or z = lam (laplacian); the bands in z
    if basis == "adjacency":
        bands = [(1.0 - high, 1.0 - low) for low, high in BANDS]
        at = [1.0, 0.0, -1.0]  # lam = 0, 1, 2
    else:
        bands, at = list(BANDS), [0.0, 1.0, 2.0]
    P = np.polynomial.polynomial
    integral = P.polyint(P.polymul(c, c))  # int g^2 dz, exact
    energies = [float(P.polyval(b, integral) - P.polyval(a, integral)) for a, b in bands]
    gains = tuple(float(P.polyval(z, c)) for z in at)
    total = math.fsum(energies)
    if total <= 0.0:  # every coefficient 0
        return FilterResponse((gains[0], gains[1], gains[2]), (0.0, 0.0, 0.0), "none")
    shares = tuple(e / total for e in energies)
    top = max(shares)
    label = next(PASSBANDS[i] for i, s in enumerate(shares) if s >= top * (1.0 - _TIE))
    return FilterResponse((gains[0], gains[1], gains[2]), (shares[0], shares[1], shares[2]), label)


def _coefficients(coefficients: object) -> np.ndarray:
    """``coefficients`` as a float64 array of shape ``(K + 1,)``, checked."""
    if isinstance(coefficients, Tensor):
        values = coefficients.detach().to("cpu", torch.float64).numpy()
    elif isinstance(coefficients, (np.ndarray, Sequence)) and not isinstance(coefficients, str):
        try:
            values = np.asarray(coefficients, dtype=np.float64)
        except (TypeError, ValueError):
            raise bad_type(
                "coefficients", f"expected a sequence of numbers, got {coefficients!r}"
            ) from None
    else:
        raise bad_type(
            "coefficients",
            f"expected a sequence, array or tensor of numbers, got {type(coefficients).__name__}",
        )
    if values.ndim != 1 or values.size == 0:
        raise bad_value(
            "coefficients", f"expected a non-empty 1-D sequence, got shape {values.shape}"
        )
    if not np.isfinite(values).all():
        raise bad_value("coefficients", f"expected finite values, got {values.tolist()}")
    return values


@dataclass(frozen=True)
class HeadFilter:
    """The polynomial filter of one or more heads of one layer (:func:`polynomial_filters`).

    Attributes:
        layer: the layer's index among the model's attention layers (0-based, in module
            order: ``blocks.0.attn`` is 0 in the reference GPT and ViT).
        module: the layer's name in ``model.named_modules()``.
        heads: the heads that apply it, in head order: the heads of one spec entry share one
            operator, and so one set of coefficients.
        operator: the operator's registry name (``"polynomial"``).
        basis: ``"adjacency"`` or ``"laplacian"``.
        learnable: whether the coefficients are a parameter.
        coefficients: ``gamma_0 .. gamma_K`` as they are now (float64 values).
        response: their :func:`filter_response`.
    """

    layer: int
    module: str
    heads: tuple[int, ...]
    operator: str
    basis: str
    learnable: bool
    coefficients: tuple[float, ...]
    response: FilterResponse

    @property
    def label(self) -> str:
        """``response.label``: ``"low-pass"``, ``"band"``, ``"high-pass"`` (or ``"none"``)."""
        return self.response.label

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the attributes, the response's flattened in (``gains``,
        ``energy``, ``label``), tuples as lists."""
        return {
            "layer": self.layer,
            "module": self.module,
            "heads": list(self.heads),
            "operator": self.operator,
            "basis": self.basis,
            "learnable": self.learnable,
            "coefficients": list(self.coefficients),
            "gains": list(self.response.gains),
            "energy": list(self.response.energy),
            "label": self.response.label,
        }


def polynomial_filters(model: nn.Module) -> list[HeadFilter]:
    r"""The coefficients and response of every polynomial head of ``model``, layer by layer.

    A layer is a submodule that lists its heads' operators (``head_operators``:
    :class:`~heatformer.models.DiffusionAttention`, and the layers the adapters of
    :mod:`heatformer.integrations` convert), in ``model.named_modules()`` order; a head
    counts when its operator answers
    :meth:`~heatformer.graph_ops.DiffusionOperator.polynomial_coefficients` (no class is
    tested). Heads that share an operator give one :class:`HeadFilter`. Reads the values on
    the host, without gradients; runs no forward pass.

    Shape:
        ``coefficients``: ``K + 1`` floats per filter; ``response.gains`` and
        ``response.energy``: 3 floats.

    Args:
        model: any module.

    Returns:
        One :class:`HeadFilter` per layer and operator with coefficients, in layer order, then
        in the order of their first head; empty for a model without such heads.

    Raises:
        TypeError: naming ``model``, when it is not a module.

    Example:
        >>> from heatformer.models import GPT, GPTConfig
        >>> heads = "attention:1,polynomial[init=ppr,alpha=0.5,order=2,learnable=true]:1"
        >>> gpt = GPT(GPTConfig(vocab_size=8, block_size=4, n_layer=2, n_head=2, n_embd=8,
        ...                     heads=heads))
        >>> [(f.layer, f.heads, f.coefficients, f.label) for f in polynomial_filters(gpt)]
        [(0, (1,), (0.5, 0.25, 0.125), 'low-pass'), (1, (1,), (0.5, 0.25, 0.125), 'low-pass')]
    """
    found = (_head_filter(*group) for group in head_operator_groups(model))
    return [filt for filt in found if filt is not None]


def head_operator_groups(
    model: nn.Module,
) -> Iterator[tuple[DiffusionOperator, int, str, tuple[int, ...]]]:
    """Every operator of every attention layer of ``model`` with the heads it serves:
    ``(operator, layer, module name, heads)``, layers numbered in order over the modules that
    hold ``head_operators`` (:class:`~heatformer.models.DiffusionAttention`, the converted
    layers of :mod:`heatformer.integrations`), heads that share one operator together. What
    :func:`polynomial_filters` and :func:`~heatformer.analysis.weight_drift` read.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise bad_type("model", f"expected a torch.nn.Module, got {type(model).__name__}")
    layer = 0
    for name, module in model.named_modules():
        operators = getattr(module, "head_operators", None)
        if not isinstance(operators, list) or not operators:
            continue
        if not all(isinstance(op, DiffusionOperator) for op in operators):
            continue
        heads_of: dict[int, list[int]] = {}  # operator id -> its heads
        for head, op in enumerate(operators):
            heads_of.setdefault(id(op), []).append(head)
        for heads in heads_of.values():
            yield operators[heads[0]], layer, name, tuple(heads)
        layer += 1


def _head_filter(
    op: DiffusionOperator, layer: int, module: str, heads: tuple[int, ...]
) -> HeadFilter | None:
    """The :class:`HeadFilter` of ``op`` on ``heads``, None when it has no coefficients."""
    answer = op.polynomial_coefficients()
    if answer is None:
        return None
    coeffs, basis = answer
    values = coeffs.detach().to("cpu", torch.float64)
    return HeadFilter(
        layer=layer,
        module=module,
        heads=heads,
        operator=op.name,
        basis=basis,
        learnable=isinstance(coeffs, nn.Parameter),
        coefficients=tuple(float(v) for v in values),
        response=filter_response(values, basis),
    )
