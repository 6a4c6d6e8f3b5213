"""The HTML report as a browser shows it: headless Chromium renders its tables and figures, logs nothing to
the console, and shows the study's name (which holds a script tag) as text."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from matplotlib import image
from test_reports import FIGURES, synthetic  # noqa: F401  (the session fixture: one report for both files)

CHROMIUM = next(
    (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary on PATH (Debian: apt-get install -y chromium)"
)

# Reports every image's decoded width, every table's row count and where the headline box ends once the
# page has loaded.
PROBE = """<script>
window.addEventListener("load", () => {
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify({
    images: [...document.images].map(img => img.naturalWidth),
    tables: Object.fromEntries([...document.querySelectorAll("table[id]")].map(t => [t.id, t.rows.length])),
    headline_bottom: document.getElementById("headline").getBoundingClientRect().bottom,
  });
  document.body.appendChild(out);
});
</script>"""


def chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0"]  # fmt: skip
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120)


def console_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]


def test_tables_and_figures_render_and_user_text_stays_text(synthetic, tmp_path):  # noqa: F811
    report = synthetic[3] / "report.html"
    probe = tmp_path / "probe.html"
    probe.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    # A common laptop window: the headline (result and claims) must show without scrolling.
    proc = chromium(
        tmp_path, "--window-size=1280,800", "--virtual-time-budget=10000", "--dump-dom", probe.as_uri()
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert console_lines(proc) == []
    dom = proc.stdout
    found = json.loads(re.search(r'<pre id="probe">(.*?)</pre>', dom).group(1).replace("&quot;", '"'))
    assert 0 < found["headline_bottom"] <= 800
    assert len(found["images"]) == len(FIGURES) and all(width > 100 for width in found["images"])
    assert found["tables"]["summary"] == 1 + 4  # header + one row per variant
    assert found["tables"]["claims-table"] == 2 and found["tables"]["progress"] == 5
    # The only script in the page is the probe; the study's name is text.
    assert dom.count("<script") == 1
    assert "<h1>&lt;script&gt;alert(1)&lt;/script&gt; &amp; co</h1>" in dom


def test_screenshot_is_not_blank(synthetic, tmp_path):  # noqa: F811
    shot = tmp_path / "shot.png"
    # Tall enough for the figures to the attention heatmaps: the claims split into tests and checks, each
    # table with its heading, pushed the heatmaps past 4000 pixels.
    proc = chromium(
        tmp_path, "--window-size=1200,5000", f"--screenshot={shot}", (synthetic[3] / "report.html").as_uri()
    )
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    assert console_lines(proc) == []
    pixels = image.imread(shot)[..., :3]
    assert pixels.std() > 0.05  # not one flat colour
    # The figures' colour maps and lines: a few percent of the page is clearly coloured, not grey.
    saturation = pixels.max(-1) - pixels.min(-1)
    assert np.mean(saturation > 0.25) > 0.02
