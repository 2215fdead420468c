"""DLAE against a float64 per-sample reference written from the official code (whynotcooper/dlae main_dlae.py
run_test_dlae, utils.py get_clip_logits_2 / _3), on streams where its logit adjustment, reflection, decaying cache
and global prototypes act; chunking, its per-dataset views and errors."""

from __future__ import annotations

import pytest
import torch

from orchestrator.methods import make_method, run_stream
from orchestrator.methods.dlae.reference import official_dlae
from orchestrator.registry import method_card
from tests.view_streams import view_stream

pytestmark = pytest.mark.usefixtures("one_thread")

# As DPE's (tests/test_dpe.py): the AdamW step divides each gradient entry by its magnitude plus eps = 1e-3, so
# float32 rounding of a near-zero gradient entry moves a residual by up to lr / eps times that rounding, which the
# logit scale multiplies again and the global average carries on; at logit scale 30 and lr <= 1e-3 that stays
# within 1e-5 of the float64 reference.
ATOL = 1e-5
ACTIVE = {"logit_scale": 30.0, "adjust_alpha": 2.0, "reflect_alpha": 0.5, "loss_decay": 0.02, "lr_text": 0.001,
          "tau_global": 0.3}


def check_against_reference(feats, emb, k, **hp):
    trace = make_method("dlae", emb, torch.arange(k), k, **hp).run(feats)
    post, preds, changed, events = official_dlae(feats, emb, {**method_card("dlae").defaults(), **hp})
    assert torch.equal(trace.predictions, post.argmax(1))
    torch.testing.assert_close(trace.posteriors.double(), post, atol=ATOL, rtol=0)
    assert trace.selected.tolist() == preds and trace.gated.tolist() == changed
    assert int(trace.state["text_updates"]) == events["global"]
    return trace, events


def test_matches_the_reference_where_every_part_acts():
    feats, emb, _, k, _ = view_stream("label_shift", num_classes=10, dim=24, n=100, views=8, seed=3)
    trace, events = check_against_reference(feats, emb, k, **ACTIVE)
    # the adjustment changed predictions (reflections), doubtful entries' losses grew, full classes replaced
    # entries, and the global prototypes moved
    assert min(events.values()) > 0, events
    assert not trace.gated.all()


def test_matches_the_reference_on_the_imagenet_a_branch_with_a_larger_cache():
    feats, emb, _, k, _ = view_stream("temporal", num_classes=8, dim=24, n=100, views=8, seed=4)
    _, events = check_against_reference(feats, emb, k, **{**ACTIVE, "query": "confident", "keep": 0.3, "shot": 4,
                                                          "align": 1.5})
    assert min(events.values()) > 0, events


def test_on_single_views_as_on_its_official_eurosat_loader():
    feats, emb, _, k, _ = view_stream("label_shift", num_classes=6, dim=16, n=100, views=1, seed=5)
    check_against_reference(feats, emb, k, **ACTIVE)


def test_chunks_continue_the_state_and_posteriors_are_distributions():
    feats, emb, ids, k, _ = view_stream("temporal", num_classes=6, dim=16, n=80, views=6, seed=24)
    whole = make_method("dlae", emb, ids, k, **ACTIVE).run(feats)
    obj = make_method("dlae", emb, ids, k, **ACTIVE)
    parts = [obj.run(feats[:30]), obj.run(feats[30:])]
    assert torch.equal(torch.cat([p.posteriors for p in parts]), whole.posteriors)
    assert all(torch.equal(parts[1].state[key], whole.state[key]) for key in whole.state)
    torch.testing.assert_close(whole.posteriors.sum(1), torch.ones(80), atol=1e-5, rtol=0)


def test_without_adjustment_reflection_and_decay_it_is_dpe():
    feats, emb, ids, k, _ = view_stream("label_shift", num_classes=8, dim=16, n=100, views=6, seed=6)
    off = {"adjust_alpha": 0.0, "reflect_alpha": 0.0, "loss_decay": 0.0, "lr_text": 0.001, "keep": 0.3,
           "logit_scale": 30.0}
    dlae = run_stream("dlae", feats, emb, ids, k, **off)
    dpe = run_stream("dpe", feats, emb, ids, k, lr_image=0.001, **{key: off[key] for key in ("lr_text", "keep",
                                                                                              "logit_scale")})
    # DPE's cache ranks by entropy / log2 K and re-sorts on every append, DLAE's by entropy and once a class is
    # full: the same entries win, and at the default shot of 3 DLAE's keys are DPE's cache means
    torch.testing.assert_close(dlae, dpe, atol=1e-5, rtol=0)


def test_its_official_loader_picks_the_views_dataset_by_dataset():
    card = method_card("dlae")
    views = {d: card.protocol_views(d).name for d in ("imagenet", "imagenet-r", "dtd", "eurosat", "ucf101")}
    assert views == {"imagenet": "crops", "imagenet-r": "augmix", "dtd": "augmix", "eurosat": "single",
                     "ucf101": "crops"}


@pytest.mark.parametrize("hp,message", [
    ({"shot": 0}, r"dlae: hparam 'shot' must be an integer >= 1 \(.*\), got 0"),
    ({"adjust_alpha": -1.0}, r"dlae: hparam 'adjust_alpha' must be a number >= 0 \(.*\), got -1.0"),
    ({"lr_text": 0}, r"dlae: hparam 'lr_text' must be a number > 0 \(.*\), got 0"),
    ({"query": "mean"}, r"dlae: hparam 'query' must be one of \['original', 'confident'\] \(.*\), got 'mean'"),
])
def test_bad_hparams_are_named(hp, message):
    with pytest.raises(ValueError, match=message):
        make_method("dlae", torch.eye(3), torch.arange(3), 3, **hp)


def test_several_rows_per_class_are_averaged_and_renormalised():
    feats, emb, ids, k, _ = view_stream("iid", num_classes=5, dim=16, n=40, views=4, seed=26, templates_per_class=3)
    merged = torch.nn.functional.normalize(torch.stack([emb[ids == c].mean(0) for c in range(k)]), dim=1)
    torch.testing.assert_close(run_stream("dlae", feats, emb, ids, k),
                               run_stream("dlae", feats, merged, torch.arange(k), k), atol=1e-6, rtol=0)
