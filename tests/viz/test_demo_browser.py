"""The demo page renders in a real browser (headless Chromium): every image loads.

Skipped only when no Chromium is installed (``.ci/run`` installs Debian's ``chromium``).
"""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = next(
    (p for p in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser"))
     if p and Path(p).exists()),
    None,
)  # fmt: skip
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
