"""The command's heap (``heatformer.lab.cli._heap``): large freed tensors leave the process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from heatformer.lab import cli
from heatformer.lab.cli import _heap

_PROBE = textwrap.dedent(
    """
    import ctypes, sys
    from heatformer.lab.cli._heap import _libc, fix_mmap_threshold

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks",
                    "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = _libc()
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    fixed = sys.argv[1] == "fix" and fix_mmap_threshold()
    libc.free(libc.malloc(20 << 20))  # a freed 20 MiB mapping: the dynamic threshold rises
    before = libc.mallinfo2().hblkhd
    kept = libc.malloc(5 << 20)
    print(fixed, (libc.mallinfo2().hblkhd - before) >> 20)
    """
)


def _probe(mode: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True,
                          check=True, env=env).stdout.split()  # fmt: skip


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or _heap._libc() is None, reason="needs glibc"
)
def test_a_fixed_threshold_maps_large_blocks_after_a_larger_one_was_freed() -> None:
    # glibc's default: freeing the 20 MiB mapping raises the threshold, so the next 5 MiB
    # block comes from the heap (0 MiB mapped); fixed (at 1 MiB) it is mapped (5 MiB)
    assert _probe("default") == ["False", "0"]
    assert _probe("fix") == ["True", "5"]
    import os

    chosen = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(64 << 20)}
    assert _probe("fix", chosen)[0] == "False"  # the user's setting wins


def test_the_command_fixes_the_threshold_and_checks_the_argument(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(cli, "fix_mmap_threshold", lambda: calls.append(1) or True)
    assert cli.main([]) == 0  # the help page
    assert calls == [1]
    with pytest.raises(ValueError, match="threshold") as info:
        _heap.fix_mmap_threshold(64 << 20)
    assert getattr(info.value, "argument", None) == "threshold"
