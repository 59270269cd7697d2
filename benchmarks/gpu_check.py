"""The prepared GPU check (issue 23): the CUDA tests and the GPU benchmarks in one run of at most
eight minutes, written to one JSON file and one Markdown table.

    make gpu-check TORCH_SPEC=torch           # from a clean clone, on a machine with a GPU
    python benchmarks/gpu_check.py --out gpu-check
    python benchmarks/gpu_check.py --dry-run  # the same code paths on the CPU, tiny sizes

Sections, in this order, each in its own process with its own time limit (a failure, an
out-of-memory or a timeout is recorded and the next section still runs; a global deadline,
``--deadline`` seconds, skips what no longer fits and says so):

1. ``pytest`` -- ``pytest -m cuda -x -q`` (every test marked ``cuda``), with its own budget.
2. ``laplacian_heads`` -- a ``DiffusionAttention`` layer, N = 4096, bf16, causal, forward +
   backward: ``attention:6,laplacian:2`` and ``attention:4,laplacian:4`` against
   ``attention:8`` (flash SDPA); target <= 1.03x. Plain flash SDPA on the same q, k, v is
   timed next to them, for reference.
3. ``heat_series`` -- ``heat_kernel`` (series, t = 1, tol 1e-6) against K times one
   ``propagate`` (K = the propagations the series made), forward + backward, on a dense
   causal softmax graph (N = 4096) and on a window(128) + 1 global graph (N = 65536);
   target <= 1.1x per term.
4. ``window_long`` -- ``WindowGraph(w=128, global=1, causal).propagate`` forward + backward at
   N = 64k, 256k, 1M (B = 1, H = 8, Dh = 64, bf16), on the ``auto`` backend (FlexAttention on
   CUDA) and on the window kernels, against FlexAttention with a plain sliding-window block
   mask (the peer; its mask is built once, outside the timing): time ratio and peak memory
   (``torch.cuda.max_memory_allocated`` above the inputs).
5. ``hf_gpt2`` -- a GPT-2-small-shaped Hugging Face model (12 layers, 768 wide, 12 heads,
   N = 1024, built from a config: no download), bf16, forward + backward of the LM loss:
   converted to ``attention`` (target <= 1.05x) and to 3 of 12 Laplacian heads (2/8; target
   <= 1.10x) against transformers' own ``sdpa``.
6. ``moonshot`` -- a window(128) + 1 global causal layer of heat heads (D = 256, H = 4, bf16),
   forward + backward at N = 16M tokens, or the largest N that fits (descending sizes; an
   out-of-memory frees the cache and tries the next; sizes whose time, extrapolated from the
   1M run, would pass the section's budget are skipped with that reason).

Timings: each section's competitors are timed side by side, round-robin (``_common.compare``),
after a warm-up (compilation included there), each call ending in ``torch.cuda.synchronize()``;
medians are reported. Without a CUDA device the script refuses (exit 2, one line) unless
``--dry-run``: then every section runs on the CPU at tiny sizes, in float32, FlexAttention in
its eager reference and forward only (it has no CPU backward in torch 2.13), and ``pytest``
collects the CUDA tests of one file (which skip). The dry run is a test
(``tests/test_gpu_check.py``), so that the first GPU run is not a debugging run.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SECTIONS = ("pytest", "laplacian_heads", "heat_series", "window_long", "hf_gpt2", "moonshot")

#: Seconds each section may take at most (its process is killed past it), on the GPU.
BUDGETS = {
    "pytest": 150.0,
    "laplacian_heads": 40.0,
    "heat_series": 50.0,
    "window_long": 90.0,
    "hf_gpt2": 40.0,
    "moonshot": 70.0,
}
#: The whole run's deadline (seconds): under the issue's 8 minutes with room to start and end.
DEADLINE = 450.0

#: Sizes of the GPU run and of the CPU dry run.
SIZES: dict[str, dict[str, Any]] = {
    "gpu": {
        "heads": {"B": 4, "N": 4096, "D": 512, "H": 8},
        "heat": {"dense_N": 4096, "window_N": 65536, "H": 8, "Dh": 64},
        "window": {"Ns": [1 << 16, 1 << 18, 1 << 20], "H": 8, "Dh": 64, "w": 128},
        "gpt2": {"layers": 12, "width": 768, "heads": 12, "vocab": 50257, "N": 1024, "B": 8},
        "moon": {"Ns": [1 << 24, 1 << 23, 1 << 22, 1 << 21, 1 << 20], "probe_N": 1 << 20},
        "moon_layer": {"D": 256, "H": 4, "w": 128},
        "repeats": 7,
    },
    "dry": {
        "heads": {"B": 1, "N": 64, "D": 32, "H": 8},
        "heat": {"dense_N": 64, "window_N": 256, "H": 2, "Dh": 16},
        "window": {"Ns": [256], "H": 2, "Dh": 16, "w": 16},
        "gpt2": {"layers": 2, "width": 32, "heads": 4, "vocab": 64, "N": 32, "B": 2},
        "moon": {"Ns": [2048, 1024], "probe_N": 512},
        "moon_layer": {"D": 32, "H": 2, "w": 16},
        "repeats": 2,
    },
}


# ---- child side: one section in this process -----------------------------------------------


class Recorder:
    """A section's record, written to its JSON file after every change (so that a section
    killed at its time limit still leaves what it measured)."""

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.data: dict[str, Any] = {"section": name, "status": "running", "results": {}}
        self.flush()

    def put(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.flush()

    def result(self, key: str, value: Any) -> None:
        self.data["results"][key] = value
        self.flush()

    def target(self, name: str, measured: float | None, limit: float) -> None:
        ok = None if measured is None else measured <= limit
        self.data.setdefault("targets", []).append(
            {"name": name, "measured": measured, "target": limit, "pass": ok}
        )
        self.flush()

    def flush(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)


class Env:
    """Device, dtype, sizes and timing helpers of one section's process."""

    def __init__(self, dry: bool) -> None:
        import torch

        self.torch = torch
        self.dry = dry
        self.cuda = torch.cuda.is_available() and not dry
        self.device = torch.device("cuda" if self.cuda else "cpu")
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.sizes = SIZES["dry" if dry else "gpu"]
        #: forward + backward on the GPU; forward only where FlexAttention runs on the CPU
        self.flex_backward = self.cuda
        if dry:
            torch.set_num_threads(1)
            _eager_flex()

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def timed(self, fn: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            fn()
            self.sync()

        return run

    def compare(
        self, fns: dict[str, Callable[[], Any]], budget_s: float, repeats: int | None = None
    ) -> dict[str, dict[str, Any]]:
        """Round-robin medians (``_common.compare``), each call synchronized."""
        from _common import compare

        runs = {name: self.timed(fn) for name, fn in fns.items()}
        reps = repeats or self.sizes["repeats"]
        # two warm-ups: the first compiles (FlexAttention, Triton), the second sizes the repeats
        timings = compare(runs, repeats=reps, warmup=2, budget_s=budget_s, min_repeats=1)
        return {name: t.as_dict() | {"warmup_s": t.warmup} for name, t in timings.items()}

    def peak(self, fn: Callable[[], Any]) -> int | None:
        """Peak CUDA memory of one call above what was allocated before it (None on CPU)."""
        if not self.cuda:
            fn()
            return None
        torch = self.torch
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated() - base)

    def free(self) -> None:
        import gc

        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()


def _eager_flex() -> None:
    """Dry run: FlexAttention's eager reference instead of a CPU compile per shape (about
    30 s each on two cores); the GPU run compiles."""
    from heatformer.graph_ops.window import flex as window_flex

    if not window_flex.flex_available():
        return
    from torch.nn.attention import flex_attention as fa

    fa._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True
    window_flex._kernel = lambda: fa.flex_attention  # type: ignore[method-assign]


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    if a.get("median_s") is None or not b.get("median_s"):
        return None
    return float(a["median_s"] / b["median_s"])


def _error(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"


def section_laplacian_heads(env: Env, rec: Recorder, budget: float) -> None:
    torch = env.torch
    from heatformer.models import DiffusionAttention

    s = env.sizes["heads"]
    b, n, d, h = s["B"], s["N"], s["D"], s["H"]
    half = h // 2
    specs = [
        f"attention:{h}",
        f"attention:{h - 2},laplacian:2",
        f"attention:{half},laplacian:{half}",
    ]
    rec.put(
        "config",
        {
            **s,
            "dtype": str(env.dtype),
            "device": str(env.device),
            "causal": True,
            "specs": specs,
            "pass": "forward + backward",
        },
    )
    x = torch.randn(b, n, d, device=env.device, dtype=env.dtype, requires_grad=True)
    fns: dict[str, Callable[[], Any]] = {}
    for spec in specs:
        torch.manual_seed(0)
        layer = DiffusionAttention(d, h, spec, causal=True, device=env.device, dtype=env.dtype)

        def step(layer: Any = layer) -> None:
            x.grad = None
            layer.zero_grad(set_to_none=True)
            layer(x).sum().backward()

        fns[spec] = step
    qkv = [
        torch.randn(b, h, n, d // h, device=env.device, dtype=env.dtype, requires_grad=True)
        for _ in range(3)
    ]

    def sdpa() -> None:
        from torch.nn.functional import scaled_dot_product_attention

        if env.cuda:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                y = scaled_dot_product_attention(*qkv, is_causal=True)
        else:
            y = scaled_dot_product_attention(*qkv, is_causal=True)
        y.sum().backward()

    fns["flash sdpa alone (q, k, v given)"] = sdpa
    timings = env.compare(fns, budget_s=budget / 4)
    base = timings[specs[0]]
    for name, t in timings.items():
        rec.result(name, t | {"ratio": _ratio(t, base)})
    for spec in specs[1:]:
        rec.target(f"{spec} / {specs[0]} (layer fwd+bwd, N={n})", _ratio(timings[spec], base), 1.03)


def _count_propagations(graph: Any, fn: Callable[[], Any]) -> int:
    calls = 0
    original = graph.propagate

    def counting(x: Any) -> Any:
        nonlocal calls
        calls += 1
        return original(x)

    graph.propagate = counting
    try:
        fn()
    finally:
        del graph.propagate
    return calls


def section_heat_series(env: Env, rec: Recorder, budget: float) -> None:
    torch = env.torch
    from heatformer.graph_ops import SoftmaxGraph, WindowGraph, heat_kernel

    s = env.sizes["heat"]
    h, dh = s["H"], s["Dh"]
    w = env.sizes["window"]["w"]
    where = "" if env.cuda else " (window kind: the kernels backend on the CPU)"
    rec.put(
        "config",
        {
            **s,
            "t": 1.0,
            "tol": 1e-6,
            "method": "series",
            "window": w,
            "dtype": str(env.dtype),
            "device": str(env.device),
            "pass": "forward + backward" + where,
        },
    )
    kinds = {
        "dense softmax (causal)": (s["dense_N"], lambda q, k: SoftmaxGraph(q, k, causal=True)),
        f"window({w}) + 1 global (causal)": (
            s["window_N"],
            lambda q, k: WindowGraph(q, k, window=w, causal=True, num_global=1),
        ),
    }
    for kind, (n, make) in kinds.items():
        try:
            q, k, x = (
                torch.randn(1, h, n, dh, device=env.device, dtype=env.dtype, requires_grad=True)
                for _ in range(3)
            )

            def heat(make: Any = make, q: Any = q, k: Any = k, x: Any = x) -> None:
                heat_kernel(make(q, k), x, 1.0, method="series", tol=1e-6).sum().backward()

            def one(make: Any = make, q: Any = q, k: Any = k, x: Any = x) -> None:
                make(q, k).propagate(x).sum().backward()

            graph = make(q.detach(), k.detach())
            with torch.no_grad():
                terms = _count_propagations(
                    graph, lambda g=graph, x=x: heat_kernel(g, x.detach(), 1.0, method="series")
                )
            t = env.compare({"heat series": heat, "one propagate": one}, budget_s=budget / 6)
            per_term = None
            if t["heat series"]["median_s"] and t["one propagate"]["median_s"]:
                per_term = t["heat series"]["median_s"] / (terms * t["one propagate"]["median_s"])
            rec.result(kind, {"N": n, "K": terms, **t, "ratio_per_term": per_term})
            rec.target(f"heat series / (K x propagate), {kind}, N={n}", per_term, 1.1)
        except Exception as err:  # recorded, the next kind still runs
            rec.result(kind, {"N": n, "error": _error(err)})
        env.free()


def _window_case(env: Env, n: int, budget: float) -> dict[str, Any]:
    """One N of :func:`section_window_long`: timings, ratios to the peer, peak memory."""
    torch = env.torch
    import heatformer.graph_ops.window as window_module
    from heatformer.graph_ops import WindowGraph
    from heatformer.graph_ops.window import flex as window_flex

    s = env.sizes["window"]
    h, dh, w = s["H"], s["Dh"], s["w"]
    backward = env.flex_backward
    q, k, v = (
        torch.randn(1, h, n, dh, device=env.device, dtype=env.dtype, requires_grad=backward)
        for _ in range(3)
    )
    t0 = time.perf_counter()
    peer_mask = window_flex.window_block_mask(WindowGraph(q, k, window=w, causal=True).layout)
    env.sync()
    mask_s = time.perf_counter() - t0
    peer_kernel = window_flex._kernel()

    def finish(y: Any) -> None:
        if backward:
            y.sum().backward()

    def heatformer(backend: str) -> Callable[[], None]:
        def run() -> None:
            previous, window_module.BACKEND = window_module.BACKEND, backend
            try:
                graph = WindowGraph(q, k, window=w, causal=True, num_global=1)
                finish(graph.propagate(v))
            finally:
                window_module.BACKEND = previous

        return run

    def peer() -> None:
        finish(peer_kernel(q, k, v, block_mask=peer_mask))

    fns = {
        "heatformer auto": heatformer("auto"),
        "heatformer kernels": heatformer("kernels"),
        "flex sliding window (peer)": peer,
    }
    if env.dry:  # the CPU's default is the kernels: show the flex backend too
        fns["heatformer flex"] = heatformer("flex")
    graph = WindowGraph(q.detach(), k.detach(), window=w, causal=True, num_global=1)
    record: dict[str, Any] = {
        "auto_backend": "flex" if window_flex.use_flex(graph, "auto") else "kernels",
        "peer_mask_build_s": mask_s,
        "block_mask_bytes": window_flex.block_mask_bytes(n),
    }
    timings = env.compare(fns, budget_s=budget)
    base = timings["flex sliding window (peer)"]
    for name, t in timings.items():
        record[name] = t | {"ratio_to_peer": _ratio(t, base)}
    for name, fn in fns.items():
        try:
            record[name]["peak_bytes"] = env.peak(fn)
        except Exception as err:  # an out-of-memory of one is recorded
            record[name]["peak_bytes"] = None
            record[name]["peak_error"] = _error(err)
        env.free()
    return record


def section_window_long(env: Env, rec: Recorder, budget: float) -> None:
    from heatformer.graph_ops.window import flex as window_flex

    s = env.sizes["window"]
    rec.put(
        "config",
        {
            **s,
            "global": 1,
            "causal": True,
            "B": 1,
            "dtype": str(env.dtype),
            "device": str(env.device),
            "block_size": window_flex.DEFAULT_BLOCK_SIZE,
            "pass": "forward + backward" if env.flex_backward else "forward only (CPU flex)",
            "peer": "flex_attention with a sliding-window BlockMask from kv blocks "
            "(create_block_mask is O(N^2)), built once outside the timing",
        },
    )
    if not window_flex.flex_available():  # torch < 2.6: no BlockMask.from_kv_blocks(seq_lengths=)
        version = env.torch.__version__
        rec.result("all", {"skipped": f"FlexAttention unavailable in torch {version}"})
        return
    window_flex._kernel()  # a broken FlexAttention fails the section here
    start = time.perf_counter()
    for n in s["Ns"]:
        left = budget - (time.perf_counter() - start)
        if left < 5:
            rec.result(f"N={n}", {"skipped": f"section budget spent ({budget:.0f} s)"})
            continue
        try:
            record = _window_case(env, n, max(1.0, left / 4))
            rec.result(f"N={n}", record)
            rec.target(
                f"window+1 global (auto) / flex sliding window, N={n}",
                record["heatformer auto"].get("ratio_to_peer"),
                1.1,
            )
        except Exception as err:  # recorded, the next size still runs
            rec.result(f"N={n}", {"error": _error(err)})
        env.free()


def section_hf_gpt2(env: Env, rec: Recorder, budget: float) -> None:
    torch = env.torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from heatformer.integrations import hf

    s = env.sizes["gpt2"]
    heads = s["heads"]
    lap = heads // 4  # 2 of 8
    mixed = f"attention:{heads - lap},laplacian:{lap}"
    forms = {
        "transformers sdpa": None,
        f"heatformer attention:{heads}": "attention",
        f"heatformer {mixed}": mixed,
    }
    rec.put(
        "config",
        {
            **s,
            "dtype": str(env.dtype),
            "device": str(env.device),
            "pass": "forward + backward of the LM loss (bf16 on the GPU)",
            "forms": list(forms),
        },
    )
    config = GPT2Config(
        n_layer=s["layers"],
        n_embd=s["width"],
        n_head=heads,
        n_positions=s["N"],
        vocab_size=s["vocab"],
        attn_pdrop=0.0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    base = GPT2LMHeadModel._from_config(config, attn_implementation="sdpa")
    base = base.to(device=env.device, dtype=env.dtype)
    models = {
        name: base if spec is None else hf.convert(copy.deepcopy(base), spec)
        for name, spec in forms.items()
    }
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, s["vocab"], (s["B"], s["N"]), generator=gen).to(env.device)
    with torch.no_grad():
        diff = (
            (models[f"heatformer attention:{heads}"](ids).logits.float() - base(ids).logits.float())
            .abs()
            .max()
        )
    rec.result("max_abs_logit_diff_all_attention", float(diff))

    def step(model: Any) -> None:
        model.zero_grad(set_to_none=True)
        model(ids, labels=ids).loss.backward()

    fns = {name: (lambda m=m: step(m)) for name, m in models.items()}
    timings = env.compare(fns, budget_s=budget / 4)
    ref = timings["transformers sdpa"]
    for name, t in timings.items():
        rec.result(name, t | {"ratio": _ratio(t, ref)})
    names = list(forms)
    rec.target(f"{names[1]} / transformers sdpa", _ratio(timings[names[1]], ref), 1.05)
    rec.target(f"{names[2]} / transformers sdpa", _ratio(timings[names[2]], ref), 1.10)


def section_moonshot(env: Env, rec: Recorder, budget: float) -> None:
    torch = env.torch
    import heatformer.graph_ops.window as window_module
    from heatformer.graph_ops.window import flex as window_flex
    from heatformer.models import DiffusionAttention

    s, lay = env.sizes["moon"], env.sizes["moon_layer"]
    d, h, w = lay["D"], lay["H"], lay["w"]
    spec = f"heat[t=1.0;tol=1e-6]:{h}"
    rec.put(
        "config",
        {
            "D": d,
            "H": h,
            "spec": spec,
            "graph": f"window[w={w},global=1]",
            "causal": True,
            "dtype": str(env.dtype),
            "device": str(env.device),
            "sizes": s["Ns"],
            "pass": "forward + backward",
        },
    )
    torch.manual_seed(0)
    layer = DiffusionAttention(
        d, h, spec, graph=f"window[w={w},global=1]", causal=True, device=env.device, dtype=env.dtype
    )

    def run(n: int, backend: str = "auto") -> tuple[float, int | None]:
        previous, window_module.BACKEND = window_module.BACKEND, backend
        try:
            x = torch.randn(1, n, d, device=env.device, dtype=env.dtype, requires_grad=True)
            if env.cuda:
                torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated() if env.cuda else 0
            env.sync()
            t0 = time.perf_counter()
            layer(x).sum().backward()
            env.sync()
            elapsed = time.perf_counter() - t0
            peak = int(torch.cuda.max_memory_allocated() - base) if env.cuda else None
        finally:
            window_module.BACKEND = previous
            layer.zero_grad(set_to_none=True)
        return elapsed, peak

    start = time.perf_counter()
    run(4 * w)  # warm-up (kernels, compilation)
    run(4 * w, "kernels")
    # the probe runs the window kernels: "auto" takes them past MAX_TILE_PAIRS (N > 1M), so they
    # are what the largest sizes run, and the probe's time extrapolates to them
    probe_n = s["probe_N"]
    probe_s, probe_peak = run(probe_n, "kernels")
    rec.result(
        "probe", {"N": probe_n, "backend": "kernels", "time_s": probe_s, "peak_bytes": probe_peak}
    )
    found = None
    for n in s["Ns"]:
        left = budget - (time.perf_counter() - start)
        estimate = probe_s * n / probe_n * 1.3
        tiles = -(-n // window_flex.DEFAULT_BLOCK_SIZE)
        flex = (
            env.cuda
            and window_flex.flex_available()
            and tiles * tiles <= window_flex.MAX_TILE_PAIRS
        )
        backend = "flex" if flex else "kernels"
        if estimate > left - 5:
            rec.result(f"N={n}", {"skipped": f"estimated {estimate:.0f} s > {left:.0f} s left"})
            continue
        try:
            elapsed, peak = run(n)
            rec.result(f"N={n}", {"time_s": elapsed, "peak_bytes": peak, "backend": backend})
            found = n
            break
        except torch.cuda.OutOfMemoryError as err:
            rec.result(f"N={n}", {"oom": _error(err)})
        except Exception as err:  # recorded, the next size still runs
            rec.result(f"N={n}", {"error": _error(err)})
        env.free()
    rec.put("largest_N", found)


def run_section(name: str, out: Path, dry: bool, budget: float) -> int:
    """Child mode: one benchmark section; its record goes to ``out/sections/NAME.json``."""
    rec = Recorder(out / "sections" / f"{name}.json", name)
    t0 = time.perf_counter()
    try:
        env = Env(dry)
        rec.put("device", _device_name(env))
        {
            "laplacian_heads": section_laplacian_heads,
            "heat_series": section_heat_series,
            "window_long": section_window_long,
            "hf_gpt2": section_hf_gpt2,
            "moonshot": section_moonshot,
        }[name](env, rec, budget)
        rec.put("status", "ok")
        return 0
    except Exception as err:  # the parent records it and goes on
        rec.put("status", "error")
        rec.put("error", _error(err))
        rec.put("traceback", traceback.format_exc()[-3000:])
        return 1
    finally:
        rec.put("wall_s", time.perf_counter() - t0)


def _device_name(env: Env) -> str:
    if env.cuda:
        return str(env.torch.cuda.get_device_name(0))
    return "cpu (dry run)"


# ---- parent side --------------------------------------------------------------------------


#: the CUDA tests run first by the ``pytest`` section, in this order
FIRST_ON_CUDA = (
    "tests/test_syncs.py",
    "tests/graph_ops/test_flex.py",
    "tests/models",
    "tests/integrations",
    "tests/analysis",
    "tests/graph_ops",
)


def _pytest(out: Path, dry: bool, budget: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-x", "-q", "-p", "no:cacheprovider"]
    if dry:  # the CUDA tests of one file, which skip on the CPU
        cmd += ["tests/graph_ops/test_flex.py", "-k", "cuda_auto"]
    else:  # what is new on CUDA first (syncs, FlexAttention, layers), the 3000-cell matrix last,
        # so that a run cut by the budget has tested those (pytest collects a file once)
        cmd += [*FIRST_ON_CUDA, "tests"]
    path = [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    t0 = time.perf_counter()
    record: dict[str, Any] = {"section": "pytest", "command": " ".join(cmd[1:])}
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget, env=env, check=False
        )
        text = proc.stdout + proc.stderr
        record["rc"] = proc.returncode
        record["status"] = {0: "ok", 1: "failed", 5: "no tests"}.get(proc.returncode, "error")
    except subprocess.TimeoutExpired as err:
        text = (err.stdout or b"").decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        record["rc"] = None
        record["status"] = "timeout"
        record["error"] = f"timed out after {budget:.0f} s"
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    summary = [ln for ln in lines if any(w in ln for w in ("passed", "failed", "skipped", "error"))]
    record["summary"] = summary[-1].strip("= ") if summary else (lines[-1] if lines else "")
    record["tail"] = "\n".join(lines[-40:])
    record["wall_s"] = time.perf_counter() - t0
    (out / "sections" / "pytest.json").write_text(json.dumps(record, indent=1))
    return record


def _child(name: str, out: Path, dry: bool, budget: float) -> dict[str, Any]:
    path = out / "sections" / f"{name}.json"
    path.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--child", name, "--out", str(out), "--budget", f"{budget}"]
    cmd += ["--dry-run"] if dry else []
    t0 = time.perf_counter()
    # start-up (imports, CUDA) and the last measurement's end; the dry run's start-up is most of
    # it, and slow on a busy machine
    timeout = budget + (90 if dry else 30)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        rc: int | None = proc.returncode
        stderr = proc.stderr
    except subprocess.TimeoutExpired as err:
        rc, stderr = None, (err.stderr or b"").decode() if isinstance(err.stderr, bytes) else ""
    record: dict[str, Any] = {"section": name, "results": {}}
    if path.exists():
        try:
            record = json.loads(path.read_text())
        except json.JSONDecodeError:
            pass
    if rc is None:
        record["status"] = "timeout"
        record["error"] = f"killed after {timeout:.0f} s (what it measured before is kept)"
    elif rc != 0 and record.get("status") in (None, "running", "ok"):
        record["status"] = "error"
        tail = [ln for ln in stderr.strip().splitlines() if ln.strip()][-5:]
        record["error"] = f"exit {rc}: " + " | ".join(tail)
    record["process_wall_s"] = time.perf_counter() - t0
    path.write_text(json.dumps(record, indent=1, default=str))
    return record


def _fmt(value: Any) -> str:
    from _common import fmt_bytes, fmt_time

    if isinstance(value, dict):
        if "median_s" in value:
            return fmt_time(value["median_s"]) + f" (n={value.get('runs')})"
        return json.dumps(value, default=str)[:80]
    if isinstance(value, float):
        return f"{value:.4g}"
    return fmt_bytes(value) if isinstance(value, int) and value > 1 << 20 else str(value)


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: the run, the targets, then one table per section."""
    from _common import fmt_bytes, fmt_time

    meta = report["meta"]
    lines = [
        "# GPU check",
        "",
        f"- device: {meta['device']}; torch {meta['torch']}; commit {meta['commit']}",
        f"- started {meta['started']}; wall {meta['wall_s']:.0f} s (deadline {meta['deadline_s']:.0f} s)"  # noqa: E501
        + ("; **dry run on the CPU** (tiny sizes, not a measurement)" if meta["dry_run"] else ""),
        "",
        "## Targets",
        "",
        "| target | measured | limit | verdict |",
        "|---|---|---|---|",
    ]
    for sec in report["sections"].values():
        for t in sec.get("targets", []):
            verdict = {True: "PASS", False: "FAIL", None: "-"}[t["pass"]]
            measured = "-" if t["measured"] is None else f"{t['measured']:.3f}x"
            lines.append(f"| {t['name']} | {measured} | <= {t['target']}x | {verdict} |")
    lines += ["", "## Sections", "", "| section | status | wall | note |", "|---|---|---|---|"]
    for name, sec in report["sections"].items():
        note = sec.get("error") or sec.get("reason") or sec.get("summary") or ""
        wall = sec.get("process_wall_s", sec.get("wall_s"))
        lines.append(f"| {name} | {sec.get('status')} | {fmt_time(wall)} | {str(note)[:120]} |")
    for name, sec in report["sections"].items():
        results = sec.get("results") or {}
        if not results:
            continue
        lines += ["", f"### {name}", ""]
        if sec.get("config"):
            lines += [f"config: `{json.dumps(sec['config'], default=str)}`", ""]
        lines += ["| case | measurement | median | ratio | peak memory |", "|---|---|---|---|---|"]
        for case, value in results.items():
            if not isinstance(value, dict):
                lines.append(f"| {case} | value | {_fmt(value)} | | |")
                continue
            subs = {k: v for k, v in value.items() if isinstance(v, dict) and "median_s" in v}
            if not subs:
                subs = {"": value}
            for sub, v in subs.items():
                ratio = v.get("ratio", v.get("ratio_to_peer", value.get("ratio_per_term")))
                median = v.get("median_s", v.get("time_s"))
                extra = {
                    k: x
                    for k, x in v.items()
                    if k
                    not in (
                        "median_s",
                        "runs",
                        "times_s",
                        "warmup_s",
                        "ratio",
                        "ratio_to_peer",
                        "peak_bytes",
                        "time_s",
                    )
                }
                label = sub or ", ".join(f"{k}={x}" for k, x in extra.items())[:100]
                if sub and "K" in value:  # heat series: the propagations per call
                    label += f" (K={value['K']}, N={value.get('N')})"
                lines.append(
                    f"| {case} | {label} | {fmt_time(median)} | "
                    f"{'-' if ratio is None else f'{ratio:.3f}x'} | {fmt_bytes(v.get('peak_bytes'))} |"  # noqa: E501
                )
    return "\n".join(lines) + "\n"


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-check"), help="report folder")
    parser.add_argument(
        "--dry-run", action="store_true", help="every section on the CPU at tiny sizes, no GPU"
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=DEADLINE,
        help=f"seconds for the whole run (default {DEADLINE:.0f})",
    )
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated subset of {','.join(SECTIONS)}",
    )
    parser.add_argument("--child", choices=SECTIONS[1:], help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=float, default=60.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out: Path = args.out
    if args.child:
        return run_section(args.child, out, args.dry_run, args.budget)

    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print(
            f"gpu_check: no CUDA device (torch {torch.__version__}, built for CUDA "
            f"{torch.version.cuda}); run it on a machine with a GPU (make gpu-check "
            "TORCH_SPEC=torch), or pass --dry-run for the CPU rehearsal",
            file=sys.stderr,
        )
        return 2
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(wanted) - set(SECTIONS))
    if unknown:
        parser.error(f"--sections: unknown {', '.join(unknown)}; expected some of {SECTIONS}")
    (out / "sections").mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    t0 = time.perf_counter()
    scale = 0.25 if args.dry_run else 1.0
    device = "cpu (dry run)" if args.dry_run else torch.cuda.get_device_name(0)
    report: dict[str, Any] = {
        "meta": {
            "dry_run": args.dry_run,
            "device": device,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "commit": _commit(),
            "started": started,
            "deadline_s": args.deadline,
            "python": sys.version.split()[0],
        },
        "sections": {},
    }
    for name in SECTIONS:
        left = args.deadline - (time.perf_counter() - t0)
        budget = min(BUDGETS[name] * scale, left - 10)
        if name not in wanted:
            report["sections"][name] = {"status": "skipped", "reason": "not in --sections"}
            continue
        if budget < 10 * scale:
            report["sections"][name] = {
                "status": "skipped",
                "reason": f"global deadline: {max(left, 0):.0f} s of {args.deadline:.0f} s left",
            }
            continue
        print(f"gpu_check: {name} (budget {budget:.0f} s) ...", flush=True)
        if name == "pytest":
            rec = _pytest(out, args.dry_run, budget)
        else:
            rec = _child(name, out, args.dry_run, budget)
        report["sections"][name] = rec
        print(
            f"gpu_check: {name}: {rec.get('status')} in {time.perf_counter() - t0:.0f} s "
            f"{rec.get('error', '')}",
            flush=True,
        )
    report["meta"]["wall_s"] = time.perf_counter() - t0
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    table = markdown(report)
    (out / "gpu_check.md").write_text(table)
    print(table)
    print(f"gpu_check: wrote {out / 'gpu_check.json'} and {out / 'gpu_check.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
