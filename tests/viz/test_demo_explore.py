"""The interactive page's numbers (``explorer_data``) and its file (``explore.html``).

The numbers are checked against exact answers (SciPy's ``expm``, a dense solve, NetworkX-free
Laplacians built by hand) and against the library's own functions; the page is checked to be
self-contained (no URL to fetch, the packaged script inline, the JSON exactly the data). The
browser test (``test_demo_browser.py``) checks what the page shows.
"""

from __future__ import annotations

import configparser
import json
import re
from importlib import resources
from pathlib import Path

import pytest
import scipy.linalg
import torch

from heatformer.analysis import LayerSnapshot, dirichlet_energy
from heatformer.graph_ops import Attention, DenseGraph, Laplacian, SoftmaxGraph
from heatformer.lab.demo import demo_from_snapshots, write_demo
from heatformer.lab.demo.explore import EXPLORE_TIMES, explorer_data, write_explorer

ROOT = Path(__file__).resolve().parents[2]
TEXT = "def add(a, b): return a + b"


def _data(text: str = TEXT, *, causal: bool = True, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    n, snaps = len(text), []
    for _ in range(2):
        q, k = (torch.randn(4, n, 8, generator=gen, dtype=torch.float64) for _ in range(2))
        graph = DenseGraph(SoftmaxGraph(q, k, causal=causal).to_dense())  # (H, N, N)
        values = torch.randn(4, n, 8, generator=gen, dtype=torch.float64)  # (H, N, Dh)
        ops = (Attention(), Attention(), Laplacian(), Laplacian())
        snaps.append(LayerSnapshot(graph, values, ops))
    return demo_from_snapshots(snaps, text=text, source=5)


@pytest.fixture(scope="module")
def data():
    return _data()


@pytest.fixture(scope="module")
def numbers(data):
    return explorer_data(data)


def _micro(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64) / 1e6


@pytest.mark.parametrize("causal", [True, False])
def test_every_head_s_operators_equal_exact_answers(causal: bool) -> None:
    data = _data(causal=causal)
    numbers = explorer_data(data)
    n = len(TEXT)
    eye = torch.eye(n, dtype=torch.float64)
    assert numbers["times"] == list(EXPLORE_TIMES) and numbers["digits"] == 6
    assert numbers["labels"][3] == "␣" and numbers["source"] == 5
    for li in range(2):
        for h in range(4):
            one = numbers["heads"][li][h]
            p = data.attention[li, h]  # (N, N)
            torch.testing.assert_close(
                torch.tensor(one["attention"], dtype=torch.float64), p, rtol=0, atol=1e-12
            )
            torch.testing.assert_close(_micro(one["laplacian"]), eye - p, rtol=0, atol=5e-7)
            ppr = 0.15 * torch.linalg.inv(eye - 0.85 * p)
            torch.testing.assert_close(_micro(one["ppr"]), ppr, rtol=0, atol=5e-7)
            for t, kernel, inf, mass in zip(
                numbers["times"], one["heat"], one["totals"]["heat"]["influence"],
                one["totals"]["heat"]["mass"],
            ):  # fmt: skip
                golden = torch.from_numpy(scipy.linalg.expm(-t * (eye - p).numpy()))
                torch.testing.assert_close(_micro(kernel), golden, rtol=0, atol=5e-7)
                # both views' totals: column sums (not conserved), row sums (conserved)
                torch.testing.assert_close(
                    torch.tensor(inf, dtype=torch.float64), golden.sum(0), rtol=0, atol=1e-11
                )
                assert max(abs(m - 1.0) for m in mass) <= 1e-12
            assert one["totals"]["ppr"]["mass"] == pytest.approx([1.0] * n, abs=1e-12)
            assert one["totals"]["attention"]["influence"] == pytest.approx(p.sum(0).tolist())


def test_energy_and_eigenvectors_are_the_symmetrized_laplacian_s(data, numbers) -> None:
    one = numbers["heads"][data.layer][data.attention_head]
    p = data.attention[data.layer, data.attention_head]
    n = p.shape[0]
    ws = 0.5 * (p + p.T)
    lap_s = torch.diag(ws.sum(1)) - ws  # D_s - W_s
    graph = DenseGraph(p).symmetrize()
    eye = torch.eye(n, dtype=torch.float64)
    for ti, t in enumerate(numbers["times"]):
        kernel = torch.from_numpy(scipy.linalg.expm(-t * (eye - p).numpy()))
        for j in (0, 5, n - 1):
            u, m = kernel[:, j], kernel[j, :]
            for view, x in (("influence", u), ("mass", m)):
                library = float(dirichlet_energy(graph, x.unsqueeze(-1), "combinatorial"))
                assert one["energy"][view][ti][j] == pytest.approx(library, abs=1e-10)
                assert one["energy"][view][ti][j] == pytest.approx(float(x @ lap_s @ x), abs=1e-10)
    # the influence view is smoothed: its energy ends lower than it starts, from every token
    first, last = one["energy"]["influence"][0], one["energy"]["influence"][-1]
    assert all(b < a for a, b in zip(first, last))
    evals = torch.tensor(one["eigenvalues"], dtype=torch.float64)
    evecs = _micro(one["eigenvectors"])  # row k: eigenvector k
    torch.testing.assert_close(evals, torch.linalg.eigvalsh(lap_s), rtol=0, atol=1e-11)
    assert bool((evals[1:] >= evals[:-1]).all()) and abs(float(evals[0])) < 1e-12
    torch.testing.assert_close(evecs @ lap_s, evals[:, None] * evecs, rtol=0, atol=1e-5)
    torch.testing.assert_close(evecs[0], torch.full((n,), n**-0.5, dtype=torch.float64), atol=1e-6,
                               rtol=0)  # fmt: skip
    assert all(float(v[v.abs().argmax()]) > 0 for v in evecs)  # the sign convention


def test_the_page_is_self_contained_and_embeds_the_numbers(data, numbers, tmp_path) -> None:
    path = write_explorer(tmp_path, data)
    page = path.read_text(encoding="utf-8")
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=", page)  # nothing to fetch
    # the only URL is the SVG namespace, a name that is never fetched
    assert set(re.findall(r"https?://[^\s\"'`]+", page)) == {"http://www.w3.org/2000/svg"}
    script = resources.files("heatformer.lab.demo").joinpath("explore.js").read_text("utf-8")
    assert f"<script>{script}</script>" in page
    embedded = re.search(r'<script type="application/json" id="demo-data">(.*?)</script>', page,
                         re.S).group(1)  # fmt: skip
    assert json.loads(embedded.replace("<\\/", "</")) == json.loads(json.dumps(numbers))
    assert len(page.encode()) < 1_000_000  # the default sentence: under a megabyte


def test_the_page_of_64_tokens_stays_reasonably_small(tmp_path) -> None:
    data = _data("abcdefgh" * 8)
    size = len(write_explorer(tmp_path, data).read_bytes())
    assert size < 4_000_000, f"{size / 1e6:.1f} MB"


def test_the_script_is_package_data() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    assert config["options.package_data"]["heatformer.lab.demo"].split() == ["explore.js"]
    assert (ROOT / "src/heatformer/lab/demo/explore.js").is_file()


def test_write_demo_writes_the_interactive_page_next_to_index(data, tmp_path) -> None:
    result = write_demo(tmp_path / "with", data, gif=False)
    assert result.explore_html == tmp_path / "with" / "explore.html"
    assert result.explore_html.is_file() and result.explore_html not in result.files
    assert '<a href="explore.html">Play with it</a>' in result.index_html.read_text("utf-8")
    bare = write_demo(tmp_path / "without", data, gif=False, explore=False)
    assert bare.explore_html is None and not (tmp_path / "without" / "explore.html").exists()
    assert "explore.html" not in bare.index_html.read_text("utf-8")


def test_explorer_data_refuses_bad_input(data) -> None:
    with pytest.raises(ValueError, match="times: expected increasing times starting at 0"):
        explorer_data(data, times=(0.5, 1.0))
    with pytest.raises(ValueError, match="times: expected increasing times starting at 0"):
        explorer_data(data, times=(0.0, 1.0, 1.0))
    with pytest.raises(ValueError, match=r"alpha: expected a number in \(0, 1\), got 1"):
        explorer_data(data, alpha=1)
