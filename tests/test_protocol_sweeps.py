"""Stream protocols and metrics through the sweep: each run's order follows its protocol, OOD samples are
flagged and left out of accuracy, and every metric the views report equals the metrics module's numpy
definition on the stored rows (hand-checked there: tests/test_metrics.py)."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import balanced_accuracy_score, f1_score

from orchestrator.data import streams
from orchestrator.data.synthetic import make_synthetic
from orchestrator.results import metrics
from orchestrator.results.db import ResultsDB
from orchestrator.results.writer import load_state
from orchestrator.sweep.load import SpecError, validate_spec
from orchestrator.sweep.plan import expand, make_trials
from orchestrator.sweep.pieces import settings_of
from orchestrator.sweep.trial import execute_trial

DATA = {"synthetic": "label_shift", "n": 400, "num_classes": 8, "dim": 16}
SPEC = {"name": "protocols", "results_dir": "results", "datasets": [DATA],
        "methods": [{"method": "clip"}, {"method": "bca", "tau": 0.3, "n1": 50}], "seeds": [1]}


def run(tmp_path: Path, **overrides) -> tuple[object, ResultsDB]:
    spec = validate_spec({**copy.deepcopy(SPEC), **overrides}, base_dir=tmp_path)
    settings = settings_of(spec)
    for trial in make_trials(expand(spec), 1):
        execute_trial(trial, settings)
    return spec, ResultsDB(spec.results_dir)


def rows(results_dir: str, run_id: str) -> dict[str, np.ndarray]:
    parts = sorted(Path(results_dir).glob(f"samples/*/*/*/*/run_id={run_id}/part-*.parquet"))
    frame = pd.concat([pq.read_table(p).to_pandas() for p in parts]).sort_values("sample_idx")
    return {c: frame[c].to_numpy() for c in frame.columns}


def test_twenty_orders_report_mean_std_and_worst_ten_percent(tmp_path):
    spec, db = run(tmp_path, stream="iid", orders=20, methods=[{"method": "bca", "tau": 0.3, "n1": 50}])
    accuracy = db.df("SELECT order_index, accuracy FROM accuracy ORDER BY order_index")
    assert accuracy["order_index"].tolist() == list(range(20))
    expected = metrics.across_orders(accuracy["accuracy"].to_numpy())
    summary = db.df("SELECT n, orders, mean, std, worst10, worst_count FROM summary").iloc[0]
    assert (summary["n"], summary["orders"], summary["worst_count"]) == (20, 20, 2)
    assert summary["mean"] == pytest.approx(expected.mean)
    assert summary["std"] == pytest.approx(expected.std)
    assert summary["worst10"] == pytest.approx(expected.worst10)
    assert expected.worst10 < expected.mean  # the orders differ: the worst two are below the mean
    # every order is the protocol's permutation for its derived seed
    seeds = streams.derive_order_seeds(1, 20)
    for run_obj in expand(spec):
        order = load_state(spec.results_dir, run_obj.run_id)["stream_order"]
        assert np.array_equal(order, streams.iid_permutation(400, seeds[run_obj.config["order_index"]]))


def test_dirichlet_stream_is_stored_in_its_order(tmp_path):
    spec, _ = run(tmp_path, stream={"dirichlet": {"gamma": 0.01}})
    labels = make_synthetic("label_shift", seed=1, n=400, num_classes=8, dim=16).labels.numpy()
    expected = streams.Dirichlet(gamma=0.01).order(labels, 1).index
    for run_obj in expand(spec):
        assert run_obj.config["stream"] == {"dirichlet": {"gamma": 0.01}}
        assert np.array_equal(load_state(spec.results_dir, run_obj.run_id)["stream_order"], expected)
        stored = rows(spec.results_dir, run_obj.run_id)
        assert np.array_equal(stored["label"], labels[expected])


def test_longtail_stream_runs_its_own_subset_per_order(tmp_path):
    data = {**DATA, "synthetic": "iid"}  # uniform class frequencies: label_shift's rarest class is too small a head
    spec, db = run(tmp_path, datasets=[data], stream={"longtail": {"imbalance": 4}}, orders=2)
    labels = make_synthetic("iid", seed=1, n=400, num_classes=8, dim=16).labels.numpy()
    seeds = streams.derive_order_seeds(1, 2)
    view = db.df("SELECT * FROM accuracy").set_index("run_id")
    for run_obj in expand(spec):
        expected = streams.LongTail(4).order(labels, seeds[run_obj.config["order_index"]]).index
        assert np.array_equal(load_state(spec.results_dir, run_obj.run_id)["stream_order"], expected)
        stored = rows(spec.results_dir, run_obj.run_id)
        assert np.array_equal(stored["label"], labels[expected])
        got = view.loc[run_obj.run_id]
        assert got["complete"] and got["n_samples"] == len(expected) < 400
        assert got["macro_f1"] == pytest.approx(100 * f1_score(stored["label"], stored["pred"], average="macro"))
    summary = db.df("SELECT method, n, macro_f1_mean FROM summary")
    assert set(summary["n"]) == {2} and summary["macro_f1_mean"].notna().all()


def test_contaminated_stream_flags_ood_and_metrics_match_numpy(tmp_path):
    spec, db = run(tmp_path, stream={"contaminated": {"rate": 0.2}})
    view = db.df("SELECT * FROM accuracy").set_index("run_id")
    for run_obj in expand(spec):
        r = rows(spec.results_dir, run_obj.run_id)
        ood = r["is_ood"]
        assert ood.mean() == pytest.approx(0.2, abs=0.01) and (r["label"][ood] == -1).all()
        assert np.isnan(r["prob_true"][ood].astype(float)).all()
        assert r["label"][~ood].max() < 4  # half of the 8 classes held out: the label space is the other 4
        expected = metrics.run_metrics(correct=r["correct"], confidence=r["confidence"], labels=r["label"],
                                       top5_classes=np.stack(r["top5"]), prob_true=r["prob_true"].astype(float),
                                       is_ood=ood, preds=r["pred"])
        got = view.loc[run_obj.run_id]
        assert got["accuracy"] == pytest.approx(100 * expected.top1)
        assert got["last50_accuracy"] == pytest.approx(100 * expected.last_half)
        assert got["top5_accuracy"] == pytest.approx(100 * expected.top5)
        assert got["ece"] == pytest.approx(100 * expected.ece)
        assert got["nll"] == pytest.approx(expected.nll, rel=1e-5)
        assert got["ood_auroc"] == pytest.approx(100 * expected.ood_auroc)
        assert got["ece20"] == pytest.approx(100 * expected.ece20)
        # the class-averaged metrics over the in-distribution rows, as sklearn computes them
        assert got["macro_f1"] == pytest.approx(100 * f1_score(r["label"][~ood], r["pred"][~ood], average="macro"))
        assert got["balanced_accuracy"] == pytest.approx(
            100 * balanced_accuracy_score(r["label"][~ood], r["pred"][~ood]))
        assert got["n_ood"] == ood.sum()
        # the trial's runs-table metrics are the same numbers
        stored = db.df(f"SELECT * FROM runs WHERE run_id = '{run_obj.run_id}'").iloc[0]
        for m in metrics.RUN_METRICS:
            assert stored[m.name] == pytest.approx(got[m.name], rel=1e-6), m.name


def test_paired_view_counts_helped_and_hurt_on_the_same_samples(tmp_path):
    spec, db = run(tmp_path, stream="iid")
    clip, bca = sorted(expand(spec), key=lambda r: r.config["method"] != "clip")
    a, b = rows(spec.results_dir, bca.run_id), rows(spec.results_dir, clip.run_id)
    expected = metrics.helped_hurt(a["image_id"], a["correct"], b["image_id"], b["correct"])
    got = db.df("SELECT * FROM paired").iloc[0]
    assert (got["run_id"], got["baseline_run"]) == (bca.run_id, clip.run_id)
    assert (got["helped"], got["hurt"], got["misaligned"]) == (expected.helped, expected.hurt, 0)
    assert got["helped"] + got["hurt"] > 0


@pytest.mark.parametrize("overrides,field,message", [
    ({"orders": 3}, "orders", "would be 3 copies of one run"),
    ({"stream": "sideways"}, "stream", "unknown stream 'sideways'"),
    ({"stream": {"dirichlet": {"gamma": -1}}}, "stream", "gamma"),
    ({"stream": {"continual": ["imagenet", "imagenet-v2"]}}, "stream", "continual streams read real datasets"),
    ({"stream": {"contaminated": {"rate": 0.2, "with": "imagenet"}}}, "stream", "can only be contaminated with"),
])
def test_bad_streams_are_refused_naming_the_field(tmp_path, overrides, field, message):
    with pytest.raises(SpecError) as info:
        validate_spec({**copy.deepcopy(SPEC), **overrides}, base_dir=tmp_path)
    assert any(path == field and message in text for path, text in info.value.issues), str(info.value)



def test_gradual_continual_stream_is_laid_over_its_datasets():
    """{continual: {datasets, mixing}} as a trial lays it over two datasets of one label space (arrange): each
    position holds the protocol's sample of its source dataset, its label and its source's name."""
    from orchestrator.data.arrange import arrange

    a = make_synthetic("iid", seed=1, n=60, num_classes=4, dim=8)
    b = dataclasses.replace(make_synthetic("iid", seed=2, n=40, num_classes=4, dim=8), name="other")
    protocol = streams.protocol_from_spec({"continual": {"datasets": [a.name, "other"], "mixing": 1.0}})
    laid = arrange(a, protocol, 5, others=(b,))
    expected = protocol.order([a.labels.numpy(), b.labels.numpy()], 5)
    # a alone for its first 30, then its last 30 and b's first 20 mixed, then b alone
    assert np.array_equal(laid.order.numpy(), expected.index) and set(expected.source[30:80]) == {0, 1}
    parts = (a, b)
    for i, (s, j) in enumerate(zip(expected.source, expected.index)):
        assert laid.labels[i] == parts[s].labels[j] and laid.image_ids[i] == parts[s].image_ids[j]
        assert laid.sources[i] == parts[s].name
