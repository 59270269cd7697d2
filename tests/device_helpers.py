"""The devices of the device-generic tests and their tolerances, stated once.

Every test that takes the ``device`` fixture (``tests/conftest.py``) or parametrizes over
:data:`DEVICES` runs on the CPU always and on CUDA where ``torch.cuda.is_available()``; the
CUDA cases carry the ``cuda`` marker, so ``pytest -m cuda`` is the whole CUDA test run. On a
machine without CUDA they are collected and skipped at setup with :data:`SKIP_REASON` (no
test body runs: they cost the CPU run nothing but their collection).

Inputs are drawn on the CPU (``torch.Generator()``) and moved with ``.to(device)``, so both
devices see the same numbers; float64 references are computed on the test's device (float64
is IEEE double on both) or, for NumPy/SciPy oracles, on the CPU.

Test modules import it directly (``from device_helpers import ...``; ``tests/`` is on
``sys.path``).
"""

from __future__ import annotations

import pytest
import torch

#: why a CUDA case is skipped on a machine without CUDA (the meta-test asserts this reason)
SKIP_REASON = "needs a CUDA device"

#: ``pytest.mark.parametrize("device", DEVICES)`` / the ``device`` fixture's params: the CPU,
#: then CUDA, marked ``cuda`` and skipped where there is none
DEVICES = [
    pytest.param(torch.device("cpu"), id="cpu"),
    pytest.param(
        torch.device("cuda"),
        id="cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(not torch.cuda.is_available(), reason=SKIP_REASON),
        ],
    ),
]

#: relative tolerance per device type and dtype, for ``max|y - y64| <= TOL * (max|y64| + 1)``
#: against the float64 computation on the same (rounded) inputs.
#:
#: CPU: about 10 units of rounding of the dtype (float64: against the explicit-weights
#: computation); these are the values the combination matrix has always used.
#:
#: CUDA (not yet measured on a GPU; the first run of ``pytest -m cuda`` confirms them):
#:
#: - float64 as on the CPU: IEEE double on both; cuBLAS/cuSPARSE reduction orders move a
#:   result by a few units of 2^-53, far below 1e-9.
#: - float32 1e-3 (CPU 1e-4): a user's ``torch.backends.cuda.matmul.allow_tf32`` /
#:   ``torch.set_float32_matmul_precision("high")`` makes cuBLAS multiply in TF32 (10-bit
#:   mantissa, unit roundoff 2^-11 = 4.9e-4); SDPA's memory-efficient kernel and split-K
#:   reductions sum in other orders than the CPU. Two TF32 roundings of the largest term.
#: - float16 4e-2 and bfloat16 1.6e-1 (twice the CPU's): the flash and memory-efficient
#:   SDPA kernels round the probabilities ``P`` to the input dtype before ``P V`` (the CPU's
#:   math path keeps them in float32), one more rounding per propagation, which a heat or PPR
#:   series repeats on every term (the Poisson weights sum to 1: at most ``t`` more units).
TOL: dict[str, dict[torch.dtype, float]] = {
    "cpu": {
        torch.float64: 1e-9,
        torch.float32: 1e-4,
        torch.float16: 2e-2,
        torch.bfloat16: 8e-2,
    },
    "cuda": {
        torch.float64: 1e-9,
        torch.float32: 1e-3,
        torch.float16: 4e-2,
        torch.bfloat16: 1.6e-1,
    },
}

#: ``torch.testing.assert_close`` keywords of the float64 equivalences of the layer and
#: model tests (the layer against ``nn.MultiheadAttention``, SDPA and its explicit update,
#: cached against full decoding, conversions against the converted model), on every device:
#: float64 stays float64 on CUDA (SDPA's math kernel; no TF32 or flash kernel in double)
TIGHT: dict[str, float] = {"atol": 1e-12, "rtol": 1e-10}


def tolerance(device: torch.device | str, dtype: torch.dtype) -> float:
    """The relative tolerance of :data:`TOL` for a device (``"cpu"``, ``"cuda:0"``, ...) and a
    dtype."""
    kind = torch.device(device).type
    if kind not in TOL:
        raise ValueError(f"device: expected one of {sorted(TOL)}, got {kind!r}")
    return TOL[kind][dtype]


def close(
    device: torch.device | str, dtype: torch.dtype, *, atol: float, rtol: float
) -> dict[str, float]:
    """``assert_close`` keywords: a test's CPU tolerances ``atol``, ``rtol`` for ``dtype``, as
    they are on the CPU, and scaled on another device by the ratio of its :data:`TOL` to the
    CPU's (float32 on CUDA: 10 times; float64: unchanged).

    For the float32 equivalences against other libraries' attention (``nn.MultiheadAttention``,
    Hugging Face's sdpa, timm), whose tolerances each test states for the CPU."""
    factor = tolerance(device, dtype) / TOL["cpu"][dtype]
    return {"atol": atol * factor, "rtol": rtol * factor}


def generator(device: torch.device | str, seed: int) -> torch.Generator:
    """A generator on ``device`` (what sampling on that device, e.g. ``GPT.generate``, needs)."""
    return torch.Generator(device=torch.device(device)).manual_seed(seed)
