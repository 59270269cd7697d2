"""Model files, run checkpoints and run folders (``heatformer.models.files``), library only.

The checkpoints here are written by hand in the layout of a run of the ``heatformer`` command
(``OUT/runs/RUN/checkpoint.pt``); ``tests/lab/test_load_trained.py`` loads real runs.
"""

from __future__ import annotations

import io
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from device_helpers import DEVICES
from heatformer.models import (
    GPT,
    GPTConfig,
    SequenceClassifier,
    SequenceClassifierConfig,
    UnfinishedTraining,
    ViT,
    ViTConfig,
    load_model,
    model_file_keys,
    save_model,
)

HEADS = ("attention:2", "attention:1,heat[t=0.5;learnable=true]:1")


def _models() -> list[nn.Module]:
    torch.manual_seed(0)
    return [
        GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8, heads=HEADS)),
        ViT(ViTConfig(image_size=4, patch_size=2, n_layer=2, n_head=2, n_embd=8, heads=HEADS,
                      graph="topk[k=2];softmax")),
        SequenceClassifier(SequenceClassifierConfig(vocab_size=11, block_size=8, n_layer=2,
                                                    n_head=2, n_embd=8, heads=HEADS)),
    ]  # fmt: skip


def _input(model: nn.Module) -> torch.Tensor:
    if isinstance(model, ViT):
        return torch.randn(2, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    return torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(1))


def _checkpoint(model: nn.Module, step: int, steps: int) -> dict[str, Any]:
    """A training loop's checkpoint: its own keys (as a run of the ``heatformer`` command has
    them) beside the keys of a model file."""
    optimizer = torch.optim.AdamW(model.parameters())
    model(_input(model)).float().sum().backward()
    optimizer.step()
    return {
        "format": "heatformer-run-checkpoint-v1",
        "step": step,
        "steps": steps,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "data_generator": torch.Generator().get_state(),
        **(model_file_keys(model) or {}),
    }


@pytest.mark.parametrize("index", [0, 1, 2], ids=["gpt", "vit", "clf"])
def test_a_checkpoint_with_the_keys_of_a_model_file_loads_as_trained(
    tmp_path: Path, index: int
) -> None:
    model = _models()[index]
    path = tmp_path / "checkpoint.pt"
    torch.save(_checkpoint(model, 3, 3), path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a finished training: no warning
        loaded = load_model(path)
    assert type(loaded) is type(model) and not loaded.training
    assert loaded.config == model.config
    assert loaded.config.heads == HEADS and isinstance(loaded.config.heads, tuple)
    model.eval()
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)
    x = _input(model)
    torch.testing.assert_close(loaded(x), model(x), atol=0, rtol=0)


def test_the_weights_that_two_keys_share_are_written_once() -> None:
    model = GPT(GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=2, n_embd=64))
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    sizes = []
    for keys in ({}, model_file_keys(model)):
        buffer = io.BytesIO()
        torch.save({"model": model.state_dict(), **(keys or {})}, buffer)
        sizes.append(buffer.tell())
    assert sizes[0] > weights
    assert sizes[1] - sizes[0] < 0.05 * weights  # the kind, config and tensor records only


def test_a_training_cut_short_loads_with_a_warning_that_says_its_step(tmp_path: Path) -> None:
    model = _models()[0]
    path = tmp_path / "checkpoint.pt"
    torch.save(_checkpoint(model, 2, 6), path)
    with pytest.warns(UnfinishedTraining, match=r"got those of step 2 of 6 \(a run that") as rec:
        loaded = load_model(path)
    (warning,) = [w.message for w in rec if isinstance(w.message, UnfinishedTraining)]
    assert (warning.path, warning.step, warning.steps) == (path, 2, 6)
    assert loaded.config == model.config and not loaded.training


def test_a_run_folder_and_an_output_folder_of_one_run_name_its_checkpoint(tmp_path: Path) -> None:
    model = _models()[2]
    run = tmp_path / "out" / "runs" / "c00-attention2-s0"
    run.mkdir(parents=True)
    torch.save(_checkpoint(model, 1, 1), run / "checkpoint.pt")
    (run / "result.json").write_text("{}")
    (run.parent / ".c01.tmp-1").mkdir()  # a temporary is no run
    x = _input(model)
    expected = model.eval()(x)
    for path in (run, tmp_path / "out", str(run / "checkpoint.pt")):
        torch.testing.assert_close(load_model(path)(x), expected, atol=0, rtol=0)


def test_a_folder_of_several_runs_is_refused_listing_them(tmp_path: Path) -> None:
    model = _models()[0]
    names = [f"c{i:02d}-attention2-s0" for i in range(10)]
    for name in names:
        (tmp_path / "runs" / name).mkdir(parents=True)
    torch.save(_checkpoint(model, 1, 1), tmp_path / "runs" / names[0] / "checkpoint.pt")
    listed = ", ".join(str(tmp_path / "runs" / name) for name in names[:8])
    with pytest.raises(ValueError) as err:
        load_model(tmp_path)
    assert str(err.value) == (
        f"path: expected one run's folder, got {tmp_path}, which holds 10 runs: pass one of "
        f"{listed} and 2 more"
    )


@pytest.mark.parametrize("layout", ["missing", "empty folder", "empty runs", "run without file"])
def test_a_path_without_a_checkpoint_says_what_it_expected(tmp_path: Path, layout: str) -> None:
    path = tmp_path / "out"
    if layout != "missing":
        path.mkdir()
    if layout == "empty runs":
        (path / "runs").mkdir()
    if layout == "run without file":
        (path / "runs" / "c00").mkdir(parents=True)
        expected = f"{path / 'runs' / 'c00'}, which holds neither"
    else:
        expected = {
            "missing": f"{path}, which does not exist",
            "empty folder": f"{path}, which holds neither",
            "empty runs": f"{path}, whose runs/ is empty",
        }[layout]
    with pytest.raises(FileNotFoundError, match=r"^path: expected .*got " + re.escape(expected)):
        load_model(path)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"model_class": "mypackage.Net"}, "(its model is a mypackage.Net, not one of ['GPT', "),
        ({}, "(it was written before run checkpoints held a model's kind and config)"),
    ],
    ids=["custom model", "older checkpoint"],
)
def test_a_run_checkpoint_without_a_model_kind_says_what_it_is(
    tmp_path: Path, extra: dict[str, Any], says: str
) -> None:
    saved = {"format": "heatformer-run-checkpoint-v1", "step": 2, "model": {}, **extra}
    torch.save(saved, tmp_path / "checkpoint.pt")
    with pytest.raises(ValueError) as err:
        load_model(tmp_path)
    message = str(err.value)
    assert message.startswith(
        f"path: {tmp_path / 'checkpoint.pt'} is a run's checkpoint without a model's kind and "
        "config " + says
    )
    assert message.endswith("load_state_dict(torch.load(path, weights_only=True)['model'])")


class _Payload:
    """Not something ``weights_only=True`` unpickles."""


def test_files_are_read_with_weights_only(tmp_path: Path) -> None:
    model = _models()[0]
    path = tmp_path / "code.pt"
    torch.save({**(model_file_keys(model) or {}), "extra": _Payload()}, path)
    with pytest.raises(ValueError, match=r"cannot read with weights_only=True \(Unpickling"):
        load_model(path)
    legacy = tmp_path / "legacy.pt"  # torch.save's format before zip archives: no mmap
    torch.save(model_file_keys(model), legacy, _use_new_zipfile_serialization=False)
    assert load_model(legacy).config == model.config
    (tmp_path / "text.pt").write_text("not a torch file")
    with pytest.raises(ValueError, match=r"cannot read with weights_only=True \(Unpickling"):
        load_model(tmp_path / "text.pt")
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(ValueError, match=r"holds a list$"):
        load_model(tmp_path / "list.pt")


def test_only_the_library_kinds_have_model_file_keys() -> None:
    class MyGPT(GPT):
        pass

    config = GPTConfig(vocab_size=11, n_layer=1, n_embd=8, n_head=2)
    assert model_file_keys(MyGPT(config)) is None
    assert model_file_keys(nn.Linear(2, 2)) is None
    with pytest.raises(TypeError, match=r"^model: expected one of \['GPT', 'SequenceClassifier', "):
        save_model(MyGPT(config), "unused.pt")


@pytest.mark.parametrize("device", DEVICES)
def test_map_location_puts_the_model_on_that_device(tmp_path: Path, device: torch.device) -> None:
    model = _models()[1]
    save_model(model, tmp_path / "vit.pt")
    loaded = load_model(tmp_path / "vit.pt", map_location=device)
    assert {p.device.type for p in loaded.state_dict().values()} == {device.type}
    x = _input(model)
    torch.testing.assert_close(loaded(x.to(device)).cpu(), model.eval()(x), atol=1e-5, rtol=1e-4)
    save_model(loaded, tmp_path / "saved_there.pt")  # None: where it was saved from
    again = load_model(tmp_path / "saved_there.pt", map_location=None)
    assert {p.device.type for p in again.state_dict().values()} == {device.type}
