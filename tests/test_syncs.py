"""No host syncs in forward or backward: every operator x graph kind, and KV-cache decoding.

A device sync is any operation whose result the host must wait for: reading a tensor's value
(``Tensor.item``, ``bool(t)``, ``float(t)``, ``tolist``, all ``aten._local_scalar_dense``
underneath), an output whose *shape* depends on the values (``nonzero``, ``masked_select``,
``unique``, ``repeat_interleave`` without ``output_size``, boolean indexing), or a copy to
the host (``.cpu()``, ``aten._to_copy`` / ``copy_`` onto the CPU). On a GPU each one stalls the
queue; under :func:`torch.compile` each is a graph break. They are found here on the CPU, where
they cost nothing, by a :class:`~torch.utils._python_dispatch.TorchDispatchMode` that sees every
aten call of a forward and of its backward (the dispatcher runs below autograd), and on CUDA the
same cells also run under ``torch.cuda.set_sync_debug_mode("error")``.

Allowed reads, each with its reason (none happens inside a layer's forward or backward here):

- argument checks at public boundaries (``DenseGraph(weight)`` checks its weights, the
  functional ``heat_kernel`` checks a tensor ``t``): once per call of a public function by a
  user, never in a layer;
- top-k selection on the CPU (:func:`heatformer.graph_ops.sparsify._reads_free`): it reads
  whether any row ties at its k-th value, so that only those rows pay for the tie-breaking
  (3-5x the selection when every row pays, measured). A read of a CPU tensor is no device
  sync; on an accelerator and under tracing every row is resolved with no read. The cells
  here force that device path on the CPU, and :func:`test_the_cpu_topk_read_is_the_only_one`
  pins the CPU read to that one place;
- a heat series on the combinatorial Laplacian of a graph that is not row-stochastic (a
  ``DenseGraph`` of arbitrary weights) or with a tensor ``t`` and no ``t_max``: its plan
  needs ``c t`` (``c`` the largest out-degree), which is data. Attention graphs are
  row-stochastic, and :class:`~heatformer.graph_ops.HeatKernel` always gives a bound.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import heatformer.graph_ops.sparsify as sparsify
from heatformer._spec import format_entry
from heatformer.graph_ops import GRAPHS, OPERATORS, DiffusionOperator, resolve_graph
from heatformer.models import DiffusionAttention, KVCache
from heatformer.models.heads import format_operator, parse_heads

#: aten operations that make the host wait for the device (see the module docstring)
SYNC_OPS = frozenset(
    {
        "aten::_local_scalar_dense",  # item, bool, float, int, tolist
        "aten::nonzero",
        "aten::nonzero_static",
        "aten::masked_select",
        "aten::unique",
        "aten::_unique",
        "aten::_unique2",
        "aten::unique_consecutive",
        "aten::unique_dim",
        "aten::repeat_interleave",
        "aten::equal",
        "aten::is_nonzero",
    }
)


class SyncSpy(TorchDispatchMode):
    """Records every sync point (:data:`SYNC_OPS` and copies to the CPU of a tensor on another
    device) with the heatformer line that caused it."""

    def __init__(self) -> None:
        super().__init__()
        self.hits: Counter[str] = Counter()

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        name = func._schema.name
        to_host = name in ("aten::_to_copy", "aten::copy_") and _leaves_device(args, kwargs)
        if name in SYNC_OPS or to_host:
            self.hits[f"{name} at {_caller()}"] += 1
        return func(*args, **(kwargs or {}))


def _leaves_device(args: tuple[Any, ...], kwargs: Any) -> bool:
    """A copy from a non-CPU tensor onto the CPU (always False in a CPU-only run)."""
    src = args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) else args[0]
    target = (kwargs or {}).get("device")
    dst_cpu = (target is not None and torch.device(target).type == "cpu") or (
        len(args) > 1 and isinstance(args[0], torch.Tensor) and args[0].device.type == "cpu"
    )
    return isinstance(src, torch.Tensor) and src.device.type != "cpu" and dst_cpu


def _caller() -> str:
    """The innermost frame of heatformer's own code, as ``graph_ops/sparsify.py:LINE``.

    Frames are told by their module's name (``heatformer.*``), not by their path: a checkout
    made by ``git clone ... heatformer`` has ``/heatformer/`` in every path under it, this file's
    and the venv's torch included.
    """
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("heatformer."):
            relative = module.removeprefix("heatformer.").replace(".", "/")
            name = "/__init__.py" if frame.f_code.co_filename.endswith("__init__.py") else ".py"
            return f"{relative}{name}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "torch"


@contextmanager
def no_syncs(device: torch.device) -> Iterator[SyncSpy]:
    """Spy on the CPU; on CUDA also torch's own sync check, which raises at the sync."""
    spy = SyncSpy()
    previous = torch.cuda.get_sync_debug_mode() if device.type == "cuda" else None
    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode("error")
    try:
        with spy:
            yield spy
    finally:
        if previous is not None:
            torch.cuda.set_sync_debug_mode(previous)


@pytest.fixture
def device_topk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Top-k selection as on an accelerator: every row tie-broken, nothing read."""
    monkeypatch.setattr(sparsify, "_reads_free", lambda t: False, raising=False)


#: every registered operator with each of its example parameter sets
OPERATOR_CASES = [
    pytest.param(format_operator(name, params), id=format_operator(name, params))
    for name, cls in OPERATORS.items()
    for params in cls.examples
]
#: every registered graph kind with each of its examples
KINDS = [format_entry(name, p, sep=",") for name, cls in GRAPHS.items() for p in cls.examples]


def _layer(spec: str, kind: str, causal: bool, device: torch.device) -> DiffusionAttention:
    op = _operator(spec)
    if causal and op.reads_transpose:
        pytest.skip("refused in a causal layer (reads W^T)")
    torch.manual_seed(0)
    return DiffusionAttention(16, 2, f"attention:1,{spec}:1", graph=kind, causal=causal).to(device)


def _operator(spec: str) -> DiffusionOperator:
    return parse_heads(f"{spec}:1", 1)[0]


def _step(layer: DiffusionAttention, x: torch.Tensor, mask: torch.Tensor | None) -> None:
    y = layer(x, key_mask=mask)
    y.square().sum().backward()


@pytest.mark.usefixtures("device_topk")
@pytest.mark.parametrize(
    ("causal", "masked"), [(False, False), (True, True)], ids=["bidirectional", "causal-masked"]
)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("spec", OPERATOR_CASES)
def test_forward_and_backward_make_no_host_sync(
    spec: str, kind: str, causal: bool, masked: bool, device: torch.device
) -> None:
    """The first call included: nothing is read on a first use (constants are checked at
    construction), so a compiled or CUDA-graphed first step is sync-free too. Two cases per
    cell: bidirectional and unmasked (operators that read ``W^T`` run here), and causal with
    left padding (rows without keys: the masked code paths)."""
    layer = _layer(spec, kind, causal, device)
    x = torch.randn(2, 9, 16, device=device, requires_grad=True)
    mask = None
    if masked:
        mask = torch.ones(2, 9, dtype=torch.bool, device=device)
        mask[1, :3] = False
    with no_syncs(device) as spy:
        _step(layer, x, mask)
    assert not spy.hits, f"host syncs: {dict(spy.hits)}"
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())


@pytest.mark.usefixtures("device_topk")
@pytest.mark.parametrize("kind", [k for k in KINDS if resolve_graph(k).incremental])
@pytest.mark.parametrize("spec", ["attention", "laplacian", "laplacian[step=0.5]"])
def test_kv_cache_decoding_makes_no_host_sync(spec: str, kind: str, device: torch.device) -> None:
    """Every decode step, including the ones where a window's cache drops old keys (decided
    on the host from the cache's position runs), and equal to recomputing the sequence."""
    layer = _layer(spec, kind, True, device).eval()
    x = torch.randn(2, 12, 16, device=device)
    cache = KVCache()
    with torch.no_grad():
        steps = [layer(x[:, :5], cache=cache)]
        with no_syncs(device) as spy:
            steps += [layer(x[:, i : i + 1], cache=cache) for i in range(5, 12)]
        full = layer(x)
    assert not spy.hits, f"host syncs: {dict(spy.hits)}"
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_the_cpu_topk_read_is_the_only_one() -> None:
    """On the CPU top-k reads one flag per selection (a CPU read, no device sync): from
    ``stable_topk_indices`` and nowhere else; both ways select the same edges, ties too."""
    layer = _layer("laplacian", "topk[k=3]", True, torch.device("cpu"))
    x = torch.randn(2, 9, 16, requires_grad=True)
    with no_syncs(torch.device("cpu")) as spy:
        _step(layer, x, None)
    places = {hit.split(" at ")[1].split(":")[0] for hit in spy.hits}
    assert places == {"graph_ops/sparsify.py"}, dict(spy.hits)
    scores = torch.randn(3, 5, 40)
    scores[0, :, :12] = 2.5  # ties across the cut
    scores[1, :, 30:] = float("-inf")
    fast = sparsify.stable_topk_indices(scores, 8)
    kth = torch.topk(scores, 8, dim=-1).values[..., -1:]
    assert torch.equal(fast, sparsify._tie_broken_topk(scores, kth, 8))
    assert torch.equal(fast[0, 0], torch.arange(8))  # the lowest-index ties


@pytest.mark.parametrize(
    "spec", ["heat", "heat[t=1.7;learnable=true]", "heat[t=40.0;normalization=combinatorial]"]
)
def test_heat_plans_without_reading_t(spec: str, device: torch.device) -> None:
    """The heat series is planned on the host: a fixed t is a float kept at construction, a
    learnable one has its bound t_max; on attention graphs c = 1 is known for every
    normalization (row-stochastic)."""
    op = _operator(spec).to(device)
    q, k, x = (torch.randn(2, 3, 10, 4, device=device) for _ in range(3))
    graph = resolve_graph("softmax").build(q, k, causal=True)
    with no_syncs(device) as spy:
        y = op(graph, x)
    assert not spy.hits, f"host syncs: {dict(spy.hits)}"
    assert bool(torch.isfinite(y).all())
