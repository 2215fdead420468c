"""MTA: against a per-sample float64 transcription of the official solve_mta, hand-checked cases, errors,
and a sanity check on synthetic views."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from orchestrator.methods import make_method, run_stream
from orchestrator.methods.mta.method import affinities, bandwidths, gram, solve
from orchestrator.methods.mta.reference import official_mta
from view_streams import view_stream


def _accuracy(posteriors: torch.Tensor, labels: torch.Tensor) -> float:
    return float((posteriors.argmax(1) == labels).float().mean())


def test_matches_the_official_loop_over_a_stream():
    views, emb, ids, k, labels = view_stream("iid", n=1000, num_classes=20, dim=64, seed=3, views=64, class_views=True)
    args = (emb, ids, k)
    trace = make_method("mta", *args).run(views)
    ref = official_mta(views, emb)
    # The same solver in float64 is the reference up to float64 rounding: the algorithm is exact.
    feats, text = views.double(), emb.double()
    one = torch.ones(1, dtype=torch.float64)
    coefficients = solve(gram(feats), affinities(100.0 * feats @ text.T), bandwidths(feats), 0.2 * one, 4.0 * one)
    mode = (coefficients[:, 0, :, None] * feats).sum(1)
    torch.testing.assert_close(100.0 * mode @ text.T, ref, atol=1e-9, rtol=0)
    # From float32 features: identical predictions, posteriors within 1e-5 everywhere, also on the rare
    # samples whose MeanShift still moves after its 25 mode steps (the float64 iteration on the views'
    # coefficients; a float32 one ended up to 1e-4 away on about 2 in 1000 here).
    assert torch.equal(trace.predictions, ref.argmax(1))
    torch.testing.assert_close(trace.posteriors, ref.softmax(1).float(), atol=1e-5, rtol=0)
    # the MeanShift acts: the mode's prediction departs from view 0's on many samples
    view0 = run_stream("clip", views[:, 0], *args).argmax(1)
    assert int((trace.predictions != view0).sum()) > 100
    assert not trace.gated.any() and bool((trace.selected == -1).all()) and trace.state == {}


def test_float32_against_float64_at_k_100():
    # The docstring's statement, measured: on this stream the same predictions and posteriors within 1e-5 of the
    # float64 loop. No bound in general: on CLIP features at K = 100, 3 of 600 samples were reported 5.3e-4 away.
    views, emb, ids, k, _ = view_stream("iid", n=600, num_classes=100, dim=64, seed=3, views=64, view_noise=1.0)
    trace = make_method("mta", emb, ids, k).run(views)
    ref = official_mta(views, emb)
    assert torch.equal(trace.predictions, ref.argmax(1))
    torch.testing.assert_close(trace.posteriors, ref.softmax(1).float(), atol=1e-5, rtol=0)


def test_matches_the_official_loop_at_imagenet_scale():
    gen = torch.Generator().manual_seed(0)
    text = F.normalize(torch.randn(1000, 64, generator=gen), dim=1)
    latent = F.normalize(text[torch.randint(1000, (40,), generator=gen)] + 0.8 * torch.randn(40, 64, generator=gen),
                         dim=1)
    views = F.normalize(latent[:, None] + 0.15 * torch.randn(40, 64, 64, generator=gen), dim=-1)
    post = run_stream("mta", views, text, torch.arange(1000), 1000, lambda_y=0.3, lambda_q=2.0)
    ref = official_mta(views, text, lambda_y=0.3, lambda_q=2.0)
    assert torch.equal(post.argmax(1), ref.argmax(1))
    torch.testing.assert_close(post, ref.softmax(1).float(), atol=1e-5, rtol=0)


def test_symmetric_views_keep_the_original_as_the_mode():
    # Views 1-4 sit symmetrically around view 0 = e1 in (e1, e2, e3), and the class embeddings live in
    # (e1, e4), so the four have equal logits, equal bandwidths and equal inlierness, and every weighted mean
    # stays on e1: the output is zero-shot CLIP on view 0, softmax(scale * T e1), by hand.
    a = 0.3
    rows = [[1, 0, 0, 0], [1, a, 0, 0], [1, -a, 0, 0], [1, 0, a, 0], [1, 0, -a, 0]]
    views = F.normalize(torch.tensor([rows], dtype=torch.float32), dim=-1)
    text = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.6, 0.0, 0.0, 0.8]])
    post = run_stream("mta", views, text, torch.arange(2), 2, logit_scale=10.0)
    e0, e1 = math.exp(10.0), math.exp(6.0)
    torch.testing.assert_close(post, torch.tensor([[e0 / (e0 + e1), e1 / (e0 + e1)]]), atol=1e-6, rtol=0)


def test_the_mode_leaves_an_off_cluster_original_for_the_views_cluster():
    # View 0 leans to class 1; the other views cluster tightly on the class-0 side: the mode joins them.
    gen = torch.Generator().manual_seed(1)
    text = torch.eye(2, 3)
    cluster = F.normalize(torch.tensor([1.0, 0.6, 0.2]) + 0.05 * torch.randn(9, 3, generator=gen), dim=-1)
    view0 = F.normalize(torch.tensor([[0.8, 1.0, 0.2]]), dim=-1)
    views = torch.cat([view0, cluster])[None]
    assert int(run_stream("clip", views[:, 0], text, torch.arange(2), 2).argmax()) == 1
    assert int(run_stream("mta", views, text, torch.arange(2), 2).argmax()) == 0


def test_chunks_are_independent():
    views, emb, ids, k, labels = view_stream("iid", n=200, num_classes=10, dim=32, seed=1, views=64, class_views=True)
    method = make_method("mta", emb, ids, k)
    whole = method.run(views).posteriors
    parts = torch.cat([method.run(views[:77]).posteriors, method.run(views[77:]).posteriors])
    assert torch.equal(parts.argmax(1), whole.argmax(1))
    torch.testing.assert_close(parts, whole, atol=1e-6, rtol=0)
    torch.testing.assert_close(whole.sum(1), torch.ones(200), atol=1e-5, rtol=0)


def test_several_embeddings_per_class_use_their_normalised_mean():
    views, emb, ids, k, _ = view_stream("iid", n=100, num_classes=8, dim=32, seed=2, templates_per_class=3, views=16)
    protos = F.normalize(torch.stack([emb[ids == c].mean(0) for c in range(k)]), dim=1)
    torch.testing.assert_close(run_stream("mta", views, emb, ids, k),
                               run_stream("mta", views, protos, torch.arange(k), k), atol=1e-5, rtol=0)


@pytest.mark.parametrize(("hp", "message"), [
    ({"lambda_y": 0.0}, r"mta: hparam 'lambda_y' must be a number > 0 .*got 0.0"),
    ({"lambda_q": -1}, r"mta: hparam 'lambda_q' must be a number >= 0 .*got -1"),
    ({"logit_scale": "100"}, r"mta: hparam 'logit_scale' must be a number"),
    ({"max_iter": 3}, r"unknown hparam 'max_iter' for method 'mta'"),
])
def test_bad_hparams_are_named(hp, message):
    with pytest.raises(ValueError, match=message):
        make_method("mta", torch.eye(2), torch.arange(2), 2, **hp)


def test_few_views_and_duplicate_views():
    gen = torch.Generator().manual_seed(0)
    views = F.normalize(torch.randn(3, 4, 2, generator=gen), dim=-1)
    # one view is its own mode: zero-shot CLIP on it
    torch.testing.assert_close(run_stream("mta", views[:, :1], torch.eye(2), torch.arange(2), 2),
                               torch.softmax(100.0 * views[:, 0], dim=-1), atol=1e-6, rtol=0)
    # below 5 views the official k = int(0.3 (V - 1)) is 0 (NaN there); here one nearest view sets h
    assert bool(torch.isfinite(run_stream("mta", views, torch.eye(2), torch.arange(2), 2)).all())
    dup = F.normalize(torch.randn(2, 6, 2, generator=gen), dim=-1)
    dup[1, 1] = dup[1, 0]
    dup[1, 2] = dup[1, 0]
    with pytest.raises(ValueError, match=r"mta: sample 1 has a view whose nearest views all coincide"):
        run_stream("mta", dup, torch.eye(2), torch.arange(2), 2)
    with pytest.raises(ValueError, match=r"\[n, V, d\]"):
        run_stream("mta", views[:, 0], torch.eye(2), torch.arange(2), 2)


@pytest.mark.parametrize("seed", [0, 1])
def test_sanity_beats_zero_shot_clip_on_synthetic_views(seed):
    """A sanity check of the mechanism on simulated views (not a claim about real data): pooling the views'
    mode classifies better than view 0 alone."""
    views, emb, ids, k, labels = view_stream("iid", n=500, num_classes=20, dim=64, seed=seed, views=64,
                                             class_views=True)
    args = (emb, ids, k)
    clip = _accuracy(run_stream("clip", views[:, 0], *args), labels)
    mta = _accuracy(run_stream("mta", views, *args), labels)
    assert mta > clip + 0.1
