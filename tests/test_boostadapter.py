"""BoostAdapter: against a per-sample float64 transcription of the official runner, hand-checked one- and
two-step cases, chunking, errors, the per-dataset facts, and a sanity check on synthetic views."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from orchestrator.methods import make_method, run_stream
from orchestrator.methods.boostadapter.reference import official_boostadapter
from orchestrator.registry import method_card
from view_streams import view_stream


def _check_against_reference(views, emb, hp, ref_kw):
    args = (emb, torch.arange(emb.shape[0]), emb.shape[0])
    trace = make_method("boostadapter", *args, **hp).run(views)
    ref, acts = official_boostadapter(views, emb, **ref_kw)
    assert torch.equal(trace.predictions, ref.argmax(1))
    torch.testing.assert_close(trace.posteriors, ref.softmax(1).float(), atol=1e-5, rtol=0)
    # every adaptive part acts: full positive slots replace entries, the FIFO negative cache drops its
    # oldest, and the boosting views change classes' cache entries, which changes predictions
    assert acts["pos_dropped"] > 100 and acts["neg_dropped"] > 20 and acts["boosted_classes"] > 1000
    unboosted, _ = official_boostadapter(views, emb, boost=False, **ref_kw)
    assert int((unboosted.argmax(1) != ref.argmax(1)).sum()) > 10
    assert int(trace.gated.sum()) > 100 and bool(torch.isfinite(trace.state["neg_entropy"]).any())
    return trace


def test_matches_the_official_loop_with_the_original_view_query():
    views, emb, ids, k, labels = view_stream("label_shift", n=2000, num_classes=30, dim=64, seed=4, views=64,
                                             class_views=True)
    hp = {"pos_alpha": 5.0, "pos_beta": 5.0, "delta": 2}
    _check_against_reference(views, emb, {**hp, "query": "original"}, {**hp, "infer_ori_image": True})


def test_matches_the_official_loop_with_the_confident_mean_query():
    # At logit scale 100 these views are so confident that the mean of six views' probabilities is nearly a
    # mixture of one-hots, whose entropies recur across samples (5:1 -> 0.4506 nats, ...) and tie up to
    # rounding, so the cache ranking is decided by rounding. A softer scale keeps
    # the ranking decided by the numbers.
    views, emb, ids, k, labels = view_stream("iid", n=2000, num_classes=30, dim=64, seed=5, views=64, class_views=True)
    hp = {"pos_alpha": 2.0, "pos_beta": 5.0, "delta": 3, "logit_scale": 30.0}
    _check_against_reference(views, emb, {**hp, "query": "confident"}, {**hp, "infer_ori_image": False})


def test_matches_the_official_loop_at_imagenet_scale():
    gen = torch.Generator().manual_seed(0)
    text = F.normalize(torch.randn(1000, 64, generator=gen), dim=1)
    latent = F.normalize(text[torch.randint(20, (40,), generator=gen)] + 0.3 * torch.randn(40, 64, generator=gen),
                         dim=1)
    views = F.normalize(latent[:, None] + 0.1 * torch.randn(40, 64, 64, generator=gen), dim=-1)
    post = run_stream("boostadapter", views, text, torch.arange(1000), 1000, delta=1, query="confident")
    ref, acts = official_boostadapter(views, text, delta=1, infer_ori_image=False)
    assert acts["boosted_classes"] > 0
    assert torch.equal(post.argmax(1), ref.argmax(1))
    torch.testing.assert_close(post, ref.softmax(1).float(), atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------ by hand

def _unit(*rows):
    return F.normalize(torch.tensor(rows, dtype=torch.float32), dim=-1)


def _softmax_list(xs):
    e = [math.exp(x) for x in xs]
    return [v / sum(e) for v in e]


def _h(logits):
    return -sum(p * math.log(p) for p in _softmax_list(logits))


# K = 2, T = I, logit_scale 1: a view's logits are its two coordinates; every entropy is above 0.5 nats,
# i.e. above the negative cache's band (gating entropy = nats / log2(2)), so only the positive side acts.
# V = 10, keep 0.1: one boosting view, the lowest-entropy one.
FLAT = [0.72, 0.69]


def _sample(view0, boost_view):
    return _unit(view0, boost_view, *[FLAT] * 8)


def _ba(feats, **hp):
    return make_method("boostadapter", torch.eye(2), torch.arange(2), 2, logit_scale=1.0, **hp).run(feats)


def test_one_step_the_sample_and_its_boosting_view_are_in_the_cache():
    x = _sample([0.8, 0.6], [0.3, 0.95])               # view 0 predicts class 0, the boosting view class 1
    f, b = x[0].tolist(), x[1].tolist()
    assert _h(b) < _h(f) < _h(x[2].tolist())
    trace = _ba(x[None], pos_alpha=2.0, pos_beta=5.0)
    dot = f[0] * b[0] + f[1] * b[1]
    expected = _softmax_list([f[0] + 2.0 * math.exp(-5.0 * (1 - 1.0)), f[1] + 2.0 * math.exp(-5.0 * (1 - dot))])
    torch.testing.assert_close(trace.posteriors, torch.tensor([expected]), atol=1e-6, rtol=0)
    # only the query is kept: the boosting view is not
    torch.testing.assert_close(trace.state["pos_keys"][0, 0], x[0])
    assert bool(torch.isinf(trace.state["pos_entropy"][1]).all()) and trace.gated.tolist() == [True]


def test_view_zero_counts_twice_when_it_is_its_own_boosting_view():
    x = _unit([0.95, 0.3], *[FLAT] * 9)                 # view 0 is the most confident view
    f = x[0].tolist()
    trace = _ba(x[None], pos_alpha=1.5, pos_beta=3.0)
    expected = _softmax_list([f[0] + 2 * 1.5 * math.exp(-3.0 * (1 - 1.0)), f[1]])
    torch.testing.assert_close(trace.posteriors, torch.tensor([expected]), atol=1e-6, rtol=0)


def test_two_steps_a_better_boosting_view_displaces_a_kept_entry_for_this_sample_only():
    # pos_shot 1, delta 0: class 1's slot holds sample 1; sample 2's boosting view (class 1, lower entropy)
    # takes the slot in sample 2's boosting cache, while the kept cache still holds sample 1.
    s1 = _sample([0.4, 0.9], FLAT)                      # view 0 predicts class 1 and is its own boosting view
    s2 = _sample([0.8, 0.6], [0.2, 0.98])
    f1, f2, b2 = s1[0].tolist(), s2[0].tolist(), s2[1].tolist()
    assert _h(b2) < _h(f1)
    trace = _ba(torch.stack([s1, s2]), pos_shot=1, pos_alpha=2.0, pos_beta=4.0)
    dot = f2[0] * b2[0] + f2[1] * b2[1]
    expected = _softmax_list([f2[0] + 2.0 * 1.0, f2[1] + 2.0 * math.exp(-4.0 * (1 - dot))])
    torch.testing.assert_close(trace.posteriors[1], torch.tensor(expected), atol=1e-6, rtol=0)
    torch.testing.assert_close(trace.state["pos_keys"][:, 0], torch.stack([s2[0], s1[0]]))
    # with delta = 1 the slot takes both: sample 1's entry stays beside the boosting view
    with_delta = _ba(torch.stack([s1, s2]), pos_shot=1, delta=1, pos_alpha=2.0, pos_beta=4.0)
    dot1 = f2[0] * f1[0] + f2[1] * f1[1]
    expected = _softmax_list([f2[0] + 2.0, f2[1] + 2.0 * (math.exp(-4.0 * (1 - dot)) + math.exp(-4.0 * (1 - dot1)))])
    torch.testing.assert_close(with_delta.posteriors[1], torch.tensor(expected), atol=1e-6, rtol=0)


def test_negative_cache_is_fifo():
    # K = 3, T = I, logit scale 5 (as TDA's negative-cache test): both samples fall in the entropy band and
    # predict class 0; with neg_shot 1 the newer one replaces the older, although its entropy is higher.
    a, b = _unit([1.0, 0.5, 0.0]), _unit([1.0, 0.55, 0.0])
    ha, hb = (_h([5.0 * v for v in s[0].tolist()]) for s in (a, b))
    assert hb > ha and all(0.2 < h / math.log2(3) < 0.5 for h in (ha, hb))
    feats = torch.stack([a, b])                         # one view each
    trace = make_method("boostadapter", torch.eye(3), torch.arange(3), 3, logit_scale=5.0, neg_shot=1).run(feats)
    torch.testing.assert_close(trace.state["neg_keys"][0, 0], b[0])
    tda = make_method("tda", torch.eye(3), torch.arange(3), 3, logit_scale=5.0, neg_shot=1).run(feats[:, 0])
    torch.testing.assert_close(tda.state["neg_keys"][0, 0], a[0])  # TDA keeps the lower-entropy entry


def test_one_view_is_tda_with_a_fifo_negative_cache():
    views, emb, ids, k, labels = view_stream("label_shift", n=300, num_classes=10, dim=32, seed=6, views=1,
                                             class_views=True)
    args = (emb, ids, k)
    for neg_shot, same in ((1, False), (60, True)):     # FIFO only differs from TDA once a slot is full
        ours = run_stream("boostadapter", views, *args, neg_shot=neg_shot, pos_alpha=1.0, pos_beta=8.0)
        tda = run_stream("tda", views[:, 0], *args, neg_shot=neg_shot, pos_alpha=1.0, pos_beta=8.0)
        assert torch.allclose(ours, tda, atol=1e-5, rtol=0) == same


# ------------------------------------------------------------------------------------------ contract

def test_chunks_continue_the_state():
    views, emb, ids, k, labels = view_stream("iid", n=400, num_classes=10, dim=32, seed=7, views=64, class_views=True)
    args = (emb, ids, k)
    whole = make_method("boostadapter", *args, query="confident", delta=2).run(views)
    method = make_method("boostadapter", *args, query="confident", delta=2)
    first, second = method.run(views[:150]), method.run(views[150:])
    parts = torch.cat([first.posteriors, second.posteriors])
    assert torch.equal(parts.argmax(1), whole.predictions)
    torch.testing.assert_close(parts, whole.posteriors, atol=1e-6, rtol=0)
    for key, value in whole.state.items():
        torch.testing.assert_close(second.state[key], value, atol=1e-6, rtol=0)
    torch.testing.assert_close(whole.posteriors.sum(1), torch.ones(400), atol=1e-5, rtol=0)


def test_several_embeddings_per_class_use_their_normalised_mean():
    views, emb, ids, k, _ = view_stream("iid", n=100, num_classes=8, dim=32, seed=2, templates_per_class=3, views=16)
    protos = F.normalize(torch.stack([emb[ids == c].mean(0) for c in range(k)]), dim=1)
    torch.testing.assert_close(run_stream("boostadapter", views, emb, ids, k),
                               run_stream("boostadapter", views, protos, torch.arange(k), k), atol=1e-5, rtol=0)


@pytest.mark.parametrize(("hp", "message"), [
    ({"query": "mean"}, r"boostadapter: hparam 'query' must be one of \['original', 'confident'\] .*got 'mean'"),
    ({"pos_shot": 0}, r"boostadapter: hparam 'pos_shot' must be an integer >= 1 .*got 0"),
    ({"delta": -1}, r"boostadapter: hparam 'delta' must be an integer >= 0 .*got -1"),
    ({"keep": 0.0}, r"boostadapter: hparam 'keep' must be a number in \(0, 1\] .*got 0.0"),
    ({"pos_alpha": float("nan")}, r"boostadapter: hparam 'pos_alpha' must be a number >= 0 .*got nan"),
    ({"neg_shots": 2}, r"unknown hparam 'neg_shots' for method 'boostadapter'"),
])
def test_bad_hparams_are_named(hp, message):
    with pytest.raises(ValueError, match=message):
        make_method("boostadapter", torch.eye(2), torch.arange(2), 2, **hp)


def test_confident_query_needs_a_kept_view():
    views = F.normalize(torch.randn(2, 5, 2, generator=torch.Generator().manual_seed(0)), dim=-1)
    with pytest.raises(ValueError, match=r"boostadapter: query='confident' .* none for keep = 0.1 and V = 5"):
        run_stream("boostadapter", views, torch.eye(2), torch.arange(2), 2, query="confident")
    # one view is always the query itself (the official code's single-view branch)
    assert run_stream("boostadapter", views[:, :1], torch.eye(2), torch.arange(2), 2, query="confident").shape == (2, 2)


def test_card_holds_the_official_configs():
    card = method_card("boostadapter")
    assert card.takes_views and card.views.kind == "crops"
    assert card.defaults() == {"pos_alpha": 2.0, "pos_beta": 5.0, "neg_alpha": 0.117, "neg_beta": 1.0, "pos_shot": 3,
                               "neg_shot": 2, "delta": 0, "keep": 0.1, "query": "original", "logit_scale": 100.0}
    sketch = card.defaults("imagenet-sketch")
    assert (sketch["pos_alpha"], sketch["pos_beta"], sketch["delta"], sketch["query"]) == (2.363, 7.45, 1, "confident")
    food = card.defaults("food101")
    assert (food["pos_alpha"], food["pos_beta"], food["delta"], food["query"]) == (1.0, 1.0, 3, "original")


@pytest.mark.parametrize("seed", [0, 1])
def test_sanity_beats_zero_shot_clip_on_synthetic_views(seed):
    """A sanity check of the mechanism on simulated shifted views (not a claim about real data): with the
    original view as the query (so no view averaging), the caches and the boosting views pull predictions
    towards the image-side class centres."""
    views, emb, ids, k, labels = view_stream("iid", n=1500, num_classes=20, dim=64, seed=seed, views=64,
                                             class_views=True)
    args = (emb, ids, k)
    clip = float((run_stream("clip", views[:, 0], *args).argmax(1) == labels).float().mean())
    ours = run_stream("boostadapter", views, *args, query="original", delta=2, pos_alpha=5.0, pos_beta=2.0)
    assert float((ours.argmax(1) == labels).float().mean()) > clip + 0.03
