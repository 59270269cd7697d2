"""A model trained by ``heatformer train`` loads with ``heatformer.models.load_model`` (issue 40).

The runs are trained through the command line in this process (``--threads 1``, a few steps);
the loaded model is in eval mode, has the config the task built it with (head schedule, graph
kinds) and reproduces the run's final evaluation in ``result.json`` exactly, evaluated as the
trainer evaluates (``task.evaluate(model, device)``, float32 here). The library's own checks of
files and folders, written by hand, are in ``tests/models/test_files.py``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from device_helpers import DEVICES
from heatformer.lab.checkpoint import load_checkpoint, save_checkpoint
from heatformer.lab.cli import main
from heatformer.lab.distributed import DistContext
from heatformer.lab.folder import load_spec
from heatformer.lab.resume import CHECKPOINT_NAME, setup_run
from heatformer.lab.spec import CompareSpec
from heatformer.lab.tasks import TASK_NAMES, CharsTask, RecallTask, StdlibTask, resolve_task
from heatformer.lab.trainer import train_run
from heatformer.models import GPT, SequenceClassifier, UnfinishedTraining, ViT, load_model
from heatformer.models import files as model_files

_RUNNING = ["--no-analysis", "--device", "cpu", "--no-progress", "--threads", "1"]

#: one run per model kind: task -> (its model's class, the flags of a tiny run)
RUNS: dict[str, tuple[type[nn.Module], list[str]]] = {
    "chars": (GPT, [
        "--steps", "4", "--batch-size", "4", "--seq-len", "16", "--layers", "2", "--embd", "16",
        "--heads", "attention:1,laplacian:1", "--graph", "topk[k=4];softmax",
        "--eval-every", "2", "--eval-size", "4",
    ]),
    "digits": (ViT, [
        "--steps", "4", "--batch-size", "8", "--layers", "1", "--embd", "16", "--patch-size", "4",
        "--heads", "attention:1,heat[t=0.5]:1",
    ]),
    "recall": (SequenceClassifier, [
        "--steps", "4", "--batch-size", "4", "--seq-len", "12", "--num-pairs", "2",
        "--num-keys", "8", "--num-values", "8", "--eval-size", "16", "--layers", "1",
        "--embd", "16", "--heads", "attention:1,laplacian:1",
    ]),
}  # fmt: skip


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One torch thread, as the runs had (the same sums in the same order), then put back."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> dict[str, Path]:
    """task -> the output folder of one finished run of it."""
    previous = torch.get_num_threads()
    outs = {}
    try:
        for task, (_, flags) in RUNS.items():
            out = tmp_path_factory.mktemp(task) / "out"
            data = ["--text", str(corpus)] if task == "chars" else []
            argv = ["train", "--task", task, *data, *flags, *_RUNNING, "--out", str(out)]
            assert main(argv) == 0
            outs[task] = out
    finally:
        torch.set_num_threads(previous)
    return outs


def _run_dir(out: Path) -> Path:
    (run,) = (out / "runs").iterdir()
    return run


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("task_name", list(RUNS))
def test_a_trained_model_loads_as_trained_and_reproduces_its_evaluation(
    trained: dict[str, Path], task_name: str, device: torch.device
) -> None:
    out = trained[task_name]
    spec = load_spec(out)
    task = resolve_task(spec.task)(spec, None)
    (heads,) = spec.heads
    record = json.loads((_run_dir(out) / "result.json").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a finished run: no UnfinishedTraining
        model = load_model(out, map_location=device)  # the output folder of its one run
    assert type(model) is RUNS[task_name][0] and not model.training
    assert model.config == task.model_config(heads)  # head schedule, graph kinds, sizes
    assert {p.device.type for p in model.parameters()} == {device.type}
    metrics = task.evaluate(model, device)  # as the trainer evaluates a float32 run
    if device.type == "cpu":
        assert metrics == record["final"]
    else:
        assert metrics == pytest.approx(record["final"], rel=1e-3)
    again = load_model(_run_dir(out) / CHECKPOINT_NAME)  # the checkpoint, and the run folder
    for (n1, p1), (n2, p2) in zip(
        load_model(_run_dir(out)).state_dict().items(), again.state_dict().items(), strict=True
    ):
        assert n1 == n2 and torch.equal(p1, p2)


def test_the_library_reads_the_files_the_lab_writes_by_their_names() -> None:
    assert model_files._CHECKPOINT == CHECKPOINT_NAME
    assert model_files._RUN_FORMAT == "heatformer-run-checkpoint"
    from heatformer.lab.checkpoint import CHECKPOINT_FORMAT

    assert CHECKPOINT_FORMAT.startswith(model_files._RUN_FORMAT)


def test_a_run_checkpoint_holds_the_weights_once(trained: dict[str, Path]) -> None:
    path = _run_dir(trained["chars"]) / CHECKPOINT_NAME
    saved = load_checkpoint(path)
    assert saved is not None and saved["kind"] == "GPT" and saved["steps"] == saved["step"] == 4
    weights = sum(t.numel() * t.element_size() for t in saved["model"].values())
    without = path.parent / "without.pt"
    library = ("kind", "config", "state_dict")
    save_checkpoint(without, {k: v for k, v in saved.items() if k not in library})
    assert 0 < path.stat().st_size - without.stat().st_size < 0.1 * weights


@pytest.mark.usefixtures("one_thread")
def test_a_stopped_run_loads_saying_its_step_and_an_older_checkpoint_resumes(
    corpus: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    flags = ["train", "--text", str(corpus), *RUNS["chars"][1], *_RUNNING, "--out", str(out)]
    assert main([*flags, "--stop-at-step", "2"]) == 0
    with pytest.warns(UnfinishedTraining, match=r"got those of step 2 of 4") as caught:
        model = load_model(out)
    assert [(w.message.step, w.message.steps) for w in caught] == [(2, 4)]  # type: ignore[union-attr]
    assert isinstance(model, GPT) and not model.training
    path = _run_dir(out) / CHECKPOINT_NAME
    saved = load_checkpoint(path)
    assert saved is not None
    older = {k: v for k, v in saved.items() if k not in ("kind", "config", "state_dict", "steps")}
    save_checkpoint(path, older)  # as a checkpoint written before run checkpoints held them
    with pytest.raises(ValueError, match="it was written before run checkpoints held a model's"):
        load_model(out)
    assert main(["train", "--resume", str(out)]) == 0  # resumes all the same
    spec = load_spec(out)
    task = resolve_task(spec.task)(spec, None)
    record = json.loads((_run_dir(out) / "result.json").read_text())
    assert task.evaluate(load_model(out), torch.device("cpu")) == record["final"]


class _MyGPT(GPT):
    """A model of the run's own (a ``model_factory``'s), not a kind the library rebuilds."""


def test_a_run_of_a_model_factory_is_refused_naming_its_model(
    tiny_spec: object, tmp_path: Path
) -> None:
    spec: CompareSpec = tiny_spec(steps=2, eval_every=2, heads=("attention:2",))  # type: ignore[operator]
    task = resolve_task("chars")(spec, None)
    run_dir = tmp_path / "run"
    train_run(task, "attention:2", 0, run_dir,
              model_factory=lambda t, heads: _MyGPT(t.model_config(heads)))  # fmt: skip
    name = f"{__name__}._MyGPT"
    with pytest.raises(ValueError, match=rf"\(its model is a {name}, not one of \['GPT', "):
        load_model(run_dir)


# ---------------------------------------------------------------- every task's model


def _data(name: str) -> object:
    text = torch.tensor(list(b"the heat kernel spreads values along edges. " * 40))
    text = text.to(torch.uint8)
    chars = CharsTask(train=text[:1200], val=text[1200:], train_files=("a",), val_files=("b",),
                      source="<bytes>")  # fmt: skip
    files = [b"import os\n" * 3, b"def f():\n    return 1\n" * 2, b"class A:\n    pass\n" * 2]
    stream = torch.tensor(list(b"".join(files)), dtype=torch.uint8)
    sizes = tuple((len(data),) for data in files)
    stdlib = StdlibTask(
        classes=("a", "b", "c"), train_files=(("a/x.py",), ("b/x.py",), ("c/x.py",)),
        train_sizes=sizes, test_files=(("a/y.py",), ("b/y.py",), ("c/y.py",)), test_sizes=sizes,
        train=stream, test=stream.clone(), seq_len=12, eval_per_class=4, source="<bytes>",
    )  # fmt: skip
    recall = RecallTask(num_keys=8, num_values=8, num_pairs=2, seq_len=12, val_size=40)
    return {"chars": chars, "masked": chars, "recall": recall, "stdlib": stdlib}.get(name)


#: options of the synthetic tasks that fit a sequence of 12 tokens
_SYNTHETIC: dict[str, dict[str, Any]] = {
    "mqar": {"vocab_size": 16, "num_kv_pairs": 2, "eval_size": 4},
    "selective_copy": {"num_tokens_to_copy": 3, "eval_size": 4},
    "listops": {"min_length": 4, "eval_size": 4},
    "passkey": {"num_digits": 2, "eval_lengths": (12,), "eval_size": 4},
    "induction": {"eval_size": 4},
    "parity": {"eval_size": 4},
}


@pytest.mark.parametrize("name", TASK_NAMES)
def test_every_task_trains_a_model_that_its_checkpoint_loads(name: str, tmp_path: Path) -> None:
    """Each built-in task's model is a kind the library rebuilds from a run's checkpoint."""
    options = {"seq_len": 12} if name != "digits" else {"patch_size": 4}
    options |= _SYNTHETIC.get(name, {})
    heads = "attention:1,laplacian:1"
    spec = CompareSpec(task=name, heads=(heads,), n_layer=1, n_embd=16, steps=3,
                       graph="window[w=4]", options=options)  # fmt: skip
    task = resolve_task(name)(spec, _data(name))
    run = setup_run(task, heads, 0, tmp_path, spec, DistContext(), None)
    run.step = 3
    run.checkpoint()
    model = load_model(tmp_path)
    assert type(model) is type(run.model) and model.config == run.model.config
    assert model.config.graph == "window[w=4]" and not model.training
    for (n1, p1), (n2, p2) in zip(
        run.model.state_dict().items(), model.state_dict().items(), strict=True
    ):
        assert n1 == n2 and torch.equal(p1, p2)
