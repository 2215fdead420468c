"""What a user watching a long sweep sees: progress within a trial (encoding images/s and time left, adapting
samples done), an ETA weighted by each method's measured cost, and `bca sweep --ray-dashboard`."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from orchestrator.sweep.plan import expand, make_trials
from orchestrator.sweep.progress import ProgressCallback, TrialProgress, dashboard_hint
from orchestrator.sweep.pieces import settings_of
from orchestrator.sweep.load import validate_spec
from orchestrator.sweep.trial import execute_trial

N, PART = 450, 100
SPEC = {
    "name": "progress",
    "results_dir": "results",
    "datasets": [{"synthetic": "temporal", "n": N, "num_classes": 5, "dim": 16}],
    "methods": [{"method": "clip"}, {"method": "tda"}],
    "seeds": [1, 2],
    "part_rows": PART,
}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_trial_reports_each_stage_at_most_once_per_interval():
    clock, reports = Clock(), []
    progress = TrialProgress(reports.append, every_s=10, clock=clock)
    for t, done in ((0, 100), (5, 200), (10, 300), (12, 400), (20, 450)):
        clock.now = t
        progress("adapting", done, N)
    assert [(r["progress_done"], r["progress_rate"]) for r in reports] == [(300, 30.0), (450, 22.5)]
    clock.now = 21
    progress("encoding", 10, 50)  # a new stage starts its own clock
    clock.now = 31
    progress("encoding", 30, 50)
    assert reports[-1] == {"progress": "encoding", "progress_done": 30, "progress_total": 50, "progress_rate": 3.0}


def test_a_run_reports_samples_done_after_each_part(tmp_path):
    spec = validate_spec({**copy.deepcopy(SPEC), "methods": [{"method": "bca"}], "seeds": [1]}, base_dir=tmp_path)
    calls = []
    (trial,) = make_trials(expand(spec), 1)
    execute_trial(trial, settings_of(spec), lambda *args: calls.append(args))
    assert calls == [("adapting", k, N) for k in (100, 200, 300, 400, 450)]


def test_encoding_reports_images_done(tmp_path):
    """A real dataset encoded by the trial: the encoder's progress reaches the trial's progress callback."""
    from orchestrator.clip.testing import TINY_VIT, build_dataset, write_model_config

    build_dataset("dtd", tmp_path / "data", num_classes=2, per_class=3)
    config = write_model_config(TINY_VIT, tmp_path / "models")
    spec = validate_spec({"name": "enc", "results_dir": "results", "cache_dir": "cache", "data_root": "data",
                          "backbones": [{"model": TINY_VIT, "config": str(config), "pretrained": "random"}],
                          "datasets": ["dtd"],
                          "methods": [{"method": "clip"}], "seeds": [1], "part_rows": 4},
                         base_dir=tmp_path)
    calls = []
    (trial,) = make_trials(expand(spec), 1)
    execute_trial(trial, settings_of(spec), lambda *args: calls.append(args))
    encoding = [c for c in calls if c[0] == "encoding"]
    assert encoding and encoding[-1] == ("encoding", 6, 6)
    assert [c for c in calls if c[0] == "adapting"] == [("adapting", 4, 6), ("adapting", 6, 6)]


def test_running_trial_lines_and_an_eta_weighted_by_method_cost(tmp_path):
    """clip costs 1/450 s per sample, tda 1/5 (90x): with both clips and one tda done after 92 s, the one tda
    left takes about 90 s more, not the third of the elapsed time a per-run average would say."""
    spec = validate_spec(copy.deepcopy(SPEC), base_dir=tmp_path)
    runs = expand(spec)
    trials = make_trials(runs, 1)
    clip = [t for t in trials if t.runs[0].config["method"] == "clip"]
    tda = [t for t in trials if t.runs[0].config["method"] == "tda"]
    clock, lines = Clock(), []
    callback = ProgressCallback(trials, runs, out=lines.append, clock=clock)

    def tune_trial(plan, **result):
        return SimpleNamespace(config={"trial": plan.key}, last_result=result)

    callback.on_trial_start(0, [], tune_trial(clip[0]))
    clock.now = 92
    for plan, speed in ((clip[0], 450.0), (clip[1], 450.0), (tda[0], 5.0)):
        callback.on_trial_complete(0, [], tune_trial(plan, accuracy=50.0, samples_per_s=speed, n_runs=1,
                                                     n_samples=N))
    assert lines[-1].startswith("[3/4]  tda") and lines[-1].endswith("ETA 1:30")
    clock.now = 137
    callback.on_trial_result(0, [], tune_trial(tda[1]), {"progress": "adapting", "progress_done": 225,
                                                         "progress_total": N, "progress_rate": 5.0})
    assert lines[-1] == ("  tda | synthetic synthetic-temporal seed=2: adapting 225/450 samples, 5 samples/s, "
                         "0:45 left  ETA 0:45")
    callback.on_trial_result(0, [], tune_trial(tda[1]), {"progress": "encoding", "progress_done": 512,
                                                         "progress_total": 2048, "progress_rate": 256.0})
    assert "encoding 512/2,048 images, 256 images/s, 0:06 left" in lines[-1]


def _finished_lines(spec, pack: int) -> list[str]:
    """The progress lines of the spec's trials (packs of `pack`), each reported finished."""
    runs = expand(spec)
    trials = make_trials(runs, pack)
    lines: list[str] = []
    callback = ProgressCallback(trials, runs, out=lines.append, clock=Clock())
    for plan in trials:
        callback.on_trial_complete(0, [], SimpleNamespace(config={"trial": plan.key}, last_result={
            "accuracy": 50.0, "samples_per_s": 100.0, "n_runs": len(plan.runs), "n_samples": N}))
    return lines


def test_progress_lines_name_stream_and_order(tmp_path):
    """The demo's lines: runs of one configuration differ only in stream and order, so both are named."""
    spec = validate_spec({**copy.deepcopy(SPEC), "methods": [{"method": "clip"}], "seeds": [1],
                          "stream": ["iid", {"dirichlet": {"gamma": 0.01}}], "orders": 2}, base_dir=tmp_path)
    described = sorted(line.split("|")[1].split("  acc")[0].strip() for line in _finished_lines(spec, 1))
    assert described == [f"synthetic synthetic-temporal {stream} seed=1 order={k}"
                         for stream in ("dirichlet(gamma=0.01)", "iid") for k in (0, 1)]
    # a trial over several orders of one stream names their range
    spec = validate_spec({**copy.deepcopy(SPEC), "methods": [{"method": "clip"}], "seeds": [1], "stream": "iid",
                          "orders": 3}, base_dir=tmp_path)
    assert [line.split("]", 1)[1].split("  acc")[0].strip() for line in _finished_lines(spec, 3)] == [
        "pack of 3 runs | synthetic synthetic-temporal iid seed=1 orders=0-2"]


def test_closing_hint_runs_in_a_fresh_shell(tmp_path):
    """The closing hint names this environment's bca script, so it works where `bca` is not on the PATH."""
    hint = dashboard_hint(tmp_path / "my results")
    command = hint.removeprefix("open the dashboard: ")
    script = command.split(" dashboard ")[0]
    assert Path(script).name == "bca" and (Path.cwd() / script).is_file()
    out = subprocess.run(["env", "-i", "bash", "-c", f"{script} dashboard --help"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert command.endswith(f"--results '{tmp_path / 'my results'}'")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ray_dashboard_flag_starts_rays_dashboard_on_loopback(tmp_path):
    spec_path = tmp_path / "dash.yaml"
    spec_path.write_text(yaml.safe_dump({**copy.deepcopy(SPEC), "name": "dash", "methods": [{"method": "clip"}],
                                         "seeds": [1]}))
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "sweep", str(spec_path), "--ray-dashboard"],
                          capture_output=True, text=True, timeout=280, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("Ray dashboard: "))
    assert line.startswith("Ray dashboard: http://127.0.0.1:") and "this machine only" in line
