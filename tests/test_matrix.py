"""The combination matrix: every registered operator x graph kind x dtype x entry point.

Generated from the registries, so a new operator (with its ``examples``) is covered without
editing this file. Each cell either

- returns finite values that agree with the float64 computation on the same (rounded) inputs,
  within the tolerance of its dtype (:data:`TOL`), the float64 cells themselves agreeing with
  an independent dense reference (NumPy attention matrix, then the operator on a
  ``DenseGraph``); or
- is a refusal the library declares (:func:`expected_refusal`), raised as ``ValueError`` whose
  message starts with the argument's name.

Entry points: the functional call ``op(graph, x)``, ``DiffusionAttention`` forward and
backward, ``GPT.generate`` with and without the KV cache, and ``heatformer train`` for two
steps (with ``--bf16`` and ``--topk``).

Low-precision inputs: queries and keys are small integers, so attention scores are exact in
every dtype and top-k selects the same keys everywhere; only the arithmetic after the scores
differs. In layer cells (learned projections, not integers) a half-precision top-k layer keeps
``k = N`` keys (the sparse path with a selection that cannot flip on a rounding).
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

import numpy as np
import pytest
import torch
from torch import Tensor

from heatformer.graph_ops import OPERATORS, DenseGraph, Graph, SoftmaxGraph, resolve_operator
from heatformer.models import GPT, DiffusionAttention, GPTConfig
from heatformer.models.heads import format_operator
from references import softmax_reference, topk_reference

#: relative tolerance per dtype: ``max|y - y64| <= TOL * (max|y64| + 1)``; about 10 units of
#: rounding of the dtype (float64: against an independent dense reference).
TOL: dict[torch.dtype, float] = {
    torch.float64: 1e-9,
    torch.float32: 1e-4,
    torch.float16: 2e-2,
    torch.bfloat16: 8e-2,
}
DTYPES = list(TOL)
HALF = (torch.float16, torch.bfloat16)

#: every registered operator with each of the parameter sets it declares
OPERATOR_CASES = [
    pytest.param(name, params, id=format_operator(name, params))
    for name, cls in OPERATORS.items()
    for params in cls.examples
]


@dataclass(frozen=True)
class GraphCase:
    """How the attention graph is built: masks, causality and top-k sparsification."""

    causal: bool = False
    masked: bool = False  # batch element 1 has its first 3 keys padded (left padding)
    topk: int | None = None


GRAPH_CASES = {
    "softmax": GraphCase(),
    "causal": GraphCase(causal=True),
    "masked": GraphCase(masked=True),
    "masked-causal": GraphCase(causal=True, masked=True),  # rows 0-2 of element 1: no edges
    "topk": GraphCase(topk=3),
    "topk-masked-causal": GraphCase(causal=True, masked=True, topk=3),
}

B, H, N, E, C = 2, 2, 9, 4, 3


def _dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def expected_refusal(op: torch.nn.Module, case: GraphCase, entry: str) -> str | None:
    """The refusal a cell must raise (a regex on the message), or None when it must compute."""
    if entry in ("layer", "generate") and case.causal and _symmetrizes(op):
        return r"^operators: expected heads that read only the past .* 'sym' normalization"
    return None


def _symmetrizes(op: torch.nn.Module) -> bool:
    return getattr(op, "normalization", None) == "sym"


def assert_agrees(
    actual: Tensor, expected: Tensor, dtype: torch.dtype, what: str, truncation: float = 0.0
) -> None:
    """Finite, the input dtype, and within ``TOL[dtype]`` of the float64 result (plus twice
    a series' declared truncation ``tol``: two computations may truncate differently)."""
    assert actual.dtype == dtype, f"{what}: dtype {actual.dtype}, expected {dtype}"
    assert bool(torch.isfinite(actual).all()), f"{what}: non-finite values in {dtype}"
    assert bool(torch.isfinite(expected).all()), f"{what}: non-finite float64 reference"
    actual, expected = actual.detach().double(), expected.detach().double()
    err = float((actual - expected).abs().max())
    scale = float(expected.abs().max()) + 1.0
    bound = (TOL[dtype] + 2 * truncation) * scale
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}"


def _truncation(op: torch.nn.Module) -> float:
    """The truncation tolerance an operator declares (``tol``; 0 when it has none)."""
    return float(getattr(op, "tol", 0.0))


# ---- functional: op(graph, x) -------------------------------------------------------------------


def _inputs(seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Integer queries/keys (exact scores in every dtype), a float signal, a key mask."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-2, 3, (B, H, N, E), generator=gen).double()
    k = torch.randint(-2, 3, (B, H, N, E), generator=gen).double()
    x = torch.randn(B, H, N, C, generator=gen, dtype=torch.float64)
    key_mask = torch.ones(B, N, dtype=torch.bool)
    key_mask[1, :3] = False
    return q, k, x, key_mask


def _graph(case: GraphCase, q: Tensor, k: Tensor, key_mask: Tensor) -> Graph:
    mask = key_mask[:, None, None, :] if case.masked else None  # (B, 1, 1, N)
    graph: Graph = SoftmaxGraph(q, k, mask=mask, causal=case.causal)
    return graph.topk(case.topk) if case.topk else graph


def _dense_reference(case: GraphCase, q: Tensor, k: Tensor, key_mask: Tensor) -> DenseGraph:
    """The same graph from NumPy: softmax with the masks, then top-k, as explicit weights."""
    qn, kn = q.double().numpy(), k.double().numpy()
    mask = key_mask[:, None, None, :].numpy() if case.masked else None
    p = softmax_reference(qn, kn, mask=mask, causal=case.causal)
    if case.topk:
        scores = qn @ np.swapaxes(kn, -1, -2) / math.sqrt(E)
        allowed = np.ones(scores.shape, dtype=bool)
        if mask is not None:
            allowed &= np.broadcast_to(mask, scores.shape)
        if case.causal:
            allowed &= np.tril(np.ones((N, N), dtype=bool))
        p = topk_reference(p, np.where(allowed, scores, -np.inf), case.topk)
    return DenseGraph(torch.as_tensor(p))


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("case_name", list(GRAPH_CASES))
@pytest.mark.parametrize(("name", "params"), OPERATOR_CASES)
def test_functional(name: str, params: dict[str, Any], case_name: str, dtype: torch.dtype) -> None:
    case = GRAPH_CASES[case_name]
    q, k, x, key_mask = _inputs()
    op = resolve_operator(name, **params)
    reference_op = copy.deepcopy(op).double()  # the same parameters, in float64
    q, k, x = q.to(dtype), k.to(dtype), x.to(dtype)
    y = op(_graph(case, q, k, key_mask), x)
    if dtype == torch.float64:  # against the NumPy attention matrix as explicit weights
        expected = reference_op(_dense_reference(case, q, k, key_mask), x)
    else:  # against float64 on the same rounded inputs
        expected = reference_op(_graph(case, q.double(), k.double(), key_mask), x.double())
    assert_agrees(y, expected, dtype, f"{name}{params} on {case_name}", _truncation(op))


# ---- DiffusionAttention: forward and backward ---------------------------------------------------


def _layer_spec(name: str, params: dict[str, Any]) -> str:
    """Two heads: plain attention (the fused path) next to the operator under test."""
    return f"attention:1,{format_operator(name, params)}:1"


@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("case_name", list(GRAPH_CASES))
@pytest.mark.parametrize(("name", "params"), OPERATOR_CASES)
def test_layer_forward_backward(
    name: str, params: dict[str, Any], case_name: str, dtype: torch.dtype
) -> None:
    case = GRAPH_CASES[case_name]
    d_model, n = 8, N
    topk = (n if dtype in HALF else case.topk) if case.topk else None
    spec = _layer_spec(name, params)
    torch.manual_seed(0)

    def build() -> DiffusionAttention:
        return DiffusionAttention(d_model, 2, spec, topk=topk, causal=case.causal, dtype=dtype)

    refusal = expected_refusal(resolve_operator(name, **params), case, "layer")
    if refusal is not None:
        with pytest.raises(ValueError, match=refusal):
            build()
        return
    layer = build()
    reference = copy.deepcopy(layer).double()
    gen = torch.Generator().manual_seed(1)
    x64 = torch.randn(B, n, d_model, generator=gen, dtype=torch.float64)
    probe = torch.randn(B, n, d_model, generator=gen, dtype=torch.float64)
    key_mask = torch.ones(B, n, dtype=torch.bool)
    key_mask[1, :3] = False
    mask = key_mask if case.masked else None

    def run(model: DiffusionAttention, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x = x.detach().requires_grad_(True)
        y = model(x, mask)
        (y.double() * probe).sum().backward()
        assert x.grad is not None and model.in_proj.weight.grad is not None
        return y.detach(), x.grad, model.in_proj.weight.grad

    x = x64.to(dtype)
    outs = run(layer, x)
    refs = run(reference, x.double())
    truncation = max(_truncation(op) for op in layer.head_operators)
    for what, actual, expected in zip(("output", "grad x", "grad in_proj"), outs, refs):
        assert_agrees(actual, expected, dtype, f"{spec} on {case_name}: {what}", truncation)
    if dtype == torch.float64:  # the layer against its documented per-head definition
        per_head = _per_head_reference(layer, x, case, mask)
        assert_agrees(outs[0], per_head, dtype, f"{spec} on {case_name}: per head", truncation)


def _per_head_reference(
    layer: DiffusionAttention, x: Tensor, case: GraphCase, key_mask: Tensor | None
) -> Tensor:
    """``y[:, h] = op_h(DenseGraph(P_h), v_h)`` with ``P_h`` from NumPy (the docstring's
    "equivalent to"); a symmetrizing head also drops padded queries' out-edges."""
    with torch.no_grad():
        q, k, v = layer.project_qkv(x)
        heads = []
        for h, op in enumerate(layer.head_operators):
            qn, kn = q[:, h].numpy(), k[:, h].numpy()
            mask = None
            if key_mask is not None:
                mask = key_mask[:, None, :].numpy()  # (B, 1, N)
                if _symmetrizes(op):
                    mask = mask & np.swapaxes(mask, -1, -2)
            p = softmax_reference(qn, kn, mask=mask, causal=case.causal)
            if layer.topk is not None and layer.topk < x.shape[1]:
                scores = qn @ np.swapaxes(kn, -1, -2) / math.sqrt(qn.shape[-1])
                allowed = np.ones(scores.shape, dtype=bool)
                if mask is not None:
                    allowed &= np.broadcast_to(mask, scores.shape)
                if case.causal:
                    allowed &= np.tril(np.ones(scores.shape[-2:], dtype=bool))
                p = topk_reference(p, np.where(allowed, scores, -np.inf), layer.topk)
            heads.append(op(DenseGraph(torch.as_tensor(p)), v[:, h]))
        return layer.merge_heads(torch.stack(heads, dim=1))


# ---- GPT.generate with and without the KV cache -------------------------------------------------

GENERATE_DTYPES = [torch.float64, torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", GENERATE_DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("topk", [None, 4], ids=["dense", "topk4"])
@pytest.mark.parametrize(("name", "params"), OPERATOR_CASES)
def test_generate(name: str, params: dict[str, Any], topk: int | None, dtype: torch.dtype) -> None:
    config = GPTConfig(
        vocab_size=16, block_size=20, n_layer=2, n_head=2, n_embd=8,
        heads=_layer_spec(name, params), topk=topk,
    )  # fmt: skip
    refusal = expected_refusal(resolve_operator(name, **params), GraphCase(causal=True), "generate")
    torch.manual_seed(0)
    if refusal is not None:
        with pytest.raises(ValueError, match=refusal):
            GPT(config)
        return
    model = GPT(config).to(dtype).eval()
    prompt = torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(2))

    def sample(use_cache: bool) -> Tensor:  # top_k=1 is greedy up to ties, drawn reproducibly
        draws = torch.Generator().manual_seed(3)
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
        from heatformer.models import KVCache

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
    "bf16": ["--bf16"],
    "topk": ["--topk", "4"],
    "bf16-topk": ["--bf16", "--topk", "4"],
    "digits": [],  # a ViT on 8x8 digits: bidirectional, where symmetrizing heads are allowed
}
CLI_SECOND = ["plain", "bf16", "topk", "digits"]
#: the defaults in every variant, the first other example in all but the combined one, the
#: remaining examples plain
CLI_CASES = [
    pytest.param(name, params, variant, id=f"{format_operator(name, params)}-{variant}")
    for name, cls in OPERATORS.items()
    for i, params in enumerate(cls.examples)
    for variant in (CLI_VARIANTS if i == 0 else CLI_SECOND if i == 1 else ["plain"])
]


@pytest.mark.parametrize(("name", "params", "variant"), CLI_CASES)
def test_cli_train(
    name: str, params: dict[str, Any], variant: str, corpus: Path, tmp_path: Path, capsys
) -> None:
    from heatformer.cli import main

    heads = _layer_spec(name, params)
    out = tmp_path / "run"
    common = [
        "train", "--heads", heads, "--steps", "2", "--batch-size", "2", "--layers", "1",
        "--embd", "8", "--eval-every", "2", "--analysis-size", "2", "--device", "cpu",
        "--no-progress", "--out", str(out),
    ]  # fmt: skip
    if variant == "digits":
        task = ["--task", "digits", "--patch-size", "4"]
    else:
        task = ["--text", str(corpus), "--seq-len", "12", "--eval-size", "2"]
    code = main([*common, *task, *CLI_VARIANTS[variant]])
    err = capsys.readouterr().err
    causal = variant != "digits"
    refusal = expected_refusal(resolve_operator(name, **params), GraphCase(causal=causal), "layer")
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
    assert run["model_config"]["topk"] == (4 if "topk" in variant else None)
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
