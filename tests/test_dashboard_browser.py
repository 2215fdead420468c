"""The dashboard in a real browser: `bca dashboard` on localhost, loaded in headless Chromium driven over the
DevTools protocol. It opens the app (the comparison's rows), changes a filter by typing into it (the table and
the URL follow), follows that shared link in a fresh load (the same view), opens every panel, a run's page and
the two-run comparison, and checks that every chart has a plotting area; then once more at 1920 px in the dark
theme. BCA_SCREENSHOTS=docs saves a full-page screenshot of each view there (the pictures of docs/results.md).

Needs Debian's chromium (/usr/bin/chromium; `.ci/run` installs it). Without it this test fails, on purpose.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlencode

import pytest
import websocket

from dashboard.workbench import PANELS
from dashboard_results import CONFIG_ROWS, bca_executable, real_sweep_results
from orchestrator.results.db import ResultsDB
from orchestrator.results.testing import write_fake_run

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("BCA_CHROMIUM", "/usr/bin/chromium")
# The docs' screenshots are refreshed only on request (BCA_SCREENSHOTS=docs), so a test run leaves the work
# tree clean.
SCREENSHOTS = Path(os.environ.get("BCA_SCREENSHOTS", ""))
VIEW_HEIGHT = 1200
# Text each panel shows once drawn.
PANEL_TEXT = {"Evidence": "p (Holm, per table)", "Paper tables": "Show the paper's numbers",
              "Sensitivity": "other settings held at", "Prior": "top classes", "Per class": "classes shown",
              "Which settings matter": "Parallel coordinates", "Cost": "Peak memory", "Runs": "goes to a run's own page"}
# Panels that are tables only.
TABLE_PANELS = ("Paper tables", "Runs")
# How long to wait for slow starts on a loaded 2-core machine; waits, not assertions about speed.
START_WAIT_S = 120
RENDER_WAIT_S = 180


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return real_sweep_results(tmp_path_factory.getbasetemp())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what: str, check, wait_s: float, interval: float = 0.5) -> Any:
    """Poll check() until it returns something truthy; fail naming `what` after wait_s."""
    deadline = time.monotonic() + wait_s
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as e:  # not up yet: connection refused, file not written, ...
            last_error = e
        time.sleep(interval)
    pytest.fail(f"gave up waiting for {what} after {wait_s:.0f} s (last error: {last_error!r})")


def stop(proc: subprocess.Popen) -> None:
    """Stop a process started in its own session, with everything it started."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextmanager
def dashboard_server(results_dir: Path, port: int, log: Path) -> Iterator[str]:
    with open(log, "wb") as out:
        proc = subprocess.Popen([bca_executable(), "dashboard", "--results", str(results_dir), "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        def healthy() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"bca dashboard exited with {proc.returncode}:\n{log.read_text()}")
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=5) as r:
                return r.read().strip() == b"ok"

        wait_until("the dashboard's health endpoint", healthy, START_WAIT_S)
        yield url
    finally:
        stop(proc)


@contextmanager
def chromium(profile: Path, log: Path) -> Iterator[int]:
    """Headless Chromium with a fresh profile; yields its DevTools port (chosen by Chromium, read back)."""
    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        pytest.fail(f"Chromium not found at {CHROMIUM}: install Debian's chromium (apt-get install -y chromium), "
                    "as .ci/run does, or point BCA_CHROMIUM at a Chromium binary")
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--remote-debugging-port=0",
            "--window-size=1440,1320", "about:blank"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def devtools_port() -> int | None:
            if proc.poll() is not None:
                pytest.fail(f"chromium exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            lines = (profile / "DevToolsActivePort").read_text().splitlines()
            return int(lines[0]) if lines else None

        yield wait_until("Chromium's DevToolsActivePort file", devtools_port, START_WAIT_S)
    finally:
        stop(proc)


class DevTools:
    """A minimal Chrome DevTools Protocol client over one page's websocket."""

    def __init__(self, port: int) -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            pages = [t for t in json.load(r) if t.get("type") == "page"]
        assert pages, f"Chromium on port {port} lists no page target"
        # No Origin header: Chromium refuses DevTools websockets from origins it was not told to allow.
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self.next_id = 0

    def call(self, method: str, **params: Any) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:  # events arrive interleaved with replies; skip them
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"JS error in {expression[:80]!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        self.ws.close()


# Idle: Streamlit is not running the script, no placeholder is left, and the page shows `text` somewhere.
IDLE_JS = """
((text) => {
  const running = document.querySelector('[data-testid="stStatusWidget"]');
  const skeletons = document.querySelectorAll('[data-testid="stSkeleton"]').length;
  const main = document.querySelector('[data-testid="stMain"]');
  return !running && skeletons === 0 && !!main && main.innerText.includes(text);
})(%s)
"""
# Every chart's plotting area (Vega's root frame; the charts render as SVG, charts.for_page): [width, height].
PLOT_AREAS_JS = """
JSON.stringify([...document.querySelectorAll('.vega-embed')].map(e => {
  const frame = e.querySelector('svg g.role-frame.root > g > path.background');
  if (!frame) return [0, 0];
  const r = frame.getBoundingClientRect();
  return [Math.round(r.width), Math.round(r.height)];
}))
"""
# The run page's metrics: every cell of the table in the "Metrics" column, and those cut off (past the column's
# right edge, or wider than their box).
RUN_METRICS_JS = """
(() => {
  const column = [...document.querySelectorAll('[data-testid="stColumn"]')]
    .find(c => c.innerText.trim().startsWith('Metrics'));
  const right = column.getBoundingClientRect().right;
  const cells = [...column.querySelectorAll('td, th')];
  const cut = cells.filter(c => c.getBoundingClientRect().right > right + 1 || c.scrollWidth > c.clientWidth + 1);
  return JSON.stringify([cells.map(c => c.innerText.trim()), cut.map(c => c.innerText.trim())]);
})()
"""
# The first screen: the page's first two tables (the comparison and its gain over CLIP with evidence), as
# [top, bottom] in page pixels.
FIRST_TABLES_JS = """
JSON.stringify([...document.querySelectorAll('[data-testid="stTable"]')].slice(0, 2).map(t => {
  const r = t.getBoundingClientRect();
  return [Math.round(r.top + window.scrollY), Math.round(r.bottom + window.scrollY)];
}))
"""
COMPARISON_ROWS_JS = """
[...document.querySelectorAll('[data-testid="stTable"]')[0].querySelectorAll('tbody tr')].map(
  r => r.querySelector('th, td').innerText.trim())
"""


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a listening TCP socket on `port`, from /proc/net/tcp{,6} (hex, as the kernel shows)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port_hex = local.rsplit(":", 1)
            if state == "0A" and int(port_hex, 16) == port:  # 0A = LISTEN
                found.add(address)
    return found


def navigate(cdp: DevTools, url: str, text: str) -> None:
    cdp.call("Page.navigate", url=url)
    wait_for(cdp, text)


def wait_for(cdp: DevTools, text: str) -> None:
    time.sleep(1)  # let a rerun start before asking whether it is done
    wait_until(f"the page to show {text!r}", lambda: cdp.evaluate(IDLE_JS % json.dumps(text)), RENDER_WAIT_S)
    exceptions = cdp.evaluate("document.querySelectorAll('[data-testid=\"stException\"]').length")
    assert exceptions == 0, f"the page shows a Python exception after waiting for {text!r}"


def plot_areas(cdp: DevTools, where: str, at_least: int = 1) -> list[list[int]]:
    """Every chart on the page has a plotting area (not just a legend or a title): at least 40 x 40 px."""
    areas = json.loads(cdp.evaluate(PLOT_AREAS_JS))
    assert len(areas) >= at_least, f"{where}: {len(areas)} charts, expected at least {at_least}"
    flat = [a for a in areas if a[0] < 40 or a[1] < 40]
    assert not flat, f"{where}: charts with (almost) no plotting area {flat} among {areas}"
    return areas


def comparison_cells(cdp: DevTools) -> set[str]:
    text = cdp.evaluate("document.querySelectorAll('[data-testid=\"stTable\"]')[0].innerText")
    return {cell.strip() for line in text.splitlines() for cell in line.split("\t")}


def screenshot(cdp: DevTools, name: str, width: int) -> None:
    """The whole page as docs/<name>.png, only when BCA_SCREENSHOTS names a folder (refreshed on request)."""
    if not SCREENSHOTS.name:
        return
    height = int(cdp.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollHeight"))
    cdp.call("Emulation.setDeviceMetricsOverride", width=width, height=min(height + 40, 5000), deviceScaleFactor=1,
             mobile=False)
    time.sleep(1.5)  # the charts re-layout to the new viewport
    shot = cdp.call("Page.captureScreenshot", format="png")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    (SCREENSHOTS / f"{name}.png").write_bytes(base64.b64decode(shot["data"]))
    cdp.call("Emulation.setDeviceMetricsOverride", width=width, height=VIEW_HEIGHT, deviceScaleFactor=1, mobile=False)


def choose_in_multiselect(cdp: DevTools, key: str, text: str) -> None:
    """Type into a Streamlit multiselect and press Enter, as a user picks an option."""
    cdp.evaluate(f"document.querySelector('.st-key-{key} input').focus()")
    cdp.call("Input.insertText", text=text)
    time.sleep(0.5)
    for kind in ("keyDown", "keyUp"):
        cdp.call("Input.dispatchKeyEvent", type=kind, key="Enter", code="Enter", windowsVirtualKeyCode=13)
    cdp.call("Input.dispatchKeyEvent", type="keyDown", key="Escape", code="Escape", windowsVirtualKeyCode=27)


@contextmanager
def page(results_dir: Path, tmp_path: Path, name: str, env: dict[str, str] | None = None) -> Iterator[tuple[str, DevTools]]:
    port = free_port()
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        with dashboard_server(results_dir, port, tmp_path / f"{name}-dashboard.log") as url, \
                chromium(tmp_path / f"{name}-profile", tmp_path / f"{name}-chromium.log") as devtools_port:
            # Issue 7: loopback only unless --host says otherwise (127.0.0.1 is 0100007F in /proc/net/tcp).
            assert listening_addresses(port) == {"0100007F"}, listening_addresses(port)
            cdp = DevTools(devtools_port)
            try:
                cdp.call("Page.enable")
                yield url, cdp
            finally:
                cdp.close()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_dashboard_in_chromium(results: Path, tmp_path: Path) -> None:
    with ResultsDB(results) as db:
        runs = db.df("SELECT run_id, method, dataset, seed FROM accuracy ORDER BY method, run_id")
    with page(results, tmp_path, "light") as (url, cdp):
        cdp.call("Emulation.setDeviceMetricsOverride", width=1280, height=VIEW_HEIGHT, deviceScaleFactor=1,
                 mobile=False)
        navigate(cdp, url, "Comparison: top-1 accuracy")
        cells = comparison_cells(cdp)
        missing = [m for m in CONFIG_ROWS if m not in cells]
        assert not missing, f"comparison table lacks rows {missing}; it shows {sorted(cells)}"
        plot_areas(cdp, "workbench, Stream panel", at_least=1)
        # the comparison and its evidence are the first screen, whole; the rest waits in the panels below
        tables = json.loads(cdp.evaluate(FIRST_TABLES_JS))
        assert len(tables) == 2 and tables[1][1] <= VIEW_HEIGHT, tables
        screenshot(cdp, "dashboard", 1280)

        # change a filter as a user does: the table follows and the URL carries the filter
        choose_in_multiselect(cdp, "filter_method", "bca")
        wait_until("the URL to carry the method filter",
                   lambda: "filter_method=bca" in cdp.evaluate("location.href"), RENDER_WAIT_S)
        wait_for(cdp, "Comparison: top-1 accuracy")
        filtered = {c for c in comparison_cells(cdp) if c.startswith(("CLIP", "TDA", "BCA"))}
        assert filtered and all(c.startswith("BCA") for c in filtered), filtered
        shared = cdp.evaluate("location.href")

        # follow the shared link in a fresh page load: the same view
        cdp.call("Page.navigate", url="about:blank")
        navigate(cdp, shared, "Comparison: top-1 accuracy")
        assert {c for c in comparison_cells(cdp) if c.startswith(("CLIP", "TDA", "BCA"))} == filtered

        for panel in PANELS[1:]:
            navigate(cdp, f"{url}/?{urlencode({'panel': panel})}", "Comparison: top-1 accuracy")
            wait_for(cdp, PANEL_TEXT[panel])
            plot_areas(cdp, f"{panel} panel", at_least=0 if panel in TABLE_PANELS else 1)
            screenshot(cdp, f"dashboard-{panel.lower().replace(' ', '-')}", 1280)

        bca = runs[runs["method"] == "bca"].iloc[0]
        navigate(cdp, f"{url}/?{urlencode({'page': 'Run', 'run': bca['run_id']})}", "Reproduce this run")
        assert f"bca sweep reproduce-{bca['run_id']}.yaml" in cdp.evaluate("document.body.innerText")
        plot_areas(cdp, "run page (prior heat-maps)", at_least=2)
        screenshot(cdp, "dashboard-run", 1280)
        cdp.call("Emulation.setDeviceMetricsOverride", width=1440, height=VIEW_HEIGHT, deviceScaleFactor=1,
                 mobile=False)
        time.sleep(1.5)  # the page re-lays out to the new viewport
        cells, cut = json.loads(cdp.evaluate(RUN_METRICS_JS))
        assert {"top-1 accuracy (%)", "peak memory (MB)"} <= set(cells) and not cut, (cells, cut)
        cdp.call("Emulation.setDeviceMetricsOverride", width=1280, height=VIEW_HEIGHT, deviceScaleFactor=1,
                 mobile=False)

        same = runs[(runs["dataset"] == bca["dataset"]) & (runs["seed"] == bca["seed"])]
        clip = same[same["method"] == "clip"].iloc[0]
        navigate(cdp, f"{url}/?{urlencode({'page': 'Compare two runs', 'run_a': clip['run_id'], 'run_b': bca['run_id']})}",
                 "only B right")
        plot_areas(cdp, "two-run comparison", at_least=2)
        screenshot(cdp, "dashboard-compare", 1280)

    # wide screen, dark theme: still every chart with a plotting area
    with page(results, tmp_path, "dark", {"STREAMLIT_THEME_BASE": "dark"}) as (url, cdp):
        cdp.call("Emulation.setDeviceMetricsOverride", width=1920, height=VIEW_HEIGHT, deviceScaleFactor=1,
                 mobile=False)
        navigate(cdp, f"{url}/?{urlencode({'panel': 'Which settings matter'})}", PANEL_TEXT["Which settings matter"])
        background = cdp.evaluate("getComputedStyle(document.querySelector('[data-testid=\"stApp\"]')).backgroundColor")
        assert background != "rgb(255, 255, 255)", background
        plot_areas(cdp, "dark, 1920 px", at_least=2)
        screenshot(cdp, "dashboard-dark", 1920)


def test_page_follows_a_running_sweep(tmp_path: Path) -> None:
    """While a run is running, new result files appear on the open page without any click (auto-refresh)."""
    config = {"sweep": "live", "backbone": "RN50", "dataset": "imagenet", "method": "bca", "seed": 1,
              "hparams": {"tau": 0.3}}
    results = tmp_path / "results"
    write_fake_run(results, {**config, "method": "clip", "hparams": {}}, n=100)
    write_fake_run(results, config, n=100, rows=40, status="running")
    caption = "document.querySelector('[data-testid=\"stMain\"] [data-testid=\"stCaptionContainer\"]').innerText"
    with page(results, tmp_path, "live") as (url, cdp):
        navigate(cdp, url, "1 running · 1 finished")
        write_fake_run(results, {**config, "seed": 2}, n=100)  # the sweep goes on
        wait_until("the page to show the new run", lambda: "2 finished" in cdp.evaluate(caption), RENDER_WAIT_S)
