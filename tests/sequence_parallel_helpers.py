"""Launch helpers of the sequence-parallel tests: spawned process groups, ``torchrun`` commands,
and a process that dies.

Run as a script under ``torchrun`` (``python -m torch.distributed.run ... THIS_FILE ARGS``), this
file is ``heatformer ARGS`` in which the rank named by ``HEATFORMER_TEST_DIE_RANK`` exits at once
(``os._exit(1)``, no clean-up: a crashed process) in the middle of the training step whose index
``HEATFORMER_TEST_DIE_STEP`` names (after its backward pass, before the gradients are reduced
over the ranks); with ``HEATFORMER_TEST_HANG=1`` it stops answering there instead (sleeps).
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: seconds a spawned group may take before the test fails (and kills it)
GROUP_DEADLINE_S = 240.0


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _entry(rank: int, fn: Callable[..., Any], world: int, port: int, args: tuple[Any, ...]) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def spawn_group(fn: Callable[..., Any], world: int, *args: Any) -> None:
    """Run ``fn(rank, world, *args)`` in ``world`` spawned processes joined in a gloo group on
    the loopback interface; fail (killing them) after :data:`GROUP_DEADLINE_S` seconds."""
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    context = mp.start_processes(
        _entry, args=(fn, world, free_port(), args), nprocs=world, join=False,
        start_method="spawn",
    )  # fmt: skip
    deadline = time.monotonic() + GROUP_DEADLINE_S
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            raise TimeoutError(f"the {world} spawned processes ran past {GROUP_DEADLINE_S} s")


#: GPT cases of the equality test: (config fields, sequence length N)
GPT_CASES: tuple[tuple[dict[str, Any], int], ...] = (
    ({"heads": "attention:1,laplacian:1,heat:1", "graph": "window[w=3,global=1]"}, 11),
    ({"heads": "laplacian:1,heat:1,attention:1", "graph": "window[w=4]"}, 7),
    (
        {
            "heads": "attention:2,heat:1",
            "graph": "window[w=2,global=2]",
            "activation_checkpointing": True,
        },
        9,
    ),
    ({"heads": "laplacian:1,attention:2", "graph": "window[w=2]"}, 3),  # an empty block at P = 4
)


def gpt_case(case: int) -> tuple[Any, Any, Any]:
    """``(model, idx, weights)`` of a case, in float64: the same on every process (seeded), and
    ``weights`` ``(2, N, V)`` of the loss ``(logits * weights).sum()``."""
    import torch

    from heatformer.models import GPT, GPTConfig

    fields, n = GPT_CASES[case]
    config = GPTConfig(n_layer=2, n_head=3, n_embd=12, vocab_size=11, block_size=16, **fields)
    torch.manual_seed(case)
    model = GPT(config).double()
    gen = torch.Generator().manual_seed(100 + case)
    idx = torch.randint(0, 11, (2, n), generator=gen)
    weights = torch.randn(2, n, 11, generator=gen, dtype=torch.float64)
    return model, idx, weights


def sharded_gpt_worker(rank: int, world: int, out: str) -> None:
    """Every case on this process's block of the sequence; rank 0 saves, per case, the gathered
    logits and the parameter gradients summed over the group (``out``)."""
    import torch
    import torch.distributed as dist

    from heatformer.graph_ops import SequenceShard

    results = []
    for case in range(len(GPT_CASES)):
        model, idx, weights = gpt_case(case)
        shard = SequenceShard.current(idx.shape[1])
        logits = model(shard.take(idx, 1), shard=shard)  # (2, n_local, V)
        (logits * shard.take(weights, 1)).sum().backward()
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        dist.all_reduce(grads)
        results.append((shard.gather(logits.detach(), 1), grads))
    if rank == 0:
        torch.save(results, out)


def torchrun(nproc: int, *args: str, script: Path | None = None) -> list[str]:
    """``torchrun --standalone --nproc_per_node NPROC -m heatformer ARGS`` (or ``script``)."""
    head = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    head += ["--nproc_per_node", str(nproc)]
    return head + ([str(script)] if script is not None else ["-m", "heatformer"]) + list(args)


def _dying_main() -> int:
    import torch.distributed as dist

    from heatformer.cli import main
    from heatformer.experiments import trainer

    rank = int(os.environ["HEATFORMER_TEST_DIE_RANK"])
    step = int(os.environ["HEATFORMER_TEST_DIE_STEP"])
    calls = iter(range(10**9))
    backward = trainer.backward_pass

    def backward_pass(*args: Any) -> Any:
        loss = backward(*args)
        if next(calls) == step and dist.get_rank() == rank:
            if os.environ.get("HEATFORMER_TEST_HANG") == "1":  # until torchrun's SIGTERM
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                time.sleep(3600)
            os._exit(1)
        return loss

    trainer.backward_pass = backward_pass
    return main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(_dying_main())
