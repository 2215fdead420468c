"""`bca compare`: the suite it plans, the leaderboard's numbers against scipy, and a plugin method end to end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps
from typer.testing import CliRunner

from orchestrator import registry
from orchestrator.cli import app
from orchestrator.compare import leaderboard
from orchestrator.results.db import ResultsDB
from orchestrator.results.testing import make_fake_results
from plugin_sources import SHARPEN as PLUGIN

REPO = Path(__file__).resolve().parents[1]
BCA = str(Path(sys.executable).with_name("bca"))
runner = CliRunner()



def _holm(p):
    order = np.argsort(p)
    out, running = np.empty(len(p)), 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (len(p) - i) * p[j]))
        out[j] = running
    return out


def test_leaderboard_numbers_are_scipys(tmp_path):
    runs = make_fake_results(tmp_path, sweep="board", datasets=("dtd", "eurosat"),
                             methods={"clip": {}, "bca": {"tau": 0.3}, "tda": {}, "onzeta": {}}, seeds=(1, 2, 3),
                             n=1500, part_size=1500)
    with ResultsDB(tmp_path) as db:
        board = leaderboard(db, "board")

    def acc(method):  # per (dataset, seed), the suite's paired unit
        return np.array([r.accuracy for r in sorted((r for r in runs if r.config["method"] == method),
                                                     key=lambda r: (r.config["dataset"], r.config["seed"]))])

    gains = {m: acc(m) - acc("clip") for m in ("clip", "bca", "tda", "onzeta")}
    assert list(board["method"]) == sorted(gains, key=lambda m: -gains[m].mean())
    best = board.iloc[0]["method"]
    others = [m for m in board["method"] if m != best]
    expected_p = dict(zip(others, _holm(np.array([sps.ttest_rel(acc(m), acc(best)).pvalue for m in others]))))
    for _, row in board.iterrows():
        m = row["method"]
        assert row["gain"] == pytest.approx(gains[m].mean(), abs=1e-9)
        assert row["runs"] == 6 and row["rank"] == list(board["method"]).index(m) + 1
        if m != "clip":
            ci = sps.ttest_1samp(gains[m], 0.0).confidence_interval(0.95)
            assert (row["gain_low"], row["gain_high"]) == pytest.approx((ci.low, ci.high), rel=1e-9)
            assert row["worst10"] == pytest.approx(np.sort(gains[m])[0])  # ceil(6 / 10) = 1 run
        if m == best:
            assert np.isnan(row["p_vs_best"])
        else:
            assert row["p_vs_best"] == pytest.approx(expected_p[m], rel=1e-9)
            assert row["vs_best"] == pytest.approx((acc(m) - acc(best)).mean())


def _plugin_env(tmp_path):
    (tmp_path / "plugin").mkdir(exist_ok=True)
    (tmp_path / "plugin" / "toy_plugin.py").write_text(PLUGIN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "plugin"), str(REPO)])}
    env.pop("BCA_PLUGINS", None)
    return env


def test_dry_run_plans_the_suite_with_the_plugin_and_every_single_view_builtin(tmp_path):
    done = subprocess.run([BCA, "compare", "toy_plugin", "--dry-run", "--results", str(tmp_path / "results")],
                          env=_plugin_env(tmp_path), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    singles = [c.name for c in registry.method_cards()
               if not (c.takes_views and c.view_scope == "all" and not c.single_view_datasets) and not c.image_encoder]
    n = (len(singles) + 1) * 2 * 3 * 3  # methods x presets x streams x orders
    assert f"sweep compare-sharpen (dry run: nothing is run or written): {n} runs" in done.stdout
    assert re.search(r"synthetic-fine_grained\s+sharpen\s+9", done.stdout)
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["no_such_module_xyz"], "plugin module 'no_such_module_xyz' cannot be imported"),
    (["zero"], "METHOD 'zero' takes augmented views on every dataset"),
    (["bca", "--data-root", "."], "--data-root needs at least one --dataset"),
    (["bca", "--data-root", ".", "--dataset", "dtd"], "--data-root needs --cache-dir"),
])
def test_bad_method_or_suite_exits_2_with_a_message(tmp_path, args, message):
    out = runner.invoke(app, ["compare", *args, "--dry-run", "--results", str(tmp_path)])
    assert out.exit_code == 2 and message in out.output, out.output


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_compare_a_plugin_method_prints_the_leaderboard_and_resumes(tmp_path):
    env = _plugin_env(tmp_path)
    cmd = [BCA, "compare", "toy_plugin", "--orders", "1", "--samples", "200", "--results", str(tmp_path / "r")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "Leaderboard — sweep compare-sharpen" in out and "against the best (Holm)" in out
    board = [line for line in out.splitlines() if re.match(r"^│\s+\d+ │", line)]
    assert any("Sharpened CLIP" in line for line in board) and any(" best " in line for line in board)
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=800)
    assert again.returncode == 0 and "0 to run" in again.stdout or "already finished" in again.stdout, again.stdout
    assert "Leaderboard — sweep compare-sharpen" in again.stdout
