"""Learned starting points as a user meets them: a CoOp context file in its released format (written here for the
tiny open_clip model) is read as TPT's official --load reads it; TPT started from it equals the per-sample reference
started from the same context and predicts otherwise than from the hand-written prompt; in a sweep the run records
the file's sha256 (a runs-table column) and `bca report` labels its row apart (a backbone checkpoint's sha256:
test_checkpoints.py); a frozen-feature method from a CoOp file classifies with CoOp's prompts (checked against
open_clip's text tower run by hand) over the plain image features, and a prompt-tuning run's gain is measured
against CLIP from the same file; a context that cannot be used exits 2 naming the field and the file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.clip.backbone import load_backbone
from orchestrator.clip.context import load_context
from orchestrator.clip.prompts import prompt_text
from orchestrator.clip.testing import (TINY_VIT, build_dataset, register_tiny_models, write_coop_context,
                                       write_maple_context, write_model_config)
from orchestrator.methods import make_method
from orchestrator.methods.tpt.reference import run_reference

NAMES = ["dog", "cat", "golden retriever", "tabby_cat", "airplane"]
K = len(NAMES)
ENV = {"COLUMNS": "250", "NO_COLOR": "1"}
TPT = {"lr": 5e-3, "steps": 1, "keep": 0.1, "logit_scale": 100.0}  # TPT's card defaults, as run_reference takes them


def bca(*args: str):
    return CliRunner().invoke(app, list(args), env=ENV)


@pytest.fixture(scope="module")
def backbone():
    register_tiny_models()
    return load_backbone(TINY_VIT, None, "cpu")


def test_a_coop_file_is_read_as_tpts_load_reads_it(tmp_path):
    path = write_coop_context(tmp_path, TINY_VIT, NAMES, n_ctx=4)
    assert path.relative_to(tmp_path).as_posix() == "prompt_learner/model.pth.tar-50"
    context = load_context(path)
    # TPT's own read (torch.load's default before torch 2.6: Dassl's scheduler objects unpickled as well)
    assert torch.equal(context.vectors, torch.load(path, weights_only=False)["state_dict"]["ctx"])
    assert context.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() and context.n_ctx == 4


@pytest.mark.parametrize("make,expected", [
    (lambda d: write_maple_context(d), "): its prompts enter the image encoder too, so tuning them re-encodes every "
                                       "view through the prompted vision tower at each step, which the prompt-tuning "
                                       "methods (a text context over cached image features) do not do; expected a "
                                       "CoOp context (state_dict['ctx']) for them, or the MaPLe file on promptalign"),
    (lambda d: write_coop_context(d, TINY_VIT, NAMES, class_specific=True),
     "a class-specific context (CoOp's CSC, ctx (5, 4, 128) = n_cls x n_ctx x width)"),
    (lambda d: d / "absent.pth.tar-50", "does not exist; expected CoOp's prompt_learner/model.pth.tar-<epoch> or "
                                        "MaPLe's MultiModalPromptLearner/model.pth.tar-<epoch>"),
])
def test_what_cannot_be_started_from_is_refused_naming_the_file(tmp_path, make, expected):
    path = make(tmp_path)
    with pytest.raises(ValueError) as err:
        load_context(path)
    assert f"context file {path}" in str(err.value) and expected in str(err.value)


def test_tpt_from_a_context_equals_the_reference_and_differs_from_the_hand_written_prompt(tmp_path, backbone):
    context = load_context(write_coop_context(tmp_path, TINY_VIT, NAMES, n_ctx=6, seed=3))
    plain, learned = prompt_text(backbone, NAMES), prompt_text(backbone, NAMES, context=context)
    assert learned.n_ctx == 6 and torch.equal(learned.initial_context(), context.vectors)
    with torch.no_grad():
        emb = F.normalize(plain.tower(plain.tower.embed(plain.tokens), plain.tokens.argmax(-1)), dim=-1)
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, K, (8,), generator=g)
    views = F.normalize(torch.randn(8, 10, emb.shape[1], generator=g) + 3 * emb[labels][:, None], dim=-1)
    post = make_method("tpt", emb, torch.arange(K), K, text=learned).run(views).posteriors
    ref = run_reference(views, learned, **TPT)
    assert torch.equal(post.argmax(1), ref.argmax(1))
    assert (post - ref).abs().max() <= 1e-5    # as test_tpt's bound: float32 chunked against per-sample
    hand = make_method("tpt", emb, torch.arange(K), K, text=plain).run(views).posteriors
    assert (post.argmax(1) != hand.argmax(1)).any()


def _spec(tmp_path: Path, methods: list[dict], **backbone) -> Path:
    build_dataset("dtd", tmp_path / "data", num_classes=3, per_class=2)
    spec = {"name": "startpoints", "results_dir": "results", "cache_dir": "cache", "data_root": "data",
            "backbones": [{"model": TINY_VIT, "pretrained": "random",
                           "config": str(write_model_config(TINY_VIT, tmp_path / "models")), **backbone}],
            "datasets": ["dtd"], "views": "augmix9", "methods": methods, "seeds": [1], "resources": {"cpus": 1}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_run_from_a_coop_file_records_it_and_reports_apart(tmp_path):
    from dashboard.context import reproduce_spec
    from orchestrator.results.writer import RunWriter, read_run
    from orchestrator.sweep.load import load_spec, validate_spec
    from orchestrator.sweep.record import write_sweep_record
    from orchestrator.sweep.pieces import load_stream, settings_of
    from orchestrator.sweep.plan import expand, make_trials
    from orchestrator.sweep.trial import execute_trial

    file = write_coop_context(tmp_path / "coop", TINY_VIT, NAMES, n_ctx=4, seed=5)
    sha = hashlib.sha256(file.read_bytes()).hexdigest()
    spec = load_spec(_spec(tmp_path, [{"method": "clip"}, {"method": "tpt"},
                                      {"method": "tpt", "context": "coop/prompt_learner/model.pth.tar-50"}]))
    runs = expand(spec)
    settings = settings_of(spec)
    for trial in make_trials(runs, "auto"):
        execute_trial(trial, settings)
    tpt = {run.config.get("context_sha256"): run for run in runs if run.method == "tpt"}
    assert set(tpt) == {None, sha}
    assert read_run(spec.results_dir, spec.name, tpt[sha].run_id)["context_sha256"] == sha
    assert read_run(spec.results_dir, spec.name, tpt[None].run_id)["context_sha256"] is None

    def preds(run) -> torch.Tensor:
        rows = sorted((r for p in RunWriter(spec.results_dir, run.config).samples_dir.glob("part-*.parquet")
                       for r in pq.read_table(p).to_pylist()), key=lambda r: r["sample_idx"])
        return torch.tensor([r["pred"] for r in rows])

    stream, _ = load_stream(tpt[sha].source, settings, keep_views=True)
    backbone = load_backbone(TINY_VIT, None, "cpu")
    reference = run_reference(stream.view_features, prompt_text(backbone, stream.class_names,
                                                                context=load_context(file)), **TPT)
    assert torch.equal(preds(tpt[sha]), reference.argmax(1))
    assert not torch.equal(preds(tpt[sha]), preds(tpt[None]))

    report = bca("report", "--results", spec.results_dir)
    assert report.exit_code == 0, report.output
    rows = [[c.strip() for c in line.split("│")[1:3]] for line in report.stdout.splitlines() if line.startswith("│")]
    backbone = "bca-tiny-vit (random weights)"
    assert [backbone, "TPT"] in rows and [backbone, f"TPT [context {sha[:8]}]"] in rows

    # the dashboard's "Reproduce this run" keeps the starting point: the same run, not the hand-written prompt's
    write_sweep_record(spec, runs)
    record = json.loads((Path(spec.results_dir) / "sweeps" / f"{spec.name}.json").read_text())
    again = validate_spec(reproduce_spec(record, tpt[sha].config, tpt[sha].run_id), base_dir=tmp_path)
    assert [run.run_id for run in expand(again)] == [tpt[sha].run_id]


@pytest.mark.parametrize("entry,expected", [
    ({"method": "tent", "context": "coop/prompt_learner/model.pth.tar-50"},
     "methods[0].context: 'tent' adapts CLIP's image encoder at test time, which a learned context's prompts do not "
     "enter"),
    ({"method": "tda", "context": "csc/prompt_learner/model.pth.tar-50"},
     "methods[0].context: context file {root}/csc/prompt_learner/model.pth.tar-50: a class-specific context"),
    ({"method": "tpt", "context": "missing.pth.tar"}, "methods[0].context: context file {root}/missing.pth.tar does "
                                                      "not exist"),
    ({"method": "tpt", "context": "maple/MultiModalPromptLearner/model.pth.tar-5"},
     "methods[0].context: context file {root}/maple/MultiModalPromptLearner/model.pth.tar-5 is MaPLe's"),
    ({"method": "tpt", "context": "wide/prompt_learner/model.pth.tar-50"},
     "methods[0].context: context file {root}/wide/prompt_learner/model.pth.tar-50: ctx width 64 does not fit "
     "bca-tiny-vit's text tower (width 128)"),
])
def test_a_context_that_cannot_be_used_exits_2_naming_the_field_and_file(tmp_path, entry, expected):
    write_coop_context(tmp_path / "coop", TINY_VIT, NAMES)
    write_coop_context(tmp_path / "csc", TINY_VIT, NAMES, class_specific=True)
    write_maple_context(tmp_path / "maple")
    wide = tmp_path / "wide" / "prompt_learner" / "model.pth.tar-50"
    wide.parent.mkdir(parents=True)
    torch.save({"state_dict": {"ctx": torch.zeros(4, 64)}, "epoch": 50}, wide)
    r = bca("sweep", str(_spec(tmp_path, [entry])), "--dry-run")
    assert r.exit_code == 2, r.output
    assert expected.format(root=tmp_path.resolve()) in " ".join(r.stderr.split())
    assert "Traceback" not in r.output and not (tmp_path / "results").exists()


def _coop_reference(file: Path, class_names: list[str]) -> torch.Tensor:
    """[K, d] CoOp's classifier written out on the open_clip model: each class's "X X X X <name>." tokenized, the X's
    token embeddings replaced by the file's ctx (CoOp's PromptLearner), then encode_text's remaining steps."""
    model = load_backbone(TINY_VIT, None, "cpu")
    clip = model.model
    ctx = torch.load(file, weights_only=False)["state_dict"]["ctx"]
    n = ctx.shape[0]
    tokens = model.tokenizer([" ".join(["X"] * n) + f" {name.replace('_', ' ')}." for name in class_names])
    with torch.no_grad():
        x = clip.token_embedding(tokens)
        x = torch.cat([x[:, :1], ctx.expand(len(class_names), -1, -1), x[:, 1 + n:]], dim=1)
        x = clip.ln_final(clip.transformer(x + clip.positional_embedding, attn_mask=clip.attn_mask))
        x = x[torch.arange(len(class_names)), tokens.argmax(-1)] @ clip.text_projection
    return F.normalize(x, dim=-1)


def test_frozen_feature_methods_from_a_coop_file_classify_with_its_prompts(tmp_path):
    from orchestrator.results.db import ResultsDB
    from orchestrator.results.writer import read_run
    from orchestrator.sweep.load import load_spec
    from orchestrator.sweep.pieces import load_stream, settings_of
    from orchestrator.sweep.plan import data_sources, expand, make_trials
    from orchestrator.sweep.trial import execute_trial

    file = write_coop_context(tmp_path / "coop", TINY_VIT, NAMES, n_ctx=4, seed=7)
    sha = hashlib.sha256(file.read_bytes()).hexdigest()
    at = "coop/prompt_learner/model.pth.tar-50"
    path = _spec(tmp_path, [{"method": "clip"}, {"method": "clip", "context": at}, {"method": "tda", "context": at},
                            {"method": "tpt", "context": at}])
    dry = bca("sweep", str(path), "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "feature-cache entries the trials read (1)" in dry.output    # CoOp leaves the images' features as they are
    cached = bca("cache", str(path), "--workers", "0", "--device", "cpu")
    assert cached.exit_code == 0, cached.output
    assert f"(CoOp context {sha[:8]})" in cached.output and "MaPLe" not in cached.output
    spec = load_spec(path)
    runs = expand(spec)
    assert len(data_sources(spec)) == 2      # the plain source (clip, tpt) and the one whose classes are CoOp's
    settings = settings_of(spec)
    for trial in make_trials(runs, "auto"):
        execute_trial(trial, settings)
    by = {(r.method, r.config.get("context_sha256")): r for r in runs}
    assert set(by) == {("clip", None), ("clip", sha), ("tda", sha), ("tpt", sha)}
    assert read_run(spec.results_dir, spec.name, by["tda", sha].run_id)["context_sha256"] == sha
    manifests = list(Path(spec.cache_dir).glob("features/*/manifest.json"))
    assert len(manifests) == 1 and "context_sha256" not in json.loads(manifests[0].read_text())["key_fields"]

    plain, _ = load_stream(by["clip", None].source, settings)
    coop, _ = load_stream(by["clip", sha].source, settings)
    reference = _coop_reference(file, coop.class_names)
    assert (coop.class_embeddings - reference).abs().max() <= 1e-6   # one float32 computation, two writings
    assert not torch.allclose(coop.class_embeddings, plain.class_embeddings, atol=1e-3)
    db = ResultsDB(spec.results_dir)
    preds = db.df(f"SELECT pred FROM samples WHERE run_id = '{by['clip', sha].run_id}' ORDER BY sample_idx")
    assert preds["pred"].tolist() == (coop.features @ reference.T).argmax(1).tolist()
    # TPT from the file gains against CLIP from the same file: the starting point it tunes from
    pairs = db.df("SELECT run_id, baseline_run FROM paired")
    assert dict(zip(pairs.run_id, pairs.baseline_run))[by["tpt", sha].run_id] == by["clip", sha].run_id
