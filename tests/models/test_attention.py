"""DiffusionAttention: MHA equivalence, the explicit per-head update, every operator against
numpy/scipy references, dense == top-k at k = N, symmetries, masks, KV cache and errors.

Numerical tests run in float64 so that equivalences are checked to ~1e-12, not to float32
noise. The equivalence tests take ``device`` (CPU; CUDA where available, marked ``cuda``):
float64 is float64 on CUDA too, so their tolerances are the same on both (``TIGHT`` in
``tests/device_helpers.py``).
"""

from __future__ import annotations

import copy
import gc
import math

import numpy as np
import pytest
import scipy.linalg
import torch
import torch.nn.functional as F
from torch import nn

import model_helpers as mh
from device_helpers import TIGHT
from heatformer._spec import format_entry
from heatformer.graph_ops import (
    GRAPHS,
    GraphBuilder,
    HeatKernel,
    Laplacian,
    SoftmaxGraph,
)
from heatformer.models import DiffusionAttention, KVCache

F64 = torch.float64

#: One spec per operator kind (and normalization); "interleaved" puts the fused heads
#: (attention, rw-Laplacian) at non-contiguous positions.
OPERATOR_SPECS = {
    "attention": "attention:4",
    "laplacian": "laplacian:4",
    "laplacian-sym": "laplacian[normalization=sym]:4",
    "laplacian-comb": "laplacian[normalization=combinatorial]:4",
    "heat": "heat[t=0.7;tol=1e-10]:4",
    "heat-comb": "heat[t=0.7;normalization=combinatorial;tol=1e-10]:4",
    "ppr": "ppr[alpha=0.5;tol=1e-10]:4",
    "polynomial": "polynomial[coeffs=(0.5 -1.0 0.25)]:4",
    "polynomial-ppr": "polynomial[init=ppr,alpha=0.2,order=8,learnable=true]:2,attention:2",
    "mixed": "attention:1,laplacian:1,heat[t=0.5;tol=1e-10]:1,ppr[alpha=0.5;tol=1e-10]:1",
    "interleaved": "heat[t=1.5;tol=1e-10]:1,attention:1,ppr[alpha=0.5;tol=1e-10]:1,laplacian:1",
    "controls": "center:1,attention:1,mean:1,center[scale=0.5]:1",
    "diff": "diff:1,attention:1,diff[lambda_init=0.5]:1,laplacian:1",
}


def spec_params(*, tight: bool = True) -> list:
    """``OPERATOR_SPECS`` as pytest params.

    ``tight=False`` drops the ``tol=1e-10`` series tolerances: exact properties (symmetries,
    masks) hold at any truncation, and the default tolerance needs fewer propagations.
    """
    params = []
    for name, spec in OPERATOR_SPECS.items():
        if not tight:
            spec = spec.replace(";tol=1e-10", "")
        params.append(pytest.param(spec, id=name))
    return params


def clone_layer(layer: DiffusionAttention, **kwargs) -> DiffusionAttention:
    """A layer with the same operators and weights, other keyword options (e.g. graph)."""
    weight = layer.in_proj.weight
    options = {"causal": layer.causal, "dtype": weight.dtype, "device": weight.device}
    options.update(kwargs)
    ops = copy.deepcopy(layer.head_operators)  # keeps shared instances shared
    other = DiffusionAttention(layer.embed_dim, layer.num_heads, ops, **options)
    other.load_state_dict(layer.state_dict())
    return other


def grads(layer: DiffusionAttention, x: torch.Tensor, key_mask=None, seed: int = 5):
    """Output, and the gradients of ``<out, g>`` w.r.t. ``x`` and every parameter."""
    layer.zero_grad()
    x = x.detach().clone().requires_grad_(True)
    out = layer(x, key_mask)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    (out * g.to(out.device)).sum().backward()
    named = {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}
    return out.detach(), x.grad, named


# ---- nn.MultiheadAttention ---------------------------------------------------------------------


def _mha(d: int, h: int, *, bias: bool = True, batch_first: bool = True, seed: int = 0):
    torch.manual_seed(seed)
    mha = nn.MultiheadAttention(d, h, bias=bias, batch_first=batch_first, dtype=F64)
    if bias:
        with torch.no_grad():
            mha.in_proj_bias.normal_(0.0, 0.3)
            mha.out_proj.bias.normal_(0.0, 0.3)
    return mha


@pytest.mark.parametrize(
    ("batch_first", "bias"),
    [(True, True), (False, True), (True, False)],
    ids=["bf", "sf", "nobias"],
)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_all_attention_equals_multihead_attention(
    masked, causal, batch_first, bias, device
) -> None:
    d, h, b, n = 16, 4, 3, 6
    mha = _mha(d, h, bias=bias, batch_first=batch_first).to(device)
    ours = DiffusionAttention.from_mha(mha, causal=causal)
    assert ours.in_proj.weight.dtype == F64 and (ours.in_proj.bias is not None) == bias
    assert ours.in_proj.weight.device.type == device.type
    x = mh.random_input(1, b, n, d, device=device)
    key_mask = mh.padding_mask(b, n, [6, 4, 1], device) if masked else None  # True = real
    kwargs = {"need_weights": False}
    if masked:
        kwargs["key_padding_mask"] = ~key_mask  # MHA: True = pad
    if causal:
        kwargs["attn_mask"] = torch.ones(n, n, dtype=torch.bool, device=device).triu(1)  # masked
        kwargs["is_causal"] = True

    xm = x.detach().clone().requires_grad_(True)
    inp = xm if batch_first else xm.transpose(0, 1)
    ref = mha(inp, inp, inp, **kwargs)[0]
    ref = ref if batch_first else ref.transpose(0, 1)
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(2), dtype=F64).to(device)
    (ref * g).sum().backward()

    xo = x.detach().clone().requires_grad_(True)
    out = ours(xo, key_mask)
    (out * g).sum().backward()

    assert out.device.type == device.type
    torch.testing.assert_close(out, ref, **TIGHT)
    torch.testing.assert_close(xo.grad, xm.grad, **TIGHT)
    torch.testing.assert_close(ours.in_proj.weight.grad, mha.in_proj_weight.grad, **TIGHT)
    torch.testing.assert_close(ours.out_proj.weight.grad, mha.out_proj.weight.grad, **TIGHT)
    if bias:
        torch.testing.assert_close(ours.in_proj.bias.grad, mha.in_proj_bias.grad, **TIGHT)
        torch.testing.assert_close(ours.out_proj.bias.grad, mha.out_proj.bias.grad, **TIGHT)


@pytest.mark.parametrize("batch_first", [True, False])
def test_to_mha_round_trip(batch_first) -> None:
    layer = mh.random_layer("attention", causal=False)
    mha = layer.to_mha(batch_first=batch_first)
    assert mha.batch_first == batch_first and mha.in_proj_weight.dtype == F64
    x = mh.random_input(3)
    key_mask = mh.padding_mask(2, 6, [3, 6])
    inp = x if batch_first else x.transpose(0, 1)
    ref = mha(inp, inp, inp, key_padding_mask=~key_mask, need_weights=False)[0]
    ref = ref if batch_first else ref.transpose(0, 1)
    torch.testing.assert_close(layer(x, key_mask), ref, **TIGHT)
    back = DiffusionAttention.from_mha(mha)
    for p, q in zip(back.parameters(), layer.parameters()):
        assert torch.equal(p, q)


def test_mha_conversion_errors() -> None:
    with pytest.raises(ValueError, match=r"expected every head 'attention'.*laplacian"):
        mh.random_layer("attention:2,laplacian:2").to_mha()
    with pytest.raises(ValueError, match=r"dense 'softmax' graph .* got graph 'topk\[k=3\]'"):
        mh.random_layer("attention", graph="topk[k=3]").to_mha()
    with pytest.raises(ValueError, match="QK-norm"):
        mh.random_layer("attention", qk_norm=True).to_mha()
    with pytest.raises(ValueError, match="kdim/vdim"):
        DiffusionAttention.from_mha(nn.MultiheadAttention(8, 2, kdim=4, vdim=4))
    with pytest.raises(ValueError, match="add_bias_kv"):
        DiffusionAttention.from_mha(nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(TypeError, match=r"nn\.MultiheadAttention"):
        DiffusionAttention.from_mha(nn.Linear(8, 8))  # type: ignore[arg-type]


def test_from_mha_with_other_operators_keeps_the_weights() -> None:
    mha = _mha(16, 4)
    layer = DiffusionAttention.from_mha(mha, "attention:2,laplacian:2", causal=True)
    assert layer.spec == "attention:2,laplacian:2" and layer.causal
    assert torch.equal(layer.in_proj.weight, mha.in_proj_weight)
    assert torch.equal(layer.out_proj.bias, mha.out_proj.bias)


# ---- the explicit per-head update --------------------------------------------------------------


def explicit_update(layer: DiffusionAttention, x, key_mask=None):
    """Head h: ``P_h V_h`` (attention) or ``V_h - P_h V_h`` (Laplacian), written out."""
    q, k, v = layer.project_qkv(x)  # (B, H, N, Dh)
    n = x.shape[1]
    scores = q @ k.transpose(-1, -2) / math.sqrt(layer.head_dim)  # (B, H, N, N)
    allowed = torch.ones(n, n, dtype=torch.bool, device=x.device)
    if layer.causal:
        allowed = allowed.tril()
    if key_mask is not None:
        allowed = allowed & key_mask[:, None, None, :]
    p = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    pv = p @ v
    heads = []
    for h, op in enumerate(layer.head_operators):
        a, b_ = op.affine_coefficients()  # attention (1, 0) or a Laplacian head (-1, 1)
        heads.append(float(a) * pv[:, h] + float(b_) * v[:, h])
    y = torch.stack(heads, dim=1)  # (B, H, N, Dh)
    b = x.shape[0]
    return y, layer.out_proj(y.transpose(1, 2).reshape(b, n, layer.embed_dim))


@pytest.mark.parametrize(
    "spec",
    [
        "attention:2,laplacian:2",
        "laplacian:1,attention:2,laplacian:1",
        "laplacian:4",
        ["attention", "laplacian", "attention", "laplacian"],
    ],
    ids=["att2-lap2", "lap1-att2-lap1", "lap4", "alternating-list"],
)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_mixed_heads_equal_the_explicit_update(spec, causal, masked, device) -> None:
    layer = mh.random_layer(spec, causal=causal, device=device)
    x = mh.random_input(4, device=device)
    key_mask = mh.padding_mask(2, 6, [6, 3], device) if masked else None
    q, k, v = layer.project_qkv(x)
    y_ref, out_ref = explicit_update(layer, x, key_mask)
    torch.testing.assert_close(layer.diffuse(q, k, v, key_mask), y_ref, **TIGHT)
    torch.testing.assert_close(layer(x, key_mask), out_ref, **TIGHT)


def test_repeated_names_in_a_spec_are_separate_operators() -> None:
    layer = mh.random_layer("laplacian:1,attention:2,laplacian:1")
    assert [op.name for op in layer.head_operators] == [
        "laplacian",
        "attention",
        "attention",
        "laplacian",
    ]
    assert len(layer.operators) == 3
    assert layer.head_operators[0] is not layer.head_operators[3]
    assert layer.spec == "laplacian:1,attention:2,laplacian:1"


@pytest.mark.parametrize(
    "spec",
    [
        "attention:1,heat[t=0.3;tol=1e-12]:1,laplacian:1,heat[t=2.5;tol=1e-12]:1",
        "heat[t=(0.3 4.0);tol=1e-12]:2,attention:2",
        "heat[t=0.8;learnable=true;tol=1e-12]:4",
        "heat[t=1.2;method=exact]:4",
    ],
    ids=["two-heat-entries", "per-head-t", "learnable", "exact"],
)
@pytest.mark.parametrize("causal", [False, True])
def test_heat_heads_equal_scipy_expm(spec, causal, device) -> None:
    layer = mh.random_layer(spec, causal=causal, device=device)
    x = mh.random_input(6, device=device)
    key_mask = mh.padding_mask(2, 6, [6, 4], device)  # every row keeps at least one key
    q, k, v = layer.project_qkv(x)
    y = layer.diffuse(q, k, v, key_mask)
    qn, kn, vn = (mh.to_numpy(t) for t in (q, k, v))
    n = x.shape[1]
    ops = layer.head_operators
    checked = 0
    for h, op in enumerate(ops):
        if op.name != "heat":
            continue
        t = mh.to_numpy(op.t)
        t_h = float(t) if t.ndim == 0 else float(t[sum(o is op for o in ops[:h])])
        for b in range(2):
            allowed = mh.allowed_matrix(n, key_mask[b].cpu().numpy(), causal)
            p = mh.softmax_probs(qn[b, h], kn[b, h], allowed)
            expected = scipy.linalg.expm(-t_h * (np.eye(n) - p)) @ vn[b, h]
            np.testing.assert_allclose(mh.to_numpy(y[b, h]), expected, atol=1e-10, rtol=0)
            checked += 1
    assert checked >= 4


@pytest.mark.parametrize("spec", spec_params())
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_every_operator_equals_the_reference(spec, causal, masked, device) -> None:
    layer = mh.random_layer(spec, causal=causal, device=device)
    x = mh.random_input(7, device=device)
    key_mask = mh.padding_mask(2, 6, [4, 6], device) if masked else None
    y_ref, out_ref = mh.diffuse_ref(layer, x, key_mask)
    q, k, v = layer.project_qkv(x)
    mh_close = {"atol": 1e-9, "rtol": 0}
    np.testing.assert_allclose(mh.to_numpy(layer.diffuse(q, k, v, key_mask)), y_ref, **mh_close)
    np.testing.assert_allclose(mh.to_numpy(layer(x, key_mask)), out_ref, **mh_close)


@pytest.mark.parametrize("causal", [False, True])
def test_shared_instances_at_non_contiguous_heads(causal) -> None:
    """One heat operator with a time per head serving heads 0 and 2; a scaled Laplacian
    (fused with the attention head through one SDPA call)."""
    heat = HeatKernel(t=[0.3, 4.0], tol=1e-12)
    torch.manual_seed(0)
    ops = [heat, Laplacian(step=0.5), heat, "attention"]
    layer = DiffusionAttention(16, 4, ops, causal=causal, dtype=F64)
    assert len(layer.operators) == 3 and layer.spec == "heat:1,laplacian:1,heat:1,attention:1"
    x = mh.random_input(29)
    key_mask = mh.padding_mask(2, 6, [6, 4])
    y_ref, out_ref = mh.diffuse_ref(layer, x, key_mask)
    q, k, v = layer.project_qkv(x)
    np.testing.assert_allclose(mh.to_numpy(layer.diffuse(q, k, v, key_mask)), y_ref, atol=1e-10)
    np.testing.assert_allclose(mh.to_numpy(layer(x, key_mask)), out_ref, atol=1e-10)


def test_qk_norm_and_need_weights(device) -> None:
    layer = mh.random_layer("attention:2,laplacian:2", qk_norm=True, causal=True, device=device)
    x = mh.random_input(8, device=device)
    key_mask = mh.padding_mask(2, 6, [6, 5], device)
    _, out_ref = explicit_update(layer, x, key_mask)  # project_qkv applies the QK-norm
    out, weights = layer(x, key_mask, need_weights=True)
    torch.testing.assert_close(out, out_ref, **TIGHT)
    assert weights.shape == (2, 4, 6, 6)
    q, k, _ = layer.project_qkv(x)
    qn, kn = mh.to_numpy(q), mh.to_numpy(k)
    for b in range(2):
        allowed = mh.allowed_matrix(6, key_mask[b].cpu().numpy(), True)
        for h in range(4):
            expected = mh.softmax_probs(qn[b, h], kn[b, h], allowed)
            np.testing.assert_allclose(mh.to_numpy(weights[b, h]), expected, atol=1e-12)
    # QK-norm: a LayerNorm over Dh on every head's raw queries and keys
    raw = layer.in_proj(x).view(2, 6, 3, 4, 4).permute(2, 0, 3, 1, 4)  # (3, B, H, N, Dh)
    for norm, got, r in ((layer.q_norm, q, raw[0]), (layer.k_norm, k, raw[1])):
        expected = torch.nn.functional.layer_norm(r, (4,), norm.weight, norm.bias, norm.eps)
        torch.testing.assert_close(got, expected, **TIGHT)


# ---- parameters and initialization -------------------------------------------------------------


@pytest.mark.parametrize("spec", spec_params())
def test_parameter_count_is_independent_of_the_operator_mix(spec) -> None:
    """The projections' parameters, whatever the heads (a differential head splits its query
    and key channels into its two maps, no wider projection); operators add only their own."""
    d = 16

    def projections(layer: DiffusionAttention) -> int:
        own = sum(p.numel() for p in layer.operators.parameters())
        return sum(p.numel() for p in layer.parameters()) - own

    assert projections(DiffusionAttention(d, 4, spec)) == 4 * d * d + 4 * d
    assert projections(DiffusionAttention(d, 4, spec, bias=False)) == 4 * d * d


def test_learnable_operators_add_exactly_their_parameters() -> None:
    base = 4 * 16 * 16 + 4 * 16
    count = lambda spec: sum(p.numel() for p in DiffusionAttention(16, 4, spec).parameters())  # noqa: E731
    assert count("heat[learnable=true]:2,attention:2") == base + 1  # one shared t
    assert count("heat[learnable=true]:1,heat[learnable=true]:1,attention:2") == base + 2
    assert count("heat[t=(0.5 1.0);learnable=true]:2,laplacian:2") == base + 2  # t per head
    assert count("laplacian[learnable=true]:4") == base + 1  # the step
    assert count("skip:2,attention:2") == base + 2 * 4 * 4  # a (Dh, Dh) skip weight per head


@pytest.mark.parametrize("spec", spec_params(tight=False))
def test_zero_init_makes_the_layer_output_exactly_zero(spec) -> None:
    causal = "normalization=sym" not in spec  # sym heads are refused in causal layers
    layer = DiffusionAttention(16, 4, spec, zero_init=True, causal=causal, dtype=F64)
    x = mh.random_input(9).requires_grad_(True)
    out = layer(x)
    assert torch.equal(out, torch.zeros_like(out))
    (out * mh.random_input(10)).sum().backward()  # zero at init, but out_proj can learn
    assert layer.out_proj.weight.grad is not None and layer.out_proj.weight.grad.abs().sum() > 0
    layer.reset_parameters()
    assert torch.equal(layer.out_proj.weight, torch.zeros_like(layer.out_proj.weight))


# ---- dense == top-k at k = N -------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [  # dense and top-k truncate the series at the same order: default tolerances suffice
        "attention:1,laplacian:1,heat[t=0.5]:1,ppr[alpha=0.5]:1",
        "heat[t=1.5]:1,attention:1,ppr[alpha=0.5]:1,laplacian:1",
        "heat[t=0.9;learnable=true]:2,laplacian[normalization=sym]:1,attention:1",
        "polynomial[coeffs=(0.2 1.0 -0.5)]:2,laplacian[normalization=combinatorial]:2",
    ],
    ids=["mixed", "interleaved", "learnable-heat-sym", "poly-comb"],
)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_dense_equals_topk_at_k_equal_n(spec, causal, masked, device) -> None:
    dense = mh.random_layer(spec, causal=causal, device=device)
    sparse = clone_layer(dense, graph="topk[k=6]")
    assert (sparse.graph_kind.spec, dense.graph_kind.spec) == ("topk[k=6]", "softmax")
    x = mh.random_input(11, device=device)
    key_mask = mh.padding_mask(2, 6, [6, 4], device) if masked else None
    out_d, gx_d, gp_d = grads(dense, x, key_mask)
    out_s, gx_s, gp_s = grads(sparse, x, key_mask)
    torch.testing.assert_close(out_s, out_d, atol=1e-10, rtol=1e-8)
    torch.testing.assert_close(gx_s, gx_d, atol=1e-10, rtol=1e-8)
    assert gp_s.keys() == gp_d.keys() and "in_proj.weight" in gp_d
    for name in gp_d:
        torch.testing.assert_close(gp_s[name], gp_d[name], atol=1e-10, rtol=1e-8)


def test_topk_larger_than_n_keeps_every_key() -> None:
    dense = mh.random_layer(OPERATOR_SPECS["mixed"], causal=True)
    sparse = clone_layer(dense, graph="topk[k=50]")
    x = mh.random_input(12)
    torch.testing.assert_close(sparse(x), dense(x), atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("causal", [False, True])
def test_topk_keeps_the_k_strongest_keys_renormalized(causal) -> None:
    kk = 3
    layer = mh.random_layer("attention:2,laplacian:2", causal=causal, graph=f"topk[k={kk}]")
    x = mh.random_input(13)
    key_mask = mh.padding_mask(2, 6, [6, 5])
    q, k, v = (mh.to_numpy(t) for t in layer.project_qkv(x))
    expected = np.empty_like(v)
    for b in range(2):
        allowed = mh.allowed_matrix(6, key_mask[b].numpy(), causal)
        for h in range(4):
            s = np.where(allowed, q[b, h] @ k[b, h].T / math.sqrt(q.shape[-1]), -np.inf)
            cut = -np.sort(-s, axis=-1)[:, kk - 1 : kk]  # k-th largest score per row
            p = mh.softmax_probs(q[b, h], k[b, h], allowed & (s >= cut))
            pv = p @ v[b, h]
            expected[b, h] = pv if h < 2 else v[b, h] - pv
    qt, kt, vt = layer.project_qkv(x)
    got = layer.diffuse(qt, kt, vt, key_mask)
    np.testing.assert_allclose(mh.to_numpy(got), expected, atol=1e-12)


# ---- symmetries and masks ----------------------------------------------------------------------


@pytest.mark.parametrize("spec", spec_params(tight=False))
@pytest.mark.parametrize("graph", ["softmax", "topk[k=3]"])
def test_permutation_equivariance(spec, graph) -> None:
    layer = mh.random_layer(spec, graph=graph)
    x = mh.random_input(14, n=7)
    perm = torch.tensor([3, 6, 0, 5, 1, 4, 2])
    torch.testing.assert_close(layer(x[:, perm]), layer(x)[:, perm], atol=1e-11, rtol=1e-9)


@pytest.mark.parametrize("spec", spec_params(tight=False))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padding", ["right", "left"])
def test_padded_tokens_never_change_real_outputs(spec, causal, padding) -> None:
    layer = mh.random_layer(spec, causal=causal)
    b, n = 2, 7
    x = mh.random_input(15, b, n)
    key_mask = mh.padding_mask(b, n, [7, 4])
    if padding == "left":
        key_mask = key_mask.flip(-1)
    moved = x.clone()
    noise = 5.0 * mh.random_input(16, b, n)
    moved[~key_mask] = noise[~key_mask]
    out, out_moved = layer(x, key_mask), layer(moved, key_mask)
    assert torch.isfinite(out).all() and torch.isfinite(out_moved).all()
    torch.testing.assert_close(out_moved[key_mask], out[key_mask], atol=1e-12, rtol=1e-10)
    assert not torch.allclose(moved, x)


def test_key_mask_all_true_equals_no_mask() -> None:
    layer = mh.random_layer(OPERATOR_SPECS["interleaved"], causal=True)
    x = mh.random_input(17)
    torch.testing.assert_close(
        layer(x, torch.ones(2, 6, dtype=torch.bool)), layer(x), atol=1e-13, rtol=0
    )


def test_key_padding_mask_is_the_key_mask_in_multihead_attentions_polarity() -> None:
    """``key_padding_mask`` (True = padding, nn.MultiheadAttention's) is ``~key_mask``; one of
    the two, and its errors name it."""
    layer = mh.random_layer(OPERATOR_SPECS["interleaved"], causal=False)
    x = mh.random_input(18, 2, 7)
    key_mask = mh.padding_mask(2, 7, [7, 4])
    expected, weights = layer(x, key_mask, need_weights=True)
    out, padded_weights = layer(x, key_padding_mask=~key_mask, need_weights=True)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    torch.testing.assert_close(padded_weights, weights, atol=0, rtol=0)
    torch.testing.assert_close(
        layer.graphs(x, key_padding_mask=~key_mask).to_dense(), weights, atol=0, rtol=0
    )
    with pytest.raises(
        ValueError,
        match=r"^key_padding_mask: expected key_mask \(True = real token, SDPA's polarity\) or "
        r"key_padding_mask \(True = padding, nn.MultiheadAttention's\), got both",
    ):
        layer(x, key_mask, key_padding_mask=~key_mask)
    with pytest.raises(TypeError, match=r"^key_padding_mask: expected a bool tensor \(True = pad"):
        layer(x, key_padding_mask=torch.zeros(2, 7))
    with pytest.raises(ValueError, match=r"^key_padding_mask: expected shape \(2, 7\), got"):
        layer(x, key_padding_mask=~key_mask[:, :5])


@pytest.mark.parametrize("spec", ["laplacian[normalization=sym]:4", "heat[normalization=sym]:4"])
def test_causal_sym_heads_are_refused(spec) -> None:
    """(W + W^T)/2 would let earlier tokens see later ones: a clear error instead."""
    with pytest.raises(ValueError, match=r"^operators: expected heads that read only the past"):
        DiffusionAttention(16, 4, spec, causal=True)


@pytest.mark.parametrize("spec", spec_params(tight=False))
@pytest.mark.parametrize("graph", ["softmax", "topk[k=3]"])
def test_causal_outputs_never_see_later_tokens(spec, graph, device) -> None:
    layer = mh.random_layer(spec, causal=True, graph=graph, device=device)
    x = mh.random_input(18, n=7, device=device)
    out = layer(x)
    for i in (0, 3, 5):
        moved = x.clone()
        moved[:, i + 1 :] += 3.0 * mh.random_input(19, n=7, device=device)[:, i + 1 :]
        torch.testing.assert_close(layer(moved)[:, : i + 1], out[:, : i + 1], atol=1e-12, rtol=0)


@pytest.mark.parametrize("graph", ["softmax", "topk[k=2]"])
@pytest.mark.parametrize(
    "spec", ["attention:2,laplacian:2", "laplacian:1,attention:2,laplacian:1", "laplacian:4"]
)
def test_causal_laplacian_head_is_exactly_zero_at_the_first_token(spec, graph) -> None:
    layer = mh.random_layer(spec, causal=True, graph=graph, dtype=torch.float32)
    x = mh.random_input(20, dtype=torch.float32)
    q, k, v = layer.project_qkv(x)
    y = layer.diffuse(q, k, v)
    lap = [h for h, op in enumerate(layer.head_operators) if op.name == "laplacian"]
    assert lap
    first = y[:, lap, 0]
    assert torch.equal(first, torch.zeros_like(first))
    assert (y[:, lap, 1:].abs().amax(-1) > 0).all()  # only the first token has P = e_0


@pytest.mark.parametrize("spec", spec_params())
def test_fully_masked_rows_follow_the_documented_convention(spec, device) -> None:
    """A sequence whose keys are all padding: attention heads output 0, Laplacian heads 0
    (a zero Laplacian row), heat heads exp(0) v = v; everything finite, also the gradients."""
    layer = mh.random_layer(spec, device=device)
    x = mh.random_input(21, device=device).requires_grad_(True)
    key_mask = mh.padding_mask(2, 6, [6, 0], device)
    q, k, v = layer.project_qkv(x)
    y = layer.diffuse(q, k, v, key_mask)
    y_ref, _ = mh.diffuse_ref(layer, x, key_mask)
    np.testing.assert_allclose(mh.to_numpy(y), y_ref, atol=1e-9)
    for h, op in enumerate(layer.head_operators):
        if op.name in ("attention", "laplacian"):
            assert torch.equal(y[1, h], torch.zeros_like(y[1, h]))
        if op.name == "heat":
            torch.testing.assert_close(y[1, h], v[1, h], atol=1e-9, rtol=0)  # series tol
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize(
    "spec",
    [
        # regression: sqrt'(0) at an isolated node used to give NaN gradients (sym)
        pytest.param("laplacian[normalization=sym]:2,attention:2", id="sym"),
        pytest.param(OPERATOR_SPECS["mixed"], id="mixed"),
        pytest.param(OPERATOR_SPECS["heat-comb"], id="heat-comb"),
        pytest.param(OPERATOR_SPECS["polynomial"], id="polynomial"),
    ],
)
def test_left_padded_causal_gradients_are_finite(spec) -> None:
    layer = mh.random_layer(spec, causal=True)
    key_mask = mh.padding_mask(2, 6, [6, 4]).flip(-1)  # the first token of row 1 is padding
    _, gx, gp = grads(layer, mh.random_input(22), key_mask)
    assert torch.isfinite(gx).all()
    assert all(torch.isfinite(g).all() for g in gp.values())


# ---- gradcheck ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("causal", "graph"),
    [(False, "softmax"), (True, "softmax"), (True, "topk[k=3]")],
    ids=["dense", "causal", "topk"],
)
def test_gradcheck_mixed_heads(causal, graph, device) -> None:
    spec = "attention:1,laplacian:1,heat[t=0.6;learnable=true;tol=1e-9]:1,ppr[alpha=0.5;tol=1e-9]:1"
    layer = mh.random_layer(spec, embed_dim=8, causal=causal, graph=graph, device=device)
    x = mh.random_input(23, 2, 4, 8, device=device).requires_grad_(True)
    key_mask = mh.padding_mask(2, 4, [4, 3], device)
    check = {"atol": 1e-7, "fast_mode": True}
    assert torch.autograd.gradcheck(lambda inp: layer(inp, key_mask), (x,), **check)

    heat = layer.head_operators[2]
    assert isinstance(heat, HeatKernel) and heat.learnable
    name = next(n for n, p in layer.named_parameters() if p is heat.log_t)
    log_t = heat.log_t.detach().to(F64).requires_grad_(True)
    fn = lambda lt: torch.func.functional_call(layer, {name: lt}, (x.detach(), key_mask))  # noqa: E731
    assert torch.autograd.gradcheck(fn, (log_t,), **check)


def test_graphs_are_each_heads_attention_graph() -> None:
    """``graphs(x, key_mask)``: the per-head graph (B, H) the layer diffuses on, dense or top-k."""
    layer = mh.random_layer("attention:2,laplacian:2", causal=True)
    x = mh.random_input(30)
    key_mask = mh.padding_mask(2, 6, [6, 3])
    g = layer.graphs(x, key_mask)
    assert tuple(g.batch_shape) == (2, 4) and g.num_nodes == 6
    q, k, _ = (mh.to_numpy(t) for t in layer.project_qkv(x))
    for b in range(2):
        allowed = mh.allowed_matrix(6, key_mask[b].numpy(), True)
        for h in range(4):
            expected = mh.softmax_probs(q[b, h], k[b, h], allowed)
            np.testing.assert_allclose(mh.to_numpy(g.to_dense()[b, h]), expected, atol=1e-12)
    sparse = clone_layer(layer, graph="topk[k=2]").graphs(x, key_mask)
    assert sparse.num_edges == 2 * 4 * 6 * 2
    dense = mh.to_numpy(sparse.to_dense())
    assert ((dense > 0).sum(-1) <= 2).all()
    np.testing.assert_allclose(dense[:, :, 1:].sum(-1), 1.0, atol=1e-12)  # renormalized


def test_initialization_follows_multihead_attention() -> None:
    """``reset_parameters``: Xavier-uniform projections and zero biases, as in
    ``nn.MultiheadAttention`` (so ``from_mha``/``to_mha`` users see the same init)."""
    torch.manual_seed(0)
    layer = DiffusionAttention(32, 4, "attention:2,laplacian:2", dtype=F64)
    with torch.no_grad():
        for p in layer.parameters():
            p.fill_(7.0)
    layer.reset_parameters()
    for lin in (layer.in_proj, layer.out_proj):
        fan_out, fan_in = lin.weight.shape
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        w = lin.weight.detach()
        assert float(w.abs().max()) <= bound
        assert float(w.std()) == pytest.approx(bound / math.sqrt(3.0), rel=0.1)  # U(-a, a)
        assert torch.equal(lin.bias, torch.zeros_like(lin.bias))


def test_heads_sharing_an_operator_run_as_one_batched_call(monkeypatch) -> None:
    """DESIGN: heads sharing an operator run as one call; attention and rw-Laplacian heads
    share one fused SDPA propagation."""
    calls: list[tuple] = []
    heat_forward = HeatKernel.forward
    propagate = SoftmaxGraph.propagate

    def heat_spy(self, graph, x):
        calls.append(("heat", tuple(graph.batch_shape)))
        return heat_forward(self, graph, x)

    def propagate_spy(self, x):
        calls.append(("propagate", tuple(self.batch_shape)))
        return propagate(self, x)

    monkeypatch.setattr(HeatKernel, "forward", heat_spy)
    monkeypatch.setattr(SoftmaxGraph, "propagate", propagate_spy)
    layer = mh.random_layer("laplacian:1,heat[t=0.5;method=exact]:2,attention:1")
    layer(mh.random_input(31))
    assert calls == [("propagate", (2, 2)), ("heat", (2, 2))]


@pytest.mark.parametrize("bad_dtype", [torch.float32, torch.int64])
def test_input_of_the_wrong_dtype_is_a_type_error_naming_x(bad_dtype) -> None:
    layer = mh.random_layer("attention:2,laplacian:2")  # float64
    with pytest.raises(TypeError, match=r"^x:"):
        layer(torch.ones(2, 6, 16, dtype=bad_dtype))


def test_factory_dtype_reaches_operator_parameters() -> None:
    layer = DiffusionAttention(
        16, 4, "heat[learnable=true]:2,laplacian[learnable=true]:2", dtype=F64
    )
    assert {p.dtype for p in layer.parameters()} == {F64}


# ---- dropout -----------------------------------------------------------------------------------


def test_dropout_only_in_training() -> None:
    layer = mh.random_layer("attention:2,laplacian:2", dropout=0.5)
    plain = clone_layer(layer, dropout=0.0)
    x = mh.random_input(24)
    layer.eval()
    torch.testing.assert_close(layer(x), plain(x), atol=0, rtol=0)
    layer.train()
    torch.manual_seed(0)
    assert not torch.allclose(layer(x), plain(x))


# ---- KV cache at the layer level ---------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        "attention:4",
        "attention:2,laplacian:2",
        "laplacian:1,attention:3",
        # a Laplacian step other than 1 (fixed, and learnable) must reach the cached path too
        "laplacian[step=0.5]:2,attention:1,laplacian[step=-1.5;learnable=true]:1",
    ],
)
def test_kv_cache_chunks_equal_the_full_forward(spec, device) -> None:
    layer = mh.random_layer(spec, causal=True, device=device)
    assert layer.supports_cache
    x = mh.random_input(25, n=8, device=device)
    full = layer(x)
    cache = KVCache()
    outs = []
    for start, stop in [(0, 3), (3, 4), (4, 5), (5, 8)]:
        outs.append(layer(x[:, start:stop], cache=cache))
        assert cache.length == stop
    torch.testing.assert_close(torch.cat(outs, dim=1), full, **TIGHT)


INCREMENTAL_GRAPHS = [
    format_entry(name, params, sep=",")
    for name, kind in GRAPHS.items()
    if kind.incremental
    for params in kind.examples
]


@pytest.mark.parametrize("graph", INCREMENTAL_GRAPHS)
def test_kv_cache_equals_the_full_forward_on_every_incremental_graph_kind(graph, device) -> None:
    """Every graph kind that declares ``incremental`` decodes from the cache exactly as the full
    graph computes (top-k too: a causal row ranks only keys the cache already holds)."""
    layer = mh.random_layer("attention:2,laplacian:2", causal=True, graph=graph, device=device)
    assert layer.supports_cache
    x = mh.random_input(31, n=9, device=device)
    full = layer(x)
    cache = KVCache()
    outs = [layer(x[:, a:b], cache=cache) for a, b in [(0, 2), (2, 3), (3, 7), (7, 9)]]
    assert cache.position == 9
    torch.testing.assert_close(torch.cat(outs, dim=1), full, **TIGHT)


class _Band(GraphBuilder):
    """A causal band of ``w`` keys (itself included): decoding needs only the last ``w``."""

    name = "band-test"
    incremental = True

    def __init__(self, w: int = 3) -> None:
        super().__init__(w=w)
        self.w = w

    def build(self, q, k, *, key_mask=None, drop_masked_queries=False, causal=False, **_):
        pos = torch.arange(q.shape[-2])
        band = (pos.unsqueeze(-1) - pos) < self.w
        return SoftmaxGraph(q, k, mask=band, causal=causal)

    def decode(self, q, k, v, *, positions, past):
        rows = (past + torch.arange(q.shape[-2])).unsqueeze(-1)
        allowed = (positions <= rows) & (rows - positions < self.w)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)

    def cache_keep(self) -> tuple[int, int]:
        return 0, self.w


def test_a_rolling_cache_keeps_only_what_the_graph_kind_needs() -> None:
    """A kind with ``cache_keep`` trims the cache after decoding each chunk, and chunks longer
    than the cache still see the keys they need."""
    layer = mh.random_layer("attention:2,laplacian:2", causal=True, graph=_Band(3))
    assert layer.supports_cache
    x = mh.random_input(33, n=10)
    full = layer(x)
    cache = KVCache()
    outs = []
    for a, b in [(0, 5), (5, 6), (6, 10)]:
        outs.append(layer(x[:, a:b], cache=cache))
        assert cache.length == min(3, b) and cache.position == b
    torch.testing.assert_close(torch.cat(outs, dim=1), full, **TIGHT)


@pytest.mark.parametrize(
    ("spec", "kwargs"),
    [
        ("attention:2,heat:2", {"causal": True}),
        ("laplacian[normalization=sym]:4", {"causal": True}),
        ("attention:4", {"causal": False}),
    ],
)
def test_kv_cache_refused_where_it_is_not_exact(spec, kwargs) -> None:
    layer = mh.random_layer(spec, **kwargs)
    assert not layer.supports_cache
    with pytest.raises(ValueError, match="cache: KV caching needs"):
        layer(mh.random_input(26), cache=KVCache())


def test_one_kv_cache_serves_one_layer() -> None:
    """A second layer decoding with a cache the first one fills would attend to its keys (and
    it to the second's): refused, naming the cache, while its owner goes on exactly."""
    first, second = (mh.random_layer("attention:2,laplacian:2", causal=True) for _ in range(2))
    x = mh.random_input(28, n=5)
    cache = KVCache()
    steps = [first(x[:, :3], cache=cache)]
    with pytest.raises(ValueError, match=r"^cache: expected a KVCache of this layer's own, got "
                       r"one that holds the keys of another DiffusionAttention; give every layer "
                       r"its own") as info:  # fmt: skip
        second(x[:, 3:4], cache=cache)
    assert info.value.argument == "cache"  # type: ignore[attr-defined]
    assert cache.position == 3  # the refused call appended nothing
    steps += [first(x[:, 3:5], cache=cache)]
    torch.testing.assert_close(torch.cat(steps, dim=1), first(x), **TIGHT)
    owned = KVCache()
    first(x[:, :1], cache=owned)
    del first, info, steps  # (the exception info's frame refers to the layer too)
    gc.collect()
    with pytest.raises(ValueError, match=r"^cache: .* keys of a layer gone since"):
        second(x[:, 1:2], cache=owned)
    with pytest.raises(TypeError, match=r"^cache: expected a KVCache, got dict"):
        second(x, cache={})  # type: ignore[arg-type]


EVERY_KIND = [
    format_entry(name, params, sep=",") for name, kind in GRAPHS.items() for params in kind.examples
]


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("graph", EVERY_KIND)
def test_padded_positions_never_reach_real_rows_and_zeroing_them_keeps_nan_out(
    graph: str, causal: bool, device: torch.device
) -> None:
    """What padded positions hold changes no real row (every operator); a NaN there does reach
    them through the products, as in SDPA, and zeroing the padded inputs -- the documented
    remedy (docs/concepts/graph-kinds.md) -- gives the clean result, values and gradients."""
    heads = "attention:1,laplacian:1,heat:1,ppr:1,polynomial:1,mean:1"
    heads += "" if causal else ",laplacian[normalization=sym]:1"  # W^T: padded queries dropped
    h = heads.count(":")
    layer = mh.random_layer(
        heads, embed_dim=4 * h, num_heads=h, causal=causal, graph=graph, device=device
    )
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 7, 4 * h, generator=gen, dtype=F64).to(device)
    key_mask = torch.ones(2, 7, dtype=torch.bool, device=device)
    key_mask[0, :2] = key_mask[1, -2:] = False  # left and right padding
    real = key_mask[..., None]  # (B, N, 1)

    def run(inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        layer.zero_grad()
        y = layer(inputs, key_mask)
        (y * real).sum().backward()  # a loss on the real rows only
        return y.detach() * real, layer.in_proj.weight.grad.clone()

    clean = run(x.masked_fill(~real, 0.0))
    noise = 100 * torch.randn(x.shape, generator=gen, dtype=F64).to(device)
    noisy = run(torch.where(real, x, noise))
    for a, b in zip(noisy, clean, strict=True):
        torch.testing.assert_close(a, b, **TIGHT)
    poisoned = torch.where(real, x, float("nan"))
    for a, b in zip(run(poisoned.masked_fill(~real, 0.0)), clean, strict=True):
        assert bool(torch.isfinite(a).all())
        torch.testing.assert_close(a, b, **TIGHT)


def test_kv_cache_with_key_mask_is_refused() -> None:
    layer = mh.random_layer("attention:4", causal=True)
    with pytest.raises(ValueError, match="key_mask: expected None together with cache"):
        layer(mh.random_input(27), torch.ones(2, 6, dtype=torch.bool), cache=KVCache())


# ---- input validation --------------------------------------------------------------------------


def test_bad_constructor_arguments() -> None:
    with pytest.raises(ValueError, match=r"embed_dim: expected a multiple of num_heads \(4\)"):
        DiffusionAttention(10, 4)
    with pytest.raises(ValueError, match="num_heads: expected a positive int, got 0"):
        DiffusionAttention(8, 0)
    with pytest.raises(TypeError, match=r"^embed_dim: expected a positive int, got float$"):
        DiffusionAttention(8.0, 2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^num_heads: expected a positive int, got bool$"):
        DiffusionAttention(8, True)
    with pytest.raises(ValueError, match=r"^graph: in 'topk\[k=0\]': k: expected a positive int"):
        DiffusionAttention(8, 2, graph="topk[k=0]")
    with pytest.raises(ValueError, match=r"^graph: in 'topk\[k=1.5\]': k: expected a positive"):
        DiffusionAttention(8, 2, graph="topk[k=1.5]")
    with pytest.raises(ValueError, match=r"dropout: expected a probability in \[0, 1\)"):
        DiffusionAttention(8, 2, dropout=1.0)
    with pytest.raises(TypeError, match=r"^dropout: expected a float in \[0, 1\), got str$"):
        DiffusionAttention(8, 2, dropout="0.1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^causal: expected a bool, got str$"):
        DiffusionAttention(8, 2, causal="yes")  # type: ignore[arg-type]


def test_bad_inputs() -> None:
    layer = mh.random_layer("attention:2,laplacian:2")
    x = mh.random_input(28)
    with pytest.raises(TypeError, match=r"key_mask: expected a bool tensor.*torch\.int64"):
        layer(x, torch.ones(2, 6, dtype=torch.long))
    with pytest.raises(TypeError, match="key_mask: expected a bool tensor"):
        layer(x, [[True] * 6] * 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"key_mask: expected shape \(2, 6\), got \(2, 7\)"):
        layer(x, torch.ones(2, 7, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"key_mask: expected shape \(2, 6\), got \(6,\)"):
        layer(x, torch.ones(6, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"x: expected shape \(B, N, 16\), got \(2, 6, 12\)"):
        layer(x[..., :12])
    with pytest.raises(ValueError, match=r"x: expected shape \(B, N, 16\), got \(6, 16\)"):
        layer(x[0])
    with pytest.raises(TypeError, match=r"^x: expected a Tensor, got list$"):
        layer(x.tolist())  # type: ignore[arg-type]


def test_autocast_may_mix_input_and_parameter_dtypes() -> None:
    """The dtype check on ``x`` stands aside under autocast, which mixes dtypes on purpose."""
    layer = DiffusionAttention(16, 4, "attention:2,laplacian:2")  # float32 parameters
    x = torch.randn(2, 5, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x.bfloat16())
    assert y.dtype == torch.bfloat16 and y.shape == (2, 5, 16)
    torch.testing.assert_close(y.float(), layer(x), atol=0.1, rtol=0.05)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_operator_parameters_are_made_in_the_layer_dtype(dtype) -> None:
    """A learnable t of 1.7 in a float64 layer is 1.7 to float64 round-off (it held
    1.7 + 2.2e-8 when log t was made in float32 and cast)."""
    layer = DiffusionAttention(8, 2, "heat[t=1.7;learnable=true]:1,laplacian[learnable=true]:1",
                               dtype=dtype)  # fmt: skip
    heat, lap = layer.operators
    assert heat.log_t.dtype == lap.step.dtype == dtype
    t = float(heat.t.detach())  # a learnable t carries gradients
    assert t == float(torch.tensor(1.7, dtype=dtype))
    assert abs(t - 1.7) < (1e-15 if dtype == torch.float64 else 2e-7)
    fixed = DiffusionAttention(8, 2, "heat[t=1.7]:2", dtype=torch.float32).operators[0]
    assert fixed.t.dtype == torch.float64 and float(fixed.t) == 1.7  # fixed times stay exact
