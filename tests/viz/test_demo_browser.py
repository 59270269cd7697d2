"""The demo pages render in a real browser (headless Chromium).

The static page: every image loads, and a screenshot is not blank. The interactive page
(``explore.html``, opened from disk: no server) is driven over the DevTools protocol
(``tests/cdp_helpers.py``, Chromium's ``--remote-debugging-pipe``, no extra package) with
real mouse and key events: the ``t`` slider moves, another token is clicked, the step-by-step
method is switched on, an edge is hovered, and every displayed total and node value is
compared with the numbers Python computes with heatformer's heat kernel from the page's own
``P``; the page logs no console error, and a screenshot has the expected layout. On a page of
word pieces with ``[CLS]`` on the darkest node, every label is checked to read on its node
(WCAG contrast from the rendered colours), the colour bars to say that colour follows the
square root of the value (and the nodes' colours to do so), and the notes and totals to say
what each operator's views are. On both pages the random walk's panels draw, for the head
picked, TokenRank as node area (``π`` from numpy's ``eig`` of ``Pᵀ``) and ``v₂`` as node colour
(numpy's ``eig`` of ``P``), print ``λ₂`` and show the words Python wrote of that head.

Skipped only when no Chromium is installed (``.ci/run`` installs Debian's ``chromium``).
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import viz_helpers as vh
from cdp_helpers import CHROMIUM, Browser
from heatformer.analysis import LayerSnapshot
from heatformer.graph_ops import Attention, DenseGraph, Laplacian, SoftmaxGraph, heat_kernel
from heatformer.lab.demo import demo_from_snapshots
from heatformer.lab.demo.explore import write_explorer

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Chromium (apt-get install chromium; .ci/run installs it)"
)

# writes, after the load event, the natural width of every image (-1 = not loaded) into the DOM
PROBE = (
    '<script>window.addEventListener("load", () => { document.body.dataset.images = '
    'Array.from(document.images).map(i => i.complete ? i.naturalWidth : -1).join(","); });'
    "</script>"
)


def _chromium(*args: str, profile: Path) -> str:
    command = [
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}", *args,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.fixture
def served(demo, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The demo folder served on 127.0.0.1 by http.server in a thread; yields the base URL."""
    result, _ = demo
    page = result.index_html.read_text(encoding="utf-8")
    (result.out_dir / "probe.html").write_text(page.replace("</body>", PROBE + "</body>"))
    handler = functools.partial(_QuietHandler, directory=str(result.out_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", tmp_path
    finally:
        server.shutdown()
        server.server_close()
        (result.out_dir / "probe.html").unlink()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        return None


def test_every_image_loads(served, demo) -> None:
    url, tmp = served
    dom = _chromium("--virtual-time-budget=10000", "--dump-dom", f"{url}/probe.html",
                    profile=tmp / "profile-dom")  # fmt: skip
    match = re.search(r'data-images="([^"]*)"', dom)
    assert match, "the load event never fired"
    widths = [int(w) for w in match.group(1).split(",")]
    result, _ = demo
    assert len(widths) == len(result.files) == 9
    assert all(w > 300 for w in widths), widths


def test_screenshot_is_not_blank(served) -> None:
    from PIL import Image, ImageStat

    url, tmp = served
    shot = tmp / "page.png"
    _chromium(f"--screenshot={shot}", "--window-size=1200,1800", "--virtual-time-budget=10000",
              f"{url}/index.html", profile=tmp / "profile-shot")  # fmt: skip
    with Image.open(shot) as image:
        assert image.size == (1200, 1800)
        gray = image.convert("L")
        stat = ImageStat.Stat(gray)
        assert stat.stddev[0] > 20, f"blank page? pixel std {stat.stddev[0]:.1f}"
        # the first picture (attention graph) has coloured nodes: not only grey text
        hsv = image.convert("HSV")
        saturated = sum(hsv.getchannel("S").histogram()[121:])
        assert saturated > 2000


# ---- the interactive page -------------------------------------------------------------------


def _numbers(page: Path) -> dict:
    text = page.read_text(encoding="utf-8")
    embedded = re.search(r'<script type="application/json" id="demo-data">(.*?)</script>', text,
                         re.S).group(1)  # fmt: skip
    return json.loads(embedded.replace("<\\/", "</"))


SHOWN = """(() => {
  const num = (id) => Number(document.getElementById(id).value);
  const text = (id) => document.getElementById(id).textContent;
  const total = (id) => Number(text(id).match(/= (-?[0-9.]+)/)[1]);
  const cells = (cls) => Array.from(document.querySelectorAll(`#values td.${cls}`))
    .map((td) => Number(td.textContent));
  const nodes = Array.from(document.querySelectorAll("#graph-influence g.node"));
  return { layer: num("layer"), head: num("head"), source: num("source"), ti: num("t"),
    t: Number(text("t-value")), op: document.getElementById("op").value,
    method: document.getElementById("method").value, steps: num("steps"),
    influence: total("total-influence"), mass: total("total-mass"),
    u: cells("influence"), m: cells("mass"), graph: nodes.map((g) => Number(g.dataset.value)) };
})()"""

HIT = """(() => { const e = document.elementFromPoint(%r, %r);
  return [e.dataset.i, e.dataset.j, document.getElementById("tip").textContent]; })()"""


def _shown(b: Browser) -> dict:
    """What the page shows now: the pickers, t, both totals and every node value."""
    return b.js(SHOWN)


def _python(numbers: dict, shown: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Python's influence and mass views for the shown layer, head, token and t: heatformer's
    heat kernel on the page's own P (exact method), nothing taken from the page's answers."""
    p = torch.tensor(numbers["heads"][shown["layer"]][shown["head"]]["attention"],
                     dtype=torch.float64)  # fmt: skip
    n, j = p.shape[0], shown["source"]
    kernel = heat_kernel(DenseGraph(p), torch.eye(n, dtype=torch.float64), shown["t"],
                         method="exact")  # fmt: skip
    return kernel[:, j], kernel[j, :]  # exp(-tL) e_j, exp(-tL^T) e_j


def _assert_shows(shown: dict, u: torch.Tensor, m: torch.Tensor) -> None:
    assert shown["influence"] == pytest.approx(float(u.sum()), abs=6e-7)  # 6 decimals shown
    assert shown["mass"] == pytest.approx(float(m.sum()), abs=6e-7)
    assert shown["u"] == pytest.approx(u.tolist(), abs=5.1e-5)  # 4 decimals shown
    assert shown["m"] == pytest.approx(m.tolist(), abs=5.1e-5)
    assert shown["graph"] == pytest.approx(u.tolist(), abs=6e-7)  # the nodes' colours' values


WALK = """(() => {
  const nodes = (id) => Array.from(document.querySelectorAll(`#${id} g.node`)).map((g) => ({
    value: Number(g.dataset.value), r: Number(g.querySelector("circle").getAttribute("r")) }));
  const text = (id) => document.getElementById(id).textContent;
  return { rank: nodes("graph-tokenrank"), walk: nodes("graph-walk"),
    notes: [text("note-tokenrank"), text("note-walk")],
    totals: [text("total-tokenrank"), text("total-walk")] };
})()"""


def _assert_walk(b: Browser, numbers: dict, layer: int, head: int) -> dict:
    """The walk's panels show head ``head`` of layer ``layer``: node values and areas of
    TokenRank, node values of v₂ and λ₂ as numpy computes them from the page's own ``P``, and
    the words Python wrote of that head."""
    shown = b.js(WALK)
    one = numbers["heads"][layer][head]
    p = np.array(one["attention"], dtype=np.float64)
    pi = vh.stationary_reference(p)
    assert [n["value"] for n in shown["rank"]] == pytest.approx(pi.tolist(), abs=1e-9)
    radii = np.array([n["r"] for n in shown["rank"]])
    np.testing.assert_allclose(radii, radii.max() * np.sqrt(pi / pi.max()), atol=1e-3)  # area
    v2, lam2 = vh.second_eigenvector_reference(p)
    assert [n["value"] for n in shown["walk"]] == pytest.approx(v2.real.tolist(), abs=1e-7)
    assert len({n["r"] for n in shown["walk"]}) == 1  # v_2: one size, colour only
    assert f"λ₂ = {lam2.real:.4f}" in shown["totals"][1]
    assert f"spectral gap 1 − |λ₂| = {1 - abs(lam2):.4f}" in shown["totals"][1]
    assert shown["notes"] == [one["walk"]["pi_text"], one["walk"]["vector_text"]]
    assert shown["notes"][0].startswith(f"TokenRank of layer {layer}, head {head} (")
    return shown


def _centre(b: Browser, selector: str) -> tuple[float, float]:
    rect = b.js(
        f"""(() => {{ const e = document.querySelector({json.dumps(selector)});
        e.scrollIntoView({{block: "center"}}); const r = e.getBoundingClientRect();
        return [r.left, r.top, r.width, r.height]; }})()"""
    )
    return rect[0] + rect[2] / 2, rect[1] + rect[3] / 2


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    b = Browser(tmp_path / "profile-cdp", width=1280, height=1600)
    try:
        yield b
    finally:
        b.close()


def test_interactive_page_shows_pythons_numbers(demo, browser: Browser) -> None:
    result, _ = demo
    page = result.out_dir / "explore.html"
    numbers = _numbers(page)
    b = browser
    b.load(page.as_uri())  # from disk: no server, no network
    assert b.js("document.body.dataset.ready") == "1"
    first = _shown(b)
    assert (first["layer"], first["head"], first["source"]) == (
        numbers["layer"], numbers["head"], numbers["source"],
    )  # fmt: skip
    assert (first["op"], first["method"], first["t"]) == ("heat", "exact", 1.0)
    u, m = _python(numbers, first)
    _assert_shows(first, u, m)
    assert abs(first["mass"] - 1.0) < 1e-6 and abs(first["influence"] - 1.0) > 1e-3
    # the random walk of the causal GPT's head: all of pi on token 0, the only node with area
    walk = _assert_walk(b, numbers, first["layer"], first["head"])
    assert [n["r"] > 0 for n in walk["rank"]] == [True] + [False] * (len(walk["rank"]) - 1)
    assert "This head is causal" in walk["notes"][0] and "π = e₀" in walk["notes"][0]

    # drag the t slider: a real click on its track, then one arrow key
    x, y = _centre(b, "#t")
    width = b.js("document.getElementById('t').getBoundingClientRect().width")
    b.click(x + 0.3 * width, y)
    moved = _shown(b)
    assert moved["ti"] > first["ti"], (first["ti"], moved["ti"])
    b.key("ArrowLeft", 37)
    moved = _shown(b)
    assert moved["t"] == numbers["times"][moved["ti"]] and moved["t"] != first["t"]
    _assert_shows(moved, *_python(numbers, moved))

    # pick another token: click its node in the influence graph
    token = (first["source"] + 7) % len(numbers["labels"])
    b.click(*_centre(b, f'#graph-influence g.node[data-i="{token}"] circle'))
    picked = _shown(b)
    assert picked["source"] == token and picked["t"] == moved["t"]
    u, m = _python(numbers, picked)
    _assert_shows(picked, u, m)
    assert abs(picked["mass"] - 1.0) < 1e-6  # conserved from every token

    # step by step: K Euler steps (I - (t/K) L)^K e_j, the mass total still 1
    b.js("""(() => { const s = document.getElementById("method"); s.value = "euler";
         s.dispatchEvent(new Event("change")); })()""")  # fmt: skip
    euler = _shown(b)
    p = torch.tensor(numbers["heads"][euler["layer"]][euler["head"]]["attention"],
                     dtype=torch.float64)  # fmt: skip
    n, k, t = p.shape[0], euler["steps"], euler["t"]
    step = torch.eye(n, dtype=torch.float64) - (t / k) * (torch.eye(n, dtype=torch.float64) - p)
    power = torch.linalg.matrix_power(step, k)
    _assert_shows(euler, power[:, token], power[token, :])
    error = float(b.js("Number(document.getElementById('step-info').dataset.error)"))
    exact = heat_kernel(DenseGraph(p), torch.eye(n, dtype=torch.float64), t, method="exact")
    expected = max(float((power[:, token] - exact[:, token]).abs().max()),
                   float((power[token, :] - exact[token, :]).abs().max()))  # fmt: skip
    assert error == pytest.approx(expected, abs=2e-6)

    # hover an edge: the tooltip gives the weight of the edge under the mouse
    x, y = b.js(
        """(() => { const edges = Array.from(document.querySelectorAll("#graph-mass path.edge"));
        const e = edges.filter((p) => p.dataset.i !== p.dataset.j)
                       .sort((a, b) => b.dataset.w - a.dataset.w)[0];
        e.scrollIntoView({block: "center"});
        const q = e.getPointAtLength(e.getTotalLength() / 2), c = e.getScreenCTM();
        return [q.x * c.a + q.y * c.c + c.e, q.y * c.d + q.x * c.b + c.f]; })()"""
    )
    b.hover(x, y)
    hit = b.js(HIT % (x, y))
    i, j, tip = int(hit[0]), int(hit[1]), hit[2]
    assert tip.startswith(f"P[{i}, {j}] = {float(p[i, j]):.4f}: query {i} ")
    assert b.errors() == []


def test_interactive_page_layout(demo, browser: Browser, tmp_path: Path) -> None:
    from PIL import Image

    result, _ = demo
    b = browser
    b.load((result.out_dir / "explore.html").as_uri())
    layout = b.js(
        """(() => { const r = (s) => { const b = document.querySelector(s).getBoundingClientRect();
        return [b.left, b.top, b.right, b.bottom]; };
        return { inner: window.innerWidth, scroll: document.documentElement.scrollWidth,
                 controls: r("#controls"), influence: r("#graph-influence"),
                 mass: r("#graph-mass") }; })()"""
    )
    assert layout["scroll"] <= layout["inner"]  # no horizontal scrolling
    left, top, right, bottom = layout["influence"]
    assert right - left > 0.6 * layout["inner"]  # the graph takes most of the width
    assert layout["controls"][3] <= top < layout["mass"][1]  # controls, influence, then mass
    shot = b.screenshot(tmp_path / "explore.png")
    with Image.open(shot) as image:
        assert image.size == (1280, 1600)
        rgb = image.convert("RGB")
        graph = rgb.crop((int(left), int(top), int(right), int(min(bottom, 1600))))
        saturated = sum(graph.convert("HSV").getchannel("S").histogram()[80:])
        assert saturated > 1000  # coloured nodes and edges where the layout puts the graph
        # the controls bar is where the layout puts it: its own light grey background
        bar = rgb.crop(tuple(int(v) for v in layout["controls"]))
        count, colour = max(bar.getcolors(1 << 16))
        assert colour == (246, 246, 246) and count > 0.5 * bar.size[0] * bar.size[1]
    assert b.errors() == []


# ---- the page's labels are true ----------------------------------------------------------

LABELS = """(() => {
  const rgb = (s) => (s.match(/[0-9]+/g) || []).slice(0, 3).map(Number); // "none": []
  const graphs = {};
  for (const svg of document.querySelectorAll("svg[id^=graph-]")) {
    graphs[svg.id] = {
      nodes: Array.from(svg.querySelectorAll("g.node")).map((g) => {
        const text = g.querySelector("text"), circle = g.querySelector("circle");
        return { label: text.textContent, value: Number(g.dataset.value),
          node: rgb(getComputedStyle(circle).fill), text: rgb(getComputedStyle(text).fill),
          halo: rgb(getComputedStyle(text).stroke) };
      }),
      note: svg.querySelector(".colourbar-note")?.textContent ?? null,
    };
  }
  const text = (id) => document.getElementById(id)?.textContent ?? "";
  return { graphs: graphs, notes: [text("note-influence"), text("note-mass")],
           totals: [text("total-influence"), text("total-mass")] };
})()"""

HOT = [(255, 255, 204), (253, 141, 60), (189, 0, 38)]  # the page's colour map, light to dark


def _hot(s: float) -> list[float]:
    """The colour of position ``s`` in [0, 1] along the page's colour map."""
    a, b, f = (HOT[0], HOT[1], 2 * s) if s < 0.5 else (HOT[1], HOT[2], 2 * s - 1)
    return [x + (y - x) * f for x, y in zip(a, b)]


def _set(b: Browser, control: str, value: object, event: str) -> None:
    b.js(f"""(() => {{ const s = document.getElementById({json.dumps(control)});
         s.value = {json.dumps(str(value))}; s.dispatchEvent(new Event("{event}")); }})()""")


@pytest.fixture(scope="module")
def word_pieces(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A BERT-like page: word pieces, bidirectional heads, a sink on [CLS], the source [CLS]."""
    tokens = ["[CLS]", "heat", "flows", "along", "the", "edge", "##s", ".", "[SEP]"]
    n, gen = len(tokens), torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, n, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    k[:, 0] += 2 * q.mean(1)  # every query reads [CLS] most
    graph = DenseGraph(SoftmaxGraph(q, k).to_dense())  # (H, N, N)
    layer = LayerSnapshot(graph, torch.randn(2, n, 8, generator=gen, dtype=torch.float64),
                          (Attention(), Laplacian()))  # fmt: skip
    data = demo_from_snapshots([layer], tokens=tokens, text=" ".join(tokens), source=0,
                               token_unit="word piece")  # fmt: skip
    page = write_explorer(tmp_path_factory.mktemp("word-pieces"), data)
    return page, _numbers(page)


def test_every_label_on_the_interactive_page_is_true(word_pieces, browser: Browser) -> None:
    page, numbers = word_pieces
    b = browser
    b.load(page.as_uri())
    _set(b, "t", 0, "input")  # t = 0: all of the source's value on [CLS], the darkest node
    shown = b.js(LABELS)
    assert sorted(shown["graphs"]) == [
        "graph-eigen", "graph-influence", "graph-mass", "graph-tokenrank", "graph-walk",
    ]  # fmt: skip
    for name, graph in shown["graphs"].items():
        for node in graph["nodes"]:
            contrast = vh.wcag_contrast([c / 255 for c in node["text"]],
                                        [c / 255 for c in node["node"]])  # fmt: skip
            assert contrast >= 4.5, (name, node)  # WCAG AA; was 3.2 for [CLS] (issue 38)
            assert node["halo"] == node["node"], (name, node)  # reads beyond its node too
    cls = shown["graphs"]["graph-influence"]["nodes"][0]
    assert (cls["label"], cls["value"], cls["node"]) == ("[CLS]", 1.0, [189, 0, 38])
    assert cls["text"] == [255, 255, 255]
    # the colour bars say that colour follows the square root of the value ...
    notes = {name: graph["note"] for name, graph in shown["graphs"].items()}
    assert notes == {"graph-influence": "colour ∝ √value", "graph-mass": "colour ∝ √value",
                     "graph-eigen": "colour ∝ ±√|value|", "graph-tokenrank": "colour ∝ √value",
                     "graph-walk": "colour ∝ ±√|value|"}  # fmt: skip
    # the walk's panels of both heads of this bidirectional layer: pi on every token
    for head in (0, 1):
        _set(b, "head", head, "change")
        walk = _assert_walk(b, numbers, 0, head)
        assert all(n["r"] > 0 for n in walk["rank"]) and "causal" not in walk["notes"][0]
    _set(b, "head", 0, "change")
    # ... and it does: at t = 1 (the scale's top is 1, the source's value at t = 0)
    _set(b, "t", numbers["times"].index(1.0), "input")
    nodes = b.js(LABELS)["graphs"]["graph-influence"]["nodes"]
    assert max(abs(c - e) for n in nodes for c, e in zip(n["node"], _hot(n["value"] ** 0.5))) <= 1
    assert max(abs(c - e) for n in nodes for c, e in zip(n["node"], _hot(n["value"]))) > 20
    # the notes and totals follow the operator: the Laplacian's views are not heat or mass
    _set(b, "op", "laplacian", "change")
    shown = b.js(LABELS)
    assert shown["notes"][0].startswith("A Laplacian head's output for the input e_j")
    assert shown["notes"][1].startswith("Lᵀ e_j = −dm/dt at t = 0")
    p = torch.tensor(numbers["heads"][0][0]["attention"], dtype=torch.float64)
    total = float(re.search(r"= (-?[0-9.]+)", shown["totals"][0]).group(1))
    assert total == pytest.approx(1 - float(p[:, 0].sum()), abs=6e-7)
    assert "1 − Σᵢ P[i, j]" in shown["totals"][0] and "listen" not in shown["totals"][0]
    assert b.errors() == []
