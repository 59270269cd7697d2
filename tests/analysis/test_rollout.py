"""heatformer.analysis.rollout: the rows of chosen queries, propagated backwards through each
layer's heads by their transposes (autograd of the operator's own apply), against a dense
composition in float64 at small N: every head's map ``A_h`` built as an ``N x N`` matrix on its
own (numpy / SciPy references of each operator from DESIGN's formulas, applied to the
identity: ``scipy.linalg.expm`` for heat, a solve for PPR, ...), then
``r <- r (I + mean_h A_h) / 2`` by plain matmuls. The cases are every example of every
registered operator on every example of every graph kind, causal and not."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import model_helpers as mh
from heatformer.analysis import rollout
from heatformer.checks import ArgumentError
from heatformer.graph_ops import GRAPHS, OPERATORS, DenseGraph, Graph, split_maps
from heatformer.models import (
    GPT,
    GPTConfig,
    SequenceClassifier,
    SequenceClassifierConfig,
    ViT,
    ViTConfig,
)
from heatformer.models.heads import format_operator
from references import adjacency_reference

N, EMBD, HEADS, LAYERS = 6, 8, 2, 2
TOKENS = torch.tensor([[1, 4, 2, 7, 3, 5], [6, 6, 0, 2, 9, 1]])  # (B, N)
QUERIES = [5, 0, -3]


def _spec(name: str, params: dict[str, object]) -> str:
    return format_operator(name, params) if params else name


OPERATOR_SPECS = [
    (f"{name}{i}", _spec(name, params))
    for name, cls in OPERATORS.items()
    for i, params in enumerate(cls.examples)
]
GRAPH_SPECS = [
    (f"{name}{i}", _spec(name, params))
    for name, cls in GRAPHS.items()
    for i, params in enumerate(cls.examples)
]
#: every operator example on every graph kind example, causal on every other pair (each
#: operator and each kind meets both orders; half the time of both orders everywhere); heads
#: that read W^T bidirectional, since a causal layer refuses them
CASES = [
    pytest.param(spec, graph, causal, id=f"{op_id}-{graph_id}-{'causal' if causal else 'bidir'}")
    for (i, (op_id, spec)), (j, (graph_id, graph)) in itertools.product(
        enumerate(OPERATOR_SPECS), enumerate(GRAPH_SPECS)
    )
    for causal in ["sym" not in spec and (i + j) % 2 == 0]
]


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Spread attention (larger projections) and give skip weights off-diagonal entries."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("in_proj.weight") or name.endswith("skip_weight"):
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.8)
            elif name.endswith("tok_emb.weight"):
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))


def _gpt(layer_heads: tuple[str, ...], graph: str, causal: bool, seed: int = 0) -> GPT:
    if causal and any("normalization=sym" in h for h in layer_heads):
        pytest.skip("sym heads read W^T: refused in causal layers (a later token would leak)")
    torch.manual_seed(seed)
    config = GPTConfig(
        vocab_size=10, block_size=8, n_layer=LAYERS, n_head=HEADS, n_embd=EMBD,
        heads=layer_heads, graph=graph, causal=causal,
    )  # fmt: skip
    model = GPT(config).double()
    _randomize(model, seed)
    return model


def _layer_inputs(model: torch.nn.Module, *args: object) -> list[tuple[torch.Tensor, ...]]:
    """Each attention layer's input and key mask, read by the test's own pre-hooks."""
    seen: list[tuple[torch.Tensor, ...]] = []
    hooks = [
        block.attn.register_forward_pre_hook(lambda m, a: seen.append(a[:2]))
        for block in model.blocks
    ]
    with torch.no_grad():
        model.eval()(*args)
    for hook in hooks:
        hook.remove()
    return seen


def _head_maps(attn: object, x: torch.Tensor, key_mask: torch.Tensor | None, b: int) -> list:
    """The dense ``(N, N)`` map of every head of one layer for sequence ``b``, in float64."""
    q, k, _ = attn.project_qkv(x)  # (B, H, N, Dh)
    ops = attn.head_operators
    maps = []
    for h, op in enumerate(ops):
        qm, km = (split_maps(t[b : b + 1, h], op.maps) for t in (q, k))  # (1, maps, N, d)
        qn, kn = mh.to_numpy(qm[0]), mh.to_numpy(km[0])  # (maps, N, d)
        if attn.graph_kind.spec == "softmax":  # numpy, from the formula
            mask = None if key_mask is None else key_mask[b].numpy()
            allowed = mh.allowed_matrix(x.shape[1], mask, attn.causal)
            if mask is not None and op.reads_transpose:
                allowed = allowed & mask[:, None]
            p = np.stack([mh.softmax_probs(a, c, allowed) for a, c in zip(qn, kn, strict=True)])
        else:  # the kind's own weights (the kinds are tested against numpy elsewhere)
            graph = attn.graph_kind.build(qm, km, causal=attn.causal)
            p = mh.to_numpy(graph.to_dense())[0]
        pos = sum(1 for o in ops[:h] if o is op)  # the head's index in its operator's group
        maps.append(_token_map(op, p, pos))
    return maps


def _token_map(op: object, p: np.ndarray, pos: int) -> np.ndarray:
    """A head's map between tokens, from the formulas: the operator on the identity, except
    the two heads that are not one map on every channel (their documented token maps)."""
    if op.name == "diff":  # P_1 - lambda P_2 (before the RMSNorm)
        lam = float(mh.to_numpy(op.lambda_full()))
        return adjacency_reference(p[0], "rw") - lam * adjacency_reference(p[1], "rw")
    p = p[0]
    if op.name == "skip":  # P + mean_c (W_S)_cc I'
        w = op.skip_weight
        c = op.init if w is None else float(np.trace(mh.to_numpy(w)[pos]) / w.shape[-1])
        return adjacency_reference(p, "rw") + c * np.diag((p != 0).any(-1).astype(float))
    return mh.operator_ref(op, p, np.eye(len(p)), pos)


def _dense_rollout(
    model: torch.nn.Module, args: tuple, queries: list[int], residual: float = 0.5
) -> np.ndarray:
    """``e_q (rho I + (1 - rho) mean_h A_h)`` layer by layer from the last, plain numpy."""
    inputs = _layer_inputs(model, *args)
    b, n = inputs[0][0].shape[:2]
    out = np.empty((b, len(queries), n))
    for s in range(b):
        rows = np.eye(n)[queries]
        for block, (x, *mask) in zip(reversed(model.blocks), reversed(inputs)):
            key_mask = mask[0] if mask else None
            mean = sum(_head_maps(block.attn, x, key_mask, s)) / block.attn.num_heads
            rows = residual * rows + (1 - residual) * rows @ mean
        out[s] = rows
    return out


def _tolerance(layer_heads: tuple[str, ...]) -> float:
    """Series with a tolerance (heat, PPR) are exact to it; the rest to round-off."""
    return 1e-5 if any(s.startswith(("heat", "ppr")) for s in layer_heads) else 1e-11


@pytest.mark.parametrize(("spec", "graph", "causal"), CASES)
def test_matches_dense_composition(spec: str, graph: str, causal: bool) -> None:
    """Layer 1: two heads of one operator (one group); layer 2: attention beside it."""
    layer_heads = (f"{spec}:2", f"attention:1,{spec}:1")
    model = _gpt(layer_heads, graph, causal)
    got = rollout(model, TOKENS, queries=QUERIES)
    assert got.shape == (2, len(QUERIES), N) and got.dtype == torch.float64
    expected = _dense_rollout(model, (TOKENS,), QUERIES)
    tol = _tolerance(layer_heads)
    np.testing.assert_allclose(got.numpy(), expected, atol=tol, rtol=tol)
    if causal:  # a causal rollout reads no later token
        later = np.arange(N)[None, :] > (np.array(QUERIES) % N)[:, None]
        assert (abs(got.numpy()[:, later]) < 1e-15).all()


def test_attention_rows_sum_to_one_and_residual_weights() -> None:
    model = _gpt(("attention:2", "attention:2"), "softmax", True)
    half = rollout(model, TOKENS, queries=range(N))
    torch.testing.assert_close(half.sum(-1), torch.ones(2, N, dtype=torch.float64))
    identity = rollout(model, TOKENS, queries=[2, 4], residual=1.0)
    torch.testing.assert_close(identity, torch.eye(N, dtype=torch.float64)[[2, 4]].expand(2, 2, N))
    heads_only = rollout(model, TOKENS, queries=[3], residual=0)
    expected = _dense_rollout(model, (TOKENS,), [3], residual=0.0)
    np.testing.assert_allclose(heads_only.numpy(), expected, atol=1e-12)


def test_key_mask_and_sym_heads_of_a_classifier() -> None:
    """A key mask is read from the layers' calls: padded keys get nothing, sym heads drop the
    padded queries' out-edges as the layer does."""
    torch.manual_seed(1)
    config = SequenceClassifierConfig(
        vocab_size=10, block_size=N, n_layer=2, n_head=2, n_embd=EMBD, causal=False,
        pool="mean", heads="attention:1,laplacian[normalization=sym]:1",
    )  # fmt: skip
    model = SequenceClassifier(config).double()
    _randomize(model, 1)
    key_mask = mh.padding_mask(2, N, [6, 4])
    got = rollout(model, (TOKENS, key_mask), queries=[0, 3])
    expected = _dense_rollout(model, (TOKENS, key_mask), [0, 3])
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-11)
    assert (got[1, :, 4:] == 0).all()  # padding reaches no real token
    padding = rollout(model, {"idx": TOKENS, "key_mask": key_mask}, queries=[0, 3])
    torch.testing.assert_close(padding, got)


def test_vit_class_token_and_patches() -> None:
    """A ViT's layers hold the class token and the patches; images in, rows of N = 1 + P."""
    torch.manual_seed(2)
    config = ViTConfig(
        image_size=4, patch_size=2, n_layer=2, n_head=2, n_embd=EMBD,
        heads="attention:1,heat[t=0.3;normalization=sym]:1", graph="topk[k=3]",
    )  # fmt: skip
    model = ViT(config).double()
    _randomize(model, 2)
    images = torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(2)).double()
    got = rollout(model, images, queries=0)  # the class token
    assert got.shape == (2, 1, 5)
    np.testing.assert_allclose(got.numpy(), _dense_rollout(model, (images,), [0]), atol=1e-5)


def test_no_dense_matrix_and_state_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing densifies a graph; hooks are removed and training flags kept, in float32 too."""

    def refuse(self: Graph) -> torch.Tensor:
        raise AssertionError("to_dense called")

    model = _gpt(("attention:1,diff:1", "skip:1,laplacian:1"), "window[w=2];softmax", True)
    expected = rollout(model, TOKENS, queries=[1, 5])
    with torch.inference_mode():  # autograd still runs inside
        torch.testing.assert_close(rollout(model, TOKENS, queries=[1, 5]), expected)
    model.float().train()
    monkeypatch.setattr(Graph, "to_dense", refuse)
    got = rollout(model, TOKENS, queries=torch.tensor([1, 5]))
    monkeypatch.undo()
    assert got.dtype == torch.float32 and model.training
    assert all(not b.attn._forward_pre_hooks for b in model.blocks)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)


def test_token_maps_of_operators() -> None:
    """The default is the operator itself; skip and diff give their documented maps, for any
    width (3 channels here, the skip weight's 4)."""
    gen = torch.Generator().manual_seed(3)
    w = torch.rand(2, 5, 5, generator=gen, dtype=torch.float64)  # (heads, N, N)
    w[1, 2] = 0  # a row without out-edges: I' drops it
    x = torch.randn(2, 5, 3, generator=gen, dtype=torch.float64)  # (heads, N, C)
    p = w / w.sum(-1, keepdim=True).clamp_min(1e-300)
    heat = OPERATORS.resolve("heat[t=0.7]")
    torch.testing.assert_close(heat.token_map(DenseGraph(w), x), heat(DenseGraph(w), x))
    skip = OPERATORS.resolve("skip", heads=2, dim=4)
    with torch.no_grad():
        skip.skip_weight.copy_(torch.randn(2, 4, 4, generator=gen))
    c = torch.diagonal(skip.skip_weight, dim1=-2, dim2=-1).mean(-1).double()  # (heads,)
    has = (w.sum(-1, keepdim=True) > 0).double()  # I'
    expected = p @ x + c[:, None, None] * has * x
    torch.testing.assert_close(skip.token_map(DenseGraph(w), x), expected)
    with pytest.raises(ValueError, match="2 heads") as err:
        skip.token_map(DenseGraph(w[:1].expand(3, 5, 5)), x[:1].expand(3, 5, 3))
    assert err.value.argument == "x"
    diff = OPERATORS.resolve("diff", lambda_init=0.3)
    maps = torch.stack([w[0], w[0].T.contiguous()])  # (2 maps, N, N)
    pm = maps / maps.sum(-1, keepdim=True)
    got = diff.token_map(DenseGraph(maps), x[0])
    torch.testing.assert_close(got, pm[0] @ x[0] - 0.3 * pm[1] @ x[0])


@pytest.mark.parametrize(
    ("kwargs", "argument", "kind"),
    [
        ({"queries": []}, "queries", ValueError),
        ({"queries": [N]}, "queries", ValueError),
        ({"queries": [-N - 1]}, "queries", ValueError),
        ({"queries": torch.tensor([0.0])}, "queries", TypeError),
        ({"queries": torch.zeros(1, 1, dtype=torch.long)}, "queries", TypeError),
        ({"queries": [True]}, "queries", TypeError),
        ({"queries": "0"}, "queries", TypeError),
        ({"queries": [0], "residual": 1.5}, "residual", ValueError),
        ({"queries": [0], "residual": -0.1}, "residual", ValueError),
        ({"queries": [0], "residual": "half"}, "residual", TypeError),
        ({"queries": [0], "eval_mode": 1}, "eval_mode", TypeError),
    ],
)
def test_bad_input_names_the_argument(kwargs: dict, argument: str, kind: type) -> None:
    model = _gpt(("attention:2", "attention:2"), "softmax", True)
    with pytest.raises(kind) as err:
        rollout(model, TOKENS, **kwargs)
    assert isinstance(err.value, ArgumentError) and err.value.argument == argument
    assert all(not b.attn._forward_pre_hooks for b in model.blocks)


def test_a_model_without_diffusion_attention_is_refused() -> None:
    with pytest.raises(TypeError, match="blocks") as err:
        rollout(torch.nn.Linear(2, 2), torch.zeros(1, 2), queries=[0])
    assert err.value.argument == "model"
