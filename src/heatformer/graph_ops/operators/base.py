r"""Diffusion operators: one contract, ``op(graph, x) -> y``.

Every operator is an :class:`torch.nn.Module` (so it can own parameters such as a learnable
diffusion time) whose ``forward(graph, x)`` maps a signal ``x`` of shape ``(..., N, C)`` on a
:class:`~heatformer.graph_ops.Graph` to ``(..., N, C)``, differentiably in ``x``, in the graph's
tensors (weights, ``q``, ``k``) and in its own parameters. Each also gives its
``frequency_response(lam)``: the factor it applies to an eigenvector of its Laplacian with
eigenvalue ``lam``.

- ``Attention()``: ``D_out^+ W x`` (= ``P x`` on attention); response ``1 - lam``.
- ``Laplacian()``: ``step * L x`` (= ``x - P x``); response ``step * lam``.
- ``HeatKernel(t)``: ``exp(-t L) x``; response ``exp(-t lam)``.
- ``PersonalizedPageRank(alpha)``: ``alpha sum_k (1-alpha)^k A^k x``; response
  ``alpha / (1 - (1-alpha)(1-lam))``.
- ``Polynomial(c)``: ``sum_k c_k L^k x``; response ``sum_k c_k lam^k``.
- ``MeanPooling()``: ``U x``, the mean over the allowed keys (``U`` uniform on the graph's
  structure, the weights ignored); response ``1 - lam`` on ``U``'s own Laplacian.
- ``Centering()``: ``(I' - U) x``, ``x`` minus that mean; response ``lam`` on ``U``'s
  Laplacian.
- ``UntiedSkip()``: ``P x + I' x W_S`` with a learned ``(C, C)`` matrix per head (shaped by
  the layer: :meth:`~DiffusionOperator.shape_parameters`); response ``1 - lam + c`` while
  ``W_S = c I``.
- ``Differential()``: two attention maps per head (:attr:`~DiffusionOperator.maps`),
  ``(1 - lambda_init) RMSNorm(P_1 x - lambda P_2 x)`` (the Differential Transformer).

Strings become operators only through :func:`~heatformer.graph_ops.resolve_operator`; each
operator is one module of this package plus one entry of
:data:`~heatformer.graph_ops.OPERATORS`, and declares what it can do (:attr:`~DiffusionOperator.
reads_transpose`, :meth:`~DiffusionOperator.affine_coefficients`, ``examples``,
:attr:`~DiffusionOperator.needs_shape`, :attr:`~DiffusionOperator.maps`,
:attr:`~DiffusionOperator.combines_maps`, :meth:`~DiffusionOperator.polynomial_coefficients`,
:meth:`~DiffusionOperator.token_map`, :meth:`~DiffusionOperator.learned_weight`).

References:
    Zhang, A. & Papyan, V. (2026). Laplacian heads. arXiv:2602.09297.
    Kondor, R. & Lafferty, J. (2002). Diffusion kernels on graphs. ICML.
    Klicpera, J., Weißenberger, S. & Günnemann, S. (2019). Diffusion improves graph
    learning (GDC). NeurIPS.
    Chamberlain, B. et al. (2021). GRAND: Graph neural diffusion. ICML.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from heatformer import checks as V
from heatformer.graph_ops.protocol import Graph, check_graph

__all__ = ["DiffusionOperator", "NormalizedOperator", "split_maps"]


def _parameter(
    value: float | list[float],
    device: torch.device | str | None,
    dtype: torch.dtype | None,
    *,
    transform: Callable[[float], float] | None = None,
) -> Tensor:
    """A parameter's initial tensor in the factory dtype (default: torch's default dtype),
    rounded once from the float64 ``value`` (optionally ``transform``-ed in float64)."""
    values = value if isinstance(value, list) else [value]
    if transform is not None:
        values = [transform(v) for v in values]
    data = torch.tensor(values, dtype=torch.float64)
    data = data if isinstance(value, list) else data[0]
    return data.to(device=device, dtype=dtype or torch.get_default_dtype())


def _overflow(argument: str, value: Tensor, dtype: torch.dtype) -> V.ArgumentValueError:
    shown = value.detach().double().cpu().flatten()[:8].tolist()
    return V.bad_value(
        argument,
        f"{shown} overflows {dtype} (largest finite value {torch.finfo(dtype).max:.4g}), the "
        f"dtype it is used in; run the operator in a wider dtype or use smaller values",
    )


def _rounded(value: float, dtype: torch.dtype) -> tuple[bool, bool]:
    """Whether the float ``value`` is finite once rounded to the floating ``dtype``, and
    whether it is exactly 1 there (round to nearest, ties to even), by arithmetic on the host.

    Example:
        >>> _rounded(65519.0, torch.float16), _rounded(65520.0, torch.float16)
        ((True, False), (False, False))
        >>> _rounded(1.0 + 2.0**-12, torch.float16), _rounded(1.0 + 2.0**-12, torch.float32)
        ((True, True), (True, False))
    """
    info = torch.finfo(dtype)
    top_ulp = 2.0 ** (math.frexp(info.max)[1] - 1) * info.eps  # the spacing at the largest
    finite = math.isfinite(value) and abs(value) < info.max + top_ulp / 2
    one = 1.0 - info.eps / 4 <= value <= 1.0 + info.eps / 2
    return finite, one


class DiffusionOperator(nn.Module):
    """Base class: ``forward(graph, x) -> y`` with ``x, y`` of shape ``(..., N, C)``."""

    #: registry name used in head specs such as ``"attention:6,laplacian:2"``.
    name: str = "operator"
    #: constructor keyword arguments worth trying, the defaults first: the docs show them and
    #: the test-suite's combination matrix runs every one (a new operator lists its own).
    examples: ClassVar[tuple[dict[str, Any], ...]] = ({},)
    #: the constructor argument a stored tensor holds, where the names differ (for messages)
    argument_names: ClassVar[dict[str, str]] = {}

    def forward(self, graph: Graph, x: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def frequency_response(self, lam: Tensor) -> Tensor:  # pragma: no cover - abstract
        """The factor applied to a Laplacian eigenvector with eigenvalue ``lam``."""
        raise NotImplementedError

    # ---- capabilities: what code that uses an operator asks it (never its class) ----------

    @property
    def reads_transpose(self) -> bool:
        """Whether the output reads ``W^T`` (e.g. a symmetrized graph): row ``i`` then depends
        on the queries that attend to ``i``, so a causal layer must refuse the operator."""
        return False

    def affine_coefficients(self) -> tuple[Tensor, Tensor] | None:
        r"""``(a, b)`` when the operator is affine in one propagation, else None:

        .. math:: \mathrm{op}(G, x) = a \, D_{out}^{+} W x + b \, I' x

        (``I'`` keeps the nodes that have out-edges). On an attention graph that is
        ``a P v + b v``, so a layer serves every such head from its single fused SDPA call,
        and from the KV cache. Scalars (0-dim tensors, differentiable if learnable).
        """
        return None

    def affine_constants(self) -> tuple[float, float] | None:
        """:meth:`affine_coefficients` as Python floats, when they are fixed (no parameter):
        what a layer decides on the host once (``b == 0``: no ``I' v`` term; ``a == -1, b ==
        1``: the step ``v - P v``) instead of reading the coefficients on the device per call.
        None for a learnable or a non-affine operator."""
        return None

    def polynomial_coefficients(self) -> tuple[Tensor, str] | None:
        r"""``(c, basis)`` when the operator is parameterized by the coefficients of a
        polynomial filter, learnable or fixed, else None:

        .. math:: \mathrm{op}(G, x) = \sum_{k=0}^{K} c_k B^k x

        with ``c`` of shape ``(K + 1,)`` (the parameter itself when learnable) and ``basis``
        ``"adjacency"`` (``B`` the normalized adjacency, ``P`` on attention with ``"rw"``) or
        ``"laplacian"`` (``B = L``). What an analysis reads as a head's learned filter
        (:func:`~heatformer.analysis.polynomial_filters`); an operator that is a polynomial
        without such parameters (attention, ``P``) answers None."""
        return None

    def learned_weight(self) -> tuple[Tensor, Tensor] | None:
        """``(W, W0)`` when the operator learns a matrix per head, else None: the parameter
        ``W`` ``(heads, C, C)`` itself and ``W0``, the value it was initialized to (a new
        tensor of the same shape, detached). What an analysis reads to tell how far training
        moved it from its start (:func:`~heatformer.analysis.weight_drift`: an untied skip
        head's ``W_S``, started at ``init * I``). None too while the weight waits for its shape
        (:attr:`needs_shape`)."""
        return None

    @property
    def needs_shape(self) -> bool:
        """Whether a parameter still waits for the shape of the heads it serves
        (:meth:`shape_parameters`): a layer must then give it (an untied skip's per-head
        weight); False for operators whose parameters do not depend on the layer."""
        return False

    def shape_parameters(self, heads: int, channels: int) -> None:
        """Make the parameters whose shape depends on the layer: called once by the layer (its
        :class:`~heatformer.models.routing.HeadRouter`) with the number of heads this
        operator serves and their width ``C`` (the head width ``Dh``), before any optimizer
        sees the parameters. Nothing for most operators.

        Raises:
            ValueError: naming ``heads``, when the parameters already have another shape (one
                instance shared by layers of different shapes).
        """

    @property
    def maps(self) -> int:
        """How many attention graphs ("maps") a head of this operator reads: 1 for most.

        With ``m > 1`` the operator is called with one graph whose *last batch dim* holds the
        maps, ``graph.batch_shape == (*batch, m)``, and a signal ``x`` of shape
        ``(*batch, N, C)``. A layer builds map ``i`` of a head from channels
        ``i d : (i + 1) d`` of the head's queries and keys (:func:`split_maps`, ``d = Dh / m``,
        logit scale ``1 / sqrt(d)``), so the head keeps the projection widths of every other
        head (the Differential Transformer's split of ``Q`` into ``Q_1, Q_2``).
        """
        return 1

    @property
    def combines_maps(self) -> bool:
        """Whether the output is :meth:`combine` of one propagation of ``x`` by each map,
        ``op(G, x) == combine(stack_i(P_i x))``: a layer then serves the operator's heads from
        one propagation per map wherever it serves affine heads from one propagation -- fewer
        queries than keys, and so the KV cache. False for most (see
        :meth:`affine_coefficients` for the one-map affine case)."""
        return False

    def combine(self, pv: Tensor) -> Tensor:
        """The output from ``pv`` ``(*batch, m, Nq, C)``, the propagations ``P_i x`` of the
        :attr:`maps` (rows of the queries asked for), when :attr:`combines_maps`.

        Raises:
            NotImplementedError: for an operator that does not combine its maps.
        """
        raise NotImplementedError(f"operator {self.name!r} does not combine propagations")

    def token_map(self, graph: Graph, x: Tensor) -> Tensor:
        """``A x``: the head's linear map between tokens, ``A`` ``(N, N)`` (never formed),
        applied to ``x`` ``(..., N, C)`` of any width ``C``, one signal per channel; what
        token-level analysis composes (:func:`heatformer.analysis.rollout` applies its transpose
        by autograd). By default the operator itself, right for every operator that is
        ``op(G, V) = A V`` on each channel alike (attention, Laplacian, heat, PPR, polynomial,
        mean, centring); one that is not overrides it with the map it stands for, documented
        (a differential head: ``P_1 x - lambda P_2 x``, without its per-row RMSNorm)."""
        return self(graph, x)

    def set_depth(self, depth: int) -> None:
        """Told once by a model that stacks layers (:class:`~heatformer.models.GPT`,
        :class:`~heatformer.models.ViT`), right after building them: the 1-based ``depth`` of
        the layer whose heads this operator serves. Nothing for most operators; a differential
        head takes its ``lambda_init`` from it."""

    def _check(self, graph: Graph, x: Tensor) -> None:
        graph = check_graph(graph)
        batch = graph.batch_shape
        maps = self.maps
        if maps > 1:  # the maps are the graph's last batch dim, one more than x has
            x_batch = tuple(x.shape[:-2]) if isinstance(x, Tensor) and x.dim() >= 2 else None
            if (
                not batch
                or batch[-1] != maps
                or (x_batch is not None and len(x_batch) != len(batch) - 1)
            ):
                raise V.bad_value(
                    "graph",
                    f"expected a graph of batch shape (*batch, {maps}), its {maps} maps last "
                    f"(split_maps of the queries and keys), for x of shape (*batch, N, C); got "
                    f"batch shape {tuple(batch)} for x of shape "
                    f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}",
                )
            batch = batch[:-1]
        V.check_signal(x, graph.num_nodes, batch, graph.dtype)

    # ---- constants checked in the dtype they are used in ----------------------------------

    def _checked_in(self, name: str, dtype: torch.dtype, value: Tensor | None = None) -> bool:
        """Check that the parameter or buffer ``self.<name>`` (or the ``value`` it was made
        from) is finite once rounded to ``dtype``, the dtype it is used or stored in, and
        return whether it is exactly 1 there.

        Read once per ``(name, dtype)`` -- at construction when the dtype is known, else at
        first use -- and again after :meth:`~torch.nn.Module.to`, never in every call: a
        coefficient of ``1e39`` passes a float64 check and is inf in float32.

        Raises:
            ValueError: naming the constructor argument, when a value overflows ``dtype``.
        """
        cache: dict[tuple[str, torch.dtype], bool] = self.__dict__.setdefault("_checked", {})
        key = (name, dtype)
        if key not in cache and torch.compiler.is_compiling():
            # a traced call reads nothing on the host: the value was checked at construction
            # (float64, the factory and default dtypes) and by .to()/.half(); "not 1" is
            # always correct (the factor is then applied)
            return False
        host = self.__dict__.get("_host_factors", {}).get(name)
        if key not in cache and value is None and host is not None:
            # a fixed factor: its float, checked on the host without a tensor
            finite, one = _rounded(host, dtype)
            if not finite:
                raise _overflow(self.argument_names.get(name, name), torch.tensor(host), dtype)
            cache[key] = one
        if key not in cache:
            value = (getattr(self, name) if value is None else value).detach()
            if value.device.type == "meta":  # nothing to read yet
                return False
            rounded = value.to(dtype)
            if not bool(torch.isfinite(rounded).all()):
                raise _overflow(self.argument_names.get(name, name), value, dtype)
            cache[key] = bool((rounded == 1).all())
        return cache[key]

    def _precheck(self, name: str, dtype: torch.dtype, value: Tensor) -> None:
        """:meth:`_checked_in` ahead of a first use in ``dtype``, without raising: a value that
        overflows there is refused at that use (the operator still serves wider dtypes)."""
        try:
            self._checked_in(name, dtype, value)
        except ValueError:
            pass

    def _apply(self, fn: Any, recurse: bool = True) -> DiffusionOperator:
        """``.to()``, ``.half()``, ...: refused, before anything is converted, when a stored
        value would not be finite in its new dtype (a time of ``1e5`` in float16); the values
        are checked again in the dtype of their next use."""
        stored = [*self.named_parameters(recurse=False), *self.named_buffers(recurse=False)]
        # the checks made so far stay true of the converted values (a value finite in a dtype
        # stays finite once rounded to a narrower one, which is checked below; "is 1" only
        # skips a product by 1), so a first call after .to(device) reads nothing either
        checked: dict[tuple[str, torch.dtype], bool] = dict(self.__dict__.get("_checked", {}))
        for name, value in stored:
            if value.is_floating_point() and value.device.type != "meta":
                converted = fn(value.detach())
                if converted.is_floating_point() and not bool(torch.isfinite(converted).all()):
                    raise _overflow(self.argument_names.get(name, name), value, converted.dtype)
                if converted.is_floating_point():  # read here, at .to(), not at first use
                    checked[name, converted.dtype] = bool((converted == 1).all())
        self.__dict__["_checked"] = checked
        super()._apply(fn, recurse)
        return self

    def _register_factor(
        self,
        name: str,
        value: object,
        learnable: bool,
        device: torch.device | str | None,
        dtype: torch.dtype | None,
    ) -> None:
        """Check the finite float ``value`` (the argument ``name``) and keep it as
        ``self.<name>``: a parameter in the factory dtype when ``learnable``, else a float64
        buffer cast to the signal's dtype at use (see :meth:`_times`)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise V.bad_type(name, f"expected a float, got {type(value).__name__}")
        if not math.isfinite(value):
            raise V.bad_value(name, f"expected a finite value, got {value}")
        if learnable:
            setattr(self, name, nn.Parameter(_parameter(float(value), device, dtype)))
        else:
            fixed = torch.tensor(float(value), dtype=torch.float64, device=device)
            self.register_buffer(name, fixed, persistent=False)
        factors: list[str] = self.__dict__.setdefault("_factors", [])
        factors.append(name)
        if not learnable:  # known on the host: see affine_constants
            self.__dict__.setdefault("_host_factors", {})[name] = float(value)
        given = torch.tensor(float(value), dtype=torch.float64)
        self._checked_in(name, getattr(self, name).dtype, given)  # learnable: factory dtype
        if dtype is not None:  # the signal's dtype, where it is used
            self._checked_in(name, dtype, given)
        else:  # torch's default dtype, quietly: a first call in it then reads nothing
            self._precheck(name, torch.get_default_dtype(), given)

    def _times(self, y: Tensor, factor: Tensor, learnable: bool) -> Tensor:
        """``factor * y`` in ``y``'s dtype, skipped for a fixed factor of 1 (the default: no
        extra pass); the factor is checked in that dtype on first use."""
        name = next(n for n in self.__dict__.get("_factors", ()) if getattr(self, n) is factor)
        if self._checked_in(name, y.dtype) and not learnable:
            return y
        return y * factor.to(y.dtype)


class NormalizedOperator(DiffusionOperator):
    """An operator built on one of the three Laplacian normalizations (``self.normalization``).

    The ``"sym"`` normalization symmetrizes the graph, so it reads ``W^T``.
    """

    normalization: str = "rw"

    @property
    def reads_transpose(self) -> bool:
        return self.normalization == "sym"


def split_maps(t: Tensor, maps: int, *, name: str = "t") -> Tensor:
    """The queries (or keys) of heads with ``maps`` attention maps, the maps as a batch dim:
    ``(..., N, maps * d) -> (..., maps, N, d)``, map ``i`` from channels ``i d : (i + 1) d``
    (a view, no copy). What a layer builds the graph of an operator with
    :attr:`DiffusionOperator.maps` ``> 1`` from.

    Args:
        t: ``(..., N, E)`` queries or keys, ``E`` a multiple of ``maps``.
        maps: the number of maps, a positive int.
        name: the argument named in errors.

    Raises:
        ValueError: naming ``name``, when ``E`` is not a multiple of ``maps``.

    Example:
        >>> t = torch.arange(8.0).reshape(2, 4)    # N = 2 tokens, E = 4 channels
        >>> split_maps(t, 2)                       # 2 maps of d = 2 channels
        tensor([[[0., 1.],
                 [4., 5.]],
        <BLANKLINE>
                [[2., 3.],
                 [6., 7.]]])
    """
    V.check_positive_int("maps", maps)
    if not isinstance(t, Tensor) or t.dim() < 2:
        got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
        raise V.bad_type(name, f"expected a tensor of shape (..., N, E), got {got}")
    channels = int(t.shape[-1])
    if channels % maps:
        raise V.bad_value(
            name,
            f"expected channels divisible into {maps} maps, got {channels} in {tuple(t.shape)}",
        )
    return t.unflatten(-1, (maps, channels // maps)).transpose(-2, -3)  # (..., maps, N, d)
