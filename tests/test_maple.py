"""MaPLe's released prompts as a starting point: its checkpoint (written here in the released layout for the tiny
open_clip models) is read key by key; the deep-prompted forward of open_clip's towers equals a plain float64
reference written from MaPLe's equations; in a sweep, frozen-feature methods run on the prompted features, encoded
once per (backbone, file) and recorded by the file's sha256; what cannot be started from exits 2 naming the
field and the file."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import open_clip
import pytest
import torch
import yaml
from PIL import Image
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.clip.backbone import load_backbone
from orchestrator.clip.context import load_maple
from orchestrator.clip.maple import PromptedEncoder, class_tokens
from orchestrator.clip.testing import (TINY_CONFIGS, TINY_VIT, build_dataset, register_tiny_models,
                                       write_maple_context, write_model_config)

EPS32 = torch.finfo(torch.float32).eps
ENV = {"COLUMNS": "250", "NO_COLOR": "1"}
NAMES = ["dog", "cat", "golden_retriever", "airplane"]
DEEP_VIT = "bca-tiny-vit3"  # TINY_VIT with 3 layers: two deeper prompts replace tokens, one after the other


def bca(*args: str):
    return CliRunner().invoke(app, list(args), env=ENV)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    register_tiny_models()
    if DEEP_VIT not in open_clip.list_models():
        cfg = TINY_CONFIGS[TINY_VIT]
        folder = tmp_path_factory.mktemp("models")
        (folder / f"{DEEP_VIT}.json").write_text(json.dumps(
            {**cfg, "vision_cfg": {**cfg["vision_cfg"], "layers": 3}, "text_cfg": {**cfg["text_cfg"], "layers": 3}}))
        open_clip.add_model_config(folder)
    return {name: load_backbone(name, None, "cpu") for name in (TINY_VIT, DEEP_VIT)}


def test_the_released_layout_is_read_key_by_key(tmp_path):
    path = write_maple_context(tmp_path, TINY_VIT, n_ctx=2, depth=2)
    assert path.relative_to(tmp_path).as_posix() == "MultiModalPromptLearner/model.pth.tar-5"
    checkpoint = torch.load(path, weights_only=False)  # the file written here, its training objects and all
    assert type(checkpoint["scheduler"]["successor"]).__name__ == "CosineAnnealingLR"  # as Dassl's warmup keeps it
    state = checkpoint["state_dict"]
    context = load_maple(path)
    assert context.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (context.n_ctx, context.text_width, context.vision_width, context.depth) == (2, 128, 128, 2)
    assert torch.equal(context.ctx, state["prompt_learner.ctx"])
    assert torch.equal(context.proj_weight, state["prompt_learner.proj.weight"])
    assert torch.equal(context.text_deep[0], state["prompt_learner.compound_prompts_text.0"])
    assert torch.equal(context.vision_deep[0][1], state["prompt_learner.compound_prompt_projections.0.bias"])


# ------------------------------------------------------------------------------- float64 reference (MaPLe's equations)

def _ln(x, sd, name, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * sd[f"{name}.weight"] + sd[f"{name}.bias"]


def _block(x, sd, pre, heads, causal):
    """x + MHA(ln_1(x)), then + MLP(ln_2(x)) (GELU: the tiny configs' activation), written out."""
    b, length, w = x.shape
    h = _ln(x, sd, f"{pre}.ln_1")
    q, k, v = (h @ sd[f"{pre}.attn.in_proj_weight"].T + sd[f"{pre}.attn.in_proj_bias"]).chunk(3, dim=-1)
    split = lambda t: t.reshape(b, length, heads, w // heads).transpose(1, 2)  # noqa: E731
    scores = split(q) @ split(k).transpose(-1, -2) / math.sqrt(w // heads)
    if causal:
        scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
    a = (scores.softmax(-1) @ split(v)).transpose(1, 2).reshape(b, length, w)
    x = x + a @ sd[f"{pre}.attn.out_proj.weight"].T + sd[f"{pre}.attn.out_proj.bias"]
    h = _ln(x, sd, f"{pre}.ln_2") @ sd[f"{pre}.mlp.c_fc.weight"].T + sd[f"{pre}.mlp.c_fc.bias"]
    h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))
    return x + h @ sd[f"{pre}.mlp.c_proj.weight"].T + sd[f"{pre}.mlp.c_proj.bias"]


def reference(model, file: Path, pixels, tokens, dtype):
    """(image features, text features), unnormalised, in `dtype`, from the model's and the file's tensors."""
    sd = {k: v.to(dtype) for k, v in model.state_dict().items()}
    mp = {k.removeprefix("prompt_learner."): v.to(dtype)
          for k, v in torch.load(file, weights_only=False)["state_dict"].items() if k.startswith("prompt_learner.")}
    deeper = sum(k.startswith("compound_prompts_text.") for k in mp)
    n, heads = mp["ctx"].shape[0], 2
    text_p = [mp["ctx"]] + [mp[f"compound_prompts_text.{i}"] for i in range(deeper)]
    vision_p = [mp["ctx"] @ mp["proj.weight"].T + mp["proj.bias"]] + [
        mp[f"compound_prompts_text.{i}"] @ mp[f"compound_prompt_projections.{i}.weight"].T
        + mp[f"compound_prompt_projections.{i}.bias"] for i in range(deeper)]
    layers = sum(k.endswith(".ln_1.weight") and k.startswith("visual.") for k in sd)
    # vision: patches (conv1 as a matrix), class token, positions, then P_0 appended; ln_pre
    conv = sd["visual.conv1.weight"]
    p = conv.shape[-1]
    patches = pixels.to(dtype).unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5)
    patches = patches.reshape(pixels.shape[0], -1, conv[0].numel()) @ conv.reshape(conv.shape[0], -1).T
    cls = sd["visual.class_embedding"].expand(pixels.shape[0], 1, -1)
    x = torch.cat([cls, patches], 1) + sd["visual.positional_embedding"]
    x = _ln(torch.cat([x, vision_p[0].expand(x.shape[0], -1, -1)], 1), sd, "visual.ln_pre")
    for j in range(layers):
        if 1 <= j < len(vision_p):  # layer j's prompts replace the last n tokens
            x = torch.cat([x[:, :-n], vision_p[j].expand(x.shape[0], -1, -1)], 1)
        x = _block(x, sd, f"visual.transformer.resblocks.{j}", heads, causal=False)
    image = _ln(x[:, 0], sd, "visual.ln_post") @ sd["visual.proj"]
    # text: embeddings with ctx at 1..n, positions; layer j's prompts replace positions 1..n
    t = sd["token_embedding.weight"][tokens]
    t = torch.cat([t[:, :1], text_p[0].expand(t.shape[0], -1, -1), t[:, 1 + n:]], 1) + sd["positional_embedding"]
    for j in range(layers):
        if 1 <= j < len(text_p):
            t = torch.cat([t[:, :1], text_p[j].expand(t.shape[0], -1, -1), t[:, 1 + n:]], 1)
        t = _block(t, sd, f"transformer.resblocks.{j}", heads, causal=True)
    t = _ln(t, sd, "ln_final")[torch.arange(t.shape[0]), tokens.argmax(-1)]
    return image, t @ sd["text_projection"]


# shallow and deep prompts on two layers; two deeper prompts in turn; a depth under the layers' count with X's
@pytest.mark.parametrize("model,depth,n_ctx", [(TINY_VIT, 2, 2), (DEEP_VIT, 3, 2), (DEEP_VIT, 2, 6)])
def test_the_deep_prompted_towers_equal_the_float64_reference(tmp_path, models, model, depth, n_ctx):
    backbone = models[model]
    file = write_maple_context(tmp_path, model, n_ctx=n_ctx, depth=depth, seed=depth)
    encoder = PromptedEncoder(backbone, load_maple(file))
    pixels = torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    tokens = class_tokens(backbone.tokenizer, NAMES, n_ctx)
    image, text = encoder.encode_images(pixels), encoder.class_features(NAMES)
    truth = [torch.nn.functional.normalize(f, dim=-1) for f in reference(backbone.model, file, pixels, tokens,
                                                                          torch.float64)]
    in_float32 = reference(backbone.model, file, pixels, tokens, torch.float32)
    for got, want, f32 in zip((image, text), truth, in_float32):
        drift = float((torch.nn.functional.normalize(f32, dim=-1).double() - want).abs().max())
        assert float((got.double() - want).abs().max()) <= 4 * drift + 8 * EPS32
    # the prompts move both towers' features off the plain model's
    assert (image - backbone.encode_images(pixels)).abs().max() > 1e-3


# ----------------------------------------------------------------------------------------------------- sweeps

def _spec(tmp_path: Path, methods: list[dict], model: str = TINY_VIT) -> Path:
    build_dataset("dtd", tmp_path / "data", num_classes=3, per_class=2)
    spec = {"name": "maple", "results_dir": "results", "cache_dir": "cache", "data_root": "data",
            "backbones": [{"model": model, "pretrained": "random",
                           "config": str(write_model_config(model, tmp_path / "models"))}],
            "datasets": ["dtd"], "methods": methods, "seeds": [1], "resources": {"cpus": 1}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_frozen_feature_methods_run_on_maple_features_recorded_by_the_files_hash(tmp_path):
    from orchestrator.results.db import ResultsDB
    from orchestrator.results.writer import read_run
    from orchestrator.sweep.load import load_spec
    from orchestrator.sweep.pieces import load_stream, settings_of
    from orchestrator.sweep.plan import data_sources, expand, make_trials
    from orchestrator.sweep.trial import execute_trial

    file = write_maple_context(tmp_path / "maple", TINY_VIT, n_ctx=2, depth=2, seed=3)
    sha = hashlib.sha256(file.read_bytes()).hexdigest()
    at = "maple/MultiModalPromptLearner/model.pth.tar-5"
    path = _spec(tmp_path, [{"method": "clip"}, {"method": "tda"}, {"method": "clip", "context": at},
                            {"method": "tda", "context": at}])
    cached = bca("cache", str(path), "--workers", "0", "--device", "cpu")  # encodes the prompted entries beforehand
    assert cached.exit_code == 0, cached.output
    assert f"bca-tiny-vit/random (MaPLe context {sha[:8]}) dtd" in cached.output
    spec = load_spec(path)
    runs = expand(spec)
    assert {(r.method, r.config.get("context_sha256")) for r in runs} == {(m, s) for m in ("clip", "tda")
                                                                          for s in (None, sha)}
    assert len(data_sources(spec)) == 2  # the plain source and the prompted one, shared by both methods
    settings = settings_of(spec)
    for trial in make_trials(runs, "auto"):
        execute_trial(trial, settings)
    for run in runs:
        assert read_run(spec.results_dir, spec.name, run.run_id)["context_sha256"] == run.config.get("context_sha256")
    # one image-feature entry and one text entry per (backbone, context), whichever runs read them
    manifests = [json.loads(m.read_text()) for m in Path(spec.cache_dir).glob("features/*/manifest.json")]
    assert sorted(str(m["key_fields"].get("context_sha256")) for m in manifests) == sorted([sha, "None"])
    assert len(list(Path(spec.cache_dir).glob("text/*.npz"))) == 2

    # the prompted source's features are MaPLe's towers' on the stream's images (stored float16)
    prompted = next(r for r in runs if r.method == "clip" and r.config.get("context_sha256"))
    stream, _ = load_stream(prompted.source, settings)
    backbone = load_backbone(TINY_VIT, None, "cpu")
    encoder = PromptedEncoder(backbone, load_maple(file))
    images = torch.stack([backbone.preprocess(Image.open(Path(spec.data_root) / i).convert("RGB"))
                          for i in stream.image_ids])
    assert (stream.features - encoder.encode_images(images)).abs().max() <= 2 ** -10
    assert (stream.class_embeddings - encoder.class_features(stream.class_names)).abs().max() <= 2 ** -20
    preds = ResultsDB(spec.results_dir).df(f"SELECT pred FROM samples WHERE run_id = '{prompted.run_id}' "
                                           f"ORDER BY sample_idx")["pred"].tolist()
    assert preds == (stream.features @ stream.class_embeddings.T).argmax(1).tolist()

    report = bca("report", "--results", spec.results_dir)
    assert report.exit_code == 0, report.output
    labels = {line.split("│")[2].strip() for line in report.stdout.splitlines() if line.startswith("│")}
    assert {"CLIP", f"CLIP [context {sha[:8]}]", "TDA", f"TDA [context {sha[:8]}]"} <= labels


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """A MaPLe file and a MaPLe file deeper than the tiny ViT's two layers."""
    root = tmp_path_factory.mktemp("contexts")
    write_maple_context(root / "maple", TINY_VIT)
    write_maple_context(root / "deep", TINY_VIT, depth=3)
    return root


MAPLE = "{files}/maple/MultiModalPromptLearner/model.pth.tar-5"


@pytest.mark.parametrize("entry,model,expected", [
    ({"method": "tpt", "context": MAPLE}, TINY_VIT, f"methods[0].context: context file {MAPLE} is MaPLe's"),
    ({"method": "tda", "context": MAPLE}, "bca-tiny-rn",
     "MaPLe prompts a ViT's tokens and reads its class token; bca-tiny-rn's image tower is not open_clip's ViT"),
    ({"method": "tda", "context": MAPLE}, "bca-tiny-sig", "bca-tiny-sig's text tower is not open_clip's CLIP text tower"),
    ({"method": "tent", "context": MAPLE}, TINY_VIT, "methods[0].context: 'tent' adapts CLIP's image encoder at test time"),
    ({"method": "tda", "context": "{files}/deep/MultiModalPromptLearner/model.pth.tar-5"}, TINY_VIT,
     "prompt depth 3 (ctx and 2 compound prompts) exceeds bca-tiny-vit's 2 layers; expected at most 2"),
])
def test_a_maple_context_that_cannot_be_used_exits_2_naming_the_field_and_file(tmp_path, files, entry, model, expected):
    entry = {**entry, "context": entry["context"].format(files=files)}
    r = bca("sweep", str(_spec(tmp_path, [entry], model)), "--dry-run")
    assert r.exit_code == 2, r.output
    assert expected.format(files=files) in " ".join(r.stderr.split())
    assert "Traceback" not in r.output and not (tmp_path / "results").exists()


def test_a_maple_context_under_several_template_sets_exits_2(tmp_path, files):
    """MaPLe's prompts replace the templates: two sets would be two runs of one computation, which a table would
    read as two configurations."""
    path = _spec(tmp_path, [{"method": "tda", "context": MAPLE.format(files=files)}])
    path.write_text(path.read_text() + "templates: [single, ensemble]\n")
    r = bca("sweep", str(path), "--dry-run")
    assert r.exit_code == 2, r.output
    assert ("methods[0].context: a MaPLe context's prompts replace the class templates, so the spec's 2 template "
            "sets (single, ensemble) would give 2 runs of the same numbers") in " ".join(r.stderr.split())


def test_a_maple_file_learnt_on_another_patch_size_exits_2(tmp_path, files):
    """ViT-B/16's file on ViT-B/32 has every width right: the patch size of the CLIP weights MaPLe saves beside its
    prompts tells them apart."""
    import torch

    path = tmp_path / "b32" / "MultiModalPromptLearner" / "model.pth.tar-5"
    path.parent.mkdir(parents=True)
    checkpoint = torch.load(MAPLE.format(files=files), weights_only=False)
    conv = checkpoint["state_dict"]["image_encoder.conv1.weight"]
    patch = conv.shape[-1]
    checkpoint["state_dict"]["image_encoder.conv1.weight"] = torch.zeros(*conv.shape[:2], 2 * patch, 2 * patch)
    torch.save(checkpoint, path)
    r = bca("sweep", str(_spec(tmp_path, [{"method": "tda", "context": str(path)}])), "--dry-run")
    assert r.exit_code == 2, r.output
    assert (f"methods[0].context: context file {path}: it was learnt on a ViT of patch size {2 * patch} (its "
            f"image_encoder.conv1.weight); {TINY_VIT}'s is {patch}") in " ".join(r.stderr.split())

