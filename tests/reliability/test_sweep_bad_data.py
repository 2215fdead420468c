"""A real-dataset sweep over bad data (issue 7, items 3, 5 and 6): one dataset with undecodable images and one
whose folder holds nothing, in one spec on the package's Ray session (a tiny open_clip model, random weights).

The dataset with bad images finishes with its readable images (the skips recorded in the cache's manifest);
the one whose folder was emptied after validation fails at once (no retries) with an error naming its folder
while every other run finishes; the two trials on the
same (backbone, dataset) encode the images once between them; and a finished run replays exactly from its
recorded stream order and the cached features.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from orchestrator.clip.testing import TINY_CONFIGS, TINY_VIT, build_dataset, register_tiny_models
from orchestrator.data.listing import read_dataset
from orchestrator.features import load_benchmark
from orchestrator.methods import run_stream
from orchestrator.results.verify import verify_results
from orchestrator.results.writer import load_state, read_run
from orchestrator.sweep.load import load_spec
from orchestrator.sweep.plan import expand
from orchestrator.sweep.runner import run_sweep

from .conftest import sample_rows

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def bad_data_sweep(ray_session, tmp_path_factory):
    register_tiny_models()
    base = tmp_path_factory.mktemp("bad-data-sweep")
    data = base / "data"
    build_dataset("dtd", data, num_classes=3, per_class=4)
    images = read_dataset("dtd", data)
    bad = {images.image_ids[1]: b"", images.image_ids[6]: b"<html>not an image</html>"}
    for image_id, content in bad.items():
        (data / image_id).write_bytes(content)
    build_dataset("eurosat", data, num_classes=3, per_class=2)  # valid at validation, emptied before the run
    config = base / f"{TINY_VIT}.json"
    config.write_text(json.dumps(TINY_CONFIGS[TINY_VIT]))
    spec = {
        "name": "bad-data",
        "results_dir": "results",
        "data_root": "data",
        "cache_dir": "cache",
        "backbones": [{"model": TINY_VIT, "config": str(config), "pretrained": "random"}],
        "datasets": ["dtd", "eurosat"],
        "views": "single",
        "methods": [{"method": "clip"}, {"method": "bca", "tau": 0.3, "n1": 5, "n2": 2}],
        "seeds": [3],
        "resources": {"cpus": 1},
        "part_rows": 4,
        "max_failures": 2,  # a missing folder is deterministic: failed at once, never retried
    }
    spec_path = base / "bad-data.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    lines: list[str] = []
    loaded = load_spec(spec_path)
    shutil.rmtree(data / "eurosat")
    (data / "eurosat").mkdir()
    outcome = run_sweep(loaded, out=lines.append)
    return loaded, outcome, lines, images, bad


def test_the_empty_dataset_fails_alone_and_names_its_folder(bad_data_sweep, ledger):
    spec, outcome, lines, _, _ = bad_data_sweep
    runs = expand(spec)
    eurosat = {r.run_id for r in runs if r.config["dataset"] == "eurosat"}
    assert set(outcome.failed) == eurosat and outcome.finished == len(runs) - len(eurosat), lines
    assert not any(line.startswith("retry:") for line in lines), lines
    for run_id in eurosat:
        error = read_run(spec.results_dir, spec.name, run_id)["error"]
        assert "EuroSAT" in error and "split_zhou_EuroSAT.json does not exist" in error, error
    rows = sample_rows(spec.results_dir)
    for run in runs:
        if run.run_id not in eurosat:
            n = read_run(spec.results_dir, spec.name, run.run_id)["n_samples"]
            assert [r["sample_idx"] for r in rows[run.run_id]] == list(range(n)), run.label
    problems = verify_results(spec.results_dir).problems
    assert {(p.kind, p.where) for p in problems} == {("missing_rows", rid) for rid in eurosat}, problems
    assert all("no rows written" in p.detail and "split_zhou_EuroSAT.json" in p.detail for p in problems), problems
    ledger.bad_input("sweep naming an empty dataset folder", "error", finished_runs_kept=outcome.finished)


def test_undecodable_images_are_skipped_and_the_runs_finish(bad_data_sweep, ledger):
    spec, _, _, images, bad = bad_data_sweep
    rows = sample_rows(spec.results_dir)
    for run in expand(spec):
        if run.config["dataset"] != "dtd":
            continue
        ids = [r["image_id"] for r in rows[run.run_id]]
        assert len(ids) == len(images) - len(bad) and not set(ids) & set(bad)
        row = read_run(spec.results_dir, spec.name, run.run_id)
        assert row["status"] == "finished" and row["n_skipped"] == len(bad), row
        assert sorted(s["image_id"] for s in json.loads(row["skipped"])) == sorted(bad), row["skipped"]
    manifest = next((Path(spec.cache_dir) / "features").glob("*/manifest.json"))
    assert sorted(s["image_id"] for s in json.loads(manifest.read_text())["skipped"]) == sorted(bad)
    ledger.bad_input("sweep over a dataset with a zero-byte and a non-image file", "recorded skip")


def test_two_trials_on_one_cache_entry_encode_once(bad_data_sweep, ledger):
    spec, _, _, _, _ = bad_data_sweep
    dtd = [r for r in expand(spec) if r.config["dataset"] == "dtd"]
    encoded = [read_run(spec.results_dir, spec.name, r.run_id)["time_encoder_s"] for r in dtd]
    assert len(dtd) == 2 and sum(t > 0 for t in encoded) == 1, encoded
    entries = [p for p in (Path(spec.cache_dir) / "features").iterdir() if p.is_dir()]
    assert len(entries) == 1, entries
    ledger.fault("two trials asking for one feature-cache entry (encoded once)")


def test_a_real_dataset_run_replays_from_its_recorded_order(bad_data_sweep, ledger):
    spec, _, _, _, _ = bad_data_sweep
    run = next(r for r in expand(spec) if r.config["dataset"] == "dtd" and r.config["method"] == "bca")
    order = load_state(spec.results_dir, run.run_id)["stream_order"]
    stored = sample_rows(spec.results_dir)[run.run_id]
    assert sorted(order.tolist()) == list(range(len(stored))) and order.tolist() != sorted(order.tolist())
    bench = load_benchmark("dtd", spec.data_root, spec.cache_dir, TINY_VIT, None, views="single", seed=3,
                           device="cpu")
    assert bench.encode_seconds == 0.0  # a cache hit: the replay reads what the sweep encoded
    assert [r["image_id"] for r in stored] == [bench.image_ids[i] for i in order]
    posteriors = run_stream("bca", bench.features[torch.from_numpy(order)], bench.class_embeddings,
                            bench.class_ids, bench.num_classes, **run.config["hparams"])
    assert posteriors.argmax(dim=1).tolist() == [r["pred"] for r in stored]
    assert np.allclose(posteriors.max(dim=1).values.numpy(), [r["confidence"] for r in stored], atol=1e-6)
    ledger.determinism("replay of a real-dataset run from its recorded stream order")
