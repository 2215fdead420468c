"""PromptAlign: MaPLe's prompts tuned per sample in both towers equal a float64 per-sample reference transcribed from
the official code, with both losses acting; align_weight 0 is MaPLe + TPT and needs no statistics; the source
statistics files are read in their released format and a wrong one is refused naming it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
import yaml

from orchestrator.clip.backbone import load_backbone
from orchestrator.clip.context import load_maple, load_statistics
from orchestrator.clip.maple import class_tokens
from orchestrator.clip.testing import (TINY_VIT, build_dataset, register_tiny_models, write_maple_context,
                                       write_model_config, write_promptalign_statistics)
from orchestrator.methods.base import make_method
from orchestrator.methods.prompt import PromptText, TextTower
from orchestrator.methods.promptalign.method import AlignVision
from orchestrator.methods.promptalign.reference import run_reference

NAMES = ["dog", "cat", "golden_retriever", "airplane"]
EPS32 = torch.finfo(torch.float32).eps


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    register_tiny_models()
    folder = tmp_path_factory.mktemp("promptalign")
    backbone = load_backbone(TINY_VIT, None, "cpu")
    maple = load_maple(write_maple_context(folder, TINY_VIT, n_ctx=2, depth=2, seed=3))
    stats = load_statistics(*write_promptalign_statistics(folder, TINY_VIT, n_ctx=2))
    tokens = class_tokens(backbone.tokenizer, NAMES, maple.n_ctx)
    text = PromptText(TextTower(backbone.model), tokens, maple.n_ctx, ctx=maple.ctx)
    views = torch.randn(3, 20, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    return backbone, maple, stats, tokens, text, views


def _run(setup, statistics=True, **hp):
    backbone, maple, stats, _, text, views = setup
    embeddings = torch.nn.functional.normalize(torch.randn(len(NAMES), 64), dim=-1)  # unused: both towers run
    method = make_method("promptalign", embeddings, torch.arange(len(NAMES)), len(NAMES), text=text,
                         vision=AlignVision(backbone.model.visual, maple, stats if statistics else None), **hp)
    return method.run(views)


@pytest.mark.parametrize("hp", [{"steps": 2}, {"steps": 1, "keep": 0.2, "align_keep": 0.1, "align_to": 2}])
def test_the_method_equals_the_float64_reference_with_both_losses_acting(setup, hp):
    backbone, maple, stats, tokens, _, views = setup
    trace = _run(setup, **hp)
    truth = run_reference(views, backbone.model, tokens, maple, stats.means, stats.vars, **hp)
    f32 = run_reference(views, backbone.model, tokens, maple, stats.means, stats.vars, dtype=torch.float32, **hp)
    drift = float((f32.double() - truth).abs().max())
    assert float((trace.posteriors.double() - truth).abs().max()) <= 4 * drift + 8 * EPS32
    assert bool(trace.gated.all())
    # both losses move the prediction: without the alignment, and without tuning at all, it differs
    entropy_only = run_reference(views, backbone.model, tokens, maple, None, None, align_weight=0.0, **hp)
    untuned = run_reference(views, backbone.model, tokens, maple, None, None, lr=0.0, align_weight=0.0, **hp)
    assert float((truth - entropy_only).abs().max()) > 1e3 * (drift + EPS32)
    assert float((entropy_only - untuned).abs().max()) > 1e3 * (drift + EPS32)


def test_align_weight_zero_is_maple_plus_tpt_without_statistics(setup):
    backbone, maple, _, tokens, _, views = setup
    trace = _run(setup, statistics=False, align_weight=0.0)
    truth = run_reference(views, backbone.model, tokens, maple, None, None, align_weight=0.0)
    f32 = run_reference(views, backbone.model, tokens, maple, None, None, align_weight=0.0, dtype=torch.float32)
    drift = float((f32.double() - truth).abs().max())
    assert float((trace.posteriors.double() - truth).abs().max()) <= 4 * drift + 8 * EPS32
    with pytest.raises(ValueError, match="align_weight 100.0 needs the source statistics"):
        _run(setup, statistics=False)


def test_what_cannot_run_is_refused(setup, tmp_path):
    with pytest.raises(ValueError, match=r"keep 0.01 of 20 views chooses none"):
        _run(setup, keep=0.01)
    with pytest.raises(ValueError, match="align_to .2. must exceed align_from .2."):
        _run(setup, align_from=2, align_to=2)
    means, variances = write_promptalign_statistics(tmp_path, TINY_VIT, n_ctx=2, layers=3)
    backbone, maple, _, _, text, views = setup
    with pytest.raises(ValueError, match=r"the source statistics are \(3, 19, 128\) and \(3, 19, 128\); expected "
                                         r"\(2, 19, 128\)"):
        make_method("promptalign", torch.eye(len(NAMES), 64), torch.arange(len(NAMES)), len(NAMES), text=text,
                    vision=AlignVision(backbone.model.visual, maple, load_statistics(means, variances)))
    with pytest.raises(ValueError, match=r"vis_means file .*ImgNetpre_vis_means.pt holds torch.float32 \(3, 19, 128\); "
                                         r"expected a float tensor \[2, 19, 128\]"):
        load_statistics(means, variances, (2, 19, 128))
    with pytest.raises(ValueError, match=r"vis_vars file .*nothing.pt does not exist"):
        load_statistics(means, tmp_path / "nothing.pt")


# ----------------------------------------------------------------------------------------------------- sweeps

ENV = {"COLUMNS": "250", "NO_COLOR": "1"}


def bca(*args: str):
    from typer.testing import CliRunner

    from orchestrator.cli import app

    return CliRunner().invoke(app, list(args), env=ENV)


def _spec(tmp_path: Path, methods: list[dict]) -> Path:
    build_dataset("dtd", tmp_path / "data", num_classes=3, per_class=2)
    spec = {"name": "promptalign", "results_dir": "results", "cache_dir": "cache", "data_root": "data",
            "backbones": [{"model": TINY_VIT, "pretrained": "random",
                           "config": str(write_model_config(TINY_VIT, tmp_path / "models"))}],
            "datasets": ["dtd"], "methods": methods, "seeds": [1], "resources": {"cpus": 1}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


MAPLE_AT = "maple/MultiModalPromptLearner/model.pth.tar-5"


def test_a_sweep_runs_promptalign_on_the_images_crops_recorded_by_its_files_hashes(tmp_path):
    """Through the trial: the run's rows are the method's on each image's crops (the views the cache's ViewTransform
    makes), its config records the MaPLe file's and both statistics files' sha256, and `bca report` shows its row."""
    from orchestrator.clip.views import ViewTransform, parse_views
    from orchestrator.data.datasets import open_image
    from orchestrator.results.db import ResultsDB
    from orchestrator.results.writer import read_run
    from orchestrator.sweep.load import load_spec
    from orchestrator.sweep.pieces import load_stream, settings_of
    from orchestrator.sweep.plan import expand, make_trials
    from orchestrator.sweep.trial import execute_trial

    maple_file = write_maple_context(tmp_path / "maple", TINY_VIT, n_ctx=2, depth=2, seed=3)
    means, variances = write_promptalign_statistics(tmp_path / "stats", TINY_VIT, n_ctx=2)
    path = _spec(tmp_path, [{"method": "promptalign", "context": MAPLE_AT, "vis_means": str(means),
                             "vis_vars": str(variances), "align_weight": [100.0, 0.0]}])
    plan = bca("sweep", str(path), "--dry-run")
    assert plan.exit_code == 0, plan.output
    assert "396.2 MB per image view (~24.8 GB at batch size 1, 64 views each)" in " ".join(plan.stdout.split())
    spec = load_spec(path)
    runs = expand(spec)
    assert len(runs) == 2
    sha = {name: hashlib.sha256(Path(p).read_bytes()).hexdigest()
           for name, p in (("context", maple_file), ("vis_means", means), ("vis_vars", variances))}
    for run in runs:
        assert {k: run.config.get(f"{k}_sha256") for k in sha} == sha
    settings = settings_of(spec)
    for trial in make_trials(runs, "auto"):
        execute_trial(trial, settings)
    stream, _ = load_stream(runs[0].source, settings)
    backbone = load_backbone(TINY_VIT, None, "cpu")
    maple = load_maple(maple_file)
    stats = load_statistics(means, variances)
    assert runs[0].config["views"] == "crops"  # its protocol's, recorded as any view method's
    transform = ViewTransform(parse_views("crops", runs[0].source.seed), backbone.preprocess,
                              backbone.resolved.preprocess)
    views = []
    for image_id in stream.image_ids:
        with open_image(Path(spec.data_root) / image_id) as image:
            views.append(transform(image, image_id))
    views = torch.stack(views)
    assert views.shape[1:3] == (64, 3)
    tokens = class_tokens(backbone.tokenizer, stream.class_names, maple.n_ctx)
    db = ResultsDB(spec.results_dir)
    for run in runs:
        record = read_run(spec.results_dir, spec.name, run.run_id)
        assert record["status"] == "finished" and record["context_sha256"] == sha["context"]
        weight = run.config["hparams"]["align_weight"]
        truth = run_reference(views, backbone.model, tokens, maple, stats.means, stats.vars, align_weight=weight)
        got = db.df(f"SELECT pred, prob_true FROM samples WHERE run_id = '{run.run_id}' ORDER BY sample_idx")
        assert got["pred"].tolist() == truth.argmax(1).tolist()
        want = truth[torch.arange(len(stream)), stream.labels.cpu()].numpy()
        assert abs(got["prob_true"].to_numpy() - want).max() <= 1e-5
    report = bca("report", "--results", spec.results_dir)
    assert report.exit_code == 0, report.output
    statistics = f"statistics {sha['vis_means'][:8]} {sha['vis_vars'][:8]}"
    for weight in (0, 100):
        assert f"PromptAlign (align_weight={weight}) [context {sha['context'][:8]}, {statistics}]" in report.stdout


@pytest.mark.parametrize("entry,expected", [
    ({"method": "promptalign"}, "methods[0].context: 'promptalign' tunes MaPLe's prompts in both towers from a MaPLe "
                                "context"),
    ({"method": "promptalign", "context": MAPLE_AT}, "methods[0].vis_means: 'promptalign' with align_weight > 0 "
                                                     "aligns with PromptAlign's source statistics"),
    ({"method": "promptalign", "context": MAPLE_AT, "vis_means": "stats/ImgNetpre_vis_means.pt",
      "vis_vars": "stats/nothing.pt"}, "methods[0].vis_vars: vis_vars file {root}/stats/nothing.pt does not exist"),
    ({"method": "promptalign", "context": MAPLE_AT, "vis_means": "wrong/ImgNetpre_vis_means.pt",
      "vis_vars": "wrong/ImgNetpre_vis_vars.pt"},
     "methods[0].vis_means: vis_means file {root}/wrong/ImgNetpre_vis_means.pt holds torch.float32 (3, 19, 128); "
     "expected a float tensor [2, 19, 128]"),
    ({"method": "promptalign", "context": "coop/prompt_learner/model.pth.tar-50", "align_weight": 0.0},
     "methods[0].context: context file {root}/coop/prompt_learner/model.pth.tar-50 is CoOp's; 'promptalign' tunes "
     "MaPLe's prompts"),
    ({"method": "tda", "vis_means": "stats/ImgNetpre_vis_means.pt"}, "methods[0].vis_means"),
])
def test_what_promptalign_cannot_start_from_exits_2_naming_the_field_and_file(tmp_path, entry, expected):
    from orchestrator.clip.testing import write_coop_context

    write_maple_context(tmp_path / "maple", TINY_VIT, n_ctx=2, depth=2)
    write_promptalign_statistics(tmp_path / "stats", TINY_VIT, n_ctx=2)
    write_promptalign_statistics(tmp_path / "wrong", TINY_VIT, n_ctx=2, layers=3)
    write_coop_context(tmp_path / "coop", TINY_VIT, ["a", "b", "c"], n_ctx=2)
    r = bca("sweep", str(_spec(tmp_path, [entry])), "--dry-run")
    assert r.exit_code == 2, r.output
    assert expected.format(root=tmp_path) in " ".join(r.stderr.split())
    assert "Traceback" not in r.output and not (tmp_path / "results").exists()
