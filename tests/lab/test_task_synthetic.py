"""The synthetic benchmark tasks (``mqar``, ``induction``, ``selective_copy``, ``parity``,
``listops``, ``passkey``): registered, trained end to end by ``heatformer train``, their batches
the generators' for a seed drawn from the run's generator, their metrics checked against a
model that knows the answers, and :func:`induction_score` on an exact induction solver."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from heatformer.checks import ArgumentError
from heatformer.lab.cli import main
from heatformer.lab.spec import CompareSpec
from heatformer.lab.tasks import TASKS, check_task, induction_score, resolve_task
from heatformer.lab.tasks._synthetic import ANALYSIS_SEED, EVAL_SEED, draw_seed
from heatformer.lab.tasks.passkey import cell_name

#: each task with options small enough for a few CPU steps
TINY: dict[str, dict[str, Any]] = {
    "mqar": {"seq_len": 16, "vocab_size": 32, "num_kv_pairs": 2},
    "induction": {"seq_len": 12, "vocab_size": 8},
    "selective_copy": {"seq_len": 12, "vocab_size": 8, "num_tokens_to_copy": 3},
    "parity": {"seq_len": 8},
    "listops": {"seq_len": 16, "min_length": 8},
    "passkey": {"seq_len": 16, "num_digits": 2, "eval_lengths": (16, 24), "eval_depths": (0.0, 1.0),
                "grid_size": 2},
}  # fmt: skip


def _bound(name: str, **spec: Any) -> Any:
    options = {**TINY[name], "eval_size": 6, "analysis_size": 4}
    values = {"heads": ("attention:2",), "n_layer": 1, "n_embd": 16, **spec}
    return resolve_task(name)(CompareSpec(task=name, options=options, **values))


def _flags(options: dict[str, Any]) -> list[str]:
    flags = []
    for key, value in options.items():
        text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
        flags += ["--" + key.replace("_", "-"), text]
    return flags


class Oracle(nn.Module):
    """Logits that put all their mass on the label of every scored position of the examples it
    was given (and on token 0 elsewhere): the model that knows the answers."""

    def __init__(self, sets: list[tuple[Tensor, Tensor]], vocab_size: int) -> None:
        super().__init__()
        self.sets = sets
        self.vocab_size = vocab_size

    def forward(self, x: Tensor, logits_at: Tensor | None = None) -> Tensor:
        out = self.logits(x)  # (B, N, V)
        if logits_at is None:
            return out
        return out.gather(1, logits_at[..., None].expand(-1, -1, self.vocab_size))  # GPT's

    def logits(self, x: Tensor) -> Tensor:
        out = torch.zeros(*x.shape, self.vocab_size)  # (B, N, V)
        for inputs, labels in self.sets:
            if inputs.shape[1] != x.shape[1]:
                continue
            same = (x[:, None, :] == inputs[None]).all(-1)  # (B, E)
            found, index = same.any(1), same.float().argmax(1)  # (B,)
            target = labels[index].clamp(min=0)  # (B, N)
            out[found] = 30.0 * nn.functional.one_hot(target[found], self.vocab_size).float()
        return out


def test_the_tasks_are_registered_and_checked() -> None:
    for name in TINY:
        cls = TASKS[name]
        assert check_task(cls) is cls and cls.name == name
        assert cls.metric_names[0] == "val_acc" and cls.eval_loss_name == "val_loss"
        assert "probe_acc" in cls.analysis_names and "nc2" not in cls.analysis_names
    assert TASKS["passkey"].metric_names == ("val_acc", "grid_acc", "val_loss")


def _combinations() -> list[Any]:
    """Each task with an operator and a graph kind of the registries, in turn, until every
    task, every operator that reads only the past (its first example) and every graph kind that
    is causal (each example) has run once: the tasks' row of the combination matrix."""
    from heatformer._spec import format_entry
    from heatformer.graph_ops import GRAPHS, OPERATORS, resolve_graph, resolve_operator
    from heatformer.models.heads import format_operator

    operators = [
        format_operator(name, cls.examples[0])
        for name, cls in OPERATORS.items()
        if not resolve_operator(name, **cls.examples[0]).reads_transpose
    ]
    kinds = [
        format_entry(name, params, sep=",")
        for name, cls in GRAPHS.items()
        for params in cls.examples
        if resolve_graph(format_entry(name, params, sep=",")).supports_causal
    ]
    tasks = sorted(TINY)
    count = max(len(tasks), len(operators), len(kinds))
    cases = [
        (tasks[i % len(tasks)], operators[i % len(operators)], kinds[i % len(kinds)])
        for i in range(count)
    ]
    return [pytest.param(*case, id="-".join(case)) for case in cases]


@pytest.mark.parametrize(("name", "operator", "graph"), _combinations())
def test_train_two_steps_through_the_command(
    name: str, operator: str, graph: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    code = main([
        "train", "--task", name, *_flags(TINY[name]), "--steps", "2", "--batch-size", "4",
        "--layers", "1", "--embd", "16", "--heads", f"attention:1,{operator}:1", "--graph", graph,
        "--eval-every", "2", "--eval-size", "4", "--analysis-size", "4", "--device", "cpu",
        "--threads", "1", "--no-progress", "--out", str(out),
    ])  # fmt: skip
    assert code == 0
    (record,) = json.loads((out / "results.json").read_text())["runs"]
    final = record["final"]
    assert record["model_config"]["graph"] == graph
    assert len(record["train_loss"]) == 2 and all(map(math.isfinite, record["train_loss"]))
    assert 0 <= final["val_acc"] <= 1 and math.isfinite(final["val_loss"])
    assert len(record["analysis"]["probe_acc"]) == 1
    if name == "passkey":
        cells = [cell_name(n, d) for n in (16, 24) for d in (0.0, 1.0)]
        assert cells == ["acc_L16_d0", "acc_L16_d1", "acc_L24_d0", "acc_L24_d1"]
        assert final["grid_acc"] == pytest.approx(sum(final[c] for c in cells) / 4)
        assert record["model_config"]["block_size"] == 24  # the longest length of the grid


@pytest.mark.parametrize("name", sorted(TINY))
def test_batches_are_the_generators_drawn_from_the_run_generator(name: str) -> None:
    task = _bound(name)
    generator = torch.Generator().manual_seed(3)
    state = generator.get_state()
    x, y = task.train_batch(5, generator)
    again = torch.Generator()
    again.set_state(state)
    assert all(map(torch.equal, (x, y), task.train_batch(5, again)))  # the state decides
    again.set_state(state)
    expected = task.options.generate(5, draw_seed(again))
    assert torch.equal(x, expected[0]) and torch.equal(y, expected[1])
    assert not torch.equal(task.train_batch(5, generator)[0], x)  # the stream moves on
    inputs, labels = task.data  # the fixed evaluation set, from its own seed
    assert all(map(torch.equal, (inputs, labels), task.options.generate(6, EVAL_SEED)))
    assert torch.equal(torch.cat([b for b, _ in task.eval_batches()]), inputs)
    analysis = task.analysis_batch()
    assert torch.equal(analysis[0], task.options.generate(4, ANALYSIS_SEED)[0])
    assert (labels != -100).any(1).all() and x.dtype == torch.int64
    config = task.model_config("attention:2")
    assert config.causal and config.vocab_size == task.options.num_tokens()


@pytest.mark.parametrize("name", sorted(TINY))
def test_val_acc_is_one_for_the_oracle_and_the_argmax_share_for_a_constant(name: str) -> None:
    task = _bound(name)
    vocab = task.options.num_tokens()
    sets = [task.data]
    if name == "passkey":
        sets += [task.options.cell(n, d, EVAL_SEED + 1 + i) for i, (n, d) in enumerate(task.grid())]
    oracle = task.evaluate(Oracle(sets, vocab), torch.device("cpu"))
    assert oracle["val_acc"] == 1.0 and oracle["val_loss"] < 1e-9
    constant = task.evaluate(Oracle([], vocab), torch.device("cpu"))  # zero logits: argmax 0
    labels = task.data[1][task.data[1] != -100]
    assert constant["val_acc"] == pytest.approx(float((labels == 0).double().mean()))
    assert constant["val_loss"] == pytest.approx(math.log(vocab), rel=1e-6)  # uniform
    if name == "passkey":
        assert oracle["grid_acc"] == 1.0 and oracle[cell_name(24, 1.0)] == 1.0
        assert set(oracle) == {
            "val_acc",
            "val_loss",
            "grid_acc",
            *map(cell_name, *zip(*task.grid())),
        }


def test_passkey_grid_selects_on_the_validation_half_and_sizes_its_passes() -> None:
    task = _bound("passkey", select_by="val_acc", tune=("lr=1e-3,2e-3",))
    metrics = task.evaluate(Oracle([], 28), torch.device("cpu"))
    assert metrics["validation/grid_acc"] == pytest.approx(
        sum(metrics["validation/" + cell_name(n, d)] for n, d in task.grid()) / 4
    )
    assert max(len(x) for x, _ in task._cell_batches(0, 8192, 0.5)) == 1  # one sequence a pass


def test_option_errors_name_the_option() -> None:
    cases = [
        ("mqar", {"seq_len": 15}, "seq_len", "input_seq_len"),  # odd: the generator's message
        ("mqar", {"seq_len": 16, "vocab_size": 16}, "vocab_size", ""),
        ("listops", {"seq_len": 16, "min_length": 32}, "min_length", ""),
        ("passkey", {"eval_depths": (0.5, 1.5)}, "eval_depths", ""),
        ("passkey", {"eval_lengths": (256, 8)}, "eval_lengths", ""),
        ("passkey", {"eval_lengths": ()}, "eval_lengths", ""),
        ("induction", {"eval_size": 0}, "eval_size", ""),
    ]
    for name, options, argument, words in cases:
        with pytest.raises(ArgumentError) as err:
            CompareSpec(task=name, options=options)
        assert err.value.argument == argument and words in str(err.value), (name, options)
    spec = CompareSpec(task="passkey", options={"eval_lengths": [64, 128]})  # spec.json's list
    assert spec.options.eval_lengths == (64, 128)
    assert CompareSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_passkey_resumes_to_the_same_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = [
        "--task", "passkey", *_flags(TINY["passkey"]), "--steps", "4", "--batch-size", "4",
        "--layers", "1", "--embd", "16", "--heads", "attention:2", "--eval-every", "2",
        "--eval-size", "4", "--analysis-size", "4", "--device", "cpu", "--threads", "1",
        "--no-progress", "--no-analysis",
    ]  # fmt: skip
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert main(["train", *common, "--out", str(whole)]) == 0
    assert main(["train", *common, "--out", str(parts), "--stop-at-step", "2"]) == 0
    assert main(["train", "--resume", str(parts), "--no-progress"]) == 0
    capsys.readouterr()
    (a,) = json.loads((whole / "results.json").read_text())["runs"]
    (b,) = json.loads((parts / "results.json").read_text())["runs"]
    assert a["train_loss"] == b["train_loss"] and a["evals"] == b["evals"]


class _InductionSolver(nn.Module):
    """The exact induction head: at each position, the token that followed the previous
    occurrence of the current token (token 0 when there is none)."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.weight = nn.Parameter(torch.zeros(()))  # a parameter: the device is read from it

    def forward(self, x: Tensor) -> Tensor:
        n = x.shape[1]
        same = x[:, :, None] == x[:, None, :]  # (B, N, N): x[i] == x[j]
        earlier = torch.ones(n, n, dtype=torch.bool).tril(-1)  # j < i
        hits = same & earlier
        last = torch.where(hits, torch.arange(n), -1).amax(-1)  # (B, N) previous occurrence
        after = x.gather(1, (last + 1).clamp(max=n - 1))  # (B, N)
        guess = torch.where(last >= 0, after, 0)
        return nn.functional.one_hot(guess, self.vocab_size).float()


def test_induction_score_of_the_exact_solver_is_one_and_of_a_constant_its_share() -> None:
    solver = _InductionSolver(16).train()
    assert induction_score(solver, seq_len=64, num_examples=20, batch_size=7) == 1.0
    assert solver.training  # its mode is restored
    constant = Oracle([], 16)
    from heatformer.datasets import induction

    labels = induction(16, 20, 64, 0)[1]
    share = float((labels[labels != -100] == 0).double().mean())
    assert induction_score(constant, seq_len=64, num_examples=20) == pytest.approx(share)
    with pytest.raises(ValueError, match="model: expected logits over at least vocab_size=16"):
        induction_score(Oracle([], 8), seq_len=64, num_examples=2)
    with pytest.raises(ValueError, match="seq_len"):
        induction_score(solver, seq_len=3)


def test_the_train_step_on_scored_logits_is_the_full_one() -> None:
    """The synthetic tasks train and score the GPT's logits at the scored positions only:
    the loss, the gradients and the evaluation are those of every position's logits (the
    base class's :meth:`Task.scored_logits`)."""
    from heatformer.lab.step import backward_pass
    from heatformer.lab.tasks.base import Task

    class EveryPosition(type(_bound("mqar"))):  # type: ignore[misc]
        scored_logits = Task.scored_logits

    runs = []
    for task in (_bound("mqar"), EveryPosition(_bound("mqar").spec)):
        inputs, targets = task.train_batch(6, torch.Generator().manual_seed(0))
        torch.manual_seed(0)
        model = task.build_model("attention:2").double()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        loss = backward_pass(task, model, optimizer, inputs, targets)
        metrics = task.evaluate(model, torch.device("cpu"))
        runs.append((loss, {n: p.grad for n, p in model.named_parameters()}, metrics))
    (loss_a, grads_a, metrics_a), (loss_b, grads_b, metrics_b) = runs
    torch.testing.assert_close(loss_a, loss_b, atol=1e-12, rtol=1e-12)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grad, grads_b[name], atol=1e-12, rtol=1e-12)
    assert metrics_a["val_acc"] == metrics_b["val_acc"]
    assert metrics_a["val_loss"] == pytest.approx(metrics_b["val_loss"], rel=1e-9)


def test_tie_embeddings_option_reaches_the_model() -> None:
    spec = CompareSpec(
        task="mqar", heads=("attention:2",), n_layer=1, n_embd=16,
        options={**TINY["mqar"], "tie_embeddings": True},
    )  # fmt: skip
    tied = resolve_task("mqar")(spec).build_model("attention:2")
    assert tied.head.weight is tied.tok_emb.weight
    untied = _bound("mqar").build_model("attention:2")
    assert untied.head.weight is not untied.tok_emb.weight
    with pytest.raises(ArgumentError) as err:
        CompareSpec(task="mqar", options={"tie_embeddings": "yes"})
    assert err.value.argument == "tie_embeddings"


def test_mqar_random_non_queries_reaches_the_generator() -> None:
    """``--random-non-queries no`` (Zoology's figure 2): the filler is token 0."""
    from heatformer.datasets import mqar

    spec = CompareSpec(task="mqar", options={**TINY["mqar"], "random_non_queries": False})
    inputs, labels = spec.options.generate(3, 5)
    expected = mqar(32, 3, 16, 5, num_kv_pairs=2, random_non_queries=False)
    assert torch.equal(inputs, expected[0]) and torch.equal(labels, expected[1])
    queries_and_context = labels != -100
    queries_and_context[:, :4] = True  # the key-value context
    assert (inputs[~queries_and_context] == 0).all()
    assert not (CompareSpec(task="mqar", options=TINY["mqar"]).options.generate(3, 5)[0] == 0).all()


def test_mlp_ratio_reaches_the_model_and_keeps_old_fingerprints() -> None:
    spec = CompareSpec(task="mqar", options=TINY["mqar"], n_layer=1, n_embd=16, mlp_ratio=0)
    model = resolve_task("mqar")(spec).build_model("attention")
    assert all(block.mlp is None for block in model.blocks)
    assert "mlp_ratio" not in CompareSpec(task="mqar", options=TINY["mqar"]).fingerprint()
    assert spec.fingerprint()["mlp_ratio"] == 0  # a checkpoint of another model is not resumed
    with pytest.raises(ArgumentError) as err:
        CompareSpec(task="mqar", mlp_ratio=-1)
    assert err.value.argument == "mlp_ratio"


def test_mqar_query_gaps_are_the_distance_to_the_last_key_in_the_context() -> None:
    from heatformer.datasets import mqar
    from heatformer.lab.tasks.mqar import query_gaps

    for passes in (1, 2):
        inputs, labels = mqar(64, 20, 32, 3, num_kv_pairs=3, num_passes=passes)
        context = 2 * 3 * passes
        gaps = query_gaps(inputs, labels, context)
        for b in range(len(inputs)):
            for i in range(inputs.shape[1]):
                if labels[b, i] == -100:
                    assert gaps[b, i] == 0
                    continue
                key = max(j for j in range(context) if inputs[b, j] == inputs[b, i])
                assert gaps[b, i] == i - key and labels[b, i] == inputs[b, key + 1]


@pytest.mark.parametrize("select", [False, True])
def test_mqar_near_and_far_split_val_acc_by_the_query_gap(select: bool) -> None:
    """A model that answers exactly the queries within ``near_gap`` of their key scores 1 near
    and 0 far; ``val_acc`` is their mean weighted by the counts; ``near_gap`` past every gap
    leaves ``val_acc_far`` NaN."""
    from heatformer.lab.tasks.mqar import query_gaps

    tuned = {"select_by": "val_acc", "tune": ("lr=1e-3,2e-3",)} if select else {}
    task = resolve_task("mqar")(
        CompareSpec(task="mqar", heads=("attention:2",), n_layer=1, n_embd=16, **tuned,
                    options={**TINY["mqar"], "eval_size": 40, "near_gap": 6})
    )  # fmt: skip
    inputs, labels = task.data
    near = query_gaps(inputs, labels, 4) <= 6
    assert near[labels != -100].any() and (~near)[labels != -100].any()
    known = labels.masked_fill(~near, -100)  # the oracle knows the near answers only
    metrics = task.evaluate(Oracle([(inputs, known)], 32), torch.device("cpu"))
    prefixes = ("", "validation/") if select else ("",)
    assert set(metrics) == {p + m for p in prefixes for m in task.metric_names}
    for prefix in prefixes:
        assert metrics[prefix + "val_acc_near"] == 1.0 and metrics[prefix + "val_acc_far"] == 0.0
    scored = labels != -100
    half = torch.arange(len(labels))[:, None] % 2 == 1 if select else torch.ones_like(scored)
    counts = ((scored & near & half).sum(), (scored & half).sum())
    assert metrics["val_acc"] == pytest.approx(float(counts[0] / counts[1]))
    wide = resolve_task("mqar")(
        CompareSpec(task="mqar", heads=("attention:2",), n_layer=1, n_embd=16,
                    options={**TINY["mqar"], "eval_size": 8, "near_gap": 16})
    ).evaluate(Oracle([], 32), torch.device("cpu"))  # fmt: skip
    assert math.isnan(wide["val_acc_far"]) and wide["val_acc_near"] == wide["val_acc"]
    with pytest.raises(ArgumentError) as err:
        CompareSpec(task="mqar", options={**TINY["mqar"], "near_gap": 0})
    assert err.value.argument == "near_gap"
