"""heatformer heads inside timm vision transformers (timm's own ViT and DeiT-3 code).

Where torchvision is not installed, timm is imported with a placeholder for it
(``heatformer.integrations.timm.import_timm``, tested first); the models and attention modules
tested are timm's own.

The equivalences against timm's own forward take ``device`` (CPU; CUDA where available, marked
``cuda``); their float32 tolerances are the CPU's, scaled per device by ``close``
(tests/device_helpers.py). State dicts through bytes stay on the CPU.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from device_helpers import close
from heatformer.checks import ArgumentError

F32 = torch.float32
SMALL = {"img_size": 32, "patch_size": 8, "num_classes": 5}


@pytest.fixture(scope="module")
def ht(timm: Any) -> Any:
    from heatformer.integrations import timm as adapter

    return adapter


def _fresh_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a new interpreter (no timm imported yet), on one thread."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


# ---- import_timm: timm without torchvision ---------------------------------------------------


def test_import_timm_imports_timm_with_a_placeholder_it_removes_afterwards() -> None:
    if importlib.util.find_spec("timm") is None:
        pytest.skip("timm is not installed")
    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed: import_timm imports timm as it is")
    done = _fresh_python(
        """
        import sys
        from heatformer.integrations.timm import import_timm

        timm = import_timm()
        import timm as again
        print(again is timm, import_timm() is timm)
        print(sorted(n for n in sys.modules if n.startswith("torchvision")), len(sys.meta_path))
        try:
            import torchvision
        except ModuleNotFoundError as err:
            print("ModuleNotFoundError", err.name)
        try:
            timm.layers.norm_act.FrozenBatchNorm2d(4)
        except RuntimeError as err:
            print(err)
        """
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "True True"
    assert lines[1].startswith("[] ")  # no placeholder module left
    assert lines[2] == "ModuleNotFoundError torchvision"
    assert lines[3] == (
        "torchvision.ops.misc.FrozenBatchNorm2d is heatformer's placeholder: torchvision is not "
        "installed (heatformer.integrations.timm.import_timm imported timm without it)"
    )


def test_import_timm_warns_about_a_torchvision_that_does_not_import(tmp_path: Path) -> None:
    if importlib.util.find_spec("timm") is None:
        pytest.skip("timm is not installed")
    broken = tmp_path / "torchvision"
    broken.mkdir()
    (broken / "__init__.py").write_text(
        'raise RuntimeError("operator torchvision::nms does not exist")'
    )
    done = _fresh_python(
        """
        import warnings
        from heatformer.integrations.timm import import_timm

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            timm = import_timm()
        print(timm.create_model("vit_tiny_patch16_224", pretrained=False).num_classes)
        for warning in caught:
            print(warning.message) if warning.category is RuntimeWarning else None
        """,
        PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    )
    assert done.returncode == 0, done.stderr
    count, warned = done.stdout.splitlines()
    assert count == "1000"
    assert warned == (
        "torchvision is installed but does not import (RuntimeError: operator torchvision::nms "
        "does not exist); importing timm with heatformer's placeholder for it"
    )


def test_import_timm_names_the_install_line_and_the_floor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from heatformer.integrations import timm as adapter

    with pytest.raises(ImportError, match=r"needs timm >= 1\.0\.9, found 1\.0\.8: .*--no-deps"):
        adapter._check_timm_version("1.0.8")
    adapter._check_timm_version(adapter.MIN_TIMM)
    monkeypatch.delitem(sys.modules, "timm", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    with pytest.raises(
        ModuleNotFoundError,
        match=r"needs timm: pip install 'heatformer\[timm\]' "
        r"&& pip install --no-deps 'timm>=1\.0\.9'",
    ):
        adapter.import_timm()


def _model(timm: Any, name: str, seed: int = 0, **kwargs: Any) -> Any:
    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False, **SMALL, **kwargs).eval()
    for module in model.modules():  # random non-trivial norms, so that they matter
        if isinstance(module, torch.nn.LayerNorm):
            torch.nn.init.normal_(module.weight, 1.0, 0.2)
            torch.nn.init.normal_(module.bias, 0.0, 0.2)
    return model


MODELS = [
    ("deit3_small_patch16_224", {}),  # 6 heads, LayerScale
    ("vit_tiny_patch16_224", {"qk_norm": True}),  # 3 heads, QK-norm
    ("vit_tiny_patch16_224", {"global_pool": "avg", "class_token": False}),
]


@pytest.mark.parametrize(("name", "kwargs"), MODELS, ids=["deit3", "vit-qknorm", "vit-avg"])
def test_all_attention_equals_the_original_forward_and_gradients(
    timm: Any, ht: Any, name: str, kwargs: dict, device: torch.device
) -> None:
    ref = _model(timm, name, **kwargs).to(device)
    model = ht.convert(copy.deepcopy(ref), "attention")
    assert (
        all(type(b.attn).__name__ == "TimmDiffusionAttention" for b in model.blocks)
        and len(model.blocks) == 12
    )
    assert list(model.state_dict()) == list(ref.state_dict())  # timm's keys, the same weights
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)).to(device)
    out_ref, out = ref(x), model(x)
    assert out.device.type == device.type
    torch.testing.assert_close(out, out_ref, **close(device, F32, atol=2e-5, rtol=1e-4))
    out_ref.square().sum().backward()
    out.square().sum().backward()
    expected = dict(ref.named_parameters())
    tol = close(device, F32, atol=1e-5, rtol=1e-3)
    for key, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[key].grad, **tol, msg=key)


def test_trailing_laplacian_heads_equal_v_minus_pv_from_the_blocks_qkv(
    timm: Any, ht: Any, device: torch.device
) -> None:
    model = _model(timm, "deit3_small_patch16_224").to(device)
    model = ht.convert(model, "attention:3,laplacian:3")
    attn = model.blocks[4].attn
    assert attn.spec == "attention:3,laplacian:3"
    qkv = attn.qkv
    assert ht.convert(model, "heat:6").blocks[4].attn is attn and attn.spec == "heat:6"
    ht.convert(model, "attention:3,laplacian:3")  # again: new heads, the same layers
    assert attn.qkv is qkv and attn.spec == "attention:3,laplacian:3"
    seen: dict[str, torch.Tensor] = {}
    attn.register_forward_hook(lambda m, args, out: seen.update(x=args[0], out=out))
    with torch.no_grad():
        model(torch.randn(2, 3, 32, 32).to(device))
    x = seen["x"].double()
    b, n, d = x.shape
    qkv = x @ attn.qkv.weight.double().T + attn.qkv.bias.double()
    q, k, v = qkv.view(b, n, 3, 6, d // 6).permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, N, Dh)
    p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // 6), dim=-1)
    y = p @ v
    y[:, 3:] = v[:, 3:] - y[:, 3:]  # the "3L" heads: (I - P) v
    y = y.transpose(1, 2).reshape(b, n, d)
    expected = y @ attn.proj.weight.double().T + attn.proj.bias.double()
    tol = close(device, F32, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(seen["out"].double(), expected, **tol)


def test_masks_dropout_and_errors(timm: Any, ht: Any) -> None:
    ref = _model(timm, "vit_tiny_patch16_224", attn_drop_rate=0.2)
    model = ht.convert(copy.deepcopy(ref), "attention").train()
    ref.train()
    x = torch.randn(2, 3, 32, 32)
    torch.manual_seed(5)
    expected = ref(x)
    torch.manual_seed(5)
    torch.testing.assert_close(model(x), expected, atol=2e-5, rtol=1e-4)  # the same dropout
    attn, attn_ref = model.blocks[0].attn, ref.blocks[0].attn
    attn.eval(), attn_ref.eval()
    tokens = torch.randn(2, 17, 192)
    keys = torch.ones(2, 1, 1, 17, dtype=torch.bool)
    keys[1, ..., 12:] = False
    takes = inspect.signature(attn_ref.forward).parameters  # timm < 1.0.17: no masks
    for mask in (keys, torch.zeros(2, 1, 1, 17).masked_fill(~keys, -math.inf)):
        if "attn_mask" in takes:
            torch.testing.assert_close(
                attn(tokens, attn_mask=mask), attn_ref(tokens, attn_mask=mask)
            )
    if "is_causal" in takes:  # newer timm (1.0.31; not 1.0.25)
        torch.testing.assert_close(attn(tokens, is_causal=True), attn_ref(tokens, is_causal=True))
    with pytest.raises(ValueError, match="an attention bias") as err:
        attn(tokens, attn_mask=torch.full((17, 17), 0.5))
    assert err.value.argument == "attn_mask"  # type: ignore[attr-defined]
    heat = ht.convert(copy.deepcopy(ref), "heat:3").train()
    with pytest.raises(ValueError, match="no counterpart for 'heat' heads"):
        heat(x)
    for call, argument in (
        (lambda: ht.convert(torch.nn.Linear(2, 2), "attention"), "model"),
        (lambda: ht.convert(copy.deepcopy(ref), "attention:2"), "heads"),
    ):
        with pytest.raises(ValueError) as err:
            call()
        assert isinstance(err.value, ArgumentError) and err.value.argument == argument


# ---- timm versions: Attention with and without norm and gate, fused or not ------------------


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "explicit"])
@pytest.mark.parametrize("missing", [("gate",), ("gate", "norm")], ids=["no-gate", "no-norm"])
def test_attention_of_every_timm_version_converts_as_it_computes(
    timm: Any, ht: Any, fused: bool, missing: tuple[str, ...]
) -> None:
    """timm's ``Attention`` has no ``gate`` before its newest releases and neither ``norm``
    nor ``gate`` before 1.0.17 (the attributes are deleted here to build such modules); timm's
    own forward is the reference, with its SDPA call (``fused_attn``) or its explicit
    softmax."""
    ref = _model(timm, "deit3_small_patch16_224", depth=2)
    for block in ref.blocks:
        block.attn.fused_attn = fused
    older = copy.deepcopy(ref)
    for block in older.blocks:
        for name in missing:
            if hasattr(block.attn, name):
                delattr(block.attn, name)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    expected = ref(x)
    model = ht.convert(older, "attention")
    torch.testing.assert_close(model(x), expected, atol=2e-5, rtol=1e-4)
    laplacian = ht.convert(copy.deepcopy(ref), "attention:3,laplacian:3")
    torch.testing.assert_close(ht.convert(model, "attention:3,laplacian:3")(x), laplacian(x))


def test_the_output_gate_of_newer_timm_is_applied(timm: Any, ht: Any) -> None:
    attention = timm.layers.Attention if hasattr(timm.layers, "Attention") else None
    if attention is None or "gated" not in inspect.signature(attention).parameters:
        pytest.skip(f"timm {timm.__version__}'s Attention has no output gate")
    torch.manual_seed(2)
    gated = attention(48, num_heads=4, qkv_bias=True, gated=True).eval()
    torch.nn.init.normal_(gated.gate.weight)
    tokens = torch.randn(2, 9, 48)
    ours = ht.TimmDiffusionAttention(gated, "attention")
    assert ours.gate is gated.gate
    for fused in (True, False):
        gated.fused_attn = fused
        torch.testing.assert_close(ours(tokens), gated(tokens), atol=2e-6, rtol=1e-5)


# ---- saving and loading a converted model ----------------------------------------------------

NAME = "deit3_small_patch16_224"
TWO = {"depth": 2}  # two blocks are enough here


def _trained(model: Any) -> Any:
    """One Adam step (every parameter moves by about the learning rate, the times too)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    out = model(torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3)))
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(4))).sum().backward()
    optimizer.step()
    model.zero_grad()
    return model.eval()


def test_a_converted_vit_state_dict_loads_back_converted_to_the_last_bit(
    timm: Any, ht: Any, tmp_path: Any
) -> None:
    from safetensors.torch import save_file

    spec = "attention:2,heat[t=0.5;learnable=true]:2,laplacian:2"
    model = _trained(ht.convert(_model(timm, NAME, **TWO), spec, graph="topk[k=4]"))
    state = model.state_dict()
    learned = model.blocks[1].attn.heads.operators[1].t.detach()
    assert abs(float(learned) - 0.5) > 1e-3
    torch.save(state, tmp_path / "vit.pt")
    save_file(state, tmp_path / "vit.safetensors")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(x)
    for file in ("vit.pt", "vit.safetensors"):
        saved = timm.models.load_state_dict(str(tmp_path / file))  # timm's own reader
        fresh = ht.load_state_dict(_model(timm, NAME, seed=5, **TWO), saved)
        assert all(b.attn.heads.source == spec for b in fresh.blocks)
        assert all(b.attn.heads.graph_kind.spec == "topk[k=4]" for b in fresh.blocks)
        with torch.no_grad():
            assert torch.equal(fresh(x), expected)
        for key, value in state.items():
            assert torch.equal(fresh.state_dict()[key], value), key


def test_a_converted_state_dict_refuses_a_model_with_other_heads(
    timm: Any, ht: Any, tmp_path: Any
) -> None:
    # Laplacian heads have no parameters of their own: only the record tells
    converted = ht.convert(_model(timm, NAME, **TWO), "attention:3,laplacian:3")
    torch.save(converted.state_dict(), tmp_path / "vit.pt")
    with pytest.raises(RuntimeError, match=r'Unexpected key\(s\).*"blocks.0.attn.heatformer_rec'):
        timm.create_model(NAME, pretrained=False, checkpoint_path=str(tmp_path / "vit.pt"),
                          **SMALL, **TWO)  # fmt: skip
    other = ht.convert(_model(timm, NAME, **TWO), "attention:3,heat:3")
    with pytest.raises(ValueError, match=r"heatformer.integrations.timm.load_state_dict\(") as err:
        other.load_state_dict(converted.state_dict(), strict=False)
    assert err.value.argument == "state_dict"  # type: ignore[attr-defined]
    plain = ht.convert(_model(timm, NAME, **TWO), "attention")
    assert list(plain.state_dict()) == list(_model(timm, NAME, **TWO).state_dict())  # timm's keys
    other.load_state_dict(_model(timm, NAME, seed=3, **TWO).state_dict())  # timm's: heads kept
    assert other.blocks[0].attn.heads.source == "attention:3,heat:3"


def test_converting_again_with_the_same_spec_keeps_learned_parameters(timm: Any, ht: Any) -> None:
    spec = "attention:3,heat[t=0.5;learnable=true]:3"
    model = _trained(ht.convert(_model(timm, NAME, **TWO), spec))
    heads = model.blocks[0].attn.heads
    learned = heads.operators[1].log_t.detach().clone()
    ht.convert(model, spec)
    assert model.blocks[0].attn.heads is heads
    assert torch.equal(heads.operators[1].log_t.detach(), learned)
    ht.convert(model, spec, graph="topk[k=4]")  # another graph kind: new heads
    assert model.blocks[0].attn.heads is not heads
