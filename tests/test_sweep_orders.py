"""A trial over several stream orders of one data source (`orders: N`; orchestrator.sweep.orders): an order-free
method's configuration computed once and its rows replayed in every order; any other method's orders stepped in
one pass over the shared features. On a tiny real dataset's crops, where the views move the posteriors: every
run's rows and runs-table row are those of the run in a trial of its own order (within float32 rounding where
the passes differ), a replayed run's rows are its configuration's one computation, a trial killed mid-way
resumes, an order that does not hold the first order's samples (a contaminated stream draws its OOD samples per
order) runs in its own order; the plan, the dry run and `bca sweep` through Ray."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from orchestrator.methods.episodic import order_free
from orchestrator.results import schema, store
from orchestrator.results.verify import verify_results
from orchestrator.results.writer import RunWriter, read_run
from orchestrator.sweep import orders as by_orders
from orchestrator.sweep.dryrun import stepping_alone
from orchestrator.sweep.load import load_spec, validate_spec
from orchestrator.sweep.plan import Trial, computed_runs, expand, make_trials
from orchestrator.sweep.pieces import settings_of
from orchestrator.sweep.trial import execute_trial

ORDERS = 3
# what differs between two executions of one run (timings, hosts, clocks), left out of the comparisons
VOLATILE = {"samples_per_s", "latency_ms", "method_mem_mb", "time_encoder_s", "time_logits_s", "time_posterior_s",
            "time_update_s", "peak_mem_mb", "warmup_s", "host", "versions", "started_at", "finished_at",
            "updated_at", "progress"}


def spec_dict(directory: Path, classes: int = 3, **extra) -> dict:
    """Order-free Zero, MTA (two configs) and TPS, and CLIP, TDA and BCA (two configs), over 3 orders of a tiny
    ImageNet-A's official crops, encoded by the tiny open_clip model."""
    from orchestrator.clip.testing import TINY_VIT, build_dataset, write_model_config

    if not (directory / "data").is_dir():
        build_dataset("imagenet-a", directory / "data", num_classes=classes, per_class=5)
    config = write_model_config(TINY_VIT, directory / "models")
    return {"name": "orders", "results_dir": "results", "cache_dir": "cache", "data_root": "data",
            "backbones": [{"model": TINY_VIT, "config": str(config), "pretrained": "random"}],
            "datasets": ["imagenet-a"], "views": "crops", "orders": ORDERS,
            "methods": [{"method": "zero"}, {"method": "mta", "lambda_y": [0.2, 0.4]}, {"method": "tps"},
                        {"method": "clip"}, {"method": "tda"}, {"method": "bca", "tau": [0.2, 0.3]}],
            "seeds": [1], "resources": {"cpus": 1}, "part_rows": 4, **extra}


def outcome(spec, runs=None) -> dict[str, tuple[list[dict], dict]]:
    """run_id -> (its rows in stream order, its runs-table row without timings), of `runs` (default: all)."""
    out = {}
    names = [c.name for c in schema.SAMPLE_COLUMNS]
    catalog = store.load_catalog(spec.results_dir)
    for run in expand(spec) if runs is None else runs:
        writer = RunWriter(spec.results_dir, run.config)
        held = catalog.compacted().get(run.run_id)
        if held is not None:  # a pack of fresh runs is committed straight into a segment
            path = next(seg for seg in catalog.segments if seg.id == held[0]).path(catalog.results_dir, "samples")
            rows = pq.read_table(path, columns=names, filters=[("run_id", "=", run.run_id)]).sort_by(
                "sample_idx").to_pylist()
        else:
            rows = [row for path in sorted(writer.samples_dir.glob("part-*.parquet"))
                    for row in pq.read_table(path, columns=names).to_pylist()]
        record = read_run(spec.results_dir, spec.name, run.run_id)
        out[run.run_id] = (rows, {k: v for k, v in record.items() if k not in VOLATILE})
    return out


def each_in_its_own_order(spec) -> None:
    """The reference: each order's runs in one pack trial of that order alone (a pack's pass over the whole
    stream; a run alone is fed its stream in parts, whose products may round differently from a whole pass's)."""
    by_source: dict = {}
    for run in expand(spec):
        by_source.setdefault(run.source, []).append(run)
    for source, runs in by_source.items():
        execute_trial(Trial(f"own-{source.order_index}", source, tuple(runs)), settings_of(spec))


def assert_same_run(got: tuple[list[dict], dict], want: tuple[list[dict], dict]) -> None:
    """Rows and runs-table row equal, the float columns within float32 rounding and everything else
    (predictions, top-5, gates, selections) exactly: a run's products may round differently in another pass (a
    pack's pass takes the whole stream, a runner stepping orders together batches them)."""
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
    directory = tmp_path_factory.mktemp("orders")
    spec = validate_spec({**spec_dict(directory), "results_dir": "own"}, base_dir=directory)
    each_in_its_own_order(spec)
    return directory, outcome(spec)


def test_the_plan_packs_a_sources_orders_and_computes_an_order_free_configuration_once(reference):
    directory, _ = reference
    spec = validate_spec(spec_dict(directory), base_dir=directory)
    runs = expand(spec)
    for pack in ("auto", 1, 3):
        trials = make_trials(runs, pack)
        assert sorted(r.run_id for t in trials for r in t.runs) == sorted(r.run_id for r in runs)
        replays = [t for t in trials if t.replay]
        assert {r.method for t in replays for r in t.runs} == {"zero", "mta", "tps"}
        for trial in replays:  # every order of each configuration it computes
            configs = {r.method + repr(r.hparams) for r in trial.runs}
            assert len(trial.replay) == len(configs)
            assert sorted(r.source.order_index for r in trial.runs) == sorted(list(range(ORDERS)) * len(configs))
        assert sum(len(computed_runs(t)) for t in replays) == 4  # zero, mta x 2, tps: once each
        assert all(computed_runs(t) == t.runs for t in trials if not t.replay)
        assert not any(order_free(r.method) for t in trials if not t.replay for r in t.runs)
        if pack == "auto":  # the progress line of a replay trial says what it computes
            from orchestrator.sweep.progress import ProgressCallback

            line = ProgressCallback(trials, runs, out=lambda _: None)._describe(replays[0])
            assert f"({len(replays[0].replay)} computed, replayed over their orders)" in line
            assert line.endswith(f"orders=0-{ORDERS - 1}")
        if pack == 1:  # each stepped run alone in its pass, which the dry run says
            assert all(len(t.replay) == 1 for t in replays) and all(len(t.runs) == 1 for t in trials if not t.replay)
            assert stepping_alone(trials) == {"clip": ORDERS, "tda": ORDERS, "bca": 2 * ORDERS}
        if pack == 3:  # a configuration's 3 orders in one trial, stepped together (runners taking orders) but
            # CLIP's: on one feature per sample the BCA family's engine steps one order at a time
            assert {tuple(sorted(r.source.order_index for r in t.runs)) for t in trials if not t.replay} \
                == {(0, 1, 2)}
            assert stepping_alone(trials) == {"clip": ORDERS}


@pytest.mark.parametrize("pack", ["auto", 3])
def test_runs_over_orders_write_each_orders_own_rows_and_records(reference, pack, tmp_path):
    directory, own = reference
    spec = validate_spec({**spec_dict(directory), "results_dir": str(tmp_path / "results"), "pack": pack},
                         base_dir=directory)
    first = [r for r in expand(spec) if r.source.order_index == 0]
    clip = [row["confidence"] for row in own[next(r.run_id for r in first if r.method == "clip")][0]]
    for run in first:
        if run.method != "clip":  # random weights: the views move the posteriors, not the tiny model's top class
            assert max(abs(row["confidence"] - c) for row, c in zip(own[run.run_id][0], clip)) > 1e-3, \
                f"{run.method}: the views never changed a posterior; the comparison would prove little"
    trials = make_trials(expand(spec), spec.pack)
    assert any(len({r.source for r in t.runs}) > 1 for t in trials if not t.replay)
    for trial in trials:
        execute_trial(trial, settings_of(spec))
    got = outcome(spec)
    assert got.keys() == own.keys()
    for run in expand(spec):
        assert_same_run(got[run.run_id], own[run.run_id])
    # a replayed run holds its configuration's one computation: each image's row the same in every order
    for run in expand(spec):
        if order_free(run.method) and run.source.order_index > 0:
            first = next(r for r in expand(spec) if r.source.order_index == 0 and r.method == run.method
                         and r.hparams == run.hparams)
            strip = ("run_id", "sample_idx", "config_hash")
            mine = {row["image_id"]: {k: v for k, v in row.items() if k not in strip} for row in got[run.run_id][0]}
            assert mine == {row["image_id"]: {k: v for k, v in row.items() if k not in strip}
                            for row in got[first.run_id][0]}
    # a replayed run's samples/s is its configuration's compute rate, the same in each of its orders
    rates: dict[str, set] = {}
    for run in expand(spec):
        if order_free(run.method):
            key = run.method + repr(run.hparams)
            rates.setdefault(key, set()).add(read_run(spec.results_dir, spec.name, run.run_id)["samples_per_s"])
    assert len(rates) == 4 and all(len(r) == 1 for r in rates.values()), rates
    report = verify_results(spec.results_dir)
    assert report.ok, report.problems
    assert len({tuple(row["image_id"] for row in rows) for rows, _ in own.values()}) == ORDERS  # orders differ


@pytest.mark.parametrize("kind", ["replayed", "stepped"])
def test_a_trial_over_orders_killed_mid_way_resumes_and_writes_the_same_rows(reference, kind, tmp_path):
    directory, own = reference
    spec = validate_spec({**spec_dict(directory), "results_dir": str(tmp_path / "killed")}, base_dir=directory)
    trial = next(t for t in make_trials(expand(spec), 3)
                 if (t.replay if kind == "replayed" else t.runs[0].method == "bca"))
    flag = tmp_path / "flag"
    with pytest.raises(RuntimeError, match="failpoint"):
        execute_trial(trial, replace(settings_of(spec), failpoint=f"raise:2:{flag}"))
    assert flag.exists()
    assert "failed" in {read_run(spec.results_dir, spec.name, r.run_id)["status"] for r in trial.runs}
    results = execute_trial(trial, settings_of(spec))
    assert results and any(r["resumed_from"] > 0 for r in results)
    done = outcome(spec, trial.runs)
    for run in trial.runs:
        assert_same_run(done[run.run_id], own[run.run_id])
    assert verify_results(spec.results_dir).ok


@pytest.mark.parametrize("stream", [{"contaminated": {"rate": 0.3}}, {"longtail": {"imbalance": 2}}])
def test_orders_that_draw_other_samples_run_in_their_own_order(tmp_path, monkeypatch, stream):
    """A contaminated stream with held-out classes draws its OOD samples per order, a long-tailed one its subset:
    an order holding a sample the first order's stream lacks runs as its own, with the rows of a run in a trial
    of its own order."""
    data = spec_dict(tmp_path, classes=6)  # contaminated: half of them held out as the OOD pool
    contaminated = {**data, "methods": [{"method": "zero"}, {"method": "bca"}], "stream": stream}
    own = validate_spec({**contaminated, "results_dir": "own"}, base_dir=tmp_path)
    each_in_its_own_order(own)
    spec = validate_spec({**contaminated, "pack": 3}, base_dir=tmp_path)
    trials = make_trials(expand(spec), spec.pack)
    assert sorted(len(t.runs) for t in trials) == [ORDERS, ORDERS]
    laid, lay = [], by_orders.in_order

    def in_order(*args):
        laid.append(lay(*args))
        return laid[-1]

    monkeypatch.setattr(by_orders, "in_order", in_order)
    for trial in trials:
        execute_trial(trial, settings_of(spec))
    assert laid[0] is not None and None in laid  # the first order lays itself out; another order cannot
    mine, want = outcome(spec), outcome(own)
    assert mine.keys() == want.keys()
    for run_id, run in want.items():
        assert_same_run(mine[run_id], run)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_bca_sweep_runs_orders_together_through_ray(reference, tmp_path):
    """`bca sweep` as a user types it (a local Ray): the trials over orders travel through Tune, every run
    finishes with the rows of its own order, the dry run says what it replays, and a second sweep finds nothing
    to do."""
    from dashboard_results import bca_executable

    directory, own = reference
    data = {**spec_dict(directory), "results_dir": str(tmp_path / "results"), "cache_dir": str(directory / "cache"),
            "data_root": str(directory / "data")}
    path = tmp_path / "orders.yaml"
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
    got = outcome(spec)
    for run in expand(spec):
        assert_same_run(got[run.run_id], own[run.run_id])
    assert verify_results(spec.results_dir).ok
    again = subprocess.run([bca_executable(), "sweep", str(path)], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and f"{runs} runs, {runs} already finished, 0 to run" in again.stdout, again.stdout


def test_an_order_free_method_reading_a_teacher_computes_once_and_replays_its_orders(reference, tmp_path):
    """RLCF reads a CLIP teacher's features, which a pack does not pass, so its runs are never packed with others;
    it is episodic, so its orders are one computation replayed (the paper study's 100 orders at the cost of one),
    each order's rows those of the run in a trial of its own order."""
    from orchestrator.clip.testing import TINY_RN
    from orchestrator.registry.backbones import TEACHER

    directory, _ = reference
    entry = {"method": "rlcf", TEACHER: TINY_RN, "steps": 1}
    spec = validate_spec({**spec_dict(directory), "methods": [entry], "results_dir": str(tmp_path / "replayed")},
                         base_dir=directory)
    runs = expand(spec)
    trials = make_trials(runs, "auto")
    assert [(len(t.runs), len(t.replay)) for t in trials] == [(ORDERS, 1)]
    alone = validate_spec({**spec_dict(directory), "methods": [entry], "results_dir": str(tmp_path / "alone")},
                          base_dir=directory)
    each_in_its_own_order(alone)
    execute_trial(trials[0], settings_of(spec))
    got, want = outcome(spec), outcome(alone)
    assert got.keys() == want.keys() == {r.run_id for r in runs}
    for run_id in want:
        assert_same_run(got[run_id], want[run_id])
    assert len({tuple(row["pred"] for row in rows) for rows, _ in got.values()}) > 1  # the orders differ
