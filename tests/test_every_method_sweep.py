"""Every registered method through a Ray sweep: on a synthetic scenario (the methods that run on a single view)
and on a tiny real dataset with the tiny open_clip model, where `views: protocol` gives each method its
official view kind (AugMix for TDA, DOTA, DPE, Zero and the BCA family; random resized crops for MTA,
BoostAdapter, TPS and DMN-ZS), both kinds encoded once each."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator import registry
from orchestrator.results.verify import verify_results
from orchestrator.results.writer import read_run
from orchestrator.sweep.load import load_spec
from orchestrator.sweep.plan import expand
from orchestrator.sweep.runner import run_sweep

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.usefixtures("local_ray")]


def _sweep(path: Path, spec: dict) -> tuple[object, list]:
    path.write_text(yaml.safe_dump(spec))
    loaded = load_spec(path)
    outcome = run_sweep(loaded, out=lambda line: None)
    assert outcome.ok, outcome.failed
    runs = expand(loaded)
    assert verify_results(loaded.results_dir).ok
    for run in runs:
        assert read_run(loaded.results_dir, loaded.name, run.run_id)["status"] == "finished", run.label
    return loaded, runs


def test_every_single_view_method_on_a_synthetic_scenario(tmp_path):
    methods = [c.name for c in registry.method_cards() if not c.views_everywhere and c.image_encoder is None]
    assert {"clip", "bca", "tda", "dota", "onzeta", "dpe", "boostadapter", "dlae", "adapt", "freetta"} <= set(methods)
    _, runs = _sweep(tmp_path / "synthetic.yaml", {
        "name": "every-synthetic", "results_dir": "results",
        "datasets": [{"synthetic": "label_shift", "n": 300, "num_classes": 5, "dim": 16}],
        "methods": [{"method": m} for m in methods], "seeds": [1], "resources": {"cpus": 1}, "part_rows": 100})
    assert sorted(r.config["method"] for r in runs) == sorted(methods)


def test_every_method_on_a_tiny_real_dataset_with_its_official_views(tmp_path):
    from orchestrator.clip.testing import TINY_RN, TINY_VIT, build_dataset, promptalign_files, write_model_config
    from orchestrator.registry.backbones import TEACHER, names_teacher

    build_dataset("imagenet-a", tmp_path / "data", num_classes=3, per_class=3)
    config = write_model_config(TINY_VIT, tmp_path / "models")
    methods = registry.method_names()
    spec, runs = _sweep(tmp_path / "real.yaml", {
        "name": "every-real", "results_dir": "results", "cache_dir": "cache", "data_root": "data",
        "backbones": [{"model": TINY_VIT, "config": str(config), "pretrained": "random",
                       "auxiliary": [{"name": "dinov2", "arch": "bca-tiny-dinov2", "pretrained": "random"}]}],
        "datasets": ["imagenet-a"], "views": "protocol",
        # a CLIP teacher (RLCF's) at toy size too: the other tiny model; PromptAlign's MaPLe file and statistics
        "methods": [{"method": m, **({TEACHER: TINY_RN} if names_teacher(registry.method_card(m)) else {}),
                     **(promptalign_files(tmp_path, TINY_VIT) if registry.method_card(m).tunes_maple else {})}
                    for m in methods], "seeds": [1], "resources": {"cpus": 1}, "part_rows": 4})
    assert sorted(r.config["method"] for r in runs) == sorted(methods)
    views = {r.config["method"]: r.config["views"] for r in runs}
    for name in methods:
        assert views[name] == registry.method_card(name).protocol_views("imagenet-a").name
    assert {"augmix", "crops"} <= set(views.values())  # both view kinds were encoded and run
    caches = {p.parent.name for p in Path(spec.cache_dir).rglob("manifest.json")}
    assert len(caches) >= 2
