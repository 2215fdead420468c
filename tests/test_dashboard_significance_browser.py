"""The gain intervals and the significance column in a real browser (headless Chromium, as
tests/test_dashboard_browser.py drives it): the section renders with its chart's plotting area, and the two-run
page shows McNemar's table. BCA_SCREENSHOTS=docs saves the section as docs/dashboard-significance.png."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest
from test_dashboard_browser import SCREENSHOTS, VIEW_HEIGHT, navigate, page, plot_areas, wait_for

from orchestrator.results.db import ResultsDB
from orchestrator.results.testing import make_fake_results

pytestmark = pytest.mark.slow
SECTION = "Gain over CLIP, with evidence"

# The section's box: from its heading to the bottom of the first chart after it.
SECTION_BOX_JS = """
(() => {
  const heading = [...document.querySelectorAll('[data-testid="stMarkdownContainer"]')]
    .filter(e => e.innerText.startsWith(%s)).pop();  // the Evidence panel's, after the first screen's
  const top = heading.getBoundingClientRect().top + window.scrollY;
  const chart = [...document.querySelectorAll('.vega-embed')]
    .find(e => e.getBoundingClientRect().top + window.scrollY > top);
  const bottom = chart.getBoundingClientRect().bottom + window.scrollY;
  return JSON.stringify([top, bottom, chart.getBoundingClientRect().width]);
})()
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("significance")
    make_fake_results(root, datasets=("imagenet", "imagenet_a", "dtd"),
                      methods={"clip": {}, "la": {"tau": 0.3}, "bca": {"tau": 0.3}, "tda": {}, "dota": {}},
                      seeds=(1, 2, 3, 4, 5), n=2000, part_size=2000)
    return root


def test_gain_intervals_in_chromium(results: Path, tmp_path: Path) -> None:
    with ResultsDB(results) as db:
        runs = db.df("SELECT run_id, method FROM runs WHERE seed = 1 AND dataset = 'dtd' ORDER BY method")
    with page(results, tmp_path, "significance") as (url, cdp):
        cdp.call("Emulation.setDeviceMetricsOverride", width=1280, height=VIEW_HEIGHT, deviceScaleFactor=1,
                 mobile=False)
        navigate(cdp, f"{url}/?{urlencode({'filter_dataset': 'dtd', 'panel': 'Evidence'})}", "p (Holm, per table)")
        text = cdp.evaluate("document.body.innerText")
        assert "gain over CLIP [95% interval]" in text and "significant at 0.05" in text and "✓" in text
        plot_areas(cdp, "workbench with the gain intervals", at_least=2)
        top, bottom, _ = json.loads(cdp.evaluate(SECTION_BOX_JS % json.dumps(SECTION)))
        assert bottom - top > 150
        if SCREENSHOTS.name:
            height = int(cdp.evaluate("document.querySelector('[data-testid=\"stMain\"]').scrollHeight"))
            cdp.call("Emulation.setDeviceMetricsOverride", width=1280, height=min(height + 40, 5000),
                     deviceScaleFactor=1, mobile=False)
            time.sleep(1.5)
            top, bottom, _ = json.loads(cdp.evaluate(SECTION_BOX_JS % json.dumps(SECTION)))
            shot = cdp.call("Page.captureScreenshot", format="png",
                            clip={"x": 0, "y": top - 10, "width": 1280, "height": bottom - top + 20, "scale": 1})
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            (SCREENSHOTS / "dashboard-significance.png").write_bytes(base64.b64decode(shot["data"]))

        clip, bca = (runs[runs["method"] == m]["run_id"].iloc[0] for m in ("clip", "bca"))
        navigate(cdp, f"{url}/?{urlencode({'page': 'Compare two runs', 'run_a': clip, 'run_b': bca})}",
                 "McNemar's test")
        wait_for(cdp, "B wrong")
