"""PromptAlign: MaPLe's prompts tuned per sample in both towers equal a float64 per-sample reference transcribed from
the official code, with both losses acting; align_weight 0 is MaPLe + TPT and needs no statistics; the source
statistics files are read in their released format and a wrong one is refused naming it."""

from __future__ import annotations

import pytest
import torch

from orchestrator.clip.backbone import load_backbone
from orchestrator.clip.context import load_maple, load_statistics
from orchestrator.clip.maple import class_tokens
from orchestrator.clip.testing import (TINY_VIT, register_tiny_models, write_maple_context,
                                       write_promptalign_statistics)
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
    with pytest.raises(ValueError, match=r"vis_means file .*ImgNetpre_vis_means.pt holds torch.float32 \(3, 19, 128\); "
                                         r"expected a float tensor \[2, 19, 128\]"):
        load_statistics(means, variances, (2, 19, 128))
    with pytest.raises(ValueError, match=r"vis_vars file .*nothing.pt does not exist"):
        load_statistics(means, tmp_path / "nothing.pt")
