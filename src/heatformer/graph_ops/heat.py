r"""Ways to compute the heat kernel ``exp(-t L) x``, in a registry.

Each entry of :data:`HEAT_METHODS` declares what it supports through a ``refuse`` function that
returns ``None`` (supported) or the reason it cannot serve a call, so ``method="auto"`` can
explain its choice and a refused method says why.

``"series"`` -- the positive Poisson-weighted series. With ``L = c (I - M)``
(:class:`~heatformer.graph_ops.laplacian.GraphLaplacian`) and ``tau = c t``,

.. math::

    e^{-tL} x = e^{-\tau} \sum_{k \ge 0} \frac{\tau^k}{k!} M^k x .

Every term is one more :meth:`~heatformer.graph_ops.Graph.propagate`; all weights are
positive and ``||M|| <= 1``, so there is no cancellation (the alternating series in ``L`` is
numerically useless beyond ``t`` of a few units). Large ``tau`` is split,
``e^{-tL} = (e^{-(t/s) L})^s`` with ``tau / s <= max_step``, which keeps the leading weight
``e^{-tau/s}`` far from underflow; each of the ``s`` sub-steps is truncated after the order
``K`` at which the Poisson tail ``P[Poisson(tau/s) > K]`` drops below ``tol / s``, so the total
truncation error is at most ``tol * max|x|`` (in the 2-norm sense for ``"sym"``): exactly
``1 - (1 - tail)^s`` in the maximum norm, the bound
:func:`~heatformer.graph_ops.poisson.series_certificate` (and :attr:`HeatKernel.certificate
<heatformer.graph_ops.HeatKernel.certificate>`) reports; the plan is
:func:`~heatformer.graph_ops.poisson.series_plan`.

``"series-dense"`` -- the same series on the graph's explicit weights, formed once
(:meth:`~heatformer.graph_ops.Graph.materialized`): for an attention graph each term is then
one ``N x N`` matrix product instead of a fused attention call that recomputes the scores,
half the flops, at ``B H N^2`` memory; ``"auto"`` takes it while the weights fit
:data:`MATERIALIZE_BUDGET_BYTES` (256 MiB by default), else the matrix-free ``"series"``.

``"exact"`` -- ``exp(-t L) x`` on the dense Laplacian, in float64, by scaling and squaring that
keeps the one eigenvalue a rounding would otherwise move (:func:`converged_expm`): ``O(N^3)``,
for small graphs, as a reference, and for any large ``t``, up to the converged limit.

Precision: float16/bfloat16 signals are propagated in their own dtype, but the series
accumulates in float32; ``"exact"`` runs in float64 for every input dtype (``matrix_exp``
returns NaN in half precision, and at large ``t`` float32 loses ``t * 1e-7`` of accuracy); the
result is rounded to the input dtype once (see :mod:`heatformer.graph_ops._precision`).

References:
    Kondor, R. & Lafferty, J. (2002). Diffusion kernels on graphs and other discrete input
    spaces. ICML.
    Al-Mohy, A. & Higham, N. (2011). Computing the action of the matrix exponential.
    SIAM J. Sci. Comput. 33(2).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from heatformer import checks as V
from heatformer.graph_ops._methods import Method, check_method, select_method
from heatformer.graph_ops._precision import accumulation_dtype, full_precision
from heatformer.graph_ops.laplacian import GraphLaplacian, dense_laplacian
from heatformer.graph_ops.poisson import SERIES_MAX_STEP, poisson_order, series_plan
from heatformer.graph_ops.protocol import Graph, check_graph

__all__ = [
    "HEAT_METHODS", "SERIES_MAX_STEP", "HeatMethod", "converged_expm", "heat_kernel",
    "poisson_order", "select_heat_method", "series_plan",
]  # fmt: skip

#: Largest graph for which ``"exact"`` forms and exponentiates the dense Laplacian.
EXACT_MAX_NODES = 2048
#: What the dense routes (``"exact"`` here, PPR's ``"solve"``) compute in, whatever the input
#: dtype: they are the references and the fallbacks for large ``t`` / small ``alpha``, where a
#: float32 rounding of the Laplacian's null space is amplified by ``t`` (or ``1/alpha``).
DENSE_DTYPE = torch.float64
#: The largest ``tau = c t`` computed: a longer time gives the result at ``TAU_CONVERGED``, equal
#: to the limit ``t -> inf`` in float64 (see :func:`converged_expm`). ``2^58``: every eigenvalue
#: ``mu`` of ``L / c`` (spectrum in ``Re mu in [0, 2]``) with ``Re mu >= 2^-52``, float64's
#: resolution of an eigenvalue of a matrix of norm 2, has decayed to ``e^{-64} < 2^-92``.
TAU_CONVERGED = 2.0**58
#: Squarings of ``exp(-h L/c)`` (``h ||L/c|| <= 1``) that reach ``TAU_CONVERGED``.
MAX_SQUARINGS = 59
#: Largest total number of propagations ``"series"`` accepts before refusing.
SERIES_MAX_TERMS = 5000
#: Most bytes ``"series-dense"`` may spend on an explicit copy of an implicit graph's weights
#: (``B H N^2`` floats for attention); above it, ``"auto"`` keeps the matrix-free series. Set
#: it (``heatformer.graph_ops.heat.MATERIALIZE_BUDGET_BYTES = ...``) to trade memory for speed.
MATERIALIZE_BUDGET_BYTES = 1 << 28
#: Terms of at least this many elements are recomputed in backward instead of stored
#: (``torch.utils.checkpoint``): a heat series on a million tokens keeps one term per segment
#: of at most ``sqrt(2 K)`` propagations (see ``_segments``), not every intermediate of every
#: propagation (PPR and polynomial series keep one term per propagation).
CHECKPOINT_ELEMENTS = 1 << 24


def _tau_max(gen: GraphLaplacian, t: Tensor | float, t_max: float | None) -> float:
    """The largest ``tau = c t`` of the batch, the series' plan, on the host.

    Read from nothing on the device when both factors are known there: ``t`` a float (or a
    tensor with its bound ``t_max``) and ``c`` known without the weights
    (:attr:`GraphLaplacian.scale_bound`: 1 for ``"rw"`` and ``"sym"``, and for
    ``"combinatorial"`` on row-stochastic graphs). Otherwise ``tau`` is read: one host sync
    (a tensor ``t`` without a bound, or the combinatorial Laplacian of a general graph, whose
    ``c`` is its largest out-degree).
    """
    bound = t if not isinstance(t, Tensor) else t_max
    if bound is not None and gen.scale_bound is not None:
        return min(gen.scale_bound * bound, TAU_CONVERGED)
    tau = _tau(gen, t)
    return float(tau.detach().max()) if tau.numel() else 0.0


def _tau(gen: GraphLaplacian, t: Tensor | float) -> Tensor:
    """``tau = c t`` in the accumulation dtype, shape ``batch_shape`` (``t`` broadcasts from the
    right, e.g. per head), at most ``TAU_CONVERGED``: formed in float64, so that no finite ``t``
    overflows (``t = 1e39`` would be inf in float32)."""
    tau = _converged_tau(gen.scale.to(torch.float64) * _as_tensor(t, gen.scale, torch.float64))
    return tau.to(accumulation_dtype(gen.graph.dtype))


def _converged_tau(tau: Tensor) -> Tensor:
    """``tau`` capped at ``TAU_CONVERGED`` (a tensor operation: no read of ``tau``; the gradient
    is 0 past the cap, as the derivative of the converged result is, to float64's rounding)."""
    return tau.clamp(max=TAU_CONVERGED)


def _as_tensor(t: Tensor | float, like: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """``t`` as a tensor in ``dtype`` (default: the accumulation dtype of ``like``),
    differentiable for a tensor."""
    dtype = dtype or accumulation_dtype(like.dtype)
    if isinstance(t, Tensor):
        return t.to(device=like.device, dtype=dtype)
    return torch.tensor(t, device=like.device, dtype=dtype)


def _series(
    graph: Graph, x: Tensor, t: Tensor | float, normalization: str, tol: float, t_max: float | None
) -> Tensor:
    gen = GraphLaplacian(graph, normalization)
    tau = _tau(gen, t)
    s, order = series_plan(_tau_max(gen, t, t_max), tol)
    step = (tau / s)[..., None, None]  # (..., 1, 1): per-graph weights, accumulation dtype
    y = x.to(step.dtype)
    segments = _segments(order, x, graph.signal_elements(x))
    for _ in range(s):
        weight = torch.exp(-step)  # e^{-tau} tau^k / k!, by recursion
        term = y.to(x.dtype)  # products with the graph in the signal's dtype
        acc = weight * y
        if segments is None:  # everything kept for the backward (small signals)
            _, acc, _ = _series_terms(gen.markov, term, weight, step, 1, order, acc)
        else:
            for first, last in segments:
                term, part, weight = checkpoint(
                    _series_terms, gen.markov, term, weight, step, first, last,
                    use_reentrant=False,
                )  # fmt: skip
                acc = acc + part
        y = acc
    return y.to(x.dtype)


def _segments(order: int, x: Tensor, elements: int | None = None) -> list[tuple[int, int]] | None:
    """The recomputed segments ``(first, last)`` of a series of terms ``1..order``: ``None``
    (store everything) for small signals or without gradients.

    The backward of segment ``j`` (counted from 0) holds the inputs of the ``j`` segments
    before it and the ``len_j`` terms it recomputes, so segments of decreasing length
    ``m, m - 1, ...`` with ``m (m + 1) / 2 >= order`` keep at most ``m ~ sqrt(2 order)``
    signals at once (4 for the 9 terms of t = 1, tol 1e-6), against ``2 sqrt(order)`` (6) for
    equal segments of ``sqrt(order)``.

    Example:
        >>> _segments(9, torch.zeros(1).expand(1 << 24))  # a large signal
        [(1, 4), (5, 7), (8, 9)]
    """
    size = x.numel() if elements is None else elements  # the graph's count (signal_elements)
    if not (torch.is_grad_enabled() and size >= CHECKPOINT_ELEMENTS):
        return None
    m = 1
    while m * (m + 1) // 2 < order:
        m += 1
    segments, first = [], 1
    for length in range(m, 0, -1):
        if first > order:
            break
        segments.append((first, min(order, first + length - 1)))
        first += length
    return segments


def _series_terms(
    fn: Callable[[Tensor], Tensor],
    term: Tensor,
    weight: Tensor,
    step: Tensor,
    first: int,
    last: int,
    acc: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Terms ``first..last`` of a series from ``term`` (the one before ``first``): the last
    term, the sum of the weighted terms (added to ``acc`` when given), and the last weight.
    A recomputed segment starts without ``acc``; the whole series of a small signal runs
    with it."""
    for k in range(first, last + 1):
        term = fn(term)
        weight = weight * step / k
        # acc + weight * term in one pass
        acc = weight * term if acc is None else torch.addcmul(acc, weight, term)
    assert acc is not None  # first <= last or an acc given
    return term, acc, weight


def propagation_step(
    fn: Callable[[Tensor], Tensor], x: Tensor, elements: int | None = None
) -> Tensor:
    """``fn(x)`` for one step of a series; recomputed in backward for large signals
    (:data:`CHECKPOINT_ELEMENTS`; ``elements``: the graph's count of ``x``,
    :meth:`~heatformer.graph_ops.Graph.signal_elements`), so the memory of a ``K``-term series
    is ``K`` signals."""
    size = x.numel() if elements is None else elements
    if torch.is_grad_enabled() and size >= CHECKPOINT_ELEMENTS:
        out: Tensor = checkpoint(fn, x, use_reentrant=False)
        return out
    return fn(x)


def _series_dense(
    graph: Graph, x: Tensor, t: Tensor | float, normalization: str, tol: float, t_max: float | None
) -> Tensor:
    return _series(graph.materialized(), x, t, normalization, tol, t_max)


def _series_dense_refuse(
    graph: Graph, t: Tensor | float, normalization: str, tol: float, t_max: float | None = None
) -> str | None:
    size = graph.materialized_bytes()
    if size is None:
        return "the graph has no explicit form that is cheaper to propagate"
    if size > MATERIALIZE_BUDGET_BYTES:
        return (
            f"its explicit weights take {size / 2**20:.0f} MiB, more than "
            f"MATERIALIZE_BUDGET_BYTES = {MATERIALIZE_BUDGET_BYTES / 2**20:.0f} MiB"
        )
    gen = GraphLaplacian(graph, normalization)
    s, order = series_plan(_tau_max(gen, t, t_max), tol)
    if s * order < 2:
        return "one propagation or none: materializing the weights would save nothing"
    return _series_refuse(graph, t, normalization, tol, t_max)


def _series_refuse(
    graph: Graph, t: Tensor | float, normalization: str, tol: float, t_max: float | None = None
) -> str | None:
    gen = GraphLaplacian(graph, normalization)
    tau_max = _tau_max(gen, t, t_max)
    s, order = series_plan(tau_max, tol)
    if s * order > SERIES_MAX_TERMS:
        return (
            f"needs {s * order} propagations (tau = c*t = {tau_max:.3g}; c is the largest "
            f"degree for the combinatorial Laplacian), more than SERIES_MAX_TERMS = "
            f"{SERIES_MAX_TERMS}"
        )
    return None


def _exact(
    graph: Graph, x: Tensor, t: Tensor | float, normalization: str, tol: float, t_max: float | None
) -> Tensor:
    # float64 whatever the input: the graph itself is recomputed in float64 (see DENSE_DTYPE)
    with full_precision(x.device.type):
        w = graph.to(DENSE_DTYPE).to_dense()  # (..., N, N)
        x64 = x.to(DENSE_DTYPE)
        t64 = _as_tensor(t, w, DENSE_DTYPE).expand(graph.batch_shape)
        squarings = None if isinstance(t, Tensor) else _squarings(t)
        if normalization == "sym":  # L_sym = S L_rw(W_s) S^-1, S = D^{1/2} (1 where d = 0)
            ws = 0.5 * (w + w.transpose(-1, -2))
            d = ws.sum(-1, keepdim=True)
            root = torch.where(d > 0, d, torch.ones_like(d)).sqrt()  # (..., N, 1)
            e = converged_expm(dense_laplacian(ws, "rw"), t64, squarings)
            y = root * (e @ (x64 / root))
        elif normalization == "rw":
            y = converged_expm(dense_laplacian(w, "rw"), t64, squarings) @ x64
        else:  # L = c (L / c), c the largest out-degree: exp(-t L) = exp(-(c t) (L / c))
            lap = dense_laplacian(w, "combinatorial")
            dmax = w.sum(-1).amax(-1) if graph.num_nodes else w.sum((-1, -2))
            c = torch.where(dmax > 0, dmax, torch.ones_like(dmax))
            known = squarings if graph.row_stochastic else None  # c = 1 (up to rounding)
            y = converged_expm(lap / c[..., None, None], c * t64, known) @ x64
    return y.to(x.dtype)


def _squarings(tau: float) -> int:
    """Squarings of a step ``h = tau / 2^s`` with ``h ||L|| <= 1`` for ``||L||_inf <= 2``."""
    tau = min(tau, TAU_CONVERGED)
    return 0 if tau <= 0.5 else min(MAX_SQUARINGS, math.ceil(math.log2(2.0 * tau)))


def converged_expm(lap: Tensor, tau: Tensor, squarings: int | None = None) -> Tensor:
    r"""``exp(-tau L)`` for Laplacians with zero row sums, accurate at every ``tau``.

    ``L`` has zero row sums and ``||L||_inf <= 2`` (``L_rw``, or ``L_comb / d_max``), so
    ``exp(-tau L)`` is row-stochastic for every ``tau``, and converges as ``tau -> inf`` to the
    spectral projector onto ``L``'s kernel (``1 pi^T`` for an irreducible walk; absorbing nodes
    -- rows without edges -- keep their value; every other eigenvalue has ``Re lambda > 0``).
    Computed by scaling and squaring, ``exp(-tau L) = exp(-h L)^{2^s}`` with ``h ||L|| <= 1``,
    the rows renormalized to sum 1 after every step: a rounding ``eps`` of ``L``'s row sums
    (its null space) would otherwise be amplified to ``e^{tau eps}`` (``4e-4`` at
    ``tau = 1e12`` for ``torch.linalg.matrix_exp`` and ``scipy.linalg.expm``, and NaN at
    ``1e300``), while the error of a component that decays stays bounded by its decay. The
    error is then about ``2^-53 ||L|| / g`` whatever ``tau``, ``g`` the spectral gap (the
    smallest ``Re lambda`` of a nonzero eigenvalue).

    ``tau`` is capped at ``TAU_CONVERGED = 2^58``: past it every eigenvalue with
    ``Re lambda >= 2^-52`` has decayed below ``e^{-64}``, so the result is the limit to
    float64's resolution (an eigenvalue closer to 0 than ``2^-52`` is not resolved from it by
    a float64 ``L``, and keeps ``e^{-2^58 lambda}``).

    Args:
        lap: ``(..., N, N)`` float64 Laplacians with zero row sums.
        tau: ``(...)`` times ``>= 0`` (differentiable).
        squarings: ``s`` when known on the host (a Python ``tau``); None takes
            ``MAX_SQUARINGS`` steps, each graph squaring only its own number of times, so
            ``tau`` is never read.

    Returns:
        ``(..., N, N)`` row-stochastic matrices.
    """
    tau = _converged_tau(tau)
    if squarings is not None:
        e = _stochastic(torch.linalg.matrix_exp(-(tau / 2.0**squarings)[..., None, None] * lap))
        for _ in range(squarings):
            e = _stochastic(e @ e)
        return e
    with torch.no_grad():  # per graph: 2^s >= 2 tau (0 for tau <= 1/2)
        own = torch.ceil(torch.log2(2.0 * tau.detach())).clamp(0, MAX_SQUARINGS)
    e = _stochastic(torch.linalg.matrix_exp(-(tau / torch.exp2(own))[..., None, None] * lap))
    for j in range(MAX_SQUARINGS):
        e = torch.where((own > j)[..., None, None], _stochastic(e @ e), e)
    return e


def _stochastic(e: Tensor) -> Tensor:
    """Rows divided by their sums (exactly 1 for ``exp(-h L)``, up to rounding)."""
    return e / e.sum(-1, keepdim=True)


def _exact_refuse(
    graph: Graph, t: Tensor | float, normalization: str, tol: float, t_max: float | None = None
) -> str | None:
    if graph.num_nodes > EXACT_MAX_NODES:
        return (
            f"forms the dense N x N Laplacian and costs O(N^3); N = {graph.num_nodes} > "
            f"EXACT_MAX_NODES = {EXACT_MAX_NODES}"
        )
    return None


#: One way to compute ``exp(-t L) x``: ``compute(graph, x, t, normalization, tol, t_max)`` and
#: ``refuse(graph, t, normalization, tol, t_max)`` (``t_max``: a bound of a tensor ``t`` known on
#: the host, or None).
HeatMethod = Method

HEAT_METHODS: dict[str, Method] = {
    "series-dense": Method(
        "series-dense", _series_dense, _series_dense_refuse,
        "the series on the graph's explicit weights, formed once: half the flops of "
        "recomputing them per term; B H N^2 memory, under MATERIALIZE_BUDGET_BYTES",
    ),
    "series": Method(
        "series", _series, _series_refuse,
        "positive Poisson-weighted series in M, one propagate per term; O(N) memory",
    ),
    "exact": Method(
        "exact", _exact, _exact_refuse,
        "exp(-tL) of the dense Laplacian in float64, converged at any t; O(N^3), small graphs",
    ),
}  # fmt: skip


def check_heat_method(method: object) -> str:
    """Check a method name: ``"auto"`` or a key of :data:`HEAT_METHODS`."""
    return check_method(method, HEAT_METHODS)


def select_heat_method(
    graph: Graph,
    t: Tensor | float,
    normalization: str,
    tol: float,
    method: str = "auto",
    t_max: float | None = None,
) -> Method:
    """Resolve ``method`` for this call; ``"auto"`` takes the first method that accepts it.

    Raises:
        ValueError: unknown method (lists the valid names), or a refused method / no method
            accepting the call (says why for each).
    """
    return select_method(HEAT_METHODS, method, "heat-kernel", graph, t, normalization, tol, t_max)


def heat_kernel(
    graph: Graph,
    x: Tensor,
    t: Tensor | float = 1.0,
    *,
    normalization: str = "rw",
    method: str = "auto",
    tol: float = 1e-6,
    t_max: float | None = None,
) -> Tensor:
    r"""Heat diffusion ``exp(-t L) x`` of a signal on a graph.

    Args:
        graph: any :class:`~heatformer.graph_ops.Graph`.
        x: ``(..., N, C)`` signal.
        t: diffusion time ``>= 0``: a float, or a tensor broadcasting (from the right) to the
            graph's batch shape, e.g. ``(H,)`` for one time per head. Differentiable.
        normalization: ``"rw"``, ``"sym"`` or ``"combinatorial"``.
        method: a key of :data:`HEAT_METHODS` or ``"auto"`` (series unless refused).
        tol: truncation tolerance of the series, relative to ``max|x|``.
        t_max: for a tensor ``t``, an upper bound of its values known on the host: the series
            is planned for ``t_max`` (its number of propagations is that of ``t_max``) instead
            of reading ``t`` on the device, so the call makes no host sync and traces under
            :func:`torch.compile` (``t`` above ``t_max`` is refused here, as the check reads
            ``t`` anyway; operators clamp instead, see :class:`~heatformer.graph_ops.
            HeatKernel`). Ignored for a float ``t``.

    Returns:
        ``(..., N, C)``.

    Large ``t``: ``exp(-tL)`` converges as ``t -> inf`` to the spectral projector onto the
    kernel of ``L`` (``1 pi^T x`` for an irreducible walk with stationary distribution
    ``pi``; a node without out-edges keeps its value and absorbs what reaches it; ``"sym"``:
    the orthogonal projector). Every finite ``t`` is accepted: ``tau = c t`` is capped at
    ``TAU_CONVERGED = 2^58``, past which every eigenvalue of ``L / c`` with real part at least
    ``2^-52`` (float64's resolution) has decayed below ``e^{-64}``, and ``"exact"`` (what
    ``"auto"`` takes once the series needs more than ``SERIES_MAX_TERMS`` propagations, for
    ``N <= EXACT_MAX_NODES``) keeps the null space exact while it squares
    (:func:`converged_expm`): its error is about ``2^-53 ||L|| / g`` whatever ``t``, ``g`` the
    spectral gap, where a plain ``matrix_exp`` drifts by ``t 2^-53`` and is NaN past
    ``t ~ 1e300``. The cap and the dense route read nothing of a tensor ``t`` on the host; the
    series plans its terms from ``tau = c t`` known on the host (a float ``t``, or ``t_max``,
    and ``c`` known without reading the weights: always but for the combinatorial Laplacian of
    a graph that is not row-stochastic), else it reads its largest ``tau`` (one host sync).
    This function checks a tensor ``t`` (finite, ``>= 0``, ``<= t_max``) by reading it; the
    operator :class:`~heatformer.graph_ops.HeatKernel` reads nothing per call.

    Raises:
        ValueError: negative or NaN ``t``, ``t`` above ``t_max``, ``tol`` outside (0, 1),
            unknown or refused method
            (a large ``t`` on ``N > EXACT_MAX_NODES`` nodes: the series would need too many
            propagations and the dense route is too large).

    Example:
        >>> import torch
        >>> from heatformer.graph_ops import DenseGraph
        >>> g = DenseGraph(torch.tensor([[0., 1.], [1., 0.]], dtype=torch.float64))
        >>> x = torch.tensor([[1.], [0.]], dtype=torch.float64)
        >>> heat_kernel(g, x, 1.0).squeeze(-1)      # (1 ± e^{-2}) / 2
        tensor([0.5677, 0.4323], dtype=torch.float64)
    """
    graph = check_graph(graph)
    V.check_signal(x, graph.num_nodes, graph.batch_shape, graph.dtype)
    t = V.check_time(t)
    tol = V.check_tol(tol)
    V.check_normalization(normalization)
    t_max = _check_t_max(t, t_max, graph.batch_shape)
    return _heat_kernel(graph, x, t, normalization, method, tol, t_max)


def _check_t_max(t: Tensor | float, t_max: float | None, batch_shape: torch.Size) -> float | None:
    """``t_max`` of :func:`heat_kernel` as a float ``>= 0`` (or None), after checking a tensor
    ``t`` (checked ``>= 0`` already) against it and against ``batch_shape``: ``t`` broadcasts
    to it and has no value above ``t_max`` (read on the host)."""
    if isinstance(t, Tensor):
        try:
            ok = torch.broadcast_shapes(t.shape, batch_shape) == batch_shape
        except RuntimeError:
            ok = False
        if not ok:
            raise V.bad_value(
                "t",
                f"expected a shape that broadcasts (from the right) to the graph's batch "
                f"shape {tuple(batch_shape)}, e.g. one time per head; got {tuple(t.shape)}",
            )
    if t_max is not None:
        if isinstance(t_max, Tensor):
            raise V.bad_type("t_max", "expected a float (a bound known on the host), got a Tensor")
        t_max = float(V.check_time(t_max, name="t_max"))
        if isinstance(t, Tensor) and t.numel() and bool((t.detach() > t_max).any()):
            raise V.bad_value("t", f"expected values <= t_max = {t_max:g}, got {t.max():g}")
    return t_max


def _heat_kernel(
    graph: Graph,
    x: Tensor,
    t: Tensor | float,
    normalization: str,
    method: str,
    tol: float,
    t_max: float | None = None,
) -> Tensor:
    """:func:`heat_kernel` on checked arguments: reads nothing of ``t`` or the graph on the
    host when the plan is known there (see :func:`_tau_max`); the operator's path."""
    chosen = select_heat_method(graph, t, normalization, tol, method, t_max)
    return chosen.compute(graph, x, t, normalization, tol, t_max)
