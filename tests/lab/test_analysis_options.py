"""What the per-layer analysis reads: the split, the cls token, before or after the final
LayerNorm; and the within/between-sequence parts of the within-sequence share."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from heatformer.analysis import collect_token_states
from heatformer.lab.cli import _experiments, build_parser
from heatformer.lab.report import format_table
from heatformer.lab.spec import CompareSpec
from heatformer.lab.tasks import Task, resolve_task
from heatformer.lab.tasks._layer_stats import LayerStats
from heatformer.models import (
    GPTConfig,
    SequenceClassifier,
    SequenceClassifierConfig,
    ViT,
    ViTConfig,
)

CPU = torch.device("cpu")
#: a 2-layer ViT of width 16 on the 8x8 digits (analysis batch: the 360 test images)
DIGITS = CompareSpec(task="digits", heads=("attention:1,laplacian:1",), n_layer=2, n_embd=16)
CHARS_OPTIONS = {"seq_len": 12, "eval_size": 8, "analysis_size": 5}


@pytest.fixture(scope="module")
def digits() -> tuple[Task, nn.Module]:
    task = resolve_task("digits")(DIGITS)
    torch.manual_seed(0)
    return task, task.build_model(DIGITS.heads[0])


def _with(task: Task, **values: Any) -> Task:
    """The same task (its data already loaded) under a spec with other analysis options."""
    return type(task)(dataclasses.replace(task.spec, **values), task.data)


def _chars() -> Task:
    from heatformer.lab.tasks.chars import CharsTask

    data = torch.tensor(list(b"heat flows along the edges of attention graphs. " * 20))
    data = data.to(torch.uint8)
    corpus = CharsTask(train=data[:700], val=data[700:], train_files=("a",), val_files=("b",),
                       source="<bytes>")  # fmt: skip
    spec = CompareSpec(task="chars", heads=("attention:2",), n_layer=2, n_embd=16,
                       options=CHARS_OPTIONS)  # fmt: skip
    return resolve_task("chars")(spec, corpus)


def _metrics_of(task: Task, states: list[Tensor], labels: Tensor) -> dict[str, list[float]]:
    """The analysis of given per-layer states: :meth:`Task.layer_values`, layer by layer."""
    per_layer = [task.layer_values(x.float(), labels) for x in states]
    return {name: [values[name] for values in per_layer] for name in task.analysis_names}


def _assert_same(got: dict[str, list[float]], want: dict[str, list[float]]) -> None:
    assert got.keys() == want.keys()
    for name, values in want.items():
        assert got[name] == pytest.approx(values, rel=1e-12, nan_ok=True), name


# ----------------------------------------------------------------------------- defaults


def test_the_defaults_read_the_test_batch_before_the_final_norm_with_every_token(
    digits: tuple[Task, nn.Module],
) -> None:
    task, model = digits
    spec = CompareSpec(task="digits")
    assert (spec.analysis_split, spec.analysis_cls, spec.analysis_point) == ("test", True, "pre_ln")
    inputs, labels = task.analysis_batch()
    assert torch.equal(task.analysis_inputs()[0], inputs)
    states = list(collect_token_states(model, inputs, to_cpu=True).values())  # the blocks' outputs
    _assert_same(task.layer_metrics(model, CPU), _metrics_of(task, states, labels))
    assert (
        task.analysis_description()
        == "the test batch, before the final LayerNorm, cls token included"
    )


def test_the_analysis_options_are_not_in_the_checkpoint_fingerprint() -> None:
    # they change no training number: a checkpoint resumes, or is re-analyzed, under any of them
    other = dataclasses.replace(
        DIGITS, analysis_split="train", analysis_cls=False, analysis_point="post_ln"
    )
    assert other.fingerprint() == DIGITS.fingerprint()
    assert not {"analysis_split", "analysis_cls", "analysis_point"} & set(DIGITS.fingerprint())
    saved = CompareSpec.from_dict(other.to_dict())  # spec.json keeps them
    assert (saved.analysis_split, saved.analysis_cls, saved.analysis_point) == (
        "train", False, "post_ln",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("values", "argument", "error"),
    [
        ({"analysis_split": "val"}, "analysis_split", ValueError),
        ({"analysis_point": "post-ln"}, "analysis_point", ValueError),
        ({"analysis_cls": 0}, "analysis_cls", TypeError),
    ],
)
def test_a_bad_analysis_option_names_itself(
    values: dict[str, Any], argument: str, error: type[Exception]
) -> None:
    with pytest.raises(error, match=argument) as info:
        CompareSpec(task="chars", **values)
    assert getattr(info.value, "argument", None) == argument


def test_the_command_line_sets_the_analysis_options() -> None:
    argv = ["compare", "--task", "digits", "--heads", "attention:2", "--analysis-split", "train",
            "--analysis-point", "post_ln", "--no-analysis-cls"]  # fmt: skip
    spec = _experiments._build_spec(build_parser().parse_args(argv), compare=True)
    assert (spec.analysis_split, spec.analysis_cls, spec.analysis_point) == (
        "train", False, "post_ln",
    )  # fmt: skip
    spec = _experiments._build_spec(build_parser().parse_args(argv[:5]), compare=True)
    assert (spec.analysis_split, spec.analysis_cls, spec.analysis_point) == ("test", True, "pre_ln")


def test_analyze_overrides_what_the_analysis_reads_and_records_it(
    tiny_spec: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from heatformer.lab.checkpoint import load_checkpoint
    from heatformer.lab.cli import main
    from heatformer.lab.compare import run_compare

    out = tmp_path / "out"
    run_compare(tiny_spec(steps=3, heads=("attention:1,laplacian:1",)), out)
    before = (out / "spec.json").read_bytes()
    # a cls token the chars model does not have: refused, naming the flag, nothing written
    assert main(["analyze", str(out), "--no-progress", "--no-analysis-cls"]) == 2
    assert "--no-analysis-cls: expected True for task 'chars'" in capsys.readouterr().err
    assert (out / "spec.json").read_bytes() == before
    argv = ["analyze", str(out), "--no-progress", "--analysis-split", "train",
            "--analysis-point", "post_ln"]  # fmt: skip
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["analysis_on"] == "a training batch, after the final LayerNorm"
    saved = json.loads((out / "spec.json").read_text())["spec"]
    assert (saved["analysis_split"], saved["analysis_point"]) == ("train", "post_ln")
    # the record holds what the task computes under those options, from the final weights
    spec = dataclasses.replace(
        CompareSpec.from_dict(saved), analysis_split="test", analysis_point="pre_ln"
    )
    task = _with(resolve_task("chars")(spec), analysis_split="train", analysis_point="post_ln")
    run = results["runs"][0]
    model = task.build_model(run["heads"])
    model.load_state_dict(load_checkpoint(out / "runs" / run["run"] / "checkpoint.pt")["model"])
    _assert_same(run["analysis"], task.layer_metrics(model, CPU))
    default = _with(task, analysis_split="test", analysis_point="pre_ln").layer_metrics(model, CPU)
    assert run["analysis"]["within_seq_var"] != pytest.approx(default["within_seq_var"])
    # the flags and their help are compare's
    from heatformer.lab.cli import _build_parsers

    flags = {"analysis_split": "--analysis-split", "analysis_point": "--analysis-point",
             "analysis_cls": "--no-analysis-cls"}  # fmt: skip
    parsers = _build_parsers()[1]
    assert flags.items() <= parsers["analyze"].option_of.items()
    assert flags.items() <= parsers["compare"].option_of.items()


# ----------------------------------------------------------------------------- the split


def test_the_train_split_analyzes_a_fixed_batch_of_training_images(
    digits: tuple[Task, nn.Module],
) -> None:
    task, model = digits
    train = _with(task, analysis_split="train")
    inputs, labels = train.analysis_inputs()
    test_inputs, _ = task.analysis_batch()
    assert inputs.shape == test_inputs.shape  # as many images as the test batch
    flat_train = task.data.train_images.flatten(1)  # (num_train, 64)
    matches = (inputs.flatten(1)[:, None] == flat_train[None]).all(-1)  # (B, num_train)
    assert bool(matches.any(1).all())  # every image is a training image ...
    position = matches.float().argmax(1)
    assert torch.equal(labels, task.data.train_labels[position])  # ... with its own label
    assert len(set(position.tolist())) == inputs.shape[0]  # distinct images
    again = _with(task, analysis_split="train", seeds=(7,)).analysis_inputs()
    assert torch.equal(again[0], inputs)  # the same batch for every run, whatever its seed
    states = list(collect_token_states(model, inputs, to_cpu=True).values())
    metrics = train.layer_metrics(model, CPU)
    _assert_same(metrics, _metrics_of(task, states, labels))
    assert metrics["nc1"] != task.layer_metrics(model, CPU)["nc1"]
    assert train.analysis_description().startswith("a training batch, ")


def test_the_train_split_of_chars_reads_training_windows() -> None:
    task = _with(_chars(), analysis_split="train")
    inputs, targets = task.analysis_inputs()
    assert inputs.shape == (CHARS_OPTIONS["analysis_size"], CHARS_OPTIONS["seq_len"])
    train = bytes(task.data.train.tolist())
    for window, following in zip(inputs.tolist(), targets.tolist(), strict=True):
        assert bytes(window) in train and following[:-1] == window[1:]  # next bytes: the labels


# ----------------------------------------------------------------------------- the cls token


@pytest.mark.parametrize(
    ("config", "index"),
    [
        (ViTConfig(pool="cls"), 0),
        (ViTConfig(pool="mean"), None),
        (SequenceClassifierConfig(pool="cls", causal=True), -1),
        (SequenceClassifierConfig(pool="cls", causal=False), 0),
        (SequenceClassifierConfig(pool="last"), None),
        (GPTConfig(), None),
    ],
)
def test_a_config_says_where_its_cls_token_is(config: Any, index: int | None) -> None:
    assert config.cls_index() == index
    if index is None:
        return
    # the token at that index is the one the head reads (pooled through the final norm)
    torch.manual_seed(0)
    vit = isinstance(config, ViTConfig)
    small = dataclasses.replace(config, n_layer=1, n_embd=16, n_head=2)
    model = ViT(small) if vit else SequenceClassifier(small)
    inputs = torch.rand(3, 1, 8, 8) if vit else torch.randint(256, (3, 6))
    read: list[Tensor] = []
    model.head.register_forward_hook(lambda module, args, output: read.append(args[0]))
    last = list(collect_token_states(model, inputs).values())[-1]  # (3, N, 16)
    torch.testing.assert_close(read[0], model.ln_f(last[:, index]).detach())


def test_leaving_the_cls_token_out_drops_exactly_that_token(
    digits: tuple[Task, nn.Module],
) -> None:
    task, model = digits
    without = _with(task, analysis_cls=False)
    inputs, labels = task.analysis_batch()
    full = list(collect_token_states(model, inputs, to_cpu=True).values())  # (B, 17, 16) each
    states = without.analysis_states(model, inputs, CPU)
    assert [x.shape[1] for x in states] == [17 - 1] * 2
    for got, want in zip(states, full, strict=True):
        assert torch.equal(got, want[:, 1:])  # the 16 patch tokens, the cls token gone
    manual = _metrics_of(task, [x[:, 1:] for x in full], labels)
    _assert_same(without.layer_metrics(model, CPU), manual)
    assert without.analysis_description().endswith(", cls token left out")


@pytest.mark.parametrize("name", ["chars", "recall"])
def test_leaving_out_a_cls_token_a_model_does_not_have_is_refused(name: str) -> None:
    spec = CompareSpec(task=name, heads=("attention:2",), n_layer=1, n_embd=16,
                       options={"seq_len": 40}, analysis_cls=False)  # fmt: skip
    with pytest.raises(ValueError, match="no cls token") as info:
        resolve_task(name)(spec, _chars().data if name == "chars" else None)
    assert getattr(info.value, "argument", None) == "analysis_cls"


# ----------------------------------------------------------------------------- the final norm


def test_post_ln_states_are_the_final_layernorm_of_the_block_outputs(
    digits: tuple[Task, nn.Module],
) -> None:
    task, model = digits
    post = _with(task, analysis_point="post_ln", analysis_cls=False)
    inputs, labels = task.analysis_batch()
    states = post.analysis_states(model, inputs, CPU)
    norm = model.ln_f
    weight, bias = norm.weight.detach().double().numpy(), norm.bias.detach().double().numpy()
    reference = []
    for x in collect_token_states(model, inputs).values():  # (B, 17, 16), float64 LayerNorm
        z = x.double().numpy()[:, 1:]
        mean, var = z.mean(-1, keepdims=True), z.var(-1, keepdims=True)
        reference.append((z - mean) / np.sqrt(var + norm.eps) * weight + bias)
    for got, want in zip(states, reference, strict=True):
        np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-5, atol=1e-5)
    _assert_same(post.layer_metrics(model, CPU), _metrics_of(task, states, labels))
    assert post.analysis_description() == (
        "the test batch, after the final LayerNorm, cls token left out"
    )


def test_post_ln_of_the_last_block_is_what_a_gpt_head_reads() -> None:
    task = _with(_chars(), analysis_point="post_ln")
    torch.manual_seed(0)
    model = task.build_model(task.spec.heads[0])
    inputs, _ = task.analysis_batch()
    read: list[Tensor] = []
    model.head.register_forward_hook(lambda module, args, output: read.append(args[0]))
    last = task.analysis_states(model, inputs, CPU)[-1]
    assert torch.equal(last, read[0])


def test_post_ln_on_a_model_without_a_final_norm_names_the_option() -> None:
    task = _with(_chars(), analysis_point="post_ln")
    torch.manual_seed(0)
    model = task.build_model(task.spec.heads[0])
    model.ln_f = nn.Identity()  # a model factory's model may have none
    with pytest.raises(ValueError, match="final LayerNorm") as info:
        task.layer_metrics(model, CPU)
    assert getattr(info.value, "argument", None) == "analysis_point"


# ----------------------------------------------------------------------------- within/between


def test_within_and_between_sequence_variance_add_up_to_the_total() -> None:
    task = resolve_task("digits")(DIGITS)
    x = torch.randn(9, 5, 16, generator=torch.Generator().manual_seed(3)) * 2 + 1  # (B, N, D)
    x[:3] += 4.0  # sequences apart: a between part worth measuring
    labels = torch.arange(9) % 3
    z = x.double().numpy()
    total = ((z - z.reshape(-1, 16).mean(0)) ** 2).sum(-1).mean()
    within = ((z - z.mean(1, keepdims=True)) ** 2).sum(-1).mean()
    between = ((z.mean(1) - z.reshape(-1, 16).mean(0)) ** 2).sum(-1).mean()
    values = task.layer_values(x, labels)
    assert values["within_seq_var"] == pytest.approx(within, rel=1e-12)
    assert values["between_seq_var"] == pytest.approx(between, rel=1e-12)
    assert values["within_seq_var"] + values["between_seq_var"] == pytest.approx(total, rel=1e-12)
    assert values["within_seq_frac"] == pytest.approx(within / total, rel=1e-12)
    merged = LayerStats()
    for part in (slice(0, 4), slice(4, 5), slice(5, 9)):  # slices merge to the same parts
        merged.add(task, x[part], labels[part])
    assert merged.values(task)["between_seq_var"] == pytest.approx(between, rel=1e-12)
    collapsed = x[:, :1].expand(9, 5, 16)  # one vector per sequence: all variance between
    values = task.layer_values(collapsed, labels)
    assert values["within_seq_var"] == pytest.approx(0.0, abs=1e-12)
    assert values["between_seq_var"] == pytest.approx(
        float(((z[:, 0] - z[:, 0].mean(0)) ** 2).sum(-1).mean()), rel=1e-12
    )


def test_the_table_prints_both_parts_next_to_the_share() -> None:
    def stats(value: float) -> dict[str, list[float]]:
        return {"mean": [0.5, value], "std": [0.0, value / 10]}

    summary = [{"heads": "attention:2", "seeds": [0, 1], "final": {"val_loss": {"mean": 1.0,
                "std": 0.1}}, "analysis": {"within_seq_frac": stats(0.61),
                "within_seq_var": stats(0.0063), "between_seq_var": stats(4.2e-5),
                "nc1": stats(2.0)}}]  # fmt: skip
    header, _, line = format_table(summary, ["val_loss"]).splitlines()
    assert header.split() == ["heads", "seeds", "val_loss", "within_seq_frac@L1",
                              "within_seq_var@L1", "between_seq_var@L1", "nc1@L1"]  # fmt: skip
    # the variances to 3 significant digits (4 decimals would print 4.2e-5 as 0.0000)
    assert "0.0063 ± 0.00063" in line and "4.2e-05 ± 4.2e-06" in line and "0.6100 ±" in line
