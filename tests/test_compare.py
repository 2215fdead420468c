"""`bca compare`: the suite it plans, the leaderboard's numbers against scipy, and a plugin method end to end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from orchestrator import registry
from orchestrator.cli import app
from orchestrator.compare import DEFAULT_ORDERS, leaderboard
from orchestrator.results.db import ResultsDB
from orchestrator.results.testing import make_fake_results
from plugin_sources import SHARPEN as PLUGIN
from stats_reference import rel_tolerance, two_level

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


def test_leaderboard_numbers_are_the_reference(tmp_path):
    runs = make_fake_results(tmp_path, sweep="board", datasets=("dtd", "eurosat"),
                             methods={"clip": {}, "bca": {"tau": 0.3}, "tda": {}, "onzeta": {}}, seeds=(1, 2, 3),
                             n=1500, part_size=1500)
    with ResultsDB(tmp_path) as db:
        board = leaderboard(db, "board")

    def of(method):  # per (dataset, seed), the suite's paired unit
        return sorted((r for r in runs if r.config["method"] == method),
                      key=lambda r: (r.config["dataset"], r.config["seed"]))

    def reference(method, baseline):
        """two_level over the suite: each seed a replicate, each dataset a test set."""
        mine, theirs = of(method), of(baseline)
        diffs = [a.correct.astype(float) - b.correct.astype(float) for a, b in zip(mine, theirs)]
        return two_level(diffs, [r.config["seed"] for r in mine], [r.config["dataset"] for r in mine])

    gains = {m: np.array([r.accuracy for r in of(m)]) - np.array([r.accuracy for r in of("clip")])
             for m in ("clip", "bca", "tda", "onzeta")}
    assert list(board["method"]) == sorted(gains, key=lambda m: -gains[m].mean())
    best = board.iloc[0]["method"]
    others = [m for m in board["method"] if m != best]
    expected_p = dict(zip(others, _holm(np.array([reference(m, best)[3] for m in others]))))
    for _, row in board.iterrows():
        m = row["method"]
        assert row["gain"] == pytest.approx(gains[m].mean(), abs=1e-9)
        assert row["runs"] == 6 and row["rank"] == list(board["method"]).index(m) + 1
        if m != "clip":
            _, low, high, _, df = reference(m, "clip")
            assert (row["gain_low"], row["gain_high"]) == pytest.approx((100 * low, 100 * high), rel=rel_tolerance(df))
            assert row["worst10"] == pytest.approx(np.sort(gains[m])[0])  # ceil(6 / 10) = 1 run
        if m == best:
            assert np.isnan(row["p_vs_best"])
        else:
            assert row["p_vs_best"] == pytest.approx(expected_p[m], rel=1e-6)
            assert row["vs_best"] == pytest.approx((np.array([r.accuracy for r in of(m)])
                                                    - np.array([r.accuracy for r in of(best)])).mean())


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
    singles = [c.name for c in registry.method_cards() if not c.views_everywhere and c.image_encoder is None]
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


def test_the_real_data_suite_plans_every_method_its_backbone_can_run_and_names_the_others(tmp_path):
    """On the user's datasets the suite has one backbone: the methods that read more (an auxiliary encoder's
    features, a CLIP teacher's) are left out with why, not a refusal of the whole comparison; METHOD itself
    reading more is refused (exit 2) saying where it runs."""
    from orchestrator.clip.testing import TINY_VIT, build_dataset, register_tiny_models

    register_tiny_models()
    build_dataset("dtd", tmp_path / "data")
    suite = ["--data-root", str(tmp_path / "data"), "--dataset", "dtd", "--cache-dir", str(tmp_path / "cache"),
             "--backbone", TINY_VIT, "--pretrained", "random", "--dry-run", "--results", str(tmp_path / "results")]
    out = runner.invoke(app, ["compare", "bca", *suite], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    left = [line for line in out.output.splitlines() if line.startswith("left out: ")]
    assert left == ["left out: PromptAlign tunes MaPLe's prompts from a MaPLe context file and PromptAlign's "
                    "source statistics, which the suite's one backbone does not give",
                    "left out: RLCF reads a CLIP teacher's features (a second backbone's weights), which the "
                    "suite's one backbone does not give",
                    "left out: COSMIC reads the dinov2 auxiliary encoder's features, which the suite's one "
                    "backbone does not give"]
    planned = set(registry.method_names()) - {"rlcf", "cosmic", "promptalign"}  # each over the default orders
    assert (f"sweep compare-bca (dry run: nothing is run or written): {len(planned) * DEFAULT_ORDERS} runs"
            in out.output)
    out = runner.invoke(app, ["compare", "cosmic", *suite])
    assert out.exit_code == 2
    assert "METHOD 'cosmic' reads the dinov2 auxiliary encoder's features" in " ".join(out.output.split())


def test_an_unknown_method_lists_the_known_ones(tmp_path):
    out = runner.invoke(app, ["compare", "nosuchmethod", "--dry-run", "--results", str(tmp_path)])
    assert out.exit_code == 2
    assert "METHOD 'nosuchmethod' is not a registered method (" in out.output
    assert all(name in out.output for name in registry.method_names()), out.output


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


def test_the_leaderboard_says_its_samples_per_s_is_the_packs():
    import io

    import pandas as pd
    from rich.console import Console

    from orchestrator.compare import render

    board = pd.DataFrame([{"rank": 1, "method": "tda", "label": "TDA", "gain": 1.0, "gain_low": 0.5,
                           "gain_high": 1.5, "worst10": 0.1, "ece": 5.0, "samples_per_s": 900.0, "runs": 18,
                           "vs_best": float("nan"), "p_vs_best": float("nan")}])
    text = io.StringIO()
    Console(file=text, width=400).print(render(board, "compare-tda"))
    out = " ".join(text.getvalue().split())
    assert "samples/s (pack)" in out and "the speed of the trials that ran the method's runs" in out
