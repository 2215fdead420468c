"""Order-free runs over several stream orders (`orders: N`): each configuration computed once and its rows
replayed in every order (orchestrator.sweep.replay). At the trial level for every episodic method on a tiny real
dataset's crops, where the views change the predictions: the replayed runs' rows and runs-table rows are those
of each run in its own order, a replay killed mid-way resumes, an order that does not hold the computed
stream's samples (a contaminated stream draws its OOD samples per order) runs in its own order; the plan and
the dry run count each configuration once."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from orchestrator.methods.episodic import order_free
from orchestrator.results.verify import verify_results
from orchestrator.results.writer import RunWriter, read_run
from orchestrator.sweep.load import load_spec, validate_spec
from orchestrator.sweep.plan import Trial, computed_runs, expand, make_trials
from orchestrator.sweep import replay
from orchestrator.sweep.trial import execute_trial, settings_of

ORDERS = 3
# what differs between two executions of one run (timings, hosts, clocks), left out of the comparisons
VOLATILE = {"samples_per_s", "time_encoder_s", "time_logits_s", "time_posterior_s", "time_update_s", "peak_mem_mb",
            "warmup_s", "host", "versions", "started_at", "finished_at", "updated_at", "progress"}


def spec_dict(directory: Path, classes: int = 3, **extra) -> dict:
    """Zero, MTA (two configs) and TPS over 3 orders of a tiny ImageNet-A's official crops, encoded by the tiny
    open_clip model."""
    from orchestrator.clip.testing import TINY_VIT, build_dataset, write_model_config

    if not (directory / "data").is_dir():
        build_dataset("imagenet-a", directory / "data", num_classes=classes, per_class=5)
    config = write_model_config(TINY_VIT, directory / "models")
    return {"name": "replay", "results_dir": "results", "cache_dir": "cache", "data_root": "data",
            "backbones": [{"model": TINY_VIT, "config": str(config), "pretrained": "random"}],
            "datasets": ["imagenet-a"], "views": "crops", "orders": ORDERS,
            "methods": [{"method": "zero"}, {"method": "mta", "lambda_y": [0.2, 0.4]}, {"method": "tps"},
                        {"method": "clip"}],
            "seeds": [1], "resources": {"cpus": 1}, "part_rows": 4, **extra}


def outcome(spec, runs=None) -> dict[str, tuple[list[dict], dict]]:
    """run_id -> (its rows in stream order, its runs-table row without timings), of `runs` (default: all)."""
    out = {}
    for run in expand(spec) if runs is None else runs:
        writer = RunWriter(spec.results_dir, run.config)
        rows = [row for path in sorted(writer.samples_dir.glob("part-*.parquet"))
                for row in pq.read_table(path).to_pylist()]
        record = read_run(spec.results_dir, spec.name, run.run_id)
        out[run.run_id] = (rows, {k: v for k, v in record.items() if k not in VOLATILE})
    return out


def each_in_its_own_order(spec) -> None:
    """The reference: each order's order-free runs as one pack over that order's stream (no replay); the other
    runs in the trials the plan gives them."""
    runs = expand(spec)
    by_source: dict = {}
    for run in runs:
        if order_free(run.method):
            by_source.setdefault(run.source, []).append(run)
    trials = [Trial(f"own-{source.order_index}", source, tuple(group)) for source, group in by_source.items()]
    for trial in trials + make_trials([run for run in runs if not order_free(run.method)], "auto"):
        execute_trial(trial, settings_of(spec))


def assert_same_run(got: tuple[list[dict], dict], want: tuple[list[dict], dict], exact: bool) -> None:
    """Rows and runs-table row equal; where `exact` is False (a sample computed in another batch of a lockstep
    pass, whose products may round differently) the float columns within float32 rounding, everything else equal."""
    if exact:
        assert got == want
        return
    (rows, record), (rows_want, record_want) = got, want
    assert len(rows) == len(rows_want)
    for row, row_want in zip(rows, rows_want):
        assert row.keys() == row_want.keys()
        for key, value in row_want.items():
            if isinstance(value, float):
                assert row[key] == pytest.approx(value, abs=1e-5, nan_ok=True), key
            else:
                assert row[key] == value, key
    for key, value in record_want.items():
        if isinstance(value, float):
            assert record[key] == pytest.approx(value, rel=1e-5, abs=1e-6, nan_ok=True), key
        else:
            assert record[key] == value, key


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    directory = tmp_path_factory.mktemp("replay")
    spec = validate_spec({**spec_dict(directory), "results_dir": "own"}, base_dir=directory)
    each_in_its_own_order(spec)
    return directory, outcome(spec)


def test_the_plan_puts_every_order_of_a_configuration_in_one_trial_that_computes_it_once(reference):
    directory, _ = reference
    spec = validate_spec(spec_dict(directory), base_dir=directory)
    runs = expand(spec)
    trials = make_trials(runs, "auto")
    replays = [t for t in trials if t.replay]
    assert sorted(r.run_id for t in trials for r in t.runs) == sorted(r.run_id for r in runs)
    assert {r.method for t in replays for r in t.runs} == {"zero", "mta", "tps"}
    assert not any(t.replay for t in trials if t.runs[0].method == "clip")  # not episodic: one source a trial
    for trial in replays:
        configs = {r.config["method"] + repr(r.hparams) for r in trial.runs}
        assert len(trial.replay) == len(configs)
        assert sorted(r.source.order_index for r in trial.runs) == sorted(list(range(ORDERS)) * len(configs))
    assert sum(len(computed_runs(t)) for t in replays) == 4  # zero, mta x 2, tps: once each
    one_each = make_trials(runs, 1)
    assert sum(len(t.replay) for t in one_each) == 4 and all(len(t.replay) <= 1 for t in one_each)


def test_replayed_runs_write_each_orders_own_rows_and_records(reference):
    directory, own = reference
    spec = validate_spec(spec_dict(directory), base_dir=directory)
    first = [r for r in expand(spec) if r.source.order_index == 0]
    clip = [row["confidence"] for row in own[next(r.run_id for r in first if r.method == "clip")][0]]
    for run in first:
        if run.method != "clip":  # random weights: the views move the posteriors, not the tiny model's top class
            assert max(abs(row["confidence"] - c) for row, c in zip(own[run.run_id][0], clip)) > 1e-3, \
                f"{run.method}: the views never changed a posterior; the comparison would prove little"
    trials = make_trials(expand(spec), "auto")
    assert any(t.replay for t in trials)
    for trial in trials:
        execute_trial(trial, settings_of(spec))
    replayed = outcome(spec)
    assert replayed.keys() == own.keys()
    for run in expand(spec):
        # the computed order is its pack's own pass; Zero's and MTA's per-sample products do not depend on the
        # batch they are in, TPS's round with it
        exact = run.source.order_index == 0 or run.method != "tps"
        assert_same_run(replayed[run.run_id], own[run.run_id], exact)
    # a run's samples/s is its configuration's compute rate, the same in each of its orders
    rates: dict[str, set] = {}
    for run in expand(spec):
        if run.method != "clip":
            key = run.method + repr(run.hparams)
            rates.setdefault(key, set()).add(read_run(spec.results_dir, spec.name, run.run_id)["samples_per_s"])
    assert len(rates) == 4 and all(len(r) == 1 for r in rates.values()), rates
    report = verify_results(spec.results_dir)
    assert report.ok, report.problems
    orders = {tuple(row["image_id"] for row in rows) for rows, _ in own.values()}
    assert len(orders) == ORDERS  # the orders do differ


def test_a_replay_killed_mid_way_resumes_and_writes_the_same_rows(reference, tmp_path):
    directory, own = reference
    spec = validate_spec({**spec_dict(directory), "results_dir": str(tmp_path / "killed")}, base_dir=directory)
    trial = next(t for t in make_trials(expand(spec), "auto") if t.replay and len(t.replay) == 1)
    flag = tmp_path / "flag"
    failing = replace(settings_of(spec), failpoint=f"raise:2:{flag}")
    with pytest.raises(RuntimeError, match="failpoint"):
        execute_trial(trial, failing)
    assert flag.exists()
    states = {read_run(spec.results_dir, spec.name, r.run_id)["status"] for r in trial.runs}
    assert "failed" in states
    results = execute_trial(trial, settings_of(spec))
    assert results and any(r["resumed_from"] > 0 for r in results)
    done = outcome(spec, trial.runs)
    for run in trial.runs:
        assert_same_run(done[run.run_id], own[run.run_id], run.source.order_index == 0 or run.method != "tps")
    assert verify_results(spec.results_dir).ok


def test_orders_that_draw_other_samples_run_in_their_own_order(tmp_path, monkeypatch):
    """A contaminated stream with another dataset's pool draws its OOD samples per order: orders that hold a
    sample the computed stream lacks are run as their own, with the same rows as a run in its own order."""
    data = spec_dict(tmp_path, classes=6)  # half of them held out as the OOD pool
    contaminated = {**data, "methods": [{"method": "zero"}], "stream": {"contaminated": {"rate": 0.3}}}
    own = validate_spec({**contaminated, "results_dir": "own"}, base_dir=tmp_path)
    each_in_its_own_order(own)
    spec = validate_spec(contaminated, base_dir=tmp_path)
    trials = make_trials(expand(spec), "auto")
    assert [len(t.runs) for t in trials if t.replay] == [ORDERS]
    laid, lay = [], replay.in_order

    def in_order(*args):
        laid.append(lay(*args))
        return laid[-1]

    monkeypatch.setattr(replay, "in_order", in_order)
    for trial in trials:
        execute_trial(trial, settings_of(spec))
    assert laid[0] is not None and None in laid  # the computed order replays itself; another order cannot
    assert outcome(spec) == outcome(own)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_bca_sweep_replays_through_ray_and_writes_every_orders_rows(reference, tmp_path):
    """`bca sweep` as a user types it (a local Ray): the replay trials travel through Tune, every run finishes
    with the rows of its own order, the dry run says what it replays, and a second sweep finds nothing to do."""
    from dashboard_results import bca_executable

    directory, own = reference
    data = {**spec_dict(directory), "results_dir": str(tmp_path / "results"), "cache_dir": str(directory / "cache"),
            "data_root": str(directory / "data")}
    path = tmp_path / "replay.yaml"
    path.write_text(yaml.safe_dump(data))
    runs = len(expand(load_spec(path)))
    dry = subprocess.run([bca_executable(), "sweep", str(path), "--dry-run"], capture_output=True, text=True,
                         timeout=300)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    line = next(ln for ln in dry.stdout.splitlines() if ln.startswith("order-free runs computed once"))
    assert line.startswith(f"order-free runs computed once over their orders: {4 * ORDERS} runs of ")
    assert set(line.split(" runs of ")[1].split(", ")[:3]) == {"zero", "mta", "tps"}
    assert "4 configurations computed" in line
    done = subprocess.run([bca_executable(), "sweep", str(path)], capture_output=True, text=True, timeout=800)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{runs}/{runs} runs finished, 0 failed" in done.stdout
    spec = load_spec(path)
    replayed = outcome(spec)
    for run in expand(spec):
        assert_same_run(replayed[run.run_id], own[run.run_id], run.source.order_index == 0 or run.method != "tps")
    assert verify_results(spec.results_dir).ok
    again = subprocess.run([bca_executable(), "sweep", str(path)], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and f"{runs} runs, {runs} already finished, 0 to run" in again.stdout, again.stdout
