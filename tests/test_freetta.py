"""FreeTTA (from the paper: no official code was found) against a float64 per-sample reference written from the
paper's equations (`orchestrator.methods.freetta.reference`), on streams where the EM weights vary, the learned
prior and covariance move and the predictions leave CLIP's; chunking, class rows and errors."""

from __future__ import annotations

import pytest
import torch

from orchestrator.methods import make_method, run_stream
from orchestrator.methods.freetta.reference import paper_freetta
from orchestrator.registry import method_card
from tests.view_streams import view_stream

pytestmark = pytest.mark.usefixtures("one_thread")

EPS32 = 2.0 ** -24


def check_against_reference(feats, emb, k, **hp):
    hp = {**method_card("freetta").defaults(), **hp}
    trace = make_method("freetta", emb, torch.arange(k), k, **hp).run(feats)
    post, preds, weights, (low, high) = paper_freetta(feats, emb, hp)
    # float32 rounds the covariance's solve to about EPS32 times its condition number (high / low, relative); the
    # discriminant's logits are at most (|x| |mu| + |mu|^2 / 2) / low <= 1.5 / low for unit x and means inside the
    # unit ball, and enter the logits times alpha; a posterior moves by at most half its logits' change.
    atol = hp["alpha"] * (1.5 / low) * (high / low) * EPS32 + 1e-6
    assert torch.equal(trace.predictions, post.argmax(1))
    torch.testing.assert_close(trace.posteriors.double(), post, atol=atol, rtol=0)
    assert trace.selected.tolist() == preds and bool(trace.gated.all())
    return trace, weights


@pytest.mark.parametrize("scenario,hp", [
    ("label_shift", {}),
    ("temporal", {"alpha": 0.5, "beta": 0.3}),
    ("iid", {"alpha": 1.0, "beta": 3.0, "logit_scale": 50.0}),
])
def test_matches_the_reference_where_its_adaptive_parts_act(scenario, hp):
    feats, emb, _, k, _ = view_stream(scenario, num_classes=10, dim=24, n=150, views=1, seed=3)
    trace, weights = check_against_reference(feats[:, 0], emb, k, **hp)
    assert max(weights) - min(weights) > 0.2                               # confident and doubtful samples
    clip = run_stream("clip", feats[:, 0], emb, torch.arange(k), k)
    assert not torch.equal(trace.predictions, clip.argmax(1))               # the GDA changed predictions
    counts = trace.state["counts"]
    assert counts.max() > 2 * counts.min()                                 # the learned prior moved
    torch.testing.assert_close(counts.sum(), trace.state["total"], atol=1e-4, rtol=0)


def test_chunks_continue_the_state_and_posteriors_are_distributions():
    feats, emb, ids, k, _ = view_stream("temporal", num_classes=6, dim=16, n=120, views=1, seed=24)
    whole = make_method("freetta", emb, ids, k).run(feats[:, 0])
    obj = make_method("freetta", emb, ids, k)
    parts = [obj.run(feats[:50, 0]), obj.run(feats[50:, 0])]
    assert torch.equal(torch.cat([p.posteriors for p in parts]), whole.posteriors)
    assert all(torch.equal(parts[1].state[key], whole.state[key]) for key in whole.state)
    torch.testing.assert_close(whole.posteriors.sum(1), torch.ones(120), atol=1e-5, rtol=0)


def test_the_card_says_it_is_from_the_paper():
    card = method_card("freetta")
    assert "from the paper" in card.summary and card.source.startswith("from the paper")


@pytest.mark.parametrize("hp,message", [
    ({"alpha": -1}, r"freetta: hparam 'alpha' must be a number >= 0 \(.*\), got -1"),
    ({"beta": "x"}, r"freetta: hparam 'beta' must be a number .*, got 'x'"),
])
def test_bad_hparams_are_named(hp, message):
    with pytest.raises(ValueError, match=message):
        make_method("freetta", torch.eye(3), torch.arange(3), 3, **hp)


def test_several_rows_per_class_are_averaged_and_renormalised():
    feats, emb, ids, k, _ = view_stream("iid", num_classes=5, dim=16, n=40, views=1, seed=26, templates_per_class=3)
    merged = torch.nn.functional.normalize(torch.stack([emb[ids == c].mean(0) for c in range(k)]), dim=1)
    torch.testing.assert_close(run_stream("freetta", feats[:, 0], emb, ids, k),
                               run_stream("freetta", feats[:, 0], merged, torch.arange(k), k), atol=1e-6, rtol=0)
