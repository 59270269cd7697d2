"""The ``masked`` task: masked-byte modelling on the ``chars`` corpus with a bidirectional GPT."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from heatformer.lab.compare import run_compare
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
    assert inputs.shape == labels.shape == (6, 20)
    assert torch.equal(inputs == MASK_ID, labels != -100)


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
    assert inputs.shape == (8, 20) and torch.equal(inputs == MASK_ID, labels != -100)


def test_a_short_run_learns(data: CharsTask, tmp_path: Path) -> None:
    spec = CompareSpec(
        task="masked", heads=("attention:2", "attention:1,laplacian:1"), seeds=(0,), steps=60,
        batch_size=16, lr=1e-2, n_layer=1, n_embd=32, eval_every=30, device="cpu",
        options={"seq_len": 24, "eval_size": 16, "analysis_size": 8, "mask_rate": 0.25},
    )  # fmt: skip
    report = run_compare(spec, tmp_path / "out", data=data)
    for record in report.results["runs"]:
        losses = record["train_loss"]
        assert losses[0] == pytest.approx(math.log(257), rel=0.05)  # a near-uniform guess
        assert sum(losses[-10:]) / 10 < 0.6 * math.log(257)
        # ~25 distinct bytes in the corpus: a short run learns their frequencies (learning
        # from the context, the unmasked neighbours, takes longer: docs/reproducing.md)
        assert record["final"]["val_bpc"] < 0.6 * math.log2(257)
        assert all(math.isfinite(v) for v in record["analysis"]["probe_acc"])
