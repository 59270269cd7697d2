"""``heatformer.analysis.attention_stats`` against the dense ``P`` in float64, every graph kind.

The references are numpy: ``P`` from :func:`references.softmax_reference` (the attention kinds,
with the window's mask written out here from its definition) or the weights divided by their
row sums, then ``P.sum(-2)``, ``-sum P log P`` and the masked logits' row maximum. The library
computes the same from blocks of rows (logits, band, kept weights), never ``N x N``; a
dispatch-mode spy checks that no tensor of ``N x N`` entries appears.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import mpmath
import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import graph_helpers as gh
import heatformer.graph_ops.window.layout as window_layout
from heatformer.analysis import AttentionStats, attention_stats
from heatformer.checks import ArgumentError
from heatformer.graph_ops import DenseGraph, SoftmaxGraph, SparseGraph, WindowGraph
from references import softmax_reference

B, H = 2, 3


# ---- references ------------------------------------------------------------------------------


def _ref(p: np.ndarray, logits: np.ndarray | None = None, allowed: np.ndarray | None = None):
    """``(in_degree, entropy, max_logit)`` of a dense ``P`` (rows sum to 1 or 0)."""
    safe = np.where(p > 0, p, 1.0)
    entropy = -(p * np.log(safe)).sum(-1)
    if logits is None:
        return p.sum(-2), entropy, None
    top = np.where(allowed, logits, -np.inf).max(-1)
    return p.sum(-2), entropy, top


def _walk(w: np.ndarray) -> np.ndarray:
    d = w.sum(-1, keepdims=True)
    return np.divide(w, d, out=np.zeros_like(w), where=d > 0)


def _check(stats: AttentionStats, ref: tuple, *, atol: float = 1e-12) -> None:
    in_degree, entropy, top = ref
    assert isinstance(stats, AttentionStats)
    assert stats.in_degree.shape == stats.entropy.shape == in_degree.shape
    np.testing.assert_allclose(gh.to_numpy(stats.in_degree), in_degree, atol=atol, rtol=0)
    np.testing.assert_allclose(gh.to_numpy(stats.entropy), entropy, atol=atol, rtol=0)
    if top is None:
        assert stats.max_logit is None
    else:
        assert stats.max_logit is not None and stats.max_logit.shape == top.shape
        np.testing.assert_allclose(gh.to_numpy(stats.max_logit), top, atol=atol, rtol=0)


def _logits(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> np.ndarray:
    qn, kn = gh.to_numpy(q), gh.to_numpy(k)
    scale = 1.0 / math.sqrt(qn.shape[-1]) if scale is None else scale
    return qn @ np.swapaxes(kn, -1, -2) * scale


def _softmax_allowed(n: int, mask: torch.Tensor | None, causal: bool, shape) -> np.ndarray:
    allowed = np.ones(shape, dtype=bool)
    if mask is not None:
        allowed &= np.broadcast_to(mask.numpy(), shape)
    if causal:
        allowed &= np.tril(np.ones((n, n), dtype=bool))
    return allowed


def _window_allowed(
    n: int, w: int, causal: bool, g: int, key_mask: np.ndarray | None, drop: bool
) -> np.ndarray:
    """The window kind's edges from its definition: ``(B or 1, 1, N, N)``."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    glob = (i < g) | (j < g)
    if causal:
        ok = (i - j >= 0) & ((i - j < w) | glob)
    else:
        ok = (np.abs(i - j) <= w) | glob
    ok = ok[None, None]
    if key_mask is not None:
        ok = ok & key_mask[:, None, None, :]
        if drop:
            ok = ok & key_mask[:, None, :, None]
    return ok


# ---- the dense attention kind ----------------------------------------------------------------

SOFTMAX_CASES = {
    "plain": {},
    "causal": {"causal": True},
    "masked": {"masked": True},
    "empty-rows": {"masked": True, "empty_rows": (1, 4)},
    "masked-causal": {"masked": True, "causal": True},
    "scaled": {"scale": 0.37},
}


@pytest.mark.parametrize("row_block", [None, 1, 3])
@pytest.mark.parametrize("case", sorted(SOFTMAX_CASES))
def test_softmax_graph_equals_its_dense_p(case: str, row_block: int | None) -> None:
    opts = SOFTMAX_CASES[case]
    c = gh.make_attention(7, n=7, batch=(B, H), features=4, **opts)
    graph = c.graph("softmax")
    p = c.probs()
    allowed = _softmax_allowed(7, c.mask, c.causal, p.shape)
    ref = _ref(p, _logits(c.q, c.k, c.scale), allowed)
    stats = attention_stats(graph, row_block=row_block)
    _check(stats, ref)
    assert stats.in_degree.dtype == torch.float64
    # against the graph's own dense form too (a second route to P)
    _check(stats, _ref(gh.to_numpy(graph.to_dense()), _logits(c.q, c.k, c.scale), allowed))
    if opts.get("empty_rows"):  # a fully masked query: no edges, entropy 0, max logit -inf
        rows = list(opts["empty_rows"])
        assert bool(torch.isneginf(stats.max_logit[..., rows]).all())  # type: ignore[index]
        assert bool((stats.entropy[..., rows] == 0).all())


def test_a_key_mask_broadcast_over_heads() -> None:
    """A padding mask ``(B, 1, 1, N)`` as models pass it (every query sees the same keys)."""
    c = gh.make_attention(3, n=9, batch=(B, H), features=4)
    key_mask = torch.ones(B, 1, 1, 9, dtype=torch.bool)
    key_mask[1, ..., 6:] = False  # sequence 1 is 6 tokens long
    graph = SoftmaxGraph(c.q, c.k, mask=key_mask)
    p = softmax_reference(gh.to_numpy(c.q), gh.to_numpy(c.k), mask=key_mask.numpy())
    allowed = np.broadcast_to(key_mask.numpy(), p.shape)
    stats = attention_stats(graph)
    _check(stats, _ref(p, _logits(c.q, c.k), allowed))
    assert bool((stats.in_degree[1, :, 6:] == 0).all())  # padding is never read
    torch.testing.assert_close(
        stats.in_degree.sum(-1), torch.full((B, H), 9.0, dtype=torch.float64)
    )


def test_uniform_and_one_hot_rows() -> None:
    """Entropy ``log m`` on a row uniform over ``m`` keys; 0 on a one-hot row."""
    n = 5
    z = torch.zeros(1, n, 2, dtype=torch.float64)
    stats = attention_stats(SoftmaxGraph(z, z, causal=True))
    torch.testing.assert_close(stats.entropy[0], torch.log(torch.arange(1.0, n + 1).double()))
    torch.testing.assert_close(stats.in_degree[0], torch.tensor([1 / m for m in range(1, n + 1)],
                               dtype=torch.float64).flip(0).cumsum(0).flip(0))  # fmt: skip
    eye = DenseGraph(torch.eye(n, dtype=torch.float64))
    onehot = attention_stats(eye)
    assert bool((onehot.entropy == 0).all()) and bool((onehot.in_degree == 1).all())
    assert onehot.max_logit is None


def test_a_peaked_row_keeps_its_small_entropy() -> None:
    """Logits 40 apart: ``P`` is one-hot to float64, yet the entropy (about ``41 e^-40``) comes
    out to relative rounding (60-digit reference), not as 0 or a rounding residue."""
    q = torch.tensor([[[40.0, 0.0]]], dtype=torch.float64).expand(1, 3, 2)
    k = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]], dtype=torch.float64)
    stats = attention_stats(SoftmaxGraph(q, k, scale=1.0))
    mpmath.mp.dps = 60
    s = [mpmath.mpf(40), mpmath.mpf(0), mpmath.mpf(0)]
    z = mpmath.fsum(mpmath.exp(v) for v in s)
    exact = -mpmath.fsum(mpmath.exp(v) / z * (v - mpmath.log(z)) for v in s)
    assert float(exact) < 1e-15
    np.testing.assert_allclose(stats.entropy[0].numpy(), float(exact), rtol=1e-12)
    assert bool((stats.max_logit == 40.0).all())  # type: ignore[union-attr]


# ---- explicit weights and edge lists ---------------------------------------------------------


def test_dense_weights_use_the_walk() -> None:
    """A general weight matrix (isolated node, self-loops): the statistics of ``D^+ W``."""
    w = gh.random_weights(11, 8, batch=(B, H), symmetric=False, isolated=(2,))
    stats = attention_stats(DenseGraph(torch.from_numpy(w)), row_block=3)
    _check(stats, _ref(_walk(w)))
    assert bool((stats.entropy[..., 2] == 0).all()) and bool((stats.in_degree[..., 2] == 0).all())


def test_sparse_graphs_equal_their_dense_form() -> None:
    w = gh.random_weights(12, 8, batch=(B, H), symmetric=False, isolated=(5,))
    sparse = DenseGraph(torch.from_numpy(w)).to_sparse()
    assert isinstance(sparse, SparseGraph)
    _check(attention_stats(sparse), _ref(_walk(w)))


def test_repeated_edges_are_summed_before_the_entropy() -> None:
    """``(0, 1)`` listed twice (weights 0.25 + 0.25) is one entry of 0.5, as in every
    operation on the graph: entropy ``log 2`` on row 0, not that of three entries."""
    edge_index = torch.tensor([[0, 0, 0, 1, 2], [1, 1, 2, 0, 2]])
    weight = torch.tensor([0.25, 0.25, 0.5, 2.0, 1.0], dtype=torch.float64)
    g = SparseGraph.from_edge_index(edge_index, weight, num_nodes=3)
    dense = gh.to_numpy(g.to_dense())
    assert dense[0, 1] == 0.5
    stats = attention_stats(g)
    _check(stats, _ref(_walk(dense)))
    assert math.isclose(float(stats.entropy[0]), math.log(2.0), rel_tol=1e-15)


@pytest.mark.parametrize("case", ["plain", "causal", "empty-rows"])
def test_topk_graphs_use_their_kept_weights(case: str) -> None:
    """A top-k graph of attention: the statistics of its renormalized kept weights (its dense
    form), no logits; rows with fewer allowed keys keep zero-weight entries, which count 0."""
    c = gh.make_attention(5, n=8, batch=(B, H), features=4, **SOFTMAX_CASES[case])
    top = c.graph("softmax").topk(3)
    stats = attention_stats(top)
    _check(stats, _ref(gh.to_numpy(top.to_dense())))
    has = (gh.to_numpy(top.to_dense()).sum(-1) > 0).sum(-1)  # rows with edges per graph
    np.testing.assert_allclose(gh.to_numpy(stats.in_degree.sum(-1)), has, atol=1e-12)


def test_symmetrized_graphs_take_the_default_rows() -> None:
    w = gh.random_weights(13, 6, batch=(B,), symmetric=False)
    g = DenseGraph(torch.from_numpy(w)).to_sparse().symmetrize()
    ws = 0.5 * (w + np.swapaxes(w, -1, -2))
    _check(attention_stats(g), _ref(_walk(ws)))


# ---- the window kind -------------------------------------------------------------------------

WINDOW_CASES = [
    # (window, causal, num_global, key mask, drop masked queries)
    (3, True, 0, False, False),
    (3, True, 2, False, False),
    (2, False, 0, False, False),
    (2, False, 1, False, False),
    (3, False, 2, True, False),
    (2, True, 1, True, False),
    (2, False, 1, True, True),
    (40, False, 0, False, False),  # a window wider than N: the dense graph
]


@pytest.mark.parametrize("small_slabs", [False, True])
@pytest.mark.parametrize(("w", "causal", "g", "masked", "drop"), WINDOW_CASES)
def test_window_graph_equals_its_dense_p(
    w: int, causal: bool, g: int, masked: bool, drop: bool, small_slabs: bool, monkeypatch
) -> None:
    """Band blocks (rows of 4, several runs with ``small_slabs``), global rows, padding."""
    if small_slabs:  # one block per run: every run boundary and the interior cut are crossed
        monkeypatch.setattr(window_layout, "SLAB_ELEMENTS", 1)
    n = 13
    c = gh.make_attention(9, n=n, batch=(B, H), features=4)
    key_mask = None
    if masked:
        key_mask = torch.ones(B, n, dtype=torch.bool)
        key_mask[1, 9:] = False
        key_mask[0, 4] = False
    graph = WindowGraph(c.q, c.k, window=w, causal=causal, num_global=g, key_mask=key_mask,
                        drop_masked_queries=drop, row_block=4)  # fmt: skip
    allowed = _window_allowed(n, min(w, n), causal, g, None if key_mask is None else
                              key_mask.numpy(), drop)  # fmt: skip
    p = softmax_reference(gh.to_numpy(c.q), gh.to_numpy(c.k), mask=allowed)
    allowed = np.broadcast_to(allowed, p.shape)
    stats = attention_stats(graph)
    _check(stats, _ref(p, _logits(c.q, c.k), allowed))
    torch.testing.assert_close(graph.to_dense(), torch.from_numpy(p))  # the same P
    if drop:  # a dropped query reads nothing: -inf, entropy 0
        assert bool(torch.isneginf(stats.max_logit[1, :, 9:]).all())  # type: ignore[index]


# ---- precision, gradients, memory ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["softmax", "window"])
def test_half_precision_graphs_give_float32_statistics(kind: str) -> None:
    c = gh.make_attention(4, n=16, batch=(B, H), features=8, causal=True)
    q, k = c.q.to(torch.bfloat16), c.k.to(torch.bfloat16)
    if kind == "softmax":
        graph: Any = SoftmaxGraph(q, k, causal=True)
    else:
        graph = WindowGraph(q, k, window=5, causal=True)
    stats = attention_stats(graph)
    assert stats.in_degree.dtype == stats.entropy.dtype == torch.float32
    exact = attention_stats(graph.to(torch.float64))  # the same bfloat16 q, k in float64
    torch.testing.assert_close(stats.entropy.double(), exact.entropy, atol=1e-5, rtol=0)
    torch.testing.assert_close(stats.in_degree.double(), exact.in_degree, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["softmax", "window", "dense", "sparse"])
def test_gradients_equal_those_of_the_dense_formula(kind: str) -> None:
    """d(sum of all three) / d(q, k or weights) by the blocks (recomputed in backward) equals
    autograd through the dense ``P`` in float64, finite on fully masked rows."""
    c = gh.make_attention(6, n=7, batch=(B,), features=3, masked=True, empty_rows=(2,))
    q, k = c.q.clone().requires_grad_(), c.k.clone().requires_grad_()
    mask = c.mask
    assert mask is not None
    if kind == "window":
        key_mask = torch.ones(B, 7, dtype=torch.bool)
        key_mask[0, 5] = False
        graph: Any = WindowGraph(q, k, window=2, num_global=1, key_mask=key_mask, row_block=2)
        allowed = torch.from_numpy(_window_allowed(7, 2, False, 1, key_mask.numpy(), False))[:, 0]
    elif kind == "softmax":
        graph, allowed = SoftmaxGraph(q, k, mask=mask, row_block=2), mask
    else:
        allowed = mask
    s = q @ k.mT / math.sqrt(3)
    s = s.masked_fill(~allowed, -torch.inf)
    p = torch.softmax(s, -1).nan_to_num(0.0)  # (B, N, N), rows without keys 0
    if kind in ("dense", "sparse"):
        weights = p.detach().clone().requires_grad_()
        graph = DenseGraph(weights) if kind == "dense" else DenseGraph(weights).to_sparse()
        d = weights.sum(-1, keepdim=True)  # D^+: 0 on the row without edges
        p = weights * torch.where(d > 0, 1.0 / torch.where(d > 0, d, 1.0), 0.0)
    entropy = -torch.where(p > 0, p * torch.log(torch.where(p > 0, p, 1.0)), 0.0).sum(-1)
    top = s.amax(-1)
    ref = p.sum(-2).sum() + entropy.sum()
    if kind not in ("dense", "sparse"):  # the logit kinds: their largest logits too
        ref = ref + torch.where(torch.isfinite(top), top, 0.0).sum()
    stats = attention_stats(graph)
    mx = stats.max_logit
    total = stats.in_degree.sum() + stats.entropy.sum()
    if mx is not None:
        total = total + torch.where(torch.isfinite(mx), mx, 0.0).sum()
    torch.testing.assert_close(total, ref, atol=1e-12, rtol=0)
    leaves = [weights] if kind in ("dense", "sparse") else [q, k]
    got = torch.autograd.grad(total, leaves)
    want = torch.autograd.grad(ref, leaves)
    for a, b in zip(got, want, strict=True):
        assert bool(torch.isfinite(a).all())
        if kind == "sparse":  # its stored entries only: an absent edge has no weight to move
            a, b = a[weights != 0], b[weights != 0]
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


class _LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an aten call made."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@contextmanager
def _largest() -> Iterator[_LargestTensor]:
    with _LargestTensor() as spy:
        yield spy


def test_no_tensor_of_n_by_n_entries() -> None:
    """At N = 2048 the softmax kind's largest tensor is a 256-row slab (1/8 of N x N), the
    window kind's a few band slabs (O(N (w + g))), a top-k graph's its edges."""
    n = 2048
    gen = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 1, n, 16, generator=gen) for _ in range(2))
    with torch.no_grad(), _largest() as spy:
        attention_stats(SoftmaxGraph(q, k, causal=True))
    assert spy.largest <= 256 * n
    window = WindowGraph(q, k, window=32, causal=True, num_global=1)
    with torch.no_grad(), _largest() as spy:
        attention_stats(window)
    assert spy.largest <= 4 * n * (window.layout.slab + 1)  # band slabs, not N x N
    top = SoftmaxGraph(q, k).topk(8)
    with torch.no_grad(), _largest() as spy:
        attention_stats(top)
    assert spy.largest <= 2 * n * 8


# ---- bad input -------------------------------------------------------------------------------


def test_bad_input_names_the_argument() -> None:
    with pytest.raises(TypeError, match=r"^graph: expected a heatformer Graph") as err:
        attention_stats(torch.eye(3))  # type: ignore[arg-type]
    assert isinstance(err.value, ArgumentError) and err.value.argument == "graph"
    g = DenseGraph(torch.eye(3))
    with pytest.raises(ValueError, match=r"^row_block: expected None or a positive int, got 0"):
        attention_stats(g, row_block=0)
    with pytest.raises(TypeError, match=r"^row_block: expected None or a positive int, got float"):
        attention_stats(g, row_block=2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        attention_stats(g, 4)  # type: ignore[misc]  # keyword-only


# ---- a Hugging Face model running sdpa, against transformers' eager attention ---------------


def _hf_inputs(n: int = 9) -> dict[str, Any]:
    """Two sequences, the second right-padded to 6 real tokens (every query keeps real keys)."""
    from hf_helpers import VOCAB

    ids = torch.randint(3, VOCAB, (2, n), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, 6:] = 0
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}


@pytest.mark.parametrize(("family", "atol"), [("bert", 1e-12), ("llama", 1e-6)])
def test_hf_statistics_equal_eager_attention_maps(family: str, atol: float, monkeypatch) -> None:
    """``hf.attention_stats`` on a model running sdpa (no ``output_attentions``) equals the
    statistics of transformers' eager ``(B, H, N, N)`` maps, in float64: a bidirectional BERT
    and a causal Llama with grouped-query attention (4 query heads, 2 key/value heads), both
    with a padded sequence. The largest logits are read from the eager function's own
    ``query``, ``key`` and mask (Llama's eager softmax runs in float32: ``atol`` 1e-6)."""
    pytest.importorskip("transformers")
    import copy
    import importlib

    from heatformer.integrations import hf
    from hf_helpers import configs

    cls, config = configs()[family]
    torch.manual_seed(0)
    model = cls(config).to(torch.float64).eval()
    model.set_attn_implementation("sdpa")
    inputs = _hf_inputs()
    stats = hf.attention_stats(model, **inputs)
    assert model.config._attn_implementation == "sdpa"  # left as it was
    assert all(getattr(m, "heatformer", None) is None for m in model.modules())

    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    original = modeling.eager_attention_forward
    logits: list[torch.Tensor] = []

    def recording(module, query, key, value, attention_mask, *args, **kwargs):  # type: ignore[no-untyped-def]
        k = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)  # (B, H, T, Dh)
        scaling = kwargs.get("scaling", args[0] if args else None) or query.shape[-1] ** -0.5
        s = query @ k.transpose(-1, -2) * scaling
        if attention_mask is not None:
            allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
            s = s.masked_fill(~allowed, -torch.inf)
        logits.append(s.amax(-1))
        return original(module, query, key, value, attention_mask, *args, **kwargs)

    monkeypatch.setattr(modeling, "eager_attention_forward", recording)
    with torch.no_grad():
        maps = eager(**inputs, output_attentions=True).attentions  # (B, H, N, N) per layer
    assert len(stats) == len(maps) == len(logits) == 2
    for got, p, top in zip(stats, maps, logits, strict=True):
        assert got.entropy.shape == (2, 4, 9) and got.entropy.dtype == torch.float64
        pn = gh.to_numpy(p)
        safe = np.where(pn > 0, pn, 1.0)
        np.testing.assert_allclose(gh.to_numpy(got.in_degree), pn.sum(-2), atol=atol, rtol=0)
        np.testing.assert_allclose(gh.to_numpy(got.entropy), -(pn * np.log(safe)).sum(-1),
                                   atol=atol, rtol=0)  # fmt: skip
        assert got.max_logit is not None
        torch.testing.assert_close(got.max_logit, top, atol=atol, rtol=0)
        assert bool((got.in_degree[1, :, 6:] == 0).all())  # padded keys are never read


def test_hf_statistics_of_a_converted_model_follow_its_graph_kind() -> None:
    """A converted model keeps its heads and graph kind: on ``topk[k=3]`` the statistics are
    those of the kept weights (no logits), each row at most ``log 3`` nats; the hook is gone
    afterwards, so the converted forward reads nothing more."""
    pytest.importorskip("transformers")
    from heatformer.integrations import hf
    from heatformer.integrations._heads import HeadOperators
    from hf_helpers import configs

    cls, config = configs()["bert"]
    torch.manual_seed(1)
    model = hf.convert(cls(config).eval(), "attention:2,laplacian:2", graph="topk[k=3]")
    inputs = _hf_inputs()
    stats = hf.attention_stats(model, **inputs)
    graphs = hf.attention_graphs(model, **inputs)
    assert model.config._attn_implementation == "heatformer"
    assert all(m._capture is None for m in model.modules() if isinstance(m, HeadOperators))
    for got, graph in zip(stats, graphs, strict=True):
        assert got.max_logit is None
        assert bool((got.entropy <= math.log(3) + 1e-6).all())
        want = attention_stats(graph)
        torch.testing.assert_close(got.in_degree, want.in_degree)
        torch.testing.assert_close(got.entropy, want.entropy)
        torch.testing.assert_close(got.in_degree.sum(-1), torch.full((2, 4), 9.0))


class _SyncSpy(TorchDispatchMode):
    """The aten calls that make the host wait for the device (as ``tests/test_syncs.py``)."""

    SYNC = frozenset({"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select",
                      "aten::unique", "aten::_unique2", "aten::repeat_interleave"})  # fmt: skip

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func._schema.name in self.SYNC:
            self.ops.append(func._schema.name)
        return func(*args, **(kwargs or {}))


def test_the_converted_attention_reads_nothing_without_the_hook() -> None:
    """After ``hf.attention_stats`` the hook is gone: the converted attention function makes no
    host sync (with a padding mask too); with the hook on the dense kind it makes none either."""
    pytest.importorskip("transformers")
    from heatformer.integrations import hf
    from heatformer.models.masks import AttentionMask
    from hf_helpers import configs

    cls, config = configs()["bert"]
    model = hf.convert(cls(config).eval(), "attention:2,laplacian:2")
    hf.attention_stats(model, input_ids=torch.zeros(1, 5, dtype=torch.long))
    _, module = hf.attention_modules(model)[0]
    heads = module.heatformer
    assert heads._capture is None
    q, k, v = (torch.randn(2, 4, 7, 8) for _ in range(3))
    key_mask = torch.ones(2, 7, dtype=torch.bool)
    key_mask[1, 5:] = False
    for mask in (AttentionMask(causal=False), AttentionMask(key_mask, causal=False)):
        with _SyncSpy() as spy:
            hf.heatformer_attention(module, q, k, v, mask)
        assert spy.ops == []
        sink = hf._StatsSink()
        heads._capture = sink
        try:
            with _SyncSpy() as spy:
                hf.heatformer_attention(module, q, k, v, mask)
        finally:
            heads._capture = None
        assert spy.ops == [] and len(sink.stats) == 1
        assert sink.stats[0].entropy.shape == (2, 4, 7)
