"""Launch helpers of the sequence-parallel tests: pooled process groups, ``torchrun`` commands,
and a process that dies.

Run as a script under ``torchrun`` (``python -m torch.distributed.run ... THIS_FILE ARGS``), this
file is ``heatformer ARGS`` in which the rank named by ``HEATFORMER_TEST_DIE_RANK`` exits at once
(``os._exit(1)``, no clean-up: a crashed process) in the middle of the training step whose index
``HEATFORMER_TEST_DIE_STEP`` names (after its backward pass, before the gradients are reduced
over the ranks); with ``HEATFORMER_TEST_HANG=1`` it stops answering there instead (sleeps).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: seconds one call of a pooled group may take before the test fails (and the pool is killed):
#: a call runs one case in a second or two alone, but the suite may run beside other jobs
CALL_DEADLINE_S = 300.0
_WORKER = Path(__file__).with_name("_group_worker.py")


class GroupPool:
    """``world`` processes joined in a gloo group on the loopback interface (a file store),
    started once and kept for many calls (``tests/_group_worker.py``), so that a test pays
    for its own case only, not for importing torch and joining a group in every process.

    :meth:`call` runs ``module.function(rank, world, *args)`` on every rank and returns the
    ranks' results. A call that fails on any rank, or runs past :data:`CALL_DEADLINE_S`, kills
    the pool (its group may be left inside a collective) and raises with every rank's error
    and the end of its stderr; :attr:`broken` then tells the fixture to start a new one.
    """

    def __init__(self, world: int, folder: Path, paths: list[str]) -> None:
        self.world, self.folder, self.calls, self.broken = world, folder, 0, False
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        src = str(Path(__file__).resolve().parents[1] / "src")
        env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
        self.logs = [folder / f"rank{r}.stderr" for r in range(world)]
        self.procs: list[subprocess.Popen[bytes]] = []
        for r, log in enumerate(self.logs):
            command = [sys.executable, str(_WORKER), str(r), str(world), str(folder / "store")]
            with log.open("w") as err:  # the child keeps its own descriptor
                self.procs.append(subprocess.Popen(
                    [*command, os.pathsep.join(paths)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env,
                ))  # fmt: skip
        self._replies("joining the group", CALL_DEADLINE_S)

    def call(self, fn: str, *args: Any, timeout: float = CALL_DEADLINE_S) -> list[Any]:
        """``fn`` (``"module:function"``) on every rank; the ranks' results in rank order
        (``timeout``: seconds before the pool is killed and the call fails)."""
        import torch

        out = self.folder / f"call{self.calls}"
        self.calls += 1
        line = json.dumps({"fn": fn, "args": list(args), "out": str(out)}) + "\n"
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(line.encode())
            proc.stdin.flush()
        self._replies(fn, timeout)
        return [torch.load(f"{out}.{r}", weights_only=True) for r in range(self.world)]

    def _replies(self, what: str, timeout: float) -> None:
        """Wait for one reply line from every rank; on an error or past ``timeout`` seconds,
        kill the pool and raise."""
        deadline = time.monotonic() + timeout
        replies: dict[int, dict[str, Any]] = {}
        pending = [b""] * self.world  # bytes read past the last whole line, per rank
        with selectors.DefaultSelector() as sel:
            for r, proc in enumerate(self.procs):
                assert proc.stdout is not None
                sel.register(proc.stdout.fileno(), selectors.EVENT_READ, r)
            while len(replies) < self.world and time.monotonic() < deadline:
                for key, _ in sel.select(timeout=1.0):
                    r, chunk = key.data, os.read(key.fd, 65536)
                    if not chunk:  # the process exited
                        replies[r] = {"ok": False, "error": "the process exited"}
                        sel.unregister(key.fd)
                        continue
                    *lines, pending[r] = (pending[r] + chunk).split(b"\n")
                    for text in lines:  # a reply is one JSON line; anything else is not ours
                        if text.startswith(b"{") and r not in replies:
                            replies[r] = json.loads(text)
                            sel.unregister(key.fd)
        if len(replies) == self.world and all(r["ok"] for r in replies.values()):
            return
        self.close()
        report = []
        for r in range(self.world):
            reply = replies.get(r, {"ok": False, "error": f"no reply in {timeout:g} s"})
            said = "finished" if reply["ok"] else reply["error"]
            report.append(f"rank {r}: {said}\n{self.logs[r].read_text()[-2000:]}")
        raise AssertionError(f"{what} on {self.world} processes failed:\n" + "\n".join(report))

    def close(self) -> None:
        """Stop the processes (a clean exit when they are idle, a kill otherwise)."""
        self.broken = True
        for proc in self.procs:
            if proc.stdin is not None and not proc.stdin.closed:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def group_pools(folder: Path, paths: list[str]) -> Iterator[Callable[[int], GroupPool]]:
    """``get(world)``: a :class:`GroupPool` of ``world`` processes, started at the first call
    and again after one broke; all stopped on exit."""
    pools: dict[int, GroupPool] = {}

    def get(world: int) -> GroupPool:
        pool = pools.get(world)
        if pool is None or pool.broken:
            sub = folder / f"group{world}-{len(pools)}-{time.monotonic_ns()}"
            sub.mkdir(parents=True)
            pool = pools[world] = GroupPool(world, sub, paths)
        return pool

    try:
        yield get
    finally:
        for pool in pools.values():
            if not pool.broken:
                pool.close()


def pool_probe(rank: int, world: int, mode: str) -> int:
    """For the pool's own test: ``"rank"`` returns the rank; ``"raise"`` raises on the last
    rank; ``"stuck"``: rank 0 waits in a collective the others never join."""
    import torch
    import torch.distributed as dist

    if mode == "raise" and rank == world - 1:
        raise ValueError(f"probe failure on rank {rank}")
    if mode == "stuck" and rank == 0:
        dist.all_reduce(torch.zeros(1))
    return rank


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


def sharded_gpt_case(rank: int, world: int, case: int) -> tuple[Any, Any] | None:
    """GPT case ``case`` on this process's block of the sequence (in a group of ``world``):
    on rank 0, the gathered logits and the parameter gradients summed over the group."""
    import torch
    import torch.distributed as dist

    from heatformer.graph_ops import SequenceShard

    model, idx, weights = gpt_case(case)
    shard = SequenceShard.current(idx.shape[1])
    logits = model(shard.take(idx, 1), shard=shard)  # (2, n_local, V)
    (logits * shard.take(weights, 1)).sum().backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    dist.all_reduce(grads)
    full = shard.gather(logits.detach(), 1)
    return (full, grads) if rank == 0 else None


def torchrun(nproc: int, *args: str, script: Path | None = None) -> list[str]:
    """``torchrun --standalone --nproc_per_node NPROC -m heatformer ARGS`` (or ``script``)."""
    head = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    head += ["--nproc_per_node", str(nproc)]
    return head + ([str(script)] if script is not None else ["-m", "heatformer"]) + list(args)


def _dying_main() -> int:
    import torch.distributed as dist

    from heatformer.lab import trainer
    from heatformer.lab.cli import main

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
