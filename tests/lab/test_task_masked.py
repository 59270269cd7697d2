"""The ``masked`` task: masked-byte modelling on the ``chars`` corpus with a bidirectional GPT."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from heatformer.lab.compare import run_compare
from heatformer.lab.report import aggregate, format_table, write_csv
from heatformer.lab.report.endpoints import endpoint_values
from heatformer.lab.spec import CompareSpec
from heatformer.lab.tasks import (
    TASKS,
    CharsTask,
    MaskedChars,
    MaskedCharsOptions,
    load_chars,
    options_by_name,
    resolve_task,
)
from heatformer.lab.tasks._python_tokens import byte_categories
from heatformer.lab.tasks._segmentation import segmentation_score
from heatformer.lab.tasks.masked import MASK_ID, mask_bytes
from heatformer.models import GPT, GPTConfig


@pytest.fixture(scope="module")
def data(corpus: Path) -> CharsTask:
    """The first 6000 bytes of the tests' corpus: pseudo-sentences over a few words."""
    return load_chars(corpus, max_bytes=6000)


def _task(data: CharsTask, **options: object) -> MaskedChars:
    values = {"seq_len": 20, "eval_size": 10, "analysis_size": 6, **options}
    spec = CompareSpec(task="masked", heads=("attention:1,laplacian:1",), n_layer=2, n_embd=16,
                       options=values)  # fmt: skip
    return MaskedChars(spec, data)


def test_registry_entry_options_and_model(data: CharsTask) -> None:
    assert TASKS["masked"] is MaskedChars and resolve_task("masked") is MaskedChars
    assert MaskedChars.metric_names == ("val_bpc", "val_acc", "val_loss")
    assert MaskedChars.higher_is_better == (False, True, False)
    assert MaskedChars.analysis_names == (
        "within_seq_var", "between_seq_var", "within_seq_frac", "effective_rank", "decay_rate",
        "nc1", "probe_acc", "seg_score",
    )  # fmt: skip
    assert MaskedCharsOptions() == MaskedCharsOptions(128, None, 2_000_000, 128, 32, 0.15)
    assert list(options_by_name()["mask_rate"]) == ["masked"]
    from heatformer.lab.cli import _build_parsers

    help_text = " ".join(_build_parsers()[1]["compare"].format_help().split())
    assert "--mask-rate X masked: share of each sequence's bytes hidden and predicted " in (
        help_text
    )
    config = _task(data).model_config("attention:2")
    assert (config.vocab_size, config.block_size, config.causal) == (257, 20, False)
    for rate in (0.0, 1.5, True, "0.1"):
        with pytest.raises(ValueError, match="mask_rate: expected a share in"):
            MaskedCharsOptions(mask_rate=rate)  # type: ignore[arg-type]


def test_batches_are_deterministic_per_seed_and_hide_the_window_bytes(data: CharsTask) -> None:
    task = _task(data)
    x, y = task.train_batch(8, torch.Generator().manual_seed(3))
    x2, y2 = task.train_batch(8, torch.Generator().manual_seed(3))
    assert torch.equal(x, x2) and torch.equal(y, y2)
    x3, _ = task.train_batch(8, torch.Generator().manual_seed(4))
    assert not torch.equal(x, x3)
    hidden = x == MASK_ID
    assert torch.equal(hidden, y != -100)  # a target exactly where a byte is hidden
    original = torch.where(hidden, y, x)  # the window before masking
    stream = bytes(task.data.train.tolist())
    assert all(bytes(row) in stream for row in original.tolist())
    # evaluation and analysis: fixed sets with a fixed mask
    first = [torch.cat(parts) for parts in zip(*task.eval_batches(), strict=True)]
    again = [torch.cat(parts) for parts in zip(*task.eval_batches(), strict=True)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert first[0].shape == (10, 20)
    inputs, labels = task.analysis_batch()
    assert inputs.shape == (6, 20) and labels.shape == (6, 20, 2)
    assert torch.equal(inputs == MASK_ID, labels[..., 0] != -100)


@pytest.mark.parametrize(("rate", "count"), [(0.15, 3), (0.01, 1), (0.5, 10), (1.0, 20)])
def test_each_sequence_hides_round_rate_times_n_bytes(rate: float, count: int) -> None:
    x = torch.randint(0, 256, (4000, 20), generator=torch.Generator().manual_seed(0))
    inputs, targets = mask_bytes(x, rate, torch.Generator().manual_seed(1))
    hidden = inputs == MASK_ID
    assert hidden.sum(1).tolist() == [count] * 4000
    assert torch.equal(inputs[~hidden], x[~hidden]) and torch.equal(targets[hidden], x[hidden])
    # every position equally likely: frequency count / N, binomial SD sqrt(p (1 - p) / 4000)
    p = count / 20
    sd = math.sqrt(p * (1 - p) / 4000)
    assert (hidden.double().mean(0) - p).abs().max() <= 5 * sd + 1e-12


def test_the_loss_and_evaluation_count_only_the_hidden_bytes(data: CharsTask) -> None:
    task = _task(data)
    x, y = task.train_batch(5, torch.Generator().manual_seed(0))
    logits = torch.randn(5, 20, 257, generator=torch.Generator().manual_seed(1))
    by_hand, count = 0.0, 0
    for b in range(5):
        for i in range(20):
            if x[b, i] == MASK_ID:
                row = logits[b, i].double()
                by_hand -= float(row[y[b, i]] - torch.logsumexp(row, 0))
                count += 1
    assert count == 5 * 3
    assert float(task.loss(logits, y)) == pytest.approx(by_hand / count, rel=1e-5)
    changed = torch.where((x == MASK_ID)[..., None], logits, logits + 100 * torch.randn(257))
    assert float(task.loss(changed, y)) == pytest.approx(by_hand / count, rel=1e-5)
    # evaluation: the same sums over the fixed set, bpc = nats / ln 2
    torch.manual_seed(0)
    model = task.build_model("attention:2")
    metrics = task.evaluate(model, torch.device("cpu"))
    nats, correct, scored = 0.0, 0, 0
    with torch.no_grad():
        for inputs, targets in task.eval_batches():
            out = model(inputs).double()
            keep = targets != -100
            picked = out[keep]  # (M, 257)
            nats -= float((picked.log_softmax(-1).gather(1, targets[keep][:, None])).sum())
            correct += int((picked.argmax(-1) == targets[keep]).sum())
            scored += int(keep.sum())
    assert scored == 10 * 3
    assert metrics["val_loss"] == pytest.approx(nats / scored, rel=1e-5)
    assert metrics["val_bpc"] == pytest.approx(nats / scored / math.log(2), rel=1e-5)
    assert metrics["val_acc"] == correct / scored


def test_the_encoder_is_bidirectional(data: CharsTask) -> None:
    task = _task(data)
    torch.manual_seed(0)
    model = task.build_model("attention:1,laplacian:1")
    assert isinstance(model, GPT) and all(not block.attn.causal for block in model.blocks)
    x, _ = task.train_batch(2, torch.Generator().manual_seed(0))
    changed = x.clone()
    changed[:, -1] = (x[:, -1] + 1) % 256
    with torch.no_grad():
        logits, graphs = model(x, return_graphs=True)
        later = model(changed)
    assert (logits[:, 0] - later[:, 0]).abs().max() > 1e-4  # the first token sees the last
    dense = graphs[0].to_dense()  # (B, H, N, N)
    later_keys = torch.ones(20, 20, dtype=torch.bool).triu(1)  # (N, N) key after the query
    assert bool((dense[..., later_keys] > 0).all())  # every edge to a later token is there
    with pytest.raises(ValueError, match="config: expected a causal GPT to generate"):
        model.generate(x[:, :3], 1)
    with pytest.raises(TypeError, match="causal: expected a bool"):
        GPTConfig(causal=1)  # type: ignore[arg-type]


def test_analysis_groups_the_hidden_positions_by_their_byte(data: CharsTask) -> None:
    task = _task(data, analysis_size=8)
    torch.manual_seed(0)
    model = task.build_model("attention:1,laplacian:1")
    values = task.layer_metrics(model, torch.device("cpu"))
    assert list(values) == list(MaskedChars.analysis_names)
    assert "probe_acc" in values and len(values["nc1"]) == 2
    assert all(math.isfinite(v) for v in values["within_seq_frac"] + values["probe_acc"])
    train = dataclasses.replace(task.spec, analysis_split="train")
    inputs, labels = MaskedChars(train, task.data).analysis_inputs()
    assert inputs.shape == (8, 20) and torch.equal(inputs == MASK_ID, labels[..., 0] != -100)
    # the training batch train_batch draws from a generator seeded with 0
    drawn = task.train_batch(8, torch.Generator().manual_seed(0))
    assert torch.equal(inputs, drawn[0]) and torch.equal(labels[..., 0], drawn[1])


@pytest.fixture(scope="module")
def source() -> CharsTask:
    """Python source: the standard library's ``textwrap.py`` (20 KB), its last tenth the
    validation split."""
    import textwrap

    return load_chars(textwrap.__file__)


@pytest.mark.parametrize("split", ["test", "train"])
def test_seg_score_separates_the_python_token_categories_of_each_window(
    source: CharsTask, split: str
) -> None:
    task = _task(source, analysis_size=8)
    task = MaskedChars(dataclasses.replace(task.spec, analysis_split=split), source)
    inputs, labels = task.analysis_inputs()
    # the categories of the stream tokenized once, at the windows' places
    stream = source.val if split == "test" else source.train
    if split == "test":
        starts = source.eval_starts(20, 8)
    else:
        starts = source.random_starts("train", 8, 20, torch.Generator().manual_seed(0))
    windows = starts[:, None] + torch.arange(20)  # (8, 20)
    original = torch.where(inputs == MASK_ID, labels[..., 0], inputs)
    assert torch.equal(original, stream[windows].long())  # the windows' bytes
    categories = byte_categories(bytes(stream.tolist()))
    assert torch.equal(labels[..., 1], categories[windows].long())
    assert set(labels[..., 1].unique().tolist()) >= {0, 2, 3}  # layout, identifier, operator
    # seg_score per layer: the score of each layer's states by those categories
    torch.manual_seed(0)
    model = task.build_model("attention:1,laplacian:1")
    values = task.layer_metrics(model, torch.device("cpu"))
    states = task.analysis_states(model, inputs, torch.device("cpu"))
    expected = [segmentation_score(x.float(), labels[..., 1]) for x in states]
    assert values["seg_score"] == pytest.approx(expected, rel=1e-9)
    assert all(-1 <= v <= 1 for v in values["seg_score"]) and len(expected) == 2
    assert task.categories("val" if split == "test" else "train") is task.categories(
        "val" if split == "test" else "train"
    )  # tokenized once per task


def test_a_short_run_learns(data: CharsTask, tmp_path: Path) -> None:
    spec = CompareSpec(
        task="masked", heads=("attention:2", "attention:1,laplacian:1"), seeds=(0,), steps=60,
        batch_size=16, lr=1e-2, n_layer=1, n_embd=32, eval_every=30, device="cpu",
        options={"seq_len": 24, "eval_size": 16, "analysis_size": 8, "mask_rate": 0.25},
        primary=("val_bpc", "seg_score@last"),
    )  # fmt: skip
    report = run_compare(spec, tmp_path / "out", data=data)
    _check_seg_score(report.results, tmp_path)
    for record in report.results["runs"]:
        losses = record["train_loss"]
        assert losses[0] == pytest.approx(math.log(257), rel=0.05)  # a near-uniform guess
        assert sum(losses[-10:]) / 10 < 0.6 * math.log(257)
        # ~25 distinct bytes in the corpus: a short run learns their frequencies (learning
        # from the context, the unmasked neighbours, takes longer: docs/reproducing.md)
        assert record["final"]["val_bpc"] < 0.6 * math.log2(257)
        assert all(math.isfinite(v) for v in record["analysis"]["probe_acc"])


def _check_seg_score(results: dict[str, Any], tmp_path: Path) -> None:
    """``seg_score`` per layer in each run record, the summary and the declared endpoint
    ``seg_score@last``; a record from before it (no ``seg_score``) still loads: its
    configuration has no value (``-`` in the table, an empty CSV cell, no endpoint)."""
    runs = results["runs"]
    assert all(len(r["analysis"]["seg_score"]) == 1 for r in runs)
    assert all(math.isfinite(r["analysis"]["seg_score"][0]) for r in runs)  # words: categories
    assert results["analysis_metrics"][-1] == "seg_score"
    row = results["summary"][1]
    assert row["analysis"]["seg_score"]["mean"] == [runs[1]["analysis"]["seg_score"][0]]
    endpoint = results["primary"][1]
    assert endpoint["endpoint"] == "seg_score@last" and list(endpoint["comparisons"]) == [
        "attention:1,laplacian:1"
    ]
    assert "seg_score@L0" in (tmp_path / "out" / "results.csv").read_text().splitlines()[0]
    old = [dict(runs[0]), dict(runs[1], analysis={**runs[1]["analysis"]})]
    del old[1]["analysis"]["seg_score"]  # a run recorded before seg_score
    names = results["analysis_metrics"]
    summary = aggregate(old, [r["heads"] for r in old], results["metrics"], names)
    assert "seg_score" in summary[0]["analysis"] and "seg_score" not in summary[1]["analysis"]
    assert endpoint_values(summary[1], "seg_score@last") is None
    table = format_table(summary, results["metrics"], names).splitlines()
    assert table[0].split()[-1] == "seg_score@L0" and table[-1].split()[-1] == "-"
    write_csv(tmp_path / "old.csv", old, results["metrics"], names)
    assert (tmp_path / "old.csv").read_text().splitlines()[-1].split(",")[-2] == ""
