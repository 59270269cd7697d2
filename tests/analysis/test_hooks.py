"""Tests for heatformer.analysis.hooks: collect_token_states and snapshot_attention.

The equivalences take ``device`` (CPU; CUDA where available, marked ``cuda``): states stay on
the model's device unless ``to_cpu``, and snapshots reproduce each layer's output there."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from device_helpers import DEVICES, close
from heatformer.analysis import LayerSnapshot, collect_token_states, snapshot_attention
from heatformer.checks import ArgumentError
from heatformer.graph_ops import Attention, DenseGraph, Laplacian
from heatformer.models import GPT, GPTConfig


class _Block(nn.Module):
    """Residual block returning ``(output, aux)`` like an attention module."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(0.5)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return x + self.dropout(torch.tanh(self.linear(x))), x.sum()


class _ToyModel(nn.Module):
    """``embed -> blocks -> head``, the layout of the reference GPT and ViT."""

    def __init__(self, dim: int = 4, depth: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(2, dim)
        self.blocks = nn.ModuleList(_Block(dim) for _ in range(depth))
        self.head = nn.Linear(dim, 1)

    def forward(self, x: Tensor, *, scale: float = 1.0) -> Tensor:
        h = self.embed(x) * scale
        for block in self.blocks:
            h, _ = block(h)
        return self.head(h)


def _all_hooks_removed(model: nn.Module) -> bool:
    return all(len(m._forward_hooks) == 0 for m in model.modules())


def test_sequential_states_equal_manual_intermediates(device: torch.device) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2)).to(device)
    x = torch.randn(2, 4, 3).to(device)  # (B, N, D)
    states = collect_token_states(model, x, ["0", "1", "2"])
    assert list(states) == ["0", "1", "2"] and states["0"].device.type == device.type
    h0 = model[0](x)
    torch.testing.assert_close(states["0"], h0)
    torch.testing.assert_close(states["1"], h0.relu())
    torch.testing.assert_close(states["2"], model[2](h0.relu()))
    assert all(not s.requires_grad for s in states.values())
    assert _all_hooks_removed(model)


def test_default_layers_are_the_blocks_and_tuples_give_their_first_tensor() -> None:
    torch.manual_seed(1)
    model = _ToyModel()
    x = torch.randn(2, 5, 2)
    states = collect_token_states(model, x)
    assert list(states) == ["blocks.0", "blocks.1", "blocks.2"]
    model.eval()
    with torch.no_grad():
        h = model.embed(x)
        for i, block in enumerate(model.blocks):
            h, _ = block(h)
            torch.testing.assert_close(states[f"blocks.{i}"], h)
    assert _all_hooks_removed(model)


def test_layers_container_is_the_fallback_default() -> None:
    class WithLayers(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))

        def forward(self, x: Tensor) -> Tensor:
            return self.layers(x)

    states = collect_token_states(WithLayers(), torch.randn(3, 2))
    assert list(states) == ["layers.0", "layers.1"]


def test_training_flags_are_restored_exactly_and_dropout_is_off() -> None:
    torch.manual_seed(2)
    model = _ToyModel()
    model.train()
    model.blocks[1].eval()  # a mixed state must come back as it was
    before = {name: m.training for name, m in model.named_modules()}
    x = torch.randn(2, 5, 2)
    first = collect_token_states(model, x, ["blocks.2"])
    second = collect_token_states(model, x, ["blocks.2"])
    torch.testing.assert_close(first["blocks.2"], second["blocks.2"])  # dropout was off
    assert {name: m.training for name, m in model.named_modules()} == before


def test_eval_mode_false_keeps_training_mode() -> None:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Dropout(0.5))
    model.train()
    x = torch.ones(1000)
    states = collect_token_states(model, x, ["0"], eval_mode=False)
    assert (states["0"] == 0).any()  # dropout was active
    assert model.training


def test_hooks_are_removed_and_flags_restored_when_forward_raises() -> None:
    class Broken(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(2, 2)])

        def forward(self, x: Tensor) -> Tensor:
            self.blocks[0](x)
            raise RuntimeError("boom")

    model = Broken()
    model.train()
    with pytest.raises(RuntimeError, match="boom"):
        collect_token_states(model, torch.randn(1, 2))
    assert _all_hooks_removed(model)
    assert model.training and model.blocks[0].training


def test_states_are_copies_unaffected_by_later_in_place_updates() -> None:
    class InPlace(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = nn.Identity()

        def forward(self, x: Tensor) -> Tensor:
            h = self.first(x)
            h.mul_(10.0)  # modifies the tensor the hook saw
            return h

    x = torch.ones(2, 3)
    states = collect_token_states(InPlace(), x.clone(), ["first"])
    torch.testing.assert_close(states["first"], x)


def test_inputs_tuple_mapping_and_root_module() -> None:
    torch.manual_seed(4)
    model = _ToyModel()
    x = torch.randn(1, 3, 2)
    by_tuple = collect_token_states(model, (x,), ["", "embed"])
    by_mapping = collect_token_states(model, {"x": x, "scale": 2.0}, ["embed"])
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(by_tuple[""], model(x))
        torch.testing.assert_close(by_tuple["embed"], model.embed(x))
        torch.testing.assert_close(by_mapping["embed"], model.embed(x))  # hook sees pre-scale


def test_to_cpu_returns_cpu_tensors() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    states = collect_token_states(model, torch.randn(1, 2), ["0"], to_cpu=True)
    assert states["0"].device.type == "cpu"


@pytest.mark.parametrize("device", DEVICES)
def test_states_stay_on_the_models_device_unless_to_cpu(device: torch.device) -> None:
    model = _ToyModel().to(device)
    x = torch.randn(2, 3, 2).to(device)
    assert collect_token_states(model, x)["blocks.0"].device.type == device.type
    assert collect_token_states(model, x, to_cpu=True)["blocks.0"].device.type == "cpu"


def test_bad_inputs_name_the_argument() -> None:
    model = _ToyModel()
    x = torch.randn(1, 3, 2)
    with pytest.raises(ValueError, match=r"layers: unknown submodule 'blocks\.7'.*'embed'"):
        collect_token_states(model, x, ["blocks.7"])
    with pytest.raises(TypeError, match="layers: expected a list"):
        collect_token_states(model, x, "blocks.0")
    with pytest.raises(ValueError, match="layers: expected distinct names"):
        collect_token_states(model, x, ["embed", "embed"])
    with pytest.raises(ValueError, match="layers: expected a list of submodule names"):
        collect_token_states(nn.Sequential(nn.Linear(2, 2)), torch.randn(1, 2))
    with pytest.raises(TypeError, match="model"):
        collect_token_states(lambda t: t, x, ["0"])
    assert _all_hooks_removed(model)


def test_layer_that_never_runs_or_runs_twice_raises() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.shared = nn.Linear(2, 2)
            self.unused = nn.Linear(2, 2)

        def forward(self, x: Tensor) -> Tensor:
            return self.shared(self.shared(x))

    model = Twice()
    with pytest.raises(ValueError, match=r"'unused'.* did not run"):
        collect_token_states(model, torch.randn(1, 2), ["unused"])
    with pytest.raises(ValueError, match="'shared' ran more than once"):
        collect_token_states(model, torch.randn(1, 2), ["shared"])
    assert _all_hooks_removed(model)


def test_layer_without_tensor_output_raises() -> None:
    class NoTensor(nn.Module):
        def forward(self, x: Tensor) -> dict[str, Tensor]:
            return {"y": x}

    model = nn.Sequential(NoTensor())
    with pytest.raises(TypeError, match="layers: expected submodule '0' to return a tensor"):
        collect_token_states(model, torch.randn(1, 2), ["0"])
    assert _all_hooks_removed(model)


# ----------------------------------------------------------------- snapshot_attention


def _gpt(*, dropout: float = 0.0, graph: str = "softmax", device: str = "cpu") -> GPT:
    torch.manual_seed(5)
    config = GPTConfig(
        vocab_size=11, block_size=8, n_layer=3, n_head=3, n_embd=12, dropout=dropout,
        heads="attention:2,laplacian:1", graph=graph,
    )  # fmt: skip
    return GPT(config).to(device)  # drawn on the CPU: the same weights on every device


def test_snapshot_reproduces_every_attention_layer_output(device: torch.device) -> None:
    """The heads' operators on the snapshot's graphs and values, merged by the layer's output
    projection, give what each attention layer returned in the model's own forward pass."""
    model = _gpt(device=device)
    idx = torch.tensor([[3, 1, 4, 1, 5, 9, 2]], device=device)
    layers = snapshot_attention(model, idx)
    names = [f"blocks.{i}.attn" for i in range(3)]
    outputs = collect_token_states(model, idx, names)
    assert len(layers) == 3
    for name, snap in zip(names, layers):
        assert isinstance(snap, LayerSnapshot)
        assert snap.graph.to_dense().dtype == torch.float64
        assert snap.source_dtype == torch.float32  # what the float64 copy was computed in
        assert snap.values.shape == (3, 7, 4) and snap.values.dtype == torch.float64
        assert snap.values.device.type == device.type
        assert [type(op) for op in snap.operators] == [Attention, Attention, Laplacian]
        dense = snap.graph.to_dense()  # (H, N, N)
        heads = torch.stack(
            [op(DenseGraph(dense[h]), snap.values[h]) for h, op in enumerate(snap.operators)]
        )  # (H, N, Dh)
        attn = model.get_submodule(name)
        with torch.no_grad():
            merged = attn.merge_heads(heads.to(torch.float32).unsqueeze(0))  # (1, N, D)
        tol = close(device, torch.float32, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(merged, outputs[name], **tol)


def test_snapshot_of_a_topk_layer_keeps_k_edges_per_query(device: torch.device) -> None:
    idx = torch.tensor([[1, 2, 3, 4, 5, 6]], device=device)
    layers = snapshot_attention(_gpt(graph="topk[k=2]", device=device), idx)
    for snap in layers:
        dense = snap.graph.to_dense().cpu()  # (H, N, N)
        edges = (dense > 0).sum(-1)  # (H, N)
        torch.testing.assert_close(
            edges, torch.minimum(torch.arange(1, 7), torch.tensor(2)).expand(3, 6)
        )
        torch.testing.assert_close(dense.sum(-1), torch.ones(3, 6, dtype=torch.float64))


def test_snapshot_runs_in_eval_mode_and_restores_flags_and_hooks() -> None:
    model = _gpt(dropout=0.5)
    model.train()
    idx = torch.tensor([[1, 2, 3, 4]])
    first, second = snapshot_attention(model, idx), snapshot_attention(model, idx)
    for a, b in zip(first, second):  # no dropout: the same graphs twice
        torch.testing.assert_close(a.graph.to_dense(), b.graph.to_dense(), rtol=0, atol=0)
    assert all(m.training for m in model.modules())
    assert _all_hooks_removed(model)
    snapshot_attention(model, idx, eval_mode=False)
    assert all(m.training for m in model.modules())


@pytest.mark.parametrize(
    ("model", "idx", "argument", "kind"),
    [
        (nn.Sequential(nn.Linear(2, 2)), torch.tensor([[1, 2]]), "model", TypeError),
        (_ToyModel(), torch.tensor([[1, 2]]), "model", TypeError),
        (_gpt(), torch.tensor([1, 2, 3]), "idx", ValueError),
        (_gpt(), torch.tensor([[1, 2], [3, 4]]), "idx", ValueError),
        (_gpt(), [[1, 2]], "idx", ValueError),
    ],
)
def test_snapshot_refuses_bad_input_naming_the_argument(
    model: nn.Module, idx: object, argument: str, kind: type
) -> None:
    with pytest.raises(kind) as info:
        snapshot_attention(model, idx)  # type: ignore[arg-type]
    assert isinstance(info.value, ArgumentError) and info.value.argument == argument
    assert _all_hooks_removed(model)
