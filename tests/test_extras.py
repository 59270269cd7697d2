"""The library runs with torch and numpy alone; every other package is an extra that a feature
names when it is missing, and the library never imports the lab.

Each check runs in a fresh interpreter in which the optional packages cannot be imported (an
import hook refuses them, as if they were not installed), so what passes here passes for a user
who ran ``pip install heatformer`` and nothing else. ``tests/test_packaging.py`` checks the
declared requirements themselves (torch and numpy only) on the built wheel.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: every optional package the library or the lab may import (import names)
OPTIONAL = (
    "networkx", "scipy", "sklearn", "tqdm", "matplotlib", "transformers", "timm",
    "torch_geometric", "PIL", "pandas", "statsmodels", "huggingface_hub", "tensorboard",
)  # fmt: skip

#: put first on sys.path of the child: the optional packages are not there for it
_BLOCKER = f"""
import sys
BLOCKED = {OPTIONAL!r}

class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""


def _run(code: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "sitecustomize.py").write_text(_BLOCKER)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src")]),
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, *(["-c", code] if code else []), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def _readme_library_blocks() -> list[str]:
    """The README's Python examples (library code), less those that start the ``heatformer``
    command in a child process: the lab needs its extra (``tests/test_readme.py`` runs them)."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    return [block for block in blocks if '"-m", "heatformer"' not in block]


def test_the_readme_examples_run_with_torch_and_numpy_alone(tmp_path: Path) -> None:
    blocks = _readme_library_blocks()
    assert blocks
    code = textwrap.dedent(
        """
        import json, sys
        for block in json.loads(sys.argv[1]):
            exec(compile(block, "README.md", "exec"), {"__name__": "__readme__"})
        import heatformer.analysis, heatformer.graph_ops, heatformer.integrations
        import heatformer.datasets, heatformer.models, heatformer.registry, heatformer.viz
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in sys.argv[2].split(","))
        print(json.dumps({"optional": loaded,
                          "lab": sorted(m for m in sys.modules if m.startswith("heatformer.lab"))}))
        """
    )
    done = _run(code, tmp_path, json.dumps(blocks), ",".join(OPTIONAL))
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"optional": [], "lab": []}  # the library never imports the lab


#: a feature of the library -> its error without the extra that brings what it needs
FEATURES = {
    "graph.to_networkx()": "to_networkx needs networkx: pip install 'heatformer[networkx]'",
    "graph.to_scipy()": "to_scipy needs scipy: pip install 'heatformer[scipy]'",
    "graph.to_pyg()": "to_pyg needs torch_geometric: pip install 'heatformer[pyg]'",
    "DenseGraph.from_networkx(None)": (
        "DenseGraph.from_networkx needs networkx: pip install 'heatformer[networkx]'"
    ),
    "heatformer.viz.plot_attention_matrix(graph)": (
        "heatformer.viz needs matplotlib: pip install 'heatformer[viz]'"
    ),
}


def test_a_feature_whose_extra_is_missing_names_it(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import json, sys, torch, heatformer.viz
        from heatformer.graph_ops import DenseGraph
        graph, seen = DenseGraph(torch.rand(3, 3)), {}
        for call in json.loads(sys.argv[1]):
            try:
                eval(call)
            except ImportError as err:
                seen[call] = str(err)
        print(json.dumps(seen))
        """
    )
    done = _run(code, tmp_path, json.dumps(list(FEATURES)))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == FEATURES


def test_the_command_without_the_lab_extra_says_how_to_get_it(tmp_path: Path) -> None:
    done = _run("", tmp_path, "-m", "heatformer", "compare", "--help")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == (
        "heatformer: the command is the lab's and needs its extra (missing: scipy, sklearn, "
        "tqdm, matplotlib, networkx): pip install 'heatformer[lab]'"
    )
