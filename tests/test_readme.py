"""The README's Python examples run as written (so they never rot)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 1


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int) -> None:
    namespace: dict[str, object] = {"__name__": "__readme__"}
    exec(compile(BLOCKS[index], f"README.md[{index}]", "exec"), namespace)
