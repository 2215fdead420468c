"""RLCF: the chunked prompt tuning on a CLIP teacher's reward against the per-sample float64 reference transcribed from
the official test_time_tuning and CLIPRewards, with tiny random-weight open_clip towers for the student (ViT) and the
teacher (ResNet, whose text tower gives the class features of "a photo of a {name}."), on a stream where the reward
moves predictions; its inputs and hparams refused with messages naming them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from orchestrator.clip.backbone import load_backbone
from orchestrator.clip.prompts import prompt_text
from orchestrator.clip.testing import TINY_RN, TINY_VIT, register_tiny_models
from orchestrator.methods import make_method
from orchestrator.methods.prompt import TEACHER_CLASSES, TEACHER_VIEWS
from orchestrator.methods.rlcf.reference import run_rlcf_reference
from orchestrator.registry import method_card

pytestmark = pytest.mark.usefixtures("one_thread")

NAMES = ["dog", "cat", "golden retriever", "tabby_cat", "airplane"]
K = len(NAMES)


def class_features(text) -> torch.Tensor:
    with torch.no_grad():
        return F.normalize(text.tower(text.tower.embed(text.tokens), text.tokens.argmax(-1)), dim=-1)


@pytest.fixture(scope="module")
def setup():
    """Student: the tiny ViT's text side and 12 samples of 20 views near its classes; teacher: the tiny ResNet's class
    features and its views of the same samples, near the classes the teacher sees (a third of them another class
    than the student's, so that the teacher's reward disagrees with the student's confidence)."""
    register_tiny_models()
    text = prompt_text(load_backbone(TINY_VIT, None, "cpu"), NAMES)
    teacher = class_features(prompt_text(load_backbone(TINY_RN, None, "cpu"), NAMES))
    emb = class_features(text)
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, K, (12,), generator=g)
    seen = torch.where(torch.arange(12) % 3 == 0, (labels + 1) % K, labels)
    views = F.normalize(torch.randn(12, 20, emb.shape[1], generator=g) + 3 * emb[labels][:, None], dim=-1)
    t_views = F.normalize(torch.randn(12, 20, teacher.shape[1], generator=g) + 3 * teacher[seen][:, None], dim=-1)
    return text, emb, views, t_views, teacher


DEFAULTS = {"lr": 7e-3, "weight_decay": 5e-4, "steps": 3, "keep": 0.1, "sample_k": 3, "logit_scale": 100.0}


# float32 against float64: a logit is 100 cosines of unit vectors in d = 64, whose float32 rounding is about sqrt(d)
# eps; AdamW steps each context entry by about lr * m / sqrt(v), smooth in the gradient away from zero, so each of
# the steps and the prediction carries the logits' rounding over, and a posterior moves by at most half a logit's error.
def tolerance(steps: int) -> float:
    return DEFAULTS["logit_scale"] * (steps + 1) * 8 * torch.finfo(torch.float32).eps


@pytest.mark.parametrize("hp", [{}, {"steps": 5, "sample_k": 2, "keep": 0.25}, {"sample_k": K, "lr": 2e-3}])
def test_rlcf_equals_the_per_sample_float64_reference_and_the_reward_moves_predictions(setup, hp):
    text, emb, views, t_views, teacher = setup
    hp_all = {**DEFAULTS, **hp}
    teacher_in = {TEACHER_VIEWS: t_views, TEACHER_CLASSES: teacher}
    method = make_method("rlcf", emb, torch.arange(K), K, text=text, **hp)
    post = method.run(views, teacher_in).posteriors
    ref = run_rlcf_reference(views.double(), t_views.double(), teacher.double(), text, **hp_all)
    assert torch.equal(post.argmax(1), ref.argmax(1))
    assert (post.double() - ref).abs().max() <= tolerance(hp_all["steps"])
    zero_shot = torch.softmax(100.0 * views[:, 0] @ emb.T, dim=-1)
    assert (post.argmax(1) != zero_shot.argmax(1)).sum() >= 2  # the reward acts on this stream
    if hp:
        return
    # chunks of one sample, and the stream in two parts, give the same rows
    one = make_method("rlcf", emb, torch.arange(K), K, text=text, **hp)
    one.chunk = 1
    parts = torch.cat([one.run(views[:7], {TEACHER_VIEWS: t_views[:7], TEACHER_CLASSES: teacher}).posteriors,
                       one.run(views[7:], {TEACHER_VIEWS: t_views[7:], TEACHER_CLASSES: teacher}).posteriors])
    assert (parts - post).abs().max() <= tolerance(hp_all["steps"])


def test_the_teacher_decides_the_update(setup):
    """The same student with a teacher that agrees with it (its own class features and views) tunes otherwise: the
    reward, not the student's confidence alone, moves the prompt."""
    text, emb, views, t_views, teacher = setup
    other = make_method("rlcf", emb, torch.arange(K), K, text=text).run(views, {TEACHER_VIEWS: t_views,
                                                                                TEACHER_CLASSES: teacher})
    own = make_method("rlcf", emb, torch.arange(K), K, text=text).run(views, {TEACHER_VIEWS: views,
                                                                              TEACHER_CLASSES: emb})
    assert (own.posteriors.argmax(1) != other.posteriors.argmax(1)).any()


def test_missing_or_misshapen_teacher_features_and_bad_hparams_are_refused(setup):
    text, emb, views, t_views, teacher = setup
    method = make_method("rlcf", emb, torch.arange(K), K, text=text)
    with pytest.raises(ValueError, match=r"rlcf: reads its teacher's features: auxiliary=\{'teacher_views': float32 "
                                         r"\[12, 20, D\].*got None"):
        method.run(views)
    with pytest.raises(ValueError, match=r"'teacher_classes': float32 \[5, D\].*got \{'teacher_views': \(12, 19, 64\)"):
        method.run(views, {TEACHER_VIEWS: t_views[:, 1:], TEACHER_CLASSES: teacher})
    with pytest.raises(ValueError, match=r"rlcf: hparam 'sample_k' must be at most the number of classes \(5\)"):
        make_method("rlcf", emb, torch.arange(K), K, text=text, sample_k=6)
    with pytest.raises(ValueError, match=r"rlcf: hparam 'teacher' must be one of \['RN50', 'ViT-B-16', 'ViT-B-32', "
                                         r"'ViT-L-14', 'bca-tiny-vit', 'bca-tiny-rn'\]"):
        make_method("rlcf", emb, torch.arange(K), K, text=text, teacher="ViT-H-14")


def test_the_official_defaults_per_dataset():
    card = method_card("rlcf")
    assert card.defaults("imagenet-a") == {**DEFAULTS, "teacher": "ViT-L-14"}
    assert card.defaults("dtd")["steps"] == 5 and card.defaults("dtd")["lr"] == 7e-3
