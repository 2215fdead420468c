"""Every method on a corruption benchmark in its released layout (CIFAR-10-C: one corruption at one severity, and
CoTTA's continual stream through two corruptions), with random weights, through the feature cache, the trials and
`bca report`'s corruption table: on a SigLIP config (tiny) each method as its card's sigmoid rule says, the ones it
refuses (tests/test_backbones.py) on the tiny CLIP ViT, and a few on ViT-B/32 (open_clip's own config: a real
tower's size, so few on a CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.clip.testing import (TINY_RN, TINY_SIGLIP, TINY_VIT, build_corrupted, promptalign_files,
                                       register_tiny_models, write_model_config)
from orchestrator.registry import method_card, method_names
from orchestrator.registry.backbones import TEACHER, names_teacher
from orchestrator.results.writer import read_run
from orchestrator.sweep.load import load_spec
from orchestrator.sweep.pieces import settings_of
from orchestrator.sweep.plan import expand, make_trials
from orchestrator.sweep.trial import execute_trial

pytestmark = pytest.mark.timeout(1200)
# the cheapest official step of each method whose defaults take many (the path is what is tested here)
CHEAP = {"clipartt": {"steps": 1}, "watt": {"rounds": 1, "template_steps": 1}}


def entry(name: str, files: Path) -> dict:
    card = method_card(name)
    # a CLIP teacher (RLCF's) at toy size too: the other tiny model; PromptAlign's MaPLe file and statistics
    return {"method": name, **CHEAP.get(name, {}),
            **({"batch_size": 2} if card.image_encoder and card.batch_size else {}),
            **({TEACHER: TINY_RN} if names_teacher(card) else {}),
            **(promptalign_files(files, TINY_VIT) if card.tunes_maple else {})}


@pytest.mark.parametrize("backbone", [TINY_SIGLIP, TINY_VIT, "ViT-B-32"])
def test_every_method_on_cifar10c_and_its_continual_stream(tmp_path, monkeypatch, backbone):
    monkeypatch.setattr("orchestrator.features.cache.default_workers", lambda: 0)
    register_tiny_models()
    build_corrupted("cifar10-c", tmp_path / "data", corruptions=("gaussian_noise", "shot_noise"), num_classes=10,
                    per_class=1)
    model = {"model": backbone, "pretrained": "random",
             "auxiliary": [{"name": "dinov2", "arch": "bca-tiny-dinov2", "pretrained": "random"}]}
    if backbone != "ViT-B-32":
        model["config"] = str(write_model_config(backbone, tmp_path / "models"))
    # SigLIP: every method its rule runs; the tiny CLIP ViT: the ones SigLIP refuses (the text-tower methods); ViT-B/32,
    # a real tower's size on a CPU: zero-shot CLIP, a cache method and an encoder-updating one
    refused = {n for n in method_names() if method_card(n).sigmoid_rule.rule == "refuse"}
    names = {TINY_SIGLIP: [n for n in method_names() if n not in refused], TINY_VIT: sorted(refused),
             "ViT-B-32": ["clip", "tda", "tent"]}[backbone]
    noise = {"name": "cifar10-c", "corruption": "gaussian_noise", "severity": 5}
    spec = {"name": "cb", "results_dir": "results", "cache_dir": "cache", "data_root": "data", "views": "augmix9",
            "backbones": [model], "datasets": [noise], "methods": [entry(n, tmp_path) for n in names], "seeds": [1],
            "stream": ["iid", {"continual": [{**noise, "corruption": ["gaussian_noise", "shot_noise"]}]}]}
    (tmp_path / "cb.yaml").write_text(yaml.safe_dump(spec))
    loaded = load_spec(tmp_path / "cb.yaml")
    runs = expand(loaded)
    assert {r.method for r in runs} == set(names) and len(runs) == 2 * len(names)
    for trial in make_trials(runs, "auto"):
        execute_trial(trial, settings_of(loaded))
    for run in runs:
        assert read_run(loaded.results_dir, "cb", run.run_id)["status"] == "finished", run.label
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["report", "--results", "results"], env={"COLUMNS": "300", "NO_COLOR": "1"})
    assert r.exit_code == 0, r.output
    assert "CIFAR-10-C, severity 5" in r.stdout and "continual stream" in r.stdout
