"""ADAPT (online) against a float64 per-sample reference written from the official code (AIM-SKKU/ADAPT
ADAPT_online.py evaluation), on streams where its banks fill and replace entries and samples that change nothing
reuse the last update's similarities; chunking, its views and errors."""

from __future__ import annotations

import pytest
import torch

from orchestrator.methods import make_method, run_stream
from orchestrator.methods.adapt.reference import official_adapt
from orchestrator.registry import method_card
from tests.view_streams import view_stream

pytestmark = pytest.mark.usefixtures("one_thread")

# The ridge matrix (n - 1) S + tr(S) I has its eigenvalues in [tr S, n tr S], so its inverse carries float32's
# 2^-24 relative rounding times at most n (<= 40 entries here) into the GDA logits, which enter the fusion divided
# by fusion_scale (>= 20) inside an exponential that multiplies logits of at most logit_scale: about 1e-6 on the
# final logits, and no more on the posteriors; 1e-5 bounds it with room.
ATOL = 1e-5


def check_against_reference(feats, emb, k, **hp):
    trace = make_method("adapt", emb, torch.arange(k), k, **hp).run(feats)
    post, preds, updates = official_adapt(feats, emb, {**method_card("adapt").defaults(), **hp})
    assert torch.equal(trace.predictions, post.argmax(1))
    torch.testing.assert_close(trace.posteriors.double(), post, atol=ATOL, rtol=0)
    assert trace.selected.tolist() == preds and trace.gated.tolist() == updates
    return trace


def test_matches_the_reference_on_single_views_where_banks_fill_and_replace():
    feats, emb, _, k, _ = view_stream("label_shift", num_classes=10, dim=24, n=200, views=1, seed=3)
    trace = check_against_reference(feats, emb, k, bank_size=3)
    counts = torch.bincount(trace.state["bank_labels"][trace.state["bank_labels"] >= 0], minlength=k)
    assert int(trace.gated.sum()) > int(counts.sum())          # entries were replaced, not only appended
    assert not trace.gated.all()                                  # and some samples changed nothing


def test_matches_the_reference_on_views_as_on_imagenets_variants():
    feats, emb, _, k, _ = view_stream("temporal", num_classes=8, dim=24, n=150, views=8, seed=4)
    check_against_reference(feats, emb, k, bank_size=2, keep=0.3, fusion_scale=40.0, mean_alpha=0.5)


def test_chunks_continue_the_state_and_posteriors_are_distributions():
    feats, emb, ids, k, _ = view_stream("temporal", num_classes=6, dim=16, n=120, views=1, seed=24)
    whole = make_method("adapt", emb, ids, k, bank_size=2).run(feats)
    obj = make_method("adapt", emb, ids, k, bank_size=2)
    parts = [obj.run(feats[:50]), obj.run(feats[50:])]
    assert torch.equal(torch.cat([p.posteriors for p in parts]), whole.posteriors)
    assert all(torch.equal(parts[1].state[key], whole.state[key]) for key in whole.state)
    torch.testing.assert_close(whole.posteriors.sum(1), torch.ones(120), atol=1e-5, rtol=0)


def test_its_views_and_scales_follow_the_official_loader_and_configs():
    card = method_card("adapt")
    views = {d: card.protocol_views(d).name for d in ("imagenet", "imagenet-a", "imagenet-sketch", "dtd")}
    assert views == {"imagenet": "single", "imagenet-a": "crops", "imagenet-sketch": "crops", "dtd": "single"}
    assert [card.defaults(d)["fusion_scale"] for d in ("imagenet", "imagenet-a", "ucf101")] == [20.0, 40.0, 70.0]


@pytest.mark.parametrize("hp,message", [
    ({"bank_size": 0}, r"adapt: hparam 'bank_size' must be an integer >= 1 \(.*\), got 0"),
    ({"mean_alpha": 1.5}, r"adapt: hparam 'mean_alpha' must be a number in \[0, 1\] \(.*\), got 1.5"),
    ({"fusion_scale": 0}, r"adapt: hparam 'fusion_scale' must be a number > 0 \(.*\), got 0"),
])
def test_bad_hparams_are_named(hp, message):
    with pytest.raises(ValueError, match=message):
        make_method("adapt", torch.eye(3), torch.arange(3), 3, **hp)


def test_several_rows_per_class_are_averaged_and_renormalised():
    feats, emb, ids, k, _ = view_stream("iid", num_classes=5, dim=16, n=40, views=4, seed=26, templates_per_class=3)
    merged = torch.nn.functional.normalize(torch.stack([emb[ids == c].mean(0) for c in range(k)]), dim=1)
    torch.testing.assert_close(run_stream("adapt", feats, emb, ids, k),
                               run_stream("adapt", feats, merged, torch.arange(k), k), atol=1e-6, rtol=0)
