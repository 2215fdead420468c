"""TPT-family prompt tuning: the text tower at test time, the chunked solve against the per-sample reference
(official equations, one sample through the text tower at a time), on streams where tuning changes predictions;
DynaPrompt's online buffer against its own per-sample reference, on a stream where prompts are appended, chosen
together and deleted."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from orchestrator.clip.backbone import load_backbone
from orchestrator.clip.prompts import prompt_text
from orchestrator.clip.testing import TINY_RN, TINY_VIT, register_tiny_models
from orchestrator.methods import make_method, run_stream_many
from orchestrator.methods.atpt.reference import min_ang_norm_mean
from orchestrator.methods.dynaprompt.reference import run_reference as dynaprompt_reference
from orchestrator.methods.otpt.method import orthogonality
from orchestrator.methods.otpt.reference import householder_term
from orchestrator.methods.tpt.reference import run_reference

NAMES = ["dog", "cat", "golden retriever", "tabby_cat", "airplane"]
K = len(NAMES)


@pytest.fixture(scope="module")
def backbone():
    register_tiny_models()
    return load_backbone(TINY_VIT, None, "cpu")


@pytest.fixture(scope="module")
def text(backbone):
    return prompt_text(backbone, NAMES)


@pytest.fixture(scope="module")
def stream(text):
    """Class embeddings at the initial context ("a photo of a {name}.") and 12 samples of 16 views near them."""
    with torch.no_grad():
        emb = F.normalize(text.tower(text.tower.embed(text.tokens), text.tokens.argmax(-1)), dim=-1)
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, K, (12,), generator=g)
    views = F.normalize(torch.randn(12, 16, emb.shape[1], generator=g) + 3 * emb[labels][:, None], dim=-1)
    return emb, views


@pytest.mark.parametrize("model", [TINY_VIT, TINY_RN])
def test_text_tower_is_the_backbones_text_encoder(model):
    register_tiny_models()
    b = load_backbone(model, None, "cpu")
    text = prompt_text(b, NAMES)
    with torch.no_grad():
        assert torch.equal(text.tower(text.tower.embed(text.tokens), text.tokens.argmax(-1)), b.model.encode_text(text.tokens))
    assert text.n_ctx == 4 and torch.equal(text.tokens[:, 1:5], text.tokens[:1, 1:5].expand(K, -1))


# AdamW's first steps move each entry by about lr in the sign of its gradient: an entry whose gradient is near zero
# can take either sign under rounding, so the gap to the reference grows with lr and steps (a smaller lr for two).
RTPT = {"neighbours": 20, "reliability_temp": 0.01, "exclude": "self"}
CASES = [("tpt", {}, {}), ("tpt", {"steps": 2, "keep": 0.25, "lr": 2e-3}, {}),
         ("ctpt", {}, {"ctpt_lambda": 50.0}), ("ctpt", {"lambda_term": 20.0, "keep": 0.25}, {"ctpt_lambda": 20.0}),
         ("rtpt", {}, {"rtpt": RTPT}), ("rtpt", {"neighbours": 5, "exclude": "code"},
                                        {"rtpt": {**RTPT, "neighbours": 5, "exclude": "code"}}),
         ("otpt", {}, {"extra": lambda t: 18.0 * householder_term(t)}),
         ("otpt", {"lambda_term": 2.0, "keep": 0.25}, {"extra": lambda t: 2.0 * householder_term(t)}),
         # A-TPT at its default lambda 80 on this stream has a context entry whose entropy and angular gradients
         # cancel to rounding level, which AdamW's first step turns into +-lr: the cases below are lambda 300, 80 with
         # tau 0.98 (two classes' nearest cosines clamped, so no gradient from them), and the minimising sign
         ("atpt", {"lambda_term": 300.0}, {"extra": lambda t: 300.0 * min_ang_norm_mean(t, 0.99999)}),
         ("atpt", {"tau_term": 0.98}, {"extra": lambda t: 80.0 * min_ang_norm_mean(t, 0.98)}),
         ("atpt", {"direction": "minimise"}, {"extra": lambda t: -80.0 * min_ang_norm_mean(t, 0.99999)})]


@pytest.mark.parametrize("method,hp,reference", CASES)
def test_each_method_equals_the_per_sample_reference_and_tuning_changes_predictions(text, stream, method, hp,
                                                                                   reference):
    emb, views = stream
    tuning = {k: hp[k] for k in ("lr", "steps", "keep") if k in hp}
    post = make_method(method, emb, torch.arange(K), K, text=text, **hp).run(views).posteriors
    ref = run_reference(views, text, **{"lr": 5e-3, "steps": 1, "keep": 0.1, "logit_scale": 100.0, **tuning},
                        **reference)
    assert torch.equal(post.argmax(1), ref.argmax(1))
    assert (post - ref).abs().max() <= 1e-5
    zero_shot = torch.softmax(100.0 * views[:, 0] @ emb.T, dim=-1)
    assert (post.argmax(1) != zero_shot.argmax(1)).sum() >= 2  # the tuning acts on this stream


def test_chunks_and_parts_do_not_change_the_rows(text, stream):
    """Several samples' prompts in one text-tower pass equal one sample per pass, and a stream in two parts
    equals it at once."""
    emb, views = stream
    whole = make_method("tpt", emb, torch.arange(K), K, text=text).run(views).posteriors
    one = make_method("tpt", emb, torch.arange(K), K, text=text)
    one.chunk = 1
    parts = make_method("tpt", emb, torch.arange(K), K, text=text)
    parts.chunk = 5
    split = torch.cat([parts.run(views[:7]).posteriors, parts.run(views[7:]).posteriors])
    assert torch.equal(whole.argmax(1), one.run(views).posteriors.argmax(1))
    assert (whole - one.run(views).posteriors).abs().max() <= 1e-5
    assert (whole - split).abs().max() <= 1e-5


def test_a_pack_equals_its_runs(text, stream):
    emb, views = stream
    configs = [{"method": "tpt", "lr": 5e-3}, {"method": "tpt", "lr": 1e-2}, {"method": "zero"}]
    preds, _ = run_stream_many(views, emb, torch.arange(K), K, configs, text=text)
    for g, config in enumerate(configs[:2]):
        alone = make_method("tpt", emb, torch.arange(K), K, text=text, lr=config["lr"]).run(views).posteriors
        assert torch.equal(preds[g], alone.argmax(1))


# ---------------------------------------------------------------------------------------------- DynaPrompt

@pytest.fixture(scope="module")
def long_stream(text):
    """Class embeddings at the initial context and 20 samples of 16 views near them: longer than the default
    buffer of 12 prompts, so that it fills and deletes."""
    with torch.no_grad():
        emb = F.normalize(text.tower(text.tower.embed(text.tokens), text.tokens.argmax(-1)), dim=-1)
    g = torch.Generator().manual_seed(1)
    labels = torch.randint(0, K, (20,), generator=g)
    return emb, F.normalize(torch.randn(20, 16, emb.shape[1], generator=g) + 3 * emb[labels][:, None], dim=-1)


DYNA = {"lr": 5e-3, "steps": 1, "keep": 0.1, "logit_scale": 100.0, "prompts": 12, "selection": "code"}


# As for TPT above: an AdamW first step moves each entry by about lr in its gradient's sign, and the entropy of a
# confident view has gradient entries below float32's rounding noise, so the gap to the reference grows with lr, and
# with the stream, as the buffer's prompts grow confident (smaller lr for the intended rule's buffer of 4 and for two
# steps).
@pytest.mark.parametrize("hp", [{}, {"prompts": 4, "selection": "intended", "lr": 2e-3},
                                {"prompts": 4, "steps": 2, "lr": 1e-3}])
def test_dynaprompt_equals_its_per_sample_reference_as_its_buffer_appends_chooses_and_deletes(text, long_stream, hp):
    emb, views = long_stream
    method = make_method("dynaprompt", emb, torch.arange(K), K, text=text, **hp)
    post = method.run(views).posteriors
    ref, log = dynaprompt_reference(views, text, **{**DYNA, **hp})
    assert torch.equal(post.argmax(1), ref.argmax(1))
    assert (post - ref).abs().max() <= 1e-5
    assert method.order == log[-1]["order"] and method.uses == log[-1]["uses"]
    # the buffer's adaptive parts act: prompts deleted and replaced by fresh ones, buffer prompts chosen beside
    # the fresh one, and the tuning changes predictions
    assert method.deleted == sum(entry["deleted"] is not None for entry in log) >= 3
    assert sum(len(entry["chosen"]) > 1 for entry in log) >= 3
    zero_shot = torch.softmax(100.0 * views[:, 0] @ emb.T, dim=-1)
    assert (post.argmax(1) != zero_shot.argmax(1)).sum() >= 2


def test_dynaprompt_twins_tie_exactly_as_in_the_reference():
    """Prompts tuned together from one state stay equal (twins) and tie in the next selections: on the benchmark's
    stream (20 classes named alike, random tower) the method breaks those ties as the reference does, by id, where
    a batched pass's rounding would break them at random and the buffer would part from the reference."""
    from benchmarks.prompt import tower_inputs

    text20, emb, views = tower_inputs("bca-tiny-vit", 20, 16, 16, "cpu")
    post = make_method("dynaprompt", emb, torch.arange(20), 20, text=text20).run(views).posteriors
    ref, log = dynaprompt_reference(views, text20, **DYNA)
    assert max(len(set(entry["chosen"])) for entry in log) >= 3  # several fresh prompts chosen and tuned at once
    assert torch.equal(post.argmax(1), ref.argmax(1)) and (post - ref).abs().max() <= 1e-5


def test_dynaprompt_carries_its_buffer_along_the_stream(text, long_stream):
    """A stream in two parts equals it at once; the same samples in another order get other posteriors (the
    buffer depends on the order: no shards, unlike the episodic methods); the tuning step's backward in blocks of
    prompts equals it in one."""
    emb, views = long_stream
    whole = make_method("dynaprompt", emb, torch.arange(K), K, text=text, prompts=4).run(views).posteriors
    parts = make_method("dynaprompt", emb, torch.arange(K), K, text=text, prompts=4)
    split = torch.cat([parts.run(views[:7]).posteriors, parts.run(views[7:]).posteriors])
    assert torch.equal(whole, split)
    backwards = make_method("dynaprompt", emb, torch.arange(K), K, text=text, prompts=4).run(views.flip(0))
    assert (whole - backwards.posteriors.flip(0)).abs().max() > 1e-3
    # the step's backward one prompt at a time (as at K = 1000 on the ViT-B/16 tower) equals it in one block
    blocks = make_method("dynaprompt", emb, torch.arange(K), K, text=text, prompts=4)
    blocks.chunk = 1
    one = blocks.run(views).posteriors
    assert torch.equal(whole.argmax(1), one.argmax(1)) and (whole - one).abs().max() <= 1e-5


def test_text_is_required_and_refused_where_it_does_not_belong(text, stream):
    emb, _ = stream
    with pytest.raises(ValueError, match=r"tpt: runs CLIP's text encoder at test time"):
        make_method("tpt", emb, torch.arange(K), K)
    with pytest.raises(ValueError, match=r"zero: takes no text encoder"):
        make_method("zero", emb, torch.arange(K), K, text=text)
    with pytest.raises(ValueError, match=r"tpt: text.tokens must be .* K = 4"):
        make_method("tpt", emb[:4], torch.arange(4), 4, text=text)


def test_otpts_term_is_the_official_householder_path_in_closed_form():
    """O-TPT's reflections map each row G_i of the text features' Gram matrix onto |G_i| e_i: the term the code
    builds through K Householder matrices is mean_i (|G_i| - 1), in value and in gradient (float64: the two paths
    round alike to 1e-12 on these magnitudes)."""
    feats = F.normalize(torch.randn(6, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(5)), dim=-1)
    a, b = feats.clone().requires_grad_(True), feats.clone().requires_grad_(True)
    official, closed = householder_term(a), orthogonality(b[None])[0]
    torch.testing.assert_close(closed, official, rtol=0, atol=1e-12)
    official.backward()
    closed.backward()
    torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=1e-12)
    assert float(closed.detach()) > 0.1                           # random features are far from orthogonal


@pytest.mark.parametrize("direction,sign", [("maximise", 1.0), ("minimise", -1.0)])
def test_atpts_loss_is_each_official_entry_points(text, stream, direction, sign):
    """A-TPT's loss over a batch of samples' text features, in value and gradient, against the official term:
    tpt_classification.py adds lambda * min_ang_norm_mean (maximise, the paper's), atpt_classification.py
    (-lambda) * it (minimise). Both read the same features, so they differ by float32 rounding of a few sums (the
    arccos's slope at these cosines, below 10, scales it)."""
    from orchestrator.methods.atpt.method import ATPT
    from orchestrator.methods.tpt.reference import avg_entropy as official_entropy

    emb, views = stream
    hp = {"lr": 5e-3, "steps": 1, "keep": 0.25, "lambda_term": 10.0, "tau_term": 0.99999, "logit_scale": 100.0}
    method = ATPT(emb, torch.arange(K), K, text=text, direction=direction, **hp)
    with torch.no_grad():
        ctx = method.prompts.ctx_init[None] + 0.05 * torch.randn(2, *method.prompts.ctx_init.shape,
                                                                 generator=torch.Generator().manual_seed(3))
        feats = method.prompts.features(ctx)
    a, b = feats.clone().requires_grad_(True), feats.clone().requires_grad_(True)
    ours = method.loss(100.0 * views[:2, :4] @ a.transpose(1, 2), a).sum()
    theirs = sum(official_entropy(100.0 * views[i, :4] @ b[i].T) + sign * 10.0 * min_ang_norm_mean(b[i], 0.99999)
                 for i in range(2))
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=0)
    ours.backward()
    theirs.backward()
    # the official term renormalises the (unit) features, which drops the gradient's radial part; the context only
    # ever sees the tangential part, through the tower's own normalisation
    ours_grad, theirs_grad = (g - (g * feats).sum(-1, keepdim=True) * feats for g in (a.grad, b.grad))
    torch.testing.assert_close(ours_grad, theirs_grad, rtol=0, atol=1e-5 * float(theirs_grad.abs().max()))
    flipped = ATPT(emb, torch.arange(K), K, text=text, direction="minimise" if direction == "maximise" else "maximise",
                   **hp)
    assert not torch.isclose(flipped.loss(100.0 * views[:2, :4] @ feats.transpose(1, 2), feats).sum(), ours.detach())


@pytest.mark.parametrize("method", ["tpt", "ctpt", "rtpt", "otpt", "atpt", "dynaprompt", "histpt"])
def test_defaults_on_an_empty_stream_and_on_the_fewest_views(text, stream, method):
    """At keep 0.1, 10 views select one; fewer select none and are refused, an empty stream of them too."""
    emb, views = stream
    assert make_method(method, emb, torch.arange(K), K, text=text).run(views[:0]).posteriors.shape == (0, K)
    post = make_method(method, emb, torch.arange(K), K, text=text).run(views[:2, :10]).posteriors
    assert post.shape == (2, K) and torch.allclose(post.sum(1), torch.ones(2))
    for V, noun in ((1, "view"), (9, "views")):
        with pytest.raises(ValueError, match=rf"^{method}: keep 0.1 of {V} {noun} selects int\({V} \* 0.1\) = 0 "
                                             rf"views for the loss, .* expected V \* keep >= 1: at keep 0.1 at least "
                                             rf"10 views \(the official protocol has 64\), or a larger keep$"):
            make_method(method, emb, torch.arange(K), K, text=text).run(views[:2 * (V > 1), :V])


def test_the_views_refused_are_those_the_official_selection_leaves_none_of():
    """select_confident_samples as the official code counts (tpt/reference.py; DynaPrompt's over [V, P, K]): the
    methods read exactly its count of views, and refuse exactly where it is none."""
    from orchestrator.methods.dynaprompt.reference import select_confident_samples as dyna_select
    from orchestrator.methods.prompt import selected_views
    from orchestrator.methods.tpt.reference import select_confident_samples

    for keep in (0.1, 0.05, 0.3, 1 / 3, 0.25):
        for V in range(1, 70):
            official = select_confident_samples(torch.randn(V, K), keep).numel()
            assert dyna_select(torch.randn(V, 3, K), keep)[1].numel() == official
            if official:
                assert selected_views("tpt", V, keep) == official
            else:
                with pytest.raises(ValueError, match=r"= 0 views for the loss"):
                    selected_views("tpt", V, keep)


@pytest.mark.parametrize("ctpt_lambda", [0.0, 50.0])
def test_the_official_step_with_no_view_does_not_tune(text, stream, ctpt_lambda):
    """What the refusal spares (tpt/reference.py, the official step on 9 views at keep 0.1): no view is selected,
    the entropy is NaN and sends no gradient, so AdamW's step only decays the context (weight decay 0.01); C-TPT's
    dispersion term alone moves it."""
    from orchestrator.methods.tpt.reference import (PromptLearner, avg_entropy, select_confident_samples,
                                                    text_dispersion)

    _, views = stream
    learner = PromptLearner(text)
    init = learner.ctx.detach().clone()
    optimizer = torch.optim.AdamW([learner.ctx], 5e-3)
    features = learner.text_features()
    output = 100.0 * views[0, :9] @ features.t()
    selected = select_confident_samples(output, 0.1)
    assert selected.numel() == 0
    entropy = avg_entropy(output[selected])
    assert entropy.isnan()
    loss = entropy + (-ctpt_lambda * text_dispersion(features)) if ctpt_lambda else entropy
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    grad = learner.ctx.grad
    if ctpt_lambda:
        assert bool(grad.isfinite().all()) and bool(grad.abs().max() > 0)
    else:
        assert not bool(grad.any())
        torch.testing.assert_close(learner.ctx.detach(), init * (1 - 5e-3 * 0.01), rtol=1e-6, atol=0)


def test_the_cards_memory_per_class_is_the_measured_one():
    """The card's text_encoder.mb_per_class is the activation memory one class prompt keeps in a step through the
    ViT-B/16 text tower (RN50's has the same shape), as TextTower counts it."""
    from orchestrator.methods.prompt import TextTower
    from orchestrator.registry import method_card

    tower = TextTower(load_backbone("ViT-B-16", None, "cpu").model)
    measured = tower.saved_bytes_per_prompt(77) / 2**20
    # DynaPrompt backpropagates a block of prompts, from one up
    for name in ("tpt", "ctpt", "rtpt", "otpt", "atpt", "dynaprompt", "histpt"):
        assert method_card(name).text_encoder.mb_per_class == round(measured, 1)
