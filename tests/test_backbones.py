"""Backbone records and sigmoid-scored backbones (SigLIP): the records agree with open_clip's configs; a backbone's
learned logit scale and bias are read from its weights; every method of the registry is planned by its card's
sigmoid rule on a tiny random-weight SigLIP-like config; a 'refuse' method exits 2; zero-shot CLIP on it predicts
as SigLIP's sigmoid does, through the feature cache, a sweep (with TDA, OnZeta and Tent on its vision tower) and the
report."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.clip.backbone import BackboneSpec, learned_logits, load_backbone, resolve_weights
from orchestrator.clip.testing import TINY_SIGLIP, TINY_VIT, build_dataset, register_tiny_models, write_model_config
from orchestrator.features import load_benchmark
from orchestrator.registry import MethodCard, method_card, method_names
from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.registry.backbones import BACKBONES, SIGMOID, SOFTMAX, head_of_config
from orchestrator.registry.card import FAMILY_SIGMOID_RULES, SigmoidRule, TextEncoderUse
from orchestrator.results.db import ResultsDB
from orchestrator.sweep import cost
from orchestrator.sweep.catalog import backbone_issue
from orchestrator.sweep.load import load_spec
from orchestrator.sweep.plan import DataSource, expand, make_trials
from orchestrator.sweep.pieces import selection_scale, settings_of
from orchestrator.sweep.trial import execute_trial

ENV = {"COLUMNS": "200", "NO_COLOR": "1"}
SCALE, BIAS = 50.0, -7.0  # the test checkpoint's learned values: neither CLIP's 100 nor open_clip's initial ones


def bca(*args: str):
    return CliRunner().invoke(app, list(args), env=ENV)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """The tiny configs' files and a tiny SigLIP checkpoint whose logit scale is SCALE and bias BIAS."""
    register_tiny_models()
    folder = tmp_path_factory.mktemp("models")
    net = load_backbone(TINY_SIGLIP, None, "cpu").model
    with torch.no_grad():
        net.logit_scale.fill_(math.log(SCALE))
        net.logit_bias.fill_(BIAS)
    torch.save(net.state_dict(), folder / "sig.pt")
    return {"sig": write_model_config(TINY_SIGLIP, folder), "vit": write_model_config(TINY_VIT, folder),
            "checkpoint": folder / "sig.pt"}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("images") / "data"
    build_dataset("dtd", root, num_classes=3, per_class=2)
    return root


def write_spec(tmp_path: Path, data: Path, models: dict[str, Path], methods: list[dict], sigmoid: bool = True,
               name: str = "sig") -> Path:
    backbone = ({"model": TINY_SIGLIP, "checkpoint": str(models["checkpoint"]), "config": str(models["sig"])}
                if sigmoid else {"model": TINY_VIT, "pretrained": "random", "config": str(models["vit"])})
    # every method runs here: COSMIC reads an auxiliary encoder's features
    backbone["auxiliary"] = [{"name": "dinov2", "arch": "bca-tiny-dinov2", "pretrained": "random"}]
    spec = {"name": name, "results_dir": "results", "cache_dir": str(data.parent / "cache"), "data_root": str(data),
            "backbones": [backbone], "datasets": ["dtd"], "methods": methods, "seeds": [1],
            "resources": {"cpus": 1}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_each_record_is_an_open_clip_config_with_its_head_and_tag():
    import open_clip

    for model, record in BACKBONES.items():
        config = open_clip.get_model_config(model)
        assert config is not None, model
        assert head_of_config(config) == record.head, model
        assert record.tag in open_clip.list_pretrained_tags_by_model(model), model
    assert {b.model for b in BACKBONES.values() if b.head == SIGMOID} == {"ViT-B-16-SigLIP"}
    assert {"RN50", "ViT-B-16", "ViT-B-32", "ViT-L-14"} <= {b.model for b in BACKBONES.values() if b.head == SOFTMAX}
    # the dry run's memory plan takes each backbone's embedding width from its config
    widths = {m: cost.source_shape(DataSource(dataset="dtd", seed=1, model=m)) for m in BACKBONES}
    assert widths == {"RN50": (47, 1024), "ViT-B-16": (47, 512), "ViT-B-32": (47, 512), "ViT-L-14": (47, 768),
                      "ViT-B-16-SigLIP": (47, 768)}
    # the dry run prices encoding with the records' measured rates and names the others unpriced
    line = cost.projected_hours([], lambda source: 0, {"ViT-B-32": 1000, "RN50": 4612 * 3600})[1]
    assert "encoding 1.0," in line and "not priced for ViT-B-32 (no measured rate)" in line


def test_a_siglip_config_needs_transformers_for_its_tokenizer():
    problem = backbone_issue("ViT-B-16-SigLIP", "webli", None, None)
    if importlib.util.find_spec("transformers") is None:
        assert problem is not None and problem[0] == "model" and "pip install transformers" in problem[1]
    else:
        assert problem is None


def test_learned_logits_come_from_the_weights(models):
    random = resolve_weights(BackboneSpec(TINY_SIGLIP, None))
    assert learned_logits(random) == pytest.approx((1 / 0.07, -10.0))  # open_clip's initial values
    scale, bias = learned_logits(resolve_weights(BackboneSpec(TINY_SIGLIP, str(models["checkpoint"]))))
    assert scale == pytest.approx(SCALE, rel=1e-6) and bias == BIAS  # exp of a float32 log: float32 rounding
    assert learned_logits(resolve_weights(BackboneSpec(TINY_VIT, None)))[1] is None  # CLIP: no bias


def test_a_card_without_a_rule_takes_its_familys_else_one_from_what_it_declares():
    def card(family="toy", hparams=(), **fields):
        return MethodCard("toy", "Toy", 999, family, "nothing", "toy:Toy", hparams, **fields)

    assert card().sigmoid_rule == SigmoidRule("unchanged")
    assert card(hparams=(LOGIT_SCALE,)).sigmoid_rule == SigmoidRule("backbone_scale")
    assert card(hparams=(LOGIT_SCALE,), text_encoder=TextEncoderUse("any", 1.0)).sigmoid_rule.rule == "refuse"
    assert card("prompt", (LOGIT_SCALE,)).sigmoid_rule == FAMILY_SIGMOID_RULES["prompt"]
    assert card(hparams=(LOGIT_SCALE,), sigmoid=SigmoidRule("unchanged")).sigmoid_rule == SigmoidRule("unchanged")
    with pytest.raises(ValueError, match="sigmoid rule 'refuse' needs a why"):
        SigmoidRule("refuse")
    with pytest.raises(ValueError, match="method 'toy': sigmoid rule 'backbone_scale' .* needs a logit_scale hparam"):
        card(sigmoid=SigmoidRule("backbone_scale"))
    with pytest.raises(ValueError, match="sigmoid rule must be one of"):
        SigmoidRule("sigmoid")
    with pytest.raises(ValueError, match="method 'toy': sigmoid must be a SigmoidRule or None, got 'unchanged'"):
        card(sigmoid="unchanged")


def test_every_method_is_planned_by_its_sigmoid_rule(tmp_path, data, models):
    names = method_names()
    runnable = [n for n in names if method_card(n).sigmoid_rule.rule != "refuse"]
    entries = [{"method": n} for n in runnable] + [{"method": "tda", "logit_scale": 30.0}]
    sig = {r.method: r for r in expand(load_spec(write_spec(tmp_path, data, models, entries)))
           if r.hparams.get("logit_scale") != 30.0}
    clip = {r.method: r for r in expand(load_spec(write_spec(tmp_path, data, models, entries, sigmoid=False,
                                                             name="vit")))
            if r.hparams.get("logit_scale") != 30.0}
    assert set(sig) == set(runnable)
    for name in runnable:
        card, run = method_card(name), sig[name]
        assert run.config["sigmoid"]["logit_scale"] == pytest.approx(SCALE, rel=1e-6), name
        assert run.config["sigmoid"]["logit_bias"] == BIAS, name
        assert "sigmoid" not in clip[name].config, name
        if card.sigmoid_rule.rule == "backbone_scale":
            assert run.hparams["logit_scale"] == run.config["sigmoid"]["logit_scale"], name
            assert clip[name].hparams["logit_scale"] == card.defaults()["logit_scale"], name
        else:
            assert card.sigmoid_rule.rule == "unchanged" and "logit_scale" not in run.hparams, name
            assert run.hparams == clip[name].hparams, name
    # the data protocol's confident-view selection (AugMix datasets) runs at the backbone's scale too
    assert selection_scale(sig["clip"].source) == pytest.approx(SCALE, rel=1e-6)
    assert selection_scale(clip["clip"].source) == 100.0
    # a spec's own logit_scale wins
    assert any(r.method == "tda" and r.hparams["logit_scale"] == 30.0
               for r in expand(load_spec(write_spec(tmp_path, data, models, entries))))
    r = bca("sweep", str(write_spec(tmp_path, data, models, [{"method": "clip"}, {"method": "onzeta"}], name="dry")),
            "--dry-run")
    assert r.exit_code == 0, r.output
    assert (f"{TINY_SIGLIP} scores with a sigmoid: logit scale 50, bias -7 (read from its weights); clip run a "
            f"softmax at that scale (bias dropped: shared by every class); onzeta run unchanged") in r.output
    refused = [n for n in names if method_card(n).sigmoid_rule.rule == "refuse"]
    assert refused  # the prompt-tuning family
    r = bca("sweep", str(write_spec(tmp_path, data, models, [{"method": "clip"}, {"method": refused[0]}],
                                    name="refused")), "--dry-run")
    assert r.exit_code == 2, r.output
    assert f"methods[1]: {refused[0]} does not run on {TINY_SIGLIP} (backbones[0]), which scores with a sigmoid" \
        in " ".join(r.output.split())


def test_clip_on_siglip_predicts_as_its_sigmoid_through_cache_sweep_and_report(tmp_path, data, models,
                                                                                monkeypatch):
    path = write_spec(tmp_path, data, models, [{"method": "clip"}, {"method": "tda"}, {"method": "onzeta"},
                                               {"method": "tent", "batch_size": 2}])
    spec = load_spec(path)
    runs = expand(spec)
    for trial in make_trials(runs, spec.pack):
        execute_trial(trial, settings_of(spec))
    monkeypatch.chdir(tmp_path)
    r = bca("report", "--sweep", "sig", "--results", "results")
    assert r.exit_code == 0, r.output
    for label in ("CLIP (batch_size=1)", "TDA (batch_size=1)", "OnZeta (batch_size=1)", "Tent (batch_size=2)"):
        assert "(n=1)" in next(line for line in r.stdout.splitlines() if f"│ {label} " in line), label

    run = next(r for r in runs if r.method == "clip")
    with ResultsDB(spec.results_dir) as db:
        rows = {row["image_id"]: row for row in db.sql(
            f"SELECT image_id, pred, confidence FROM samples WHERE run_id = '{run.run_id}'").to_pylist()}
    bench = load_benchmark("dtd", data, data.parent / "cache", TINY_SIGLIP, str(models["checkpoint"]),
                           views="single", num_workers=0, device="cpu")
    cos = bench.features.double() @ bench.class_embeddings.double().T
    softmax = torch.softmax(run.hparams["logit_scale"] * cos, dim=-1)
    sigmoid = torch.sigmoid(SCALE * cos + BIAS)
    assert len(rows) == len(bench.image_ids)
    for i, image_id in enumerate(bench.image_ids):
        assert rows[image_id]["pred"] == int(sigmoid[i].argmax()) == int(softmax[i].argmax())
        # reported posteriors are softmax(s cos) over the classes; float32 run against this float64 one
        assert rows[image_id]["confidence"] == pytest.approx(float(softmax[i].max()), abs=1e-5)
