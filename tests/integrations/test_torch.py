"""heatformer heads as a drop-in for torch.nn.MultiheadAttention.

The equivalences take ``device`` (CPU; CUDA where available, marked ``cuda``); their float32
tolerances are the CPU's, scaled per device by ``close`` (tests/device_helpers.py). Saving
and loading state dicts through bytes stays on the CPU.
"""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from torch import nn

from device_helpers import close
from heatformer.checks import ArgumentError
from heatformer.integrations.torch import MultiheadDiffusionAttention, convert, load_state_dict

E, H = 16, 4
F32 = torch.float32


def _encoder(batch_first: bool, seed: int = 0) -> nn.TransformerEncoder:
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(
        E, H, dim_feedforward=32, dropout=0.0, batch_first=batch_first
    )
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=batch_first)


def _masks(
    n: int, b: int, kind: str, float_masks: bool, device: torch.device | str = "cpu"
) -> dict[str, torch.Tensor | bool]:
    pad = torch.zeros(b, n, dtype=torch.bool, device=device)
    pad[0, n - 2 :] = True  # True = padding (nn.MultiheadAttention's polarity)
    pad[2, n - 3 :] = True
    causal = torch.ones(n, n, dtype=torch.bool, device=device).triu(1)
    if float_masks:
        pad = torch.zeros(b, n, device=device).masked_fill(pad, -math.inf)
        causal = nn.Transformer.generate_square_subsequent_mask(n, device=device)
    return {
        "none": {},
        "padding": {"src_key_padding_mask": pad},
        "causal": {"mask": causal, "is_causal": True},
        "both": {"mask": causal, "src_key_padding_mask": pad},
    }[kind]


def _real(kwargs: dict, b: int, n: int) -> torch.Tensor:
    pad = kwargs.get("src_key_padding_mask")
    if pad is None:
        return torch.ones(b, n, dtype=torch.bool)
    return ~pad if pad.dtype == torch.bool else pad == 0


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("kind", ["none", "padding", "causal", "both"])
@pytest.mark.parametrize("float_masks", [False, True], ids=["bool", "float"])
def test_encoder_with_all_attention_equals_the_original(
    batch_first: bool, kind: str, float_masks: bool, device: torch.device
) -> None:
    ref = _encoder(batch_first).to(device)
    model = convert(copy.deepcopy(ref), "attention")
    assert all(
        isinstance(m, MultiheadDiffusionAttention)
        for m in (layer.self_attn for layer in model.layers)
    )
    b, n = 3, 7
    x = (torch.randn(b, n, E) if batch_first else torch.randn(n, b, E)).to(device)
    kwargs = _masks(n, b, kind, float_masks, device)
    out_ref, out = ref(x, **kwargs), model(x, **kwargs)
    if not batch_first:
        out_ref, out = out_ref.transpose(0, 1), out.transpose(0, 1)
    real = _real(kwargs, b, n).to(device)
    assert out.device.type == device.type
    torch.testing.assert_close(out[real], out_ref[real], **close(device, F32, atol=2e-6, rtol=1e-5))
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device)
    (out_ref * w)[real].sum().backward()
    (out * w)[real].sum().backward()
    expected = dict(ref.named_parameters())
    names = [name for name, _ in model.named_parameters()]
    assert names == list(expected)  # nn.MultiheadAttention's own parameter names
    for name, p in model.named_parameters():
        tol = close(device, F32, atol=5e-6, rtol=1e-4)
        torch.testing.assert_close(p.grad, expected[name].grad, **tol, msg=name)


@pytest.mark.filterwarnings("error")  # it ran torch's nested-tensor prototype, which warns
def test_inference_runs_the_diffusion_heads_not_torchs_fused_kernel() -> None:
    ref = _encoder(True)
    model = convert(copy.deepcopy(ref), "attention:2,laplacian:2")
    x = torch.randn(3, 7, E)
    pad = _masks(7, 3, "padding", False)["src_key_padding_mask"]
    trained = model(x, src_key_padding_mask=pad)  # training mode: no fast path anywhere
    model.eval(), ref.eval()
    ref.use_nested_tensor = False  # the reference on torch's fused kernel, not its prototype
    with torch.no_grad():  # where nn.TransformerEncoder would take its fused/nested path
        out = model(x, src_key_padding_mask=pad)
        plain = ref(x, src_key_padding_mask=pad)
        real = ~pad
        torch.testing.assert_close(out[real], trained.detach()[real], atol=2e-6, rtol=1e-5)
        assert (out[real] - plain[real]).abs().max() > 1e-2  # Laplacian heads do act
        assert not out.is_nested and not model.use_nested_tensor
        all_attention = convert(copy.deepcopy(ref), "attention")
        torch.testing.assert_close(all_attention(x, src_key_padding_mask=pad)[real], plain[real])


def _qkv(mha: MultiheadDiffusionAttention, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q, k, v ``(B, H, N, Dh)`` from the module's own in-projection, in float64."""
    qkv = x.double() @ mha.in_proj_weight.double().T + mha.in_proj_bias.double()
    b, n, _ = x.shape
    return qkv.view(b, n, 3, H, E // H).permute(2, 0, 3, 1, 4).unbind(0)


def test_laplacian_heads_equal_v_minus_pv_from_the_modules_qkv(device: torch.device) -> None:
    torch.manual_seed(0)
    mha = MultiheadDiffusionAttention(E, H, batch_first=True, heads="attention:1,laplacian:3")
    nn.init.normal_(mha.in_proj_bias)
    mha = mha.to(device)
    x = torch.randn(2, 6, E).to(device)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2], device=device)
    causal = torch.ones(6, 6, dtype=torch.bool, device=device).triu(1)
    out, weights = mha(x, x, x, key_padding_mask=pad, attn_mask=causal, average_attn_weights=False)
    q, k, v = _qkv(mha, x)
    allowed = ~causal & ~pad[:, None, None, :]  # (B, 1, N, N)
    s = (q @ k.transpose(-1, -2) / math.sqrt(E // H)).masked_fill(~allowed, -math.inf)
    p = torch.softmax(s, dim=-1)
    y = p @ v
    y[:, 1:] = v[:, 1:] - y[:, 1:]  # heads 1-3: (I - P) v
    expected = y.transpose(1, 2).reshape(2, 6, E) @ mha.out_proj.weight.double().T
    expected = expected + mha.out_proj.bias.double()
    torch.testing.assert_close(out.double(), expected, **close(device, F32, atol=1e-5, rtol=1e-5))
    tol = close(device, F32, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(weights.double(), p, **tol)  # P of every head


def test_decoder_layer_per_module_specs_and_cross_attention() -> None:
    torch.manual_seed(0)
    ref = nn.TransformerDecoderLayer(E, H, dim_feedforward=32, dropout=0.0, batch_first=True)
    tgt, memory = torch.randn(2, 5, E), torch.randn(2, 8, E)
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    plain = convert(copy.deepcopy(ref), "attention")
    torch.testing.assert_close(
        plain(tgt, memory, tgt_mask=causal, tgt_is_causal=True), ref(tgt, memory, tgt_mask=causal)
    )
    mixed = convert(copy.deepcopy(ref), "attention:2,laplacian:2;attention")  # self; cross
    assert mixed.self_attn.heads.spec == "attention:2,laplacian:2"
    assert mixed.multihead_attn.heads.spec == "attention:4"
    out = mixed(tgt, memory, tgt_mask=causal)
    assert (
        torch.isfinite(out).all() and (out - ref(tgt, memory, tgt_mask=causal)).abs().max() > 1e-3
    )
    wrong = convert(copy.deepcopy(ref), "attention:2,laplacian:2")
    with pytest.raises(ValueError, match="cross-attention does not have") as err:
        wrong(tgt, memory, tgt_mask=causal)
    assert err.value.argument == "heads"  # type: ignore[attr-defined]


def test_the_multihead_attention_interface(device: torch.device) -> None:
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(E, H).to(device)  # sequence first, the default
    ours = MultiheadDiffusionAttention.from_mha(mha)
    for name in ("embed_dim", "num_heads", "head_dim", "dropout", "batch_first", "kdim", "vdim"):
        assert getattr(ours, name) == getattr(mha, name), name
    q, kv = torch.randn(5, 2, E).to(device), torch.randn(8, 2, E).to(device)
    tol = close(device, F32, atol=2e-6, rtol=1e-5)
    for args in ((q, q, q), (q, kv, kv), (q[:, 0], kv[:, 0], kv[:, 0])):  # self, cross, unbatched
        for average in (True, False):
            expected = mha(*args, average_attn_weights=average)
            got = ours(*args, average_attn_weights=average)
            torch.testing.assert_close(got[0], expected[0], **tol)
            torch.testing.assert_close(got[1], expected[1], **tol)
    assert ours(q, q, q, need_weights=False)[1] is None
    back = nn.MultiheadAttention(E, H, device=device)
    back.load_state_dict(ours.state_dict())  # the same keys both ways
    torch.testing.assert_close(back(q, q, q)[0], mha(q, q, q)[0])
    whole = convert(copy.deepcopy(mha), "attention:2,laplacian:2")  # the module itself
    assert (
        isinstance(whole, MultiheadDiffusionAttention)
        and whole.heads.spec == "attention:2,laplacian:2"
    )


def test_bad_arguments_name_themselves() -> None:
    mha = MultiheadDiffusionAttention(E, H, batch_first=True)
    x = torch.randn(2, 5, E)
    bias = torch.zeros(5, 5)
    bias[0, 1] = 0.5
    cases = [
        (lambda: mha(x, x, x, attn_mask=bias), "attn_mask", "an attention bias"),
        (lambda: mha(x, x, x, is_causal=True), "attn_mask", "is a hint"),
        (lambda: mha(x, x, x, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)),
         "key_padding_mask", r"expected shape \(2, 5\)"),
        (lambda: mha(x, x, x, attn_mask=torch.zeros(3, 5, dtype=torch.bool)), "attn_mask",
         "expected shape"),
        (lambda: mha(x[..., :8], x, x), "query", "expected a"),
        (lambda: MultiheadDiffusionAttention(E, 3), "embed_dim", "multiple of num_heads"),
        (lambda: MultiheadDiffusionAttention(E, H, kdim=8), "kdim", "not supported"),
        (lambda: convert(nn.Linear(2, 2), "attention"), "module", "no nn.MultiheadAttention"),
        (lambda: convert(_encoder(True), "attention:3"), "heads", "num_heads = 4"),
        (lambda: MultiheadDiffusionAttention(E, H, dropout=0.2, heads="heat:4")(x, x, x),
         "dropout", "no counterpart"),
    ]  # fmt: skip
    for call, argument, message in cases:
        with pytest.raises((TypeError, ValueError), match=message) as err:
            call()
        assert isinstance(err.value, ArgumentError) and err.value.argument == argument
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)
    sym = MultiheadDiffusionAttention(
        E, H, batch_first=True, heads="laplacian[normalization=sym]:4"
    )
    with pytest.raises(ValueError, match="read W\\^T"):
        sym(x, x, x, attn_mask=causal)
    assert sym(x, x, x)[0].shape == x.shape  # bidirectional: fine


# ---- saving and loading a converted module ---------------------------------------------------

LAYERS = ["attention:2,heat[t=0.5;learnable=true]:2", "attention:1,laplacian:3"]
SCHEDULE = ";".join(LAYERS)


def _trained(encoder: nn.Module) -> nn.Module:
    """One Adam step (every parameter moves by about the learning rate, the times too)."""
    optimizer = torch.optim.Adam(encoder.parameters(), lr=0.05)
    out = encoder(torch.randn(2, 6, E, generator=torch.Generator().manual_seed(3)))
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(4))).sum().backward()
    optimizer.step()
    encoder.zero_grad()
    return encoder.eval()


def _through_bytes(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded: dict[str, torch.Tensor] = torch.load(buffer, weights_only=True)
    return loaded


def test_a_converted_encoder_state_dict_loads_back_converted_to_the_last_bit() -> None:
    from safetensors.torch import load, save

    model = _trained(convert(_encoder(True), SCHEDULE, graph="topk[k=3];softmax"))
    state = model.state_dict()
    assert [k for k in state if "heatformer_record" in k or "log_t" in k] == [
        "layers.0.self_attn.heatformer_record", "layers.0.self_attn.heads.operators.1.log_t",
        "layers.1.self_attn.heatformer_record",
    ]  # fmt: skip
    assert abs(float(model.layers[0].self_attn.heads.operators[1].t.detach()) - 0.5) > 1e-3
    x = torch.randn(3, 7, E)
    pad = _masks(7, 3, "padding", False)
    with torch.no_grad():
        expected = model(x, **pad)
    for saved in (_through_bytes(state), load(save(state))):  # torch.save, safetensors
        fresh = load_state_dict(_encoder(True, seed=5).eval(), saved)
        assert [layer.self_attn.heads.source for layer in fresh.layers] == LAYERS
        assert [layer.self_attn.heads.graph_kind.spec for layer in fresh.layers] == [
            "topk[k=3]", "softmax",
        ]  # fmt: skip
        with torch.no_grad():
            assert torch.equal(fresh(x, **pad), expected)
        for key, value in state.items():
            assert torch.equal(fresh.state_dict()[key], value), key
    mha = convert(nn.MultiheadAttention(E, H), "laplacian:4")  # the module itself
    back = load_state_dict(nn.MultiheadAttention(E, H), mha.state_dict())
    assert isinstance(back, MultiheadDiffusionAttention) and back.heads.source == "laplacian:4"


def test_a_converted_state_dict_refuses_a_module_with_other_heads() -> None:
    converted = convert(_encoder(True), "attention:2,laplacian:2")  # no parameter of its own
    state = converted.state_dict()
    with pytest.raises(RuntimeError, match=r'Unexpected key\(s\).*"layers.0.self_attn.heatformer_'):
        _encoder(True).load_state_dict(state)  # unconverted: the record is an unexpected key
    other = convert(_encoder(True), "attention:2,laplacian[step=0.5]:2")
    with pytest.raises(ValueError, match=r"heatformer.integrations.torch.load_state_dict\(") as err:
        other.load_state_dict(state, strict=False)  # other heads: refused, strict or not
    assert err.value.argument == "state_dict"  # type: ignore[attr-defined]
    plain = convert(_encoder(True), "attention")  # computes what nn.MultiheadAttention does ...
    assert list(plain.state_dict()) == list(_encoder(True).state_dict())  # ... with its keys
    other.load_state_dict(_encoder(True, seed=3).state_dict())  # unconverted weights: heads kept
    assert other.layers[0].self_attn.heads.source == "attention:2,laplacian[step=0.5]:2"


def test_converting_again_with_the_same_spec_keeps_learned_parameters() -> None:
    model = _trained(convert(_encoder(True), SCHEDULE))
    heads = model.layers[0].self_attn.heads
    learned = heads.operators[1].log_t.detach().clone()
    convert(model, SCHEDULE)
    assert model.layers[0].self_attn.heads is heads
    assert torch.equal(heads.operators[1].log_t.detach(), learned)
    convert(model, "attention:2,heat[t=0.5;learnable=true]:2")  # another spec in layer 1 only
    assert model.layers[0].self_attn.heads is heads


def test_state_dict_records_that_cannot_be_applied_are_refused() -> None:
    state = convert(_encoder(True), "laplacian:4").state_dict()
    record = state["layers.0.self_attn.heatformer_record"]
    cases: list[tuple[dict[str, torch.Tensor], str]] = [
        ({**state, "layers.5.self_attn.heatformer_record": record}, "does not have"),
        ({**state, "layers.0.self_attn.heatformer_record": record.float()}, "uint8 vector"),
        ({**state, "layers.0.self_attn.heatformer_record": record[:-1]}, "not a heatformer rec"),
        ({**state, "layers.0.self_attn.heatformer_record": torch.tensor(list(b'{"format": 9}'),
          dtype=torch.uint8)}, "format 1"),
        ({**state, "layers.0.self_attn.heatformer_record": torch.tensor(list(
          b'{"format": 1, "heads": "laplacian:4", "graph": "softmax", "num_heads": 0}'),
          dtype=torch.uint8)}, "positive int"),
    ]  # fmt: skip
    for bad, message in cases:
        with pytest.raises(ValueError, match=message) as err:
            load_state_dict(_encoder(True), bad)
        assert isinstance(err.value, ArgumentError) and err.value.argument == "state_dict"
    built = MultiheadDiffusionAttention(E, H, heads=["laplacian"] * H)  # operator names only
    with pytest.raises(ValueError, match="built from operator instances") as err:
        load_state_dict(nn.MultiheadAttention(E, H), built.state_dict())
    assert err.value.argument == "state_dict"  # type: ignore[attr-defined]
