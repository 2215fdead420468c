"""BATCLIP and CLIPArTT, which run CLIP's text tower beside the image encoder they adapt, against per-batch references
written from their official code on a whole open_clip CLIP model in float64, on the tiny towers with random weights,
on streams where adaptation changes the predictions; the text tower's state travels with the run's; what they
refuse."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from orchestrator.clip.backbone import load_backbone
from orchestrator.clip.prompts import prompt_text
from orchestrator.clip.testing import TINY_RN, TINY_VIT, register_tiny_models
from orchestrator.methods import make_method
from orchestrator.methods.batclip.reference import run_reference as batclip_reference
from orchestrator.methods.clipartt.reference import run_reference as clipartt_reference
from tests.test_encoder_methods import check

NAMES = ["cat", "dog", "bird", "fish"]
K, N, B = 4, 8, 4
_MODELS: dict = {}


def model(name: str):
    """The tiny backbone, N noise images, its text side (`prompt_text`) and the class embeddings of the prompts
    'a photo of a {c}' (CLIPArTT's class prompts) through its text tower."""
    if name not in _MODELS:
        register_tiny_models()
        backbone = load_backbone(name, None, "cpu")
        images = torch.randn(N, 3, 64, 64, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            emb = F.normalize(backbone.model.encode_text(backbone.tokenizer([f"a photo of a {c}" for c in NAMES])),
                              dim=-1)
        _MODELS[name] = backbone, images, prompt_text(backbone, NAMES), emb
    return _MODELS[name]


def zero_shot(backbone, images, text_features):
    with torch.no_grad():
        return (F.normalize(backbone.model.visual.eval()(images), dim=-1) @ text_features.T).argmax(1)


def test_batclip_equals_its_reference_adapting_both_towers():
    backbone, images, text, emb = model(TINY_VIT)
    hp = {"lr": 0.1, "optimizer": "adam"}
    method = make_method("batclip", emb, torch.arange(K), K, batch_size=B, vision=backbone.model.visual, text=text,
                         **hp)
    trace = method.run(images)
    check(trace.posteriors, lambda dtype: batclip_reference(images, backbone.model, text.tokens, batch_size=B,
                                                            dtype=dtype, **hp))
    with torch.no_grad():
        prompts = F.normalize(backbone.model.encode_text(text.tokens), dim=-1)
    assert (trace.predictions != zero_shot(backbone, images, prompts)).sum() >= 2
    text_state = [k for k in trace.state if k.startswith("enc__text__")]
    assert text_state and any(not torch.equal(trace.state[k], method.initial[k]) for k in text_state)


def test_batclip_resumed_from_its_state_goes_on_to_the_same_rows():
    """The state a continual run saves (both towers' adapted norm layers and the optimiser's moments) is what a
    resumed run needs: a fresh method given the state after the first batch goes on to the rows of the whole run."""
    backbone, images, text, emb = model(TINY_VIT)

    def batclip():
        return make_method("batclip", emb, torch.arange(K), K, batch_size=B, vision=backbone.model.visual, text=text,
                           lr=0.1, optimizer="adam")

    whole = batclip().run(images)
    head = batclip().run(images[:B])
    resumed = batclip()
    resumed.load_state_tensors({k: v.numpy() for k, v in head.state.items()})  # as the state file stores it
    assert torch.equal(torch.cat([head.posteriors, resumed.run(images[B:]).posteriors]), whole.posteriors)


def test_clipartt_equals_its_reference_through_its_pseudo_captions():
    backbone, images, text, emb = model(TINY_RN)
    images, hp = images[:B], {"lr": 0.01, "steps": 2}
    trace = make_method("clipartt", emb, torch.arange(K), K, batch_size=B, vision=backbone.model.visual, text=text,
                        **hp).run(images)
    check(trace.posteriors, lambda dtype: clipartt_reference(images, backbone.model, backbone.tokenizer, NAMES,
                                                             batch_size=B, dtype=dtype, **hp))
    assert (trace.predictions != zero_shot(backbone, images, emb)).sum() >= 2


def test_batclips_defaults_follow_its_config_per_corruption_benchmark():
    from orchestrator.registry import method_card

    card = method_card("batclip")
    assert [(card.defaults(d)["optimizer"], card.defaults(d)["lr"]) for d in
            ("imagenet-c.fog.5", "cifar10-c.gaussian_noise.5", "CIFAR-100-C.fog.3", "dtd")] == \
        [("adamw", 5e-4), ("adamw", 1e-3), ("adam", 5e-4), ("adamw", 5e-4)]


def test_what_they_refuse():
    backbone, images, text, emb = model(TINY_VIT)
    vision = backbone.model.visual
    with pytest.raises(ValueError, match=r"batclip: runs CLIP's text encoder at test time, so it needs "
                                         r"text=PromptText"):
        make_method("batclip", emb, torch.arange(K), K, vision=vision)
    with pytest.raises(ValueError, match=r"clipartt: writes pseudo-captions from the class names, so text must carry "
                                         r"the backbone's tokenizer and the 4 class names"):
        make_method("clipartt", emb, torch.arange(K), K, vision=vision, text=text.__class__(text.tower, text.tokens,
                                                                                            text.n_ctx))
    with pytest.raises(ValueError, match=r"clipartt: hparam 'top_k' \(5\) names more classes in a pseudo-caption "
                                         r"than there are \(4\)"):
        make_method("clipartt", emb, torch.arange(K), K, vision=vision, text=text, top_k=5)
