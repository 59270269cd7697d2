"""The combination matrix: every registered operator x graph kind x dtype x entry point.

Generated from the registries -- :data:`~heatformer.graph_ops.OPERATORS` with each operator's
``examples`` and :data:`~heatformer.graph_ops.GRAPHS` with each kind's ``examples`` -- so a new
operator or graph kind is covered without editing this file. Each cell either

- returns finite values that agree with the float64 computation on the same (rounded) inputs,
  on the same device, within the tolerance of its device and dtype (``TOL`` in
  ``tests/device_helpers.py``); the float64 cells agree with the operator
  applied to the graph's explicit weights (``DenseGraph(graph.to_dense())``), and the layer
  with its documented per-head definition; or
- is a refusal the library declares (:func:`expected_refusal`), raised as ``ValueError`` whose
  message starts with the argument's name.

Entry points: the functional call ``op(graph, x)``, ``DiffusionAttention`` forward and
backward, ``GPT.generate`` with and without the KV cache, and ``heatformer train`` for two
steps (with ``--precision bf16`` and ``--topk``).

Devices: every computing cell takes a ``device`` (``DEVICES``: the CPU; CUDA where available,
marked ``cuda``; last in the test id, ``test_functional[...-float32-cpu]``); its inputs are
drawn on the CPU and moved there, its layers and operators moved with ``.to(device)``, and
its float64 reference computed on the same device. ``heatformer train`` runs with
``--device cpu`` or ``--device cuda``. The registry cells at the end (what each entry
declares, checked on tiny float64 inputs: nothing device-specific) are CPU only.

Low-precision inputs: queries, keys, the layer's input and its ``in_proj`` weights are small
integers, so attention scores are exact in every dtype and a data-dependent graph (top-k)
selects the same edges everywhere; only the arithmetic after the scores differs.
"""

from __future__ import annotations

import copy
import json
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from device_helpers import DEVICES, TOL, tolerance
from heatformer._spec import format_entry
from heatformer.graph_ops import (
    GRAPHS,
    OPERATORS,
    DenseGraph,
    DiffusionOperator,
    Graph,
    GraphBuilder,
    SparseGraph,
    resolve_graph,
    resolve_operator,
    split_maps,
)
from heatformer.graph_ops.sparse import trusted_sparse_graph
from heatformer.models import GPT, DiffusionAttention, GPTConfig, KVCache
from heatformer.models.heads import format_operator

#: the dtypes of the matrix (their tolerances per device: ``TOL`` in tests/device_helpers.py)
DTYPES = list(TOL["cpu"])

#: every registered operator with each of the parameter sets it declares
OPERATOR_CASES = [
    pytest.param(name, params, id=format_operator(name, params))
    for name, cls in OPERATORS.items()
    for params in cls.examples
]

#: every registered graph kind with each of its examples
KINDS = [
    format_entry(name, params, sep=",") for name, cls in GRAPHS.items() for params in cls.examples
]


@dataclass(frozen=True)
class GraphCase:
    """A graph kind (spec), and whether the graph is causal and key-masked."""

    kind: str
    causal: bool = False
    masked: bool = False  # batch element 1 has its first 3 keys padded (left padding)

    @property
    def builder(self) -> GraphBuilder:
        return resolve_graph(self.kind)


#: causal and masked together: rows 0-2 of element 1 have no edges at all
GRAPH_CASES = {
    f"{kind}{'-causal' if causal else ''}{'-masked' if masked else ''}": GraphCase(
        kind, causal, masked
    )
    for kind in KINDS
    for causal in (False, True)
    for masked in (False, True)
}

B, H, N, E, C = 2, 2, 9, 4, 3


def _dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def expected_refusal(op: DiffusionOperator, case: GraphCase, entry: str) -> str | None:
    """The refusal a cell must raise (a regex on the message), or None when it must compute.

    Asked of the registry entries, never of their classes: a causal layer refuses operators
    that read ``W^T``, and graph kinds refuse what they declare they do not support.
    """
    builder = case.builder
    if entry == "functional":
        return None
    if case.causal and not builder.supports_causal:
        return r"^graph: expected a graph kind that supports causal=True"
    if case.masked and not builder.supports_key_mask:
        return r"^key_mask: "
    if case.causal and op.reads_transpose:
        return r"^operators: expected heads that read only the past"
    return None


def assert_agrees(
    actual: Tensor, expected: Tensor, dtype: torch.dtype, what: str, truncation: float = 0.0
) -> None:
    """Finite, the input dtype, on the reference's device, and within ``tolerance(device,
    dtype)`` of the float64 result (plus twice a series' declared truncation ``tol``: two
    computations may truncate differently)."""
    assert actual.dtype == dtype, f"{what}: dtype {actual.dtype}, expected {dtype}"
    assert actual.device == expected.device, f"{what}: on {actual.device}, not {expected.device}"
    assert bool(torch.isfinite(actual).all()), f"{what}: non-finite values in {dtype}"
    assert bool(torch.isfinite(expected).all()), f"{what}: non-finite float64 reference"
    actual, expected = actual.detach().double(), expected.detach().double()
    err = float((actual - expected).abs().max())
    scale = float(expected.abs().max()) + 1.0
    bound = (tolerance(actual.device, dtype) + 2 * truncation) * scale
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}"


def _truncation(op: torch.nn.Module) -> float:
    """The truncation tolerance an operator declares (``tol``; 0 when it has none)."""
    return float(getattr(op, "tol", 0.0))


def _key_mask(n: int, device: torch.device | str = "cpu") -> Tensor:
    key_mask = torch.ones(B, n, dtype=torch.bool, device=device)
    key_mask[1, :3] = False
    return key_mask


# ---- functional: op(graph, x) -------------------------------------------------------------------


def _inputs(seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """Integer queries/keys (exact scores in every dtype) and a float signal."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-2, 3, (B, H, N, E), generator=gen).double()
    k = torch.randint(-2, 3, (B, H, N, E), generator=gen).double()
    x = torch.randn(B, H, N, C, generator=gen, dtype=torch.float64)
    return q, k, x


def _graph(case: GraphCase, q: Tensor, k: Tensor, maps: int = 1) -> Graph:
    """The case's graph of ``q``, ``k``; for an operator with ``maps > 1`` attention maps per
    head (asked of the entry), the maps from the channels of ``q``, ``k`` as a layer splits
    them (batch shape ``(B, H, maps)``)."""
    key_mask = _key_mask(N, q.device) if case.masked else None  # (B, N)
    if maps > 1:
        q, k = split_maps(q, maps), split_maps(k, maps)  # (B, H, maps, N, E / maps)
    return case.builder.build(q, k, key_mask=key_mask, causal=case.causal)


@pytest.mark.parametrize("device", DEVICES)  # last in the id: test[...-cpu]
@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("case_name", list(GRAPH_CASES))
@pytest.mark.parametrize(("name", "params"), OPERATOR_CASES)
def test_functional(
    name: str, params: dict[str, Any], case_name: str, dtype: torch.dtype, device: torch.device
) -> None:
    case = GRAPH_CASES[case_name]
    q, k, x = (t.to(device) for t in _inputs())
    op = resolve_operator(name, **params).to(device)
    reference_op = copy.deepcopy(op).double()  # the same parameters, in float64
    q, k, x = q.to(dtype), k.to(dtype), x.to(dtype)
    y = op(_graph(case, q, k, op.maps), x)
    graph64 = _graph(case, q.double(), k.double(), op.maps)
    if dtype == torch.float64:  # against the operator on the graph's explicit weights
        expected = reference_op(DenseGraph(graph64.to_dense()), x)
    else:  # against float64 on the same rounded inputs
        expected = reference_op(graph64, x.double())
    assert_agrees(y, expected, dtype, f"{name}{params} on {case_name}", _truncation(op))


# ---- DiffusionAttention: forward and backward ---------------------------------------------------


def _layer_spec(name: str, params: dict[str, Any]) -> str:
    """Two heads: plain attention (the fused path) next to the operator under test."""
    return f"attention:1,{format_operator(name, params)}:1"


def _integer_layer(layer: DiffusionAttention) -> DiffusionAttention:
    """Queries and keys made of small integers: in_proj weights in {-1, 0, 1}, no bias."""
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        w = torch.randint(-1, 2, layer.in_proj.weight.shape, generator=gen)
        layer.in_proj.weight.copy_(w.to(layer.in_proj.weight.dtype))
        if layer.in_proj.bias is not None:
            layer.in_proj.bias.zero_()
    return layer


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("case_name", list(GRAPH_CASES))
@pytest.mark.parametrize(("name", "params"), OPERATOR_CASES)
def test_layer_forward_backward(
    name: str, params: dict[str, Any], case_name: str, dtype: torch.dtype, device: torch.device
) -> None:
    case = GRAPH_CASES[case_name]
    mask = _key_mask(N, device) if case.masked else None
    layer = _layer_or_refusal(name, params, case, dtype, mask, device)
    if layer is None:
        return
    layer = _integer_layer(layer)
    reference = copy.deepcopy(layer).double()
    gen = torch.Generator().manual_seed(1)
    x64 = torch.randint(-1, 2, (B, N, 8), generator=gen).double().to(device)
    probe = torch.randn(B, N, 8, generator=gen, dtype=torch.float64).to(device)
    x = x64.to(dtype)
    outs = _run_layer(layer, x, mask, probe)
    _assert_layer_agrees(layer, outs, _run_layer(reference, x64, mask, probe), case_name)
    if dtype == torch.float64:  # the layer against its documented per-head definition
        per_head = _per_head_reference(layer, x, mask)
        truncation = max(_truncation(op) for op in layer.head_operators)
        what = f"{layer.spec} on {case_name}: per head"
        assert_agrees(outs[0], per_head, dtype, what, truncation)


def _layer_or_refusal(
    name: str,
    params: dict[str, Any],
    case: GraphCase,
    dtype: torch.dtype,
    mask: Tensor | None,
    device: torch.device,
) -> DiffusionAttention | None:
    """The cell's layer (two heads: attention and the operator; ``d_model = 8``) on ``device``,
    or None once the refusal it must raise is checked."""
    spec = _layer_spec(name, params)
    torch.manual_seed(0)

    def build() -> DiffusionAttention:  # drawn in float32, then cast: for one seed, torch 2.4
        # draws other half-precision weights than 2.13 (which rounds its float32 draw)
        return DiffusionAttention(
            8, 2, spec, graph=case.kind, causal=case.causal, dtype=torch.float32
        ).to(device, dtype)  # the same weights on every device

    refusal = expected_refusal(resolve_operator(name, **params), case, "layer")
    if refusal is None:
        return build()
    with pytest.raises(ValueError, match=refusal):
        build()(torch.zeros(B, N, 8, dtype=dtype, device=device), mask)
    return None


def _run_layer(
    model: DiffusionAttention, x: Tensor, mask: Tensor | None, probe: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Output, gradient in ``x`` and in the input projection, of the loss ``<y, probe>``."""
    x = x.detach().requires_grad_(True)
    y = model(x, mask)
    (y.double() * probe).sum().backward()
    assert x.grad is not None and model.in_proj.weight.grad is not None
    return y.detach(), x.grad, model.in_proj.weight.grad


def _assert_layer_agrees(
    layer: DiffusionAttention, outs: tuple[Tensor, ...], refs: tuple[Tensor, ...], case_name: str
) -> None:
    truncation = max(_truncation(op) for op in layer.head_operators)
    dtype = layer.in_proj.weight.dtype
    for what, actual, expected in zip(("output", "grad x", "grad in_proj"), outs, refs):
        assert_agrees(actual, expected, dtype, f"{layer.spec} on {case_name}: {what}", truncation)


def _per_head_reference(layer: DiffusionAttention, x: Tensor, key_mask: Tensor | None) -> Tensor:
    """``y[:, h] = op_h(DenseGraph(P_h), v_h)`` with ``P_h`` the explicit weights of the layer's
    graph kind (the docstring's "equivalent to"); a head that reads ``W^T`` also drops padded
    queries' out-edges."""
    with torch.no_grad():
        q, k, v = layer.project_qkv(x)
        heads = []
        for h, op in enumerate(layer.head_operators):
            qh, kh = q[:, h : h + 1], k[:, h : h + 1]
            if op.maps > 1:  # the head's maps from its channels (B, 1, maps, N, Dh / maps)
                qh, kh = split_maps(qh, op.maps), split_maps(kh, op.maps)
            graph = layer.graph_kind.build(
                qh, kh, key_mask=key_mask, drop_masked_queries=op.reads_transpose,
                causal=layer.causal,
            )  # fmt: skip
            heads.append(op(DenseGraph(graph.to_dense()), v[:, h : h + 1]))
        return layer.merge_heads(torch.cat(heads, dim=1))


# ---- large logits in half precision: forward and backward ---------------------------------------

#: the half dtypes, where scores formed in the input's dtype lose (float16: overflow past 65504;
#: bfloat16: a logit of 65536 rounded by up to 256)
HALF = [torch.float16, torch.bfloat16]
#: standard deviation of the large queries and keys: ``q . k`` has a standard deviation of
#: ``2 * 256^2 = 131072`` for ``E = 4``, so most float16 products overflow
LARGE = 256.0
#: the graph cases of the large-logit cells (fewer than the matrix's four per kind, to keep
#: them fast): functional calls on the unmasked (fused) graphs and on causal graphs with
#: padded keys (rows without edges); layers with padded keys, bidirectional (where the
#: symmetrizing heads run)
LARGE_FUNCTIONAL_CASES = [
    c for c in GRAPH_CASES if c.endswith("-causal-masked") or not c.endswith(("-causal", "-masked"))
]
LARGE_LAYER_CASES = [c for c in GRAPH_CASES if c.endswith("-masked") and "-causal" not in c]


def _assert_float16_overflows(q: Tensor, k: Tensor) -> None:
    """The regime of the cells: some float16 product ``q k^T`` overflows."""
    products = q.detach().half() @ k.detach().half().transpose(-1, -2)
    assert bool(products.isinf().any()), "inputs too small: no float16 product overflows"


def _with_rounded_weights(graph64: Graph, rounded: Graph) -> Graph:
    """``graph64`` carrying the values of ``rounded`` (its half-precision twin) where the graph
    stores weights (top-k): the operator then sees the same rounded weights in both dtypes,
    as it sees the same rounded ``q``, ``k`` elsewhere; gradients stay those of ``graph64``.

    Large logits make top-k weights nearly 0 or 1, and half precision keeps a weight that
    underflows at the dtype's smallest subnormal (6e-8 in float16): PPR at ``alpha = 1e-6``
    amplifies such a difference by up to ``1 / alpha``, a fact about the rounded graph, not
    about the operator. The two graphs are checked to keep the same edges with weights
    within ``TOL``.
    """
    if not isinstance(graph64, SparseGraph):
        return graph64  # recomputed from q, k in float64 wherever an operator needs more
    assert isinstance(rounded, SparseGraph)
    assert torch.equal(rounded.row, graph64.row) and torch.equal(rounded.col, graph64.col)
    assert_agrees(rounded.weight, graph64.weight, rounded.dtype, "top-k weights")
    weight = graph64.weight + (rounded.weight.double() - graph64.weight).detach()
    return trusted_sparse_graph(
        graph64.row, graph64.col, weight, num_nodes=graph64.num_nodes,
        batch_shape=graph64.batch_shape, sort=False,
    )  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF, ids=_dtype_id)
@pytest.mark.parametrize("case_name", LARGE_FUNCTIONAL_CASES)
@pytest.mark.parametrize(("name", "params"), OPERATOR_CASES)
def test_functional_large_logits(
    name: str, params: dict[str, Any], case_name: str, dtype: torch.dtype, device: torch.device
) -> None:
    """Random ``q``, ``k`` of size 256 (most float16 products overflow; the softmax is nearly
    one-hot): finite, and within ``TOL`` of float64 on the same rounded inputs, forward and
    backward. The scores are formed in float32, whose rounding (at most ``E 2^-24`` of the
    largest product, about 0.07 in a logit near 6e4) moves a weight only in a row whose two
    largest logits are that close, which these inputs do not have; top-k selects on the same
    float32 scores, so it keeps the edges float64 keeps (checked)."""
    case = GRAPH_CASES[case_name]
    gen = torch.Generator().manual_seed(11)
    q64, k64 = (torch.randn(B, H, N, E, generator=gen, dtype=torch.float64) * LARGE for _ in "qk")
    x64 = torch.randn(B, H, N, C, generator=gen, dtype=torch.float64)
    probe = torch.randn(B, H, N, C, generator=gen, dtype=torch.float64)
    probe = probe.to(device)
    q64, k64, x64 = (t.to(device, dtype).double() for t in (q64, k64, x64))  # rounded inputs
    _assert_float16_overflows(q64, k64)
    op = resolve_operator(name, **params).to(device)
    reference_op = copy.deepcopy(op).double()
    leaves = [t.to(dtype).requires_grad_(True) for t in (q64, k64, x64)]
    leaves64 = [t.clone().requires_grad_(True) for t in (q64, k64, x64)]
    graph = _graph(case, *leaves[:2], op.maps)
    graph64 = _with_rounded_weights(_graph(case, *leaves64[:2], op.maps), graph)
    results = []
    for module, g, inputs in ((op, graph, leaves), (reference_op, graph64, leaves64)):
        y = module(g, inputs[2])
        (y.double() * probe).sum().backward()
        # no gradient (an operator that reads only the graph's structure, e.g. mean pooling)
        # is a zero gradient, in both dtypes alike
        results.append([y.detach()] + [torch.zeros_like(t) if t.grad is None else t.grad
                                       for t in inputs])  # fmt: skip
    for what, actual, expected in zip(("output", "grad q", "grad k", "grad x"), *results):
        assert_agrees(actual, expected, dtype, f"{name}{params} on {case_name}: {what}",
                      _truncation(op))  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF, ids=_dtype_id)
@pytest.mark.parametrize("case_name", LARGE_LAYER_CASES)
@pytest.mark.parametrize(("name", "params"), OPERATOR_CASES)
def test_layer_large_logits(
    name: str, params: dict[str, Any], case_name: str, dtype: torch.dtype, device: torch.device
) -> None:
    """``DiffusionAttention(..., dtype=dtype)`` whose query and key projections are 32 times
    those of :func:`test_layer_forward_backward`, on integer inputs in ``[-4, 4]``: ``q``, ``k``
    are multiples of 32 below 1024 (exact in every dtype), so the logits are exact in float32
    and distinct ones differ by at least 512 (a one-hot softmax; no tie in these inputs, so
    the true gradients stay within float16's range), most float16 products overflow, and the
    layer agrees with float64 forward and backward (top-k weights as the half graph rounds
    them, see :func:`_with_rounded_weights`)."""
    case = GRAPH_CASES[case_name]
    mask = _key_mask(N, device) if case.masked else None
    layer = _layer_or_refusal(name, params, case, dtype, mask, device)
    if layer is None:
        return
    layer = _integer_layer(layer)
    with torch.no_grad():
        layer.in_proj.weight[:16] *= 32  # the query and key rows
    reference = copy.deepcopy(layer).double()
    kind, build_graph = reference.graph_kind, reference.graph_kind.build

    def build_rounded(q: Tensor, k: Tensor, **kwargs: Any) -> Graph:
        rounded = build_graph(q.detach().to(dtype), k.detach().to(dtype), **kwargs)
        return _with_rounded_weights(build_graph(q, k, **kwargs), rounded)

    kind.build = build_rounded  # type: ignore[method-assign]  # this copy's builder only
    gen = torch.Generator().manual_seed(1)
    x64 = torch.randint(-4, 5, (B, N, 8), generator=gen).double().to(device)
    probe = torch.randn(B, N, 8, generator=gen, dtype=torch.float64).to(device)
    with torch.no_grad():
        _assert_float16_overflows(*reference.project_qkv(x64)[:2])
    outs = _run_layer(layer, x64.to(dtype), mask, probe)
    _assert_layer_agrees(layer, outs, _run_layer(reference, x64, mask, probe), case_name)


def _one_step(op: DiffusionOperator) -> bool:
    """Whether a layer serves the operator from one propagation per map (what a KV cache
    needs): affine in one propagation, or a combination of its maps' propagations."""
    return op.affine_coefficients() is not None or op.combines_maps


#: the cells of KV-cache decoding: every operator example that a cache serves exactly (one
#: propagation per map) on every graph kind that decodes incrementally
CACHED_CASES = [
    pytest.param(name, params, kind, id=f"{format_operator(name, params)}-{kind}")
    for name, cls in OPERATORS.items()
    for params in cls.examples
    if _one_step(resolve_operator(name, **params))
    for kind in KINDS
    if resolve_graph(kind).incremental
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF, ids=_dtype_id)
@pytest.mark.parametrize(("name", "params", "kind"), CACHED_CASES)
def test_cached_decoding_large_logits(
    name: str, params: dict[str, Any], kind: str, dtype: torch.dtype, device: torch.device
) -> None:
    """Decoding from the KV cache (what ``GPT.generate`` runs), on the large logits of
    :func:`test_layer_large_logits` in a causal layer: a prompt of 5 tokens, then one token
    per step, agrees with the float64 layer on the whole sequence (top-k decoding formed its
    scores in float16: NaN past 65504)."""
    layer = _layer_or_refusal(name, params, GraphCase(kind, causal=True), dtype, None, device)
    assert layer is not None and layer.supports_cache
    layer = _integer_layer(layer).eval()
    with torch.no_grad():
        layer.in_proj.weight[:16] *= 32  # the query and key rows
    reference = copy.deepcopy(layer).double()
    x64 = torch.randint(-4, 5, (B, N, 8), generator=torch.Generator().manual_seed(1)).double()
    x64 = x64.to(device)
    x, cache = x64.to(dtype), KVCache()
    with torch.no_grad():
        _assert_float16_overflows(*reference.project_qkv(x64)[:2])
        steps = [layer(x[:, :5], cache=cache)]
        steps += [layer(x[:, i : i + 1], cache=cache) for i in range(5, N)]
        expected = reference(x64)
    assert_agrees(torch.cat(steps, dim=1), expected, dtype, f"{layer.spec} on {kind}: cached")


# ---- GPT.generate with and without the KV cache -------------------------------------------------

GENERATE_DTYPES = [torch.float64, torch.float32, torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", GENERATE_DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("name", "params"), OPERATOR_CASES)
def test_generate(
    name: str, params: dict[str, Any], kind: str, dtype: torch.dtype, device: torch.device
) -> None:
    config = GPTConfig(
        vocab_size=16, block_size=20, n_layer=2, n_head=2, n_embd=8,
        heads=_layer_spec(name, params), graph=kind,
    )  # fmt: skip
    op = resolve_operator(name, **params)
    refusal = expected_refusal(op, GraphCase(kind, causal=True), "generate")
    torch.manual_seed(0)
    if refusal is not None:
        with pytest.raises(ValueError, match=refusal):
            GPT(config)
        return
    model = GPT(config).to(device, dtype).eval()  # the same weights on every device
    incremental = resolve_graph(kind).incremental and _one_step(op)
    assert model.supports_cache == incremental  # asked of the entries, as the model does
    prompt = torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(2))
    prompt = prompt.to(device)

    def sample(use_cache: bool) -> Tensor:  # top_k=1 is greedy up to ties, drawn reproducibly
        draws = torch.Generator(device).manual_seed(3)  # sampling draws on the model's device
        return model.generate(prompt, 8, top_k=1, use_cache=use_cache, generator=draws)

    cached, recomputed = sample(True), sample(False)
    assert cached.shape == (2, 13) and torch.equal(cached[:, :5], prompt)
    assert int(cached.min()) >= 0 and int(cached.max()) < 16
    if dtype != torch.bfloat16:  # greedy tokens: a bfloat16 near-tie may flip between paths
        assert torch.equal(cached, recomputed)
    # the logits of incremental decoding equal those of the full sequence
    with torch.no_grad():
        full = model(cached)
        reference = copy.deepcopy(model).double()(cached)
    assert_agrees(full, reference, dtype, f"{config.heads} logits")
    if model.supports_cache:
        caches = [KVCache() for _ in model.blocks]
        with torch.no_grad():
            steps = [model(cached[:, :5], caches)] + [
                model(cached[:, i : i + 1], caches) for i in range(5, 13)
            ]
        assert_agrees(torch.cat(steps, dim=1), reference, dtype, f"{config.heads} cached logits")
    else:  # the documented fallback: exactly what use_cache=False computes
        assert torch.equal(cached, recomputed)


# ---- the command line: heatformer train for two steps -------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(0)
    words = "heat kernel laplacian attention graph token layer head".split()
    path = tmp_path_factory.mktemp("matrix-corpus") / "corpus.txt"
    path.write_text(" ".join(rng.choice(words) for _ in range(3000)) + "\n")
    return path


CLI_VARIANTS = {
    "plain": [],
    "bf16": ["--precision", "bf16"],
    "topk": ["--topk", "4"],
    "bf16-topk": ["--precision", "bf16", "--topk", "4"],
    "digits": [],  # a ViT on 8x8 digits: bidirectional, where symmetrizing heads are allowed
    # every registered graph kind's examples through --graph (the defaults' runs only)
    **{f"graph={kind}": ["--graph", kind] for kind in KINDS if kind != "softmax"},
}
CLI_SECOND = ["plain", "digits"]
#: the --graph variants, each with every other operator's defaults in turn (the graph kinds'
#: own cells are the layer tests'; these check that --graph reaches them through the command)
_GRAPH_VARIANTS = [v for v in CLI_VARIANTS if v.startswith("graph=")]


def _cli_variants(index: int, example: int) -> list[str]:
    """The variants of operator number ``index``'s example number ``example``: the defaults in
    every variant but the --graph ones, which take turns across the operators; the first other
    example plain and on digits; the remaining examples plain."""
    if example > 0:
        return CLI_SECOND if example == 1 else ["plain"]
    turn = [v for i, v in enumerate(_GRAPH_VARIANTS) if i % 2 == index % 2]
    return [v for v in CLI_VARIANTS if not v.startswith("graph=")] + turn


CLI_CASES = [
    pytest.param(name, params, variant, id=f"{format_operator(name, params)}-{variant}")
    for index, (name, cls) in enumerate(OPERATORS.items())
    for i, params in enumerate(cls.examples)
    for variant in _cli_variants(index, i)
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("name", "params", "variant"), CLI_CASES)
def test_cli_train(
    name: str,
    params: dict[str, Any],
    variant: str,
    device: torch.device,
    corpus: Path,
    tmp_path: Path,
    capsys,
) -> None:
    """``heatformer train`` in this process, on ``--device cpu`` or ``--device cuda``."""
    from heatformer.lab.cli import main

    heads = _layer_spec(name, params)
    out = tmp_path / "run"
    common = [
        "train", "--heads", heads, "--steps", "2", "--batch-size", "2", "--layers", "1",
        "--embd", "8", "--eval-every", "2", "--analysis-size", "2", "--device", str(device),
        "--no-progress", "--out", str(out),
    ]  # fmt: skip
    if variant == "digits":
        task = ["--task", "digits", "--patch-size", "4"]
    else:
        task = ["--text", str(corpus), "--seq-len", "12", "--eval-size", "2"]
    code = main([*common, *task, *CLI_VARIANTS[variant]])
    err = capsys.readouterr().err
    causal = variant != "digits"
    case = GraphCase("softmax", causal=causal)
    refusal = expected_refusal(resolve_operator(name, **params), case, "layer")
    if refusal is not None:  # refused before any training, naming the option
        assert code == 2, err
        assert re.search(r"error: --heads: .*'sym' normalization", err), err
        assert not (out / "runs").exists()
        return
    assert code == 0, err
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    assert len(run["train_loss"]) == 2
    assert all(math.isfinite(v) for v in run["train_loss"])
    assert all(math.isfinite(v) for v in run["final"].values())
    graph = CLI_VARIANTS[variant][1] if variant.startswith("graph=") else "softmax"
    if variant in ("topk", "bf16-topk"):  # --topk 4: the shorthand for --graph topk[k=4]
        graph = "topk[k=4]"
    assert "topk" not in run["model_config"]
    assert run["model_config"]["graph"] == graph
    assert all(
        value is None or math.isfinite(value)
        for values in run["analysis"].values()
        for value in values
    )


# ---- the registry itself ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_every_operator_declares_default_and_other_examples(name: str) -> None:
    """A new operator joins the matrix with its defaults and at least one other setting."""
    examples = OPERATORS[name].examples
    assert examples[0] == {} and len(examples) >= (1 if name == "attention" else 2)
    for params in examples:
        resolve_operator(name, **params)  # each one builds


@pytest.mark.parametrize(("name", "params"), OPERATOR_CASES)
def test_reads_transpose_is_declared_truthfully(name: str, params: dict[str, Any]) -> None:
    """On a causal graph, a later token reaches earlier outputs exactly when the operator
    declares that it reads ``W^T`` (what a causal layer asks before refusing it)."""
    op = resolve_operator(name, **params).double()
    q, k, x = _inputs(5)
    causal = GraphCase("softmax", causal=True)
    y = op(_graph(causal, q, k, op.maps), x)
    q2, k2, x2 = q.clone(), k.clone(), x.clone()
    k2[..., -1, :] += 1.0
    x2[..., -1, :] += 1.0
    y2 = op(_graph(causal, q2, k2, op.maps), x2)
    leaks = not torch.allclose(y2[..., :-1, :], y[..., :-1, :], atol=1e-12, rtol=0)
    assert leaks == op.reads_transpose


@pytest.mark.parametrize(("name", "params"), OPERATOR_CASES)
def test_affine_coefficients_are_declared_truthfully(name: str, params: dict[str, Any]) -> None:
    """An operator that declares ``(a, b)`` computes ``a D^+ W x + b I' x`` on any graph (the
    fused path and the KV cache serve it from that formula alone)."""
    op = resolve_operator(name, **params).double()
    pair = op.affine_coefficients()
    if pair is None:
        pytest.skip(f"{name} is not affine in one propagation")
    a, b = (float(c) for c in pair)
    q, k, x = _inputs(6)
    w = torch.rand(B, H, N, N, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    w[..., 4, :] = 0.0  # a node without out-edges
    for graph in (DenseGraph(w), _graph(GraphCase("softmax", True, True), q, k)):
        dense = graph.to_dense()
        degree = dense.sum(-1, keepdim=True)
        walk = torch.where(degree > 0, dense / degree.clamp_min(1e-300), 0.0)
        expected = a * walk @ x + b * (degree > 0).double() * x
        torch.testing.assert_close(op(graph, x), expected, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("kind", KINDS)
def test_graph_kind_specs_round_trip_and_declare_their_capabilities(kind: str) -> None:
    builder = resolve_graph(kind)
    assert resolve_graph(builder.spec) == builder and builder.spec == kind
    assert isinstance(builder.supports_causal, bool) and isinstance(builder.incremental, bool)
    q, k, _ = _inputs(8)
    graph = builder.build(q, k, causal=builder.supports_causal)
    assert graph.num_nodes == N and tuple(graph.batch_shape) == (B, H)
