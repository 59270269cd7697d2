"""Bad input across the public Python API: a clear TypeError/ValueError that names the argument.

The error also carries the name in ``err.argument`` (:class:`heatformer.checks.ArgumentError`),
which is how the command line tells which option was wrong.

Each row is a call a user could make by mistake, the exception type the policy asks for
(wrong kind -> ``TypeError``, wrong value -> ``ValueError``) and the name the message must
start with. Rows for the defects found by trying heatformer as a new user are marked
``# found``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from heatformer.checks import ArgumentError
from heatformer.graph_ops import (
    Attention,
    DenseGraph,
    HeatKernel,
    Laplacian,
    PersonalizedPageRank,
    Polynomial,
    SoftmaxGraph,
    SparseGraph,
    heat_kernel,
    laplacian,
    laplacian_matrix,
    resolve_operator,
    spectrum,
    topk_graph,
)
from heatformer.models import (
    GPT,
    DiffusionAttention,
    GPTConfig,
    SequenceClassifierConfig,
    ViT,
    ViTConfig,
    parse_heads,
)

Q = torch.randn(1, 6, 4)
G = SoftmaxGraph(Q, Q)
X = torch.randn(1, 6, 2)
E = torch.tensor([[0, 1], [1, 0]])
W = torch.rand(3, 3)
LAYER = DiffusionAttention(8, 2)
GPT_MODEL = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=10))

# fmt: off
CASES: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    # ---- graphs
    ("dense list", lambda: DenseGraph([[0.0, 1.0], [1.0, 0.0]]), TypeError, "weight"),
    ("dense int", lambda: DenseGraph(torch.ones(2, 2, dtype=torch.long)), TypeError, "weight"),
    ("dense 1-D", lambda: DenseGraph(torch.ones(3)), ValueError, "weight"),
    ("dense not square", lambda: DenseGraph(torch.ones(2, 3)), ValueError, "weight"),
    ("dense negative", lambda: DenseGraph(-torch.ones(2, 2)), ValueError, "weight"),
    ("dense nan", lambda: DenseGraph(torch.full((2, 2), math.nan)), ValueError, "weight"),
    ("softmax q list", lambda: SoftmaxGraph([[1.0]], Q), TypeError, "q"),
    ("softmax k dtype", lambda: SoftmaxGraph(Q, Q.double()), TypeError, "k"),
    ("softmax k features", lambda: SoftmaxGraph(Q, torch.randn(1, 6, 3)), ValueError, "k"),
    ("softmax k nodes", lambda: SoftmaxGraph(Q, torch.randn(1, 5, 4)), ValueError, "k"),
    ("softmax k batch", lambda: SoftmaxGraph(Q.expand(2, 6, 4), torch.randn(3, 6, 4)),
     ValueError, "k"),
    ("softmax scale str", lambda: SoftmaxGraph(Q, Q, scale="1"), TypeError, "scale"),
    ("softmax scale inf", lambda: SoftmaxGraph(Q, Q, scale=math.inf), ValueError, "scale"),
    ("softmax causal int", lambda: SoftmaxGraph(Q, Q, causal=1), TypeError, "causal"),
    ("softmax mask float", lambda: SoftmaxGraph(Q, Q, mask=torch.ones(6, 6)), TypeError, "mask"),
    ("softmax mask shape", lambda: SoftmaxGraph(Q, Q, mask=torch.ones(5, 5, dtype=bool)),
     ValueError, "mask"),
    ("softmax block 0", lambda: SoftmaxGraph(Q, Q, row_block=0).to_dense(), ValueError,
     "row_block"),
    ("topk 0", lambda: G.topk(0), ValueError, "k_top"),
    ("topk > N", lambda: G.topk(7), ValueError, "k_top"),
    ("topk float", lambda: G.topk(2.0), TypeError, "k_top"),
    ("topk_graph k_top", lambda: topk_graph(Q, Q, k_top=9), ValueError, "k_top"),
    ("threshold 0", lambda: G.threshold(0.0), ValueError, "eps"),
    ("threshold str", lambda: G.threshold("0.1"), TypeError, "eps"),
    ("to_networkx index", lambda: G.to_networkx((5,)), ValueError, "index"),
    ("propagate x nodes", lambda: G.propagate(torch.randn(1, 5, 2)), ValueError, "x"),
    ("propagate x dtype", lambda: G.propagate(X.double()), TypeError, "x"),
    ("propagate x 1-D", lambda: G.propagate(torch.randn(6)), ValueError, "x"),
    ("propagate x batch", lambda: SoftmaxGraph(*[torch.randn(2, 6, 4)] * 2).propagate(
        torch.randn(3, 6, 2)), ValueError, "x"),
    ("sparse row float", lambda: SparseGraph(torch.zeros(2), E[1], torch.ones(2), num_nodes=2),
     TypeError, "row"),
    ("sparse num_nodes 0", lambda: SparseGraph(E[0], E[1], torch.ones(2), num_nodes=0),
     ValueError, "num_nodes"),
    ("edge_index list", lambda: SparseGraph.from_edge_index([[0, 1], [1, 0]]), TypeError,
     "edge_index"),
    ("edge_index shape", lambda: SparseGraph.from_edge_index(torch.tensor([[0, 1, 2]])),
     ValueError, "edge_index"),
    # found: these named the internal row, col, weight
    ("edge_index range", lambda: SparseGraph.from_edge_index(E, num_nodes=1), ValueError,
     "edge_index"),
    ("edge_weight neg", lambda: SparseGraph.from_edge_index(E, -torch.ones(2)), ValueError,
     "edge_weight"),
    ("edge_weight nan", lambda: SparseGraph.from_edge_index(E, torch.tensor([1.0, math.nan])),
     ValueError, "edge_weight"),
    ("edge_weight len", lambda: SparseGraph.from_edge_index(E, torch.ones(3)), ValueError,
     "edge_index, edge_weight"),
    ("edge_weight int", lambda: SparseGraph.from_edge_index(E, torch.ones(2, dtype=int)),
     TypeError, "edge_weight"),
    ("ell indices float", lambda: SparseGraph.from_ell(torch.zeros(3, 2), torch.ones(3, 2)),
     TypeError, "indices"),
    ("ell indices range", lambda: SparseGraph.from_ell(torch.full((3, 2), 5), torch.ones(3, 2)),
     ValueError, "indices"),
    ("ell weight shape", lambda: SparseGraph.from_ell(torch.zeros(3, 2, dtype=int), W),
     ValueError, "weight"),
    # ---- Laplacians and spectra
    ("laplacian graph", lambda: laplacian(W, X), TypeError, "graph"),
    ("laplacian normalization", lambda: laplacian(G, X, "lazy"), ValueError, "normalization"),
    ("laplacian_matrix norm", lambda: laplacian_matrix(G, "RW"), ValueError, "normalization"),
    ("spectrum atol -1", lambda: spectrum(G, atol=-1.0), ValueError, "atol"),  # found
    ("spectrum atol nan", lambda: spectrum(G, atol=math.nan), ValueError, "atol"),  # found
    ("spectrum atol str", lambda: spectrum(G, atol="0"), TypeError, "atol"),
    # ---- operators
    ("laplacian step str", lambda: Laplacian(step="1"), TypeError, "step"),
    ("laplacian step inf", lambda: Laplacian(step=math.inf), ValueError, "step"),
    ("laplacian learnable 1", lambda: Laplacian(learnable=1), TypeError, "learnable"),
    ("heat t negative", lambda: HeatKernel(t=-1.0), ValueError, "t"),
    ("heat t nan", lambda: HeatKernel(t=math.nan), ValueError, "t"),
    ("heat t str", lambda: HeatKernel(t="1"), TypeError, "t"),
    ("heat t list entry", lambda: HeatKernel(t=[1.0, "2"]), TypeError, "t"),
    ("heat t list negative", lambda: HeatKernel(t=[1.0, -2.0]), ValueError, "t"),
    ("heat learnable t 0", lambda: HeatKernel(t=0.0, learnable=True), ValueError, "t"),
    ("heat tol 0", lambda: HeatKernel(tol=0.0), ValueError, "tol"),
    ("heat method", lambda: HeatKernel(method="pade"), ValueError, "method"),
    ("heat method int", lambda: HeatKernel(method=1), TypeError, "method"),
    ("heat normalization", lambda: HeatKernel(normalization="lap"), ValueError, "normalization"),
    ("heat_kernel t shape", lambda: heat_kernel(G, X, torch.ones(3)), ValueError, "t"),
    ("heat exact refused", lambda: HeatKernel(method="exact")(SoftmaxGraph(*[torch.randn(
        2049, 2)] * 2), torch.randn(2049, 1)), ValueError, "method"),
    ("ppr alpha 0", lambda: PersonalizedPageRank(alpha=0.0), ValueError, "alpha"),
    ("ppr alpha 1", lambda: PersonalizedPageRank(alpha=1.0), ValueError, "alpha"),
    ("ppr alpha str", lambda: PersonalizedPageRank(alpha="0.1"), TypeError, "alpha"),
    ("ppr tiny alpha series", lambda: PersonalizedPageRank(alpha=1e-9, method="series"),
     ValueError, "alpha"),  # found: it hung
    ("ppr method", lambda: PersonalizedPageRank(method="cg"), ValueError, "method"),
    ("ppr alpha below float64's resolution", lambda: PersonalizedPageRank(alpha=1e-17),
     ValueError, "alpha"),  # found: +0.0377 where the limit is -0.0715
    ("ppr alpha below 2^-53 / tol", lambda: PersonalizedPageRank(alpha=1e-9, tol=1e-8),
     ValueError, "alpha"),
    ("poly coeff overflows float32", lambda: Polynomial([1e39])(G, X), ValueError,
     "coeffs"),  # found: inf
    ("poly learnable coeff overflows", lambda: Polynomial([1.0, 1e39], learnable=True),
     ValueError, "coeffs"),
    ("laplacian step overflows float16", lambda: Laplacian(step=7e4)(G.to(torch.float16),
     X.half()), ValueError, "step"),
    ("heat t overflows float16", lambda: HeatKernel(t=[1e5, 1.0]).half(), ValueError, "t"),
    ("poly empty", lambda: Polynomial([]), ValueError, "coeffs"),
    ("poly str", lambda: Polynomial("1,2"), TypeError, "coeffs"),
    ("poly nan", lambda: Polynomial([1.0, math.nan]), ValueError, "coeffs"),
    ("poly bool", lambda: Polynomial([True]), TypeError, "coeffs"),
    ("poly 2-D", lambda: Polynomial(torch.ones(2, 2)), ValueError, "coeffs"),
    ("operator graph", lambda: Attention()(W, X), TypeError, "graph"),
    ("operator x", lambda: Attention()(G, torch.randn(1, 5, 2)), ValueError, "x"),
    ("resolve unknown", lambda: resolve_operator("diffusion"), ValueError, "name"),
    ("resolve type", lambda: resolve_operator(3), TypeError, "name"),
    ("resolve param", lambda: resolve_operator("heat", tt=1.0), TypeError, "heat"),
    # ---- head specs and layers
    ("spec counts", lambda: parse_heads("attention:3", 4), ValueError, "heads"),
    ("spec name", lambda: parse_heads("atention:4", 4), ValueError, "heads"),
    ("spec count 0", lambda: parse_heads("attention:0,laplacian:4", 4), ValueError, "heads"),
    ("spec param", lambda: parse_heads("heat[tt=1]:4", 4), ValueError, "heads"),
    ("spec brackets", lambda: parse_heads("heat[t=1:4", 4), ValueError, "heads"),
    ("spec dtype param", lambda: parse_heads("heat[dtype=float64]:4", 4), ValueError, "heads"),
    ("spec list length", lambda: parse_heads(["attention"], 4), ValueError, "operators"),
    ("spec list item", lambda: parse_heads([1, 2], 2), TypeError, "operators"),
    ("layer embed float", lambda: DiffusionAttention(8.0, 2), TypeError, "embed_dim"),
    ("layer heads 0", lambda: DiffusionAttention(8, 0), ValueError, "num_heads"),
    ("layer divisible", lambda: DiffusionAttention(10, 4), ValueError, "embed_dim"),
    ("layer topk 0", lambda: DiffusionAttention(8, 2, graph="topk[k=0]"), ValueError, "graph"),
    ("layer dropout 1", lambda: DiffusionAttention(8, 2, dropout=1.0), ValueError, "dropout"),
    ("layer dropout str", lambda: DiffusionAttention(8, 2, dropout="0"), TypeError, "dropout"),
    ("layer causal int", lambda: DiffusionAttention(8, 2, causal=1), TypeError, "causal"),
    ("layer causal sym", lambda: DiffusionAttention(8, 2, "laplacian[normalization=sym]",
     causal=True), ValueError, "operators"),
    ("layer x shape", lambda: LAYER(torch.randn(2, 5, 6)), ValueError, "x"),
    ("layer x type", lambda: LAYER([[1.0]]), TypeError, "x"),
    ("layer x dtype", lambda: LAYER(torch.randn(2, 5, 8).double()), TypeError, "x"),
    ("layer key_mask dtype", lambda: LAYER(torch.randn(2, 5, 8), torch.ones(2, 5)), TypeError,
     "key_mask"),
    ("layer key_mask shape", lambda: LAYER(torch.randn(2, 5, 8), torch.ones(2, 4, dtype=bool)),
     ValueError, "key_mask"),
    ("from_mha type", lambda: DiffusionAttention.from_mha(LAYER), TypeError, "mha"),
    # ---- models and configs
    ("gpt vocab 0", lambda: GPTConfig(vocab_size=0), ValueError, "vocab_size"),  # found
    ("vit classes 0", lambda: ViTConfig(num_classes=0), ValueError, "num_classes"),  # found
    ("classifier classes 0", lambda: SequenceClassifierConfig(num_classes=0), ValueError,
     "num_classes"),
    ("gpt topk > block", lambda: GPTConfig(block_size=8, graph="topk[k=9]"), ValueError,
     "graph"),  # found
    ("gpt n_embd float", lambda: GPTConfig(n_embd=8.0), TypeError, "n_embd"),
    ("gpt graph int", lambda: GPTConfig(graph=123), TypeError, "graph"),  # issue 21
    ("gpt heads int", lambda: GPTConfig(heads=123), TypeError, "heads"),  # issue 21 (audit)
    ("vit heads none", lambda: ViTConfig(heads=None), TypeError, "heads"),
    ("vit graph entry", lambda: ViTConfig(graph=("softmax", 3)), TypeError, "graph"),
    ("gpt heads", lambda: GPT(GPTConfig(n_head=2, n_embd=8, heads="attention:3")), ValueError,
     "heads"),
    ("gpt config type", lambda: GPT(ViTConfig()), TypeError, "config"),
    ("vit patch", lambda: ViTConfig(patch_size=3), ValueError, "patch_size"),
    ("vit pool", lambda: ViTConfig(pool="max"), ValueError, "pool"),
    ("vit images", lambda: ViT(ViTConfig(n_layer=1, n_head=2, n_embd=8))(torch.zeros(1, 8, 8)),
     ValueError, "images"),
    ("gpt idx float", lambda: GPT_MODEL(torch.zeros(1, 3)), TypeError, "idx"),
    ("gpt idx vocab", lambda: GPT_MODEL(torch.full((1, 3), 10)), ValueError, "idx"),  # found
    ("gpt idx negative", lambda: GPT_MODEL(torch.full((1, 3), -1)), ValueError, "idx"),
    ("gpt idx length", lambda: GPT_MODEL(torch.zeros(1, 9, dtype=torch.long)), ValueError,
     "idx"),
    ("generate temperature", lambda: GPT_MODEL.generate(torch.zeros(1, 2, dtype=torch.long), 2,
     temperature=0.0), ValueError, "temperature"),
    ("generate top_k", lambda: GPT_MODEL.generate(torch.zeros(1, 2, dtype=torch.long), 2,
     top_k=11), ValueError, "top_k"),
]
# fmt: on


@pytest.mark.parametrize(
    ("call", "error", "name"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_gets_a_clear_error_naming_the_argument(
    call: Callable[[], object], error: type[Exception], name: str
) -> None:
    with pytest.raises(Exception) as info:
        call()
    err = info.value
    assert isinstance(err, error), f"{type(err).__name__}: {err}"
    assert isinstance(err, ArgumentError), f"{type(err).__name__} without .argument: {err}"
    assert err.argument == name, (err.argument, str(err))  # what the command line reads
    message = str(err)
    assert message == f"{name}: {err.detail}", message
    assert "\n" not in message and len(err.detail) > 15, message  # one telling line


def test_the_table_is_large() -> None:
    assert len(CASES) >= 100
