"""The task registry: one module and one entry per task, checked when registered."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from heatformer.lab.spec import CompareSpec
from heatformer.lab.tasks import (
    TASK_NAMES,
    TASKS,
    Chars,
    CharsTask,
    Digits,
    MaskedChars,
    Recall,
    RecallTask,
    Stdlib,
    StdlibTask,
    Task,
    TaskOptions,
    check_task,
    option,
    options_by_name,
    register_task,
    resolve_task,
)
from heatformer.lab.tasks.digits import VIT_RECIPES
from heatformer.registry import Registry


@pytest.fixture()
def registry() -> Iterator[Registry[type[Task]]]:
    """TASKS, restored after the test."""
    before = dict(TASKS.items())
    try:
        yield TASKS
    finally:
        for name in list(TASKS):
            if before.get(name) is not TASKS[name]:
                TASKS.unregister(name)
        for cls in before.values():
            if cls.name not in TASKS:
                TASKS.register(cls)


def _chars_data() -> CharsTask:
    text = (b"the heat kernel spreads values along attention edges. " * 40)[:2000]
    data = torch.tensor(list(text), dtype=torch.uint8)
    return CharsTask(train=data[:1500], val=data[1500:], train_files=("a",), val_files=("b",),
                     source="<bytes>")  # fmt: skip


def _stdlib_data() -> StdlibTask:
    files = [b"import os\n" * 3, b"def f():\n    return 1\n" * 2, b"class A:\n    pass\n" * 2]
    sizes = tuple((len(data),) for data in files)
    stream = torch.tensor(list(b"".join(files)), dtype=torch.uint8)
    return StdlibTask(
        classes=("a", "b", "c"), train_files=(("a/x.py",), ("b/x.py",), ("c/x.py",)),
        train_sizes=sizes, test_files=(("a/y.py",), ("b/y.py",), ("c/y.py",)), test_sizes=sizes,
        train=stream, test=stream.clone(), seq_len=12, eval_per_class=4, source="<bytes>",
    )  # fmt: skip


# ----------------------------------------------------------------------------- built-ins


def test_builtin_tasks_are_the_registry_entries() -> None:
    synthetic = ("mqar", "induction", "selective_copy", "parity", "listops", "passkey")
    assert TASK_NAMES == ("chars", "digits", "recall", "stdlib", "masked", *synthetic)
    assert [TASKS[name] for name in TASK_NAMES[:5]] == [Chars, Digits, Recall, Stdlib, MaskedChars]
    for name in TASK_NAMES:
        assert check_task(TASKS[name]) is TASKS[name]
        assert resolve_task(name).name == name
    with pytest.raises(
        ValueError,
        match=re.escape("expected one of ['chars', 'digits', 'induction', 'listops', 'masked',"),
    ):
        resolve_task("char")


def test_defaults_are_declared_once_in_the_task() -> None:
    for name in TASK_NAMES:
        assert CompareSpec(task=name).options == TASKS[name].Options()
    assert CompareSpec(task="chars").options.seq_len == Chars.Options().seq_len == 128
    assert CompareSpec(task="digits").options.analysis_size == 512
    # the command line's help shows the same defaults
    from heatformer.lab.cli import _build_parsers

    help_text = " ".join(_build_parsers()[1]["compare"].format_help().split())
    assert "chars, masked: corpus cap in bytes (default 2000000)" in help_text
    assert "digits: images in the analysis batch (capped by the test split) (default 512)" in (
        help_text
    )
    assert "chars, recall, stdlib, masked: sequence length (default 128)" in help_text


def test_options_by_name_says_which_tasks_take_an_option() -> None:
    table = options_by_name()
    lengths = ["chars", "recall", "stdlib", "masked", "mqar", "induction", "selective_copy",
               "parity", "listops", "passkey"]  # fmt: skip
    assert list(table["seq_len"]) == lengths
    assert list(table["analysis_size"]) == ["chars", "digits", *lengths[1:]]
    assert list(table["npz"]) == ["digits"]
    assert table["text"]["chars"].metadata["path"] is True
    assert table["analysis_size"]["chars"].metadata["numbers"] is False


@pytest.mark.parametrize(
    ("task", "data"),
    [
        ("chars", _chars_data()),
        ("masked", _chars_data()),
        ("recall", RecallTask(num_keys=8, num_values=8, num_pairs=2, seq_len=12, val_size=40)),
        ("digits", None),
        ("stdlib", _stdlib_data()),
    ],
)
def test_one_batch_interface_for_every_task(task: str, data: Any) -> None:
    options = {"seq_len": 12} if task != "digits" else {"patch_size": 4}
    options["analysis_size"] = 8
    spec = CompareSpec(task=task, heads=("attention:2",), n_layer=1, n_embd=16, options=options)
    bound = resolve_task(task)(spec, data)
    x, y = bound.train_batch(6, torch.Generator().manual_seed(1))
    assert len(x) == len(y) == 6
    x2, y2 = bound.train_batch(6, torch.Generator().manual_seed(1))
    assert torch.equal(x, x2) and torch.equal(y, y2)  # only the caller's generator draws
    first = [torch.cat(parts) for parts in zip(*bound.eval_batches(), strict=True)]
    second = [torch.cat(parts) for parts in zip(*bound.eval_batches(), strict=True)]
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))  # a fixed set
    inputs, labels = bound.analysis_batch()
    assert len(inputs) == len(labels) == 8
    model = bound.build_model("attention:2")
    with torch.no_grad():
        logits = model(x)
    assert math_isfinite(bound.loss(logits, y))
    metrics = bound.evaluate(model, torch.device("cpu"))
    assert list(metrics) == list(bound.metric_names)


def math_isfinite(value: torch.Tensor) -> bool:
    return bool(torch.isfinite(value).all())


def test_graph_schedule_reaches_every_layer() -> None:
    spec = CompareSpec(task="chars", heads=("attention:2",), n_layer=2, n_embd=16,
                       graph="topk[k=4];softmax", options={"seq_len": 12})  # fmt: skip
    task = resolve_task("chars")(spec, _chars_data())
    assert task.model_config("attention:2").layer_graphs() == ["topk[k=4]", "softmax"]
    model = task.build_model("attention:2")
    assert [block.attn.graph_kind.spec for block in model.blocks] == ["topk[k=4]", "softmax"]
    every = dataclasses.replace(spec, graph="topk[k=4]")
    model = resolve_task("chars")(every, _chars_data()).build_model("attention:2")
    assert [block.attn.graph_kind.spec for block in model.blocks] == ["topk[k=4]"] * 2
    assert every.fingerprint() != spec.fingerprint()
    assert spec.fingerprint()["graph"] == "topk[k=4];softmax"


# ----------------------------------------------------------------------------- new tasks


@dataclass(frozen=True)
class _Opts(TaskOptions):
    size: int = option(4, "items per sequence")


class _Complete(Task):
    name = "tiny"
    Options = _Opts
    metric_names = ("acc",)
    higher_is_better = (True,)
    eval_loss_name = "acc"

    def load_data(self) -> Any:
        return None

    def model_config(self, heads: str) -> Any:
        return None

    def build_model(self, heads: str) -> Any:
        return None

    def train_batch(self, batch_size: int, generator: torch.Generator) -> Any:
        return None

    def eval_batches(self) -> Any:
        return iter(())

    def analysis_batch(self) -> Any:
        return None

    def metrics(self, loss: float, accuracy: float) -> dict[str, float]:
        return {"acc": accuracy}


def _variant(**attrs: Any) -> type[Task]:
    return type("Variant", (_Complete,), attrs)


@dataclass(frozen=True)
class _NoDefault(TaskOptions):
    size: int = dataclasses.field(metadata={"help": "x"})


@dataclass(frozen=True)
class _NoHelp(TaskOptions):
    size: int = 4


@dataclass(frozen=True)
class _Clash(TaskOptions):
    steps: int = option(4, "clashes with CompareSpec.steps")


@dataclass(frozen=True)
class _OtherParse(TaskOptions):
    seq_len: float = option(4.0, "chars and recall parse seq_len as an int")


class _Abstract(Task):
    name = "abstract"
    Options = _Opts
    metric_names = ("acc",)
    higher_is_better = (True,)
    eval_loss_name = "acc"

    def load_data(self) -> Any:
        return None


@pytest.mark.parametrize(
    ("entry", "error", "message"),
    [
        (object, TypeError, "expected a subclass of heatformer.lab.tasks.base.Task"),
        (_variant(name=""), ValueError, "expected a name such as 'parity', got ''"),
        (_variant(name="two words"), ValueError, "expected a name such as 'parity'"),
        (_Abstract, ValueError, "expected the methods ['analysis_batch', 'build_model', "
                                "'eval_batches', 'metrics', 'model_config', 'train_batch']"),
        (_variant(Options=TaskOptions), TypeError, "expected Options, a frozen TaskOptions"),
        (_variant(Options=dict), TypeError, "expected Options, a frozen TaskOptions"),
        (_variant(Options=_NoDefault), ValueError, "expected a default for option 'size'"),
        (_variant(Options=_NoHelp), ValueError, "option 'size' made with option(default, help)"),
        (_variant(Options=_Clash), ValueError, "option 'steps' clashes with the spec field"),
        (_variant(Options=_OtherParse), ValueError, "one flag serves both"),
        (_variant(metric_names=()), ValueError, "expected metric_names, a tuple of names"),
        (_variant(higher_is_better=()), ValueError, "one higher_is_better flag per metric"),
        (_variant(eval_loss_name="loss"), ValueError, "expected eval_loss_name to be one of"),
        (_variant(name="chars"), ValueError, "'chars' is already registered (Chars)"),
    ],
)  # fmt: skip
def test_registering_an_incomplete_task_fails_at_once(
    entry: Any, error: type[Exception], message: str, registry: Registry[type[Task]]
) -> None:
    with pytest.raises(error, match=re.escape(message)) as info:
        register_task(entry)
    assert info.value.argument == "task"  # type: ignore[attr-defined]
    assert set(registry) == set(TASK_NAMES)  # nothing half-registered


def test_a_complete_task_registers_and_a_spec_takes_it(registry: Registry[type[Task]]) -> None:
    assert register_task(_Complete) is _Complete
    assert register_task(_Complete) is _Complete  # the same class again: nothing changes
    spec = CompareSpec(task="tiny", options={"size": 7})
    assert spec.options == _Opts(size=7) and spec.fingerprint()["options"] == {"size": 7}
    with pytest.raises(ValueError, match="size: only the 'tiny' task uses it, got task 'chars'"):
        CompareSpec(task="chars", options={"size": 7})
    with pytest.raises(ValueError, match=r"options: expected options of task 'tiny' \['size'\]"):
        CompareSpec(task="tiny", options={"sise": 7})
    register_task(_variant(metric_names=("acc", "loss"), higher_is_better=(True, False)),
                  replace=True)  # fmt: skip
    assert TASKS["tiny"].metric_names == ("acc", "loss")


def test_an_entry_cannot_be_put_into_tasks_by_hand(registry: Registry[type[Task]]) -> None:
    """Only register_task adds a task (it checks it); an assignment would skip the checks."""
    with pytest.raises(TypeError, match=r"register\(cls\)"):
        registry["broken"] = _variant(name="broken", eval_loss_name="nope")
    assert "broken" not in registry


def test_recall_options_reach_its_data() -> None:
    """``--num-pairs/--num-keys/--num-values`` size the recall sequences (and the classes)."""
    from heatformer.lab.spec import CompareSpec
    from heatformer.lab.tasks.recall import Recall

    spec = CompareSpec(
        task="recall", steps=1, options={"seq_len": 16, "num_pairs": 1, "num_keys": 1,
                                         "num_values": 5, "eval_size": 4},
    )  # fmt: skip
    task = Recall(spec)
    assert (task.data.num_pairs, task.data.num_keys, task.data.num_values) == (1, 1, 5)
    assert task.data.vocab_size == 1 + 5 + task.data.num_filler
    x, y = task.train_batch(64, torch.Generator().manual_seed(0))
    assert x.shape == (64, 16) and bool((x[:, 0] == 0).all())  # the one key, first
    assert bool((x[:, 1] == y).all())  # its value (ids 1..5) is the target
    assert set(y.tolist()) == {1, 2, 3, 4, 5}


@pytest.mark.parametrize("recipe", sorted(VIT_RECIPES))
def test_the_digits_recipe_sets_those_vit_fields_and_the_model_builds(recipe: str) -> None:
    from heatformer.models import ViTConfig

    spec = CompareSpec(task="digits", heads=("attention:2",), n_layer=1, n_embd=16,
                       options={"recipe": recipe, "drop_path": 0.1})  # fmt: skip
    task = resolve_task("digits")(spec)
    config = task.model_config("attention:2")
    defaults = ViTConfig()
    for name in ("qk_norm", "layer_scale_init", "norm_eps", "qk_norm_eps", "pos_embed_cls"):
        expected = VIT_RECIPES[recipe].get(name, getattr(defaults, name))
        assert getattr(config, name) == expected
    assert config.drop_path == 0.1
    images, _ = task.train_batch(4, torch.Generator().manual_seed(0))
    assert task.build_model("attention:2")(images).shape == (4, 10)
    if recipe == "deit3":  # the paper's DeiT-3 settings
        assert config.qk_norm and config.layer_scale_init == 1e-6 and config.norm_eps == 1e-6
        assert not config.pos_embed_cls


@pytest.mark.parametrize(
    ("options", "argument"), [({"recipe": "deit"}, "recipe"), ({"drop_path": 1.0}, "drop_path")]
)
def test_a_bad_digits_recipe_names_its_option(options: dict, argument: str) -> None:
    with pytest.raises(ValueError, match=argument) as info:
        CompareSpec(task="digits", options=options)
    assert getattr(info.value, "argument", None) == argument


def test_layer_values_hold_nc2_and_the_decay_rate_of_the_analysis_functions() -> None:
    from heatformer.analysis import neural_collapse, spectral_decay

    task = resolve_task("digits")(CompareSpec(task="digits", heads=("attention:2",), n_embd=16))
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(12, 5, 16, generator=generator)  # (B, N, D)
    labels = torch.arange(12) % 3
    values = task.layer_values(x, labels)
    assert values["nc2"] == pytest.approx(float(neural_collapse(x.mean(1), labels).etf_distance))
    rates = spectral_decay(x).decay_rate
    assert values["decay_rate"] == pytest.approx(float(rates.mean()))
    collapsed = x[:, :1].expand(12, 5, 16)  # every token of a sequence equal: no spectrum
    values = task.layer_values(collapsed, labels)
    assert values["within_seq_frac"] == pytest.approx(0.0, abs=1e-12)
    assert math.isnan(values["decay_rate"])
    assert "nc2" in task.analysis_names and "nc2" not in Chars.analysis_names


@pytest.mark.parametrize("name", ["chars", "masked", "recall"])
def test_evaluation_and_analysis_in_slices_equal_whole_batches(name: str) -> None:
    # long sequences run in slices of sequences_per_pass examples (memory near a training
    # step's); every metric is a sum over examples, so the slicing changes no number
    if name == "chars":
        spec = CompareSpec(task="chars", heads=("attention:2,laplacian:2",), n_layer=2, n_embd=16,
                           batch_size=2, options={"seq_len": 12, "eval_size": 10,
                                                  "analysis_size": 7})  # fmt: skip
        task = resolve_task("chars")(spec, _chars_data())
    elif name == "masked":
        spec = CompareSpec(task="masked", heads=("attention:2,center:2",), n_layer=2, n_embd=16,
                           batch_size=2, options={"seq_len": 12, "eval_size": 10,
                                                  "analysis_size": 7})  # fmt: skip
        task = resolve_task("masked")(spec, _chars_data())
    else:
        spec = CompareSpec(task="recall", heads=("attention:2,heat:2",), n_layer=2, n_embd=16,
                           batch_size=2, options={"seq_len": 40, "eval_size": 10,
                                                  "analysis_size": 7})  # fmt: skip
        task = resolve_task("recall")(spec)
    assert task.sequences_per_pass == max(2, 8192 // task.model_config(spec.heads[0]).max_tokens())
    torch.manual_seed(0)
    model = task.build_model(spec.heads[0])
    whole_eval = task.evaluate(model, torch.device("cpu"))
    whole = task.layer_metrics(model, torch.device("cpu"))
    task.sequences_per_pass = 3  # 7 analysis sequences: slices of 3, 3 and 1
    sliced_eval = task.evaluate(model, torch.device("cpu"))
    sliced = task.layer_metrics(model, torch.device("cpu"))
    assert sliced_eval == pytest.approx(whole_eval, rel=1e-6)
    assert sliced.keys() == whole.keys() and len(whole["within_seq_frac"]) == 2
    for metric, values in whole.items():
        assert sliced[metric] == pytest.approx(values, rel=1e-6, nan_ok=True), metric


def test_layer_values_total_variance_merges_slices_exactly() -> None:
    # the pairwise update of (count, mean, squared deviations) against the one-pass formula
    task = resolve_task("digits")(CompareSpec(task="digits", heads=("attention:2",), n_embd=16))
    x = torch.randn(9, 5, 16, generator=torch.Generator().manual_seed(1)) * 3 + 2  # (B, N, D)
    labels = torch.arange(9) % 3
    from heatformer.lab.tasks._layer_stats import LayerStats

    merged = LayerStats()
    for part in (slice(0, 4), slice(4, 5), slice(5, 9)):
        merged.add(task, x[part], labels[part])
    flat = x.reshape(-1, 16).double()
    total = float(((flat - flat.mean(0)) ** 2).sum(-1).mean())
    assert merged.m2 / merged.count == pytest.approx(total, rel=1e-12)
    assert merged.values(task) == pytest.approx(task.layer_values(x, labels), rel=1e-9)


def test_layer_stats_keep_no_view_of_a_slice() -> None:
    # recall pools the last position, x[:, -1]: a view that would keep every slice's token
    # states alive over the analysis (measured: 1.7 GB at N = 4096, 256 sequences)
    from heatformer.lab.tasks._layer_stats import LayerStats

    task = resolve_task("recall")(CompareSpec(task="recall", heads=("attention:2",), n_embd=16,
                                              options={"seq_len": 40}))  # fmt: skip
    stats = LayerStats()
    for _ in range(3):
        stats.add(task, torch.randn(2, 40, 16), torch.arange(2))
    assert all(g.untyped_storage().nbytes() == g.nbytes for g in stats.grouped)
    assert sum(g.nbytes for g in stats.grouped) == 3 * 2 * 16 * 4
