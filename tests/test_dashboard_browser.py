"""The dashboard in a real browser: `bca dashboard` on localhost, loaded in headless Chromium driven over the
DevTools protocol, the comparison table waited for (a plain --screenshot captures only placeholders), the
methods' rows checked in the page text, and a screenshot saved to $BCA_SCREENSHOT when set
(BCA_SCREENSHOT=docs/dashboard.png refreshes the README's picture).

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

import pytest
import websocket

from dashboard_results import bca_executable, real_sweep_results

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("BCA_CHROMIUM", "/usr/bin/chromium")
# The README's screenshot is refreshed only on request, so a test run leaves the work tree clean.
SCREENSHOT = Path(os.environ.get("BCA_SCREENSHOT", ""))
# The rows the comparison table must show for the sweep's methods (report.METHOD_LABELS' spellings).
METHOD_ROWS = ("CLIP", "CLIP+LA", "CLIP+PA", "BCA (tau=0.2)", "BCA (tau=0.5)", "TDA", "TDA+PA")
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


# Rendered: the comparison table holds rows, the charts drew, and Streamlit is not running the script.
RENDERED_JS = """
(() => {
  const table = document.querySelector('[data-testid="stTable"] table');
  const charts = document.querySelectorAll('.vega-embed canvas, .vega-embed svg').length;
  const running = document.querySelector('[data-testid="stStatusWidget"]');
  const skeletons = document.querySelectorAll('[data-testid="stSkeleton"]').length;
  return !!table && table.querySelectorAll('tbody tr').length > 0 && charts > 0 && !running && skeletons === 0;
})()
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


def test_dashboard_in_chromium(results: Path, tmp_path: Path) -> None:
    port = free_port()
    with dashboard_server(results, port, tmp_path / "dashboard.log") as url, \
            chromium(tmp_path / "profile", tmp_path / "chromium.log") as devtools_port:
        # Issue 7: loopback only unless --host says otherwise (127.0.0.1 is 0100007F in /proc/net/tcp).
        assert listening_addresses(port) == {"0100007F"}, listening_addresses(port)

        cdp = DevTools(devtools_port)
        try:
            cdp.call("Emulation.setDeviceMetricsOverride", width=1440, height=1320, deviceScaleFactor=1,
                     mobile=False)
            cdp.call("Page.enable")
            cdp.call("Page.navigate", url=url)
            wait_until("the comparison table and charts to render", lambda: cdp.evaluate(RENDERED_JS), RENDER_WAIT_S)
            exceptions = cdp.evaluate("document.querySelectorAll('[data-testid=\"stException\"]').length")
            table_text = cdp.evaluate("document.querySelector('[data-testid=\"stTable\"]').innerText")
            shot = cdp.call("Page.captureScreenshot", format="png")
        finally:
            cdp.close()

    assert exceptions == 0, "the page shows a Python exception"
    rows = [line.split("\t") for line in table_text.splitlines()]
    row_labels = {cell.strip() for row in rows for cell in row[:3]}
    missing = [m for m in METHOD_ROWS if m not in row_labels]
    assert not missing, f"comparison table lacks rows {missing}; it shows:\n{table_text}"
    for dataset in ("synthetic-label_shift", "synthetic-continual"):
        assert dataset in table_text

    png = base64.b64decode(shot["data"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    if SCREENSHOT.name:
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        SCREENSHOT.write_bytes(png)
