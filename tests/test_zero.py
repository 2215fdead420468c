"""Zero: confident-view filtering, majority vote, the tie-break and the posterior's form.

With U = identity rows and logit_scale 1, a view feature log(q) has class probabilities exactly q.
"""

from __future__ import annotations

import math

import torch

from orchestrator.methods import make_method, run_stream

EYE3 = torch.eye(3)
IDS3 = torch.arange(3)
FLAT = [0.34, 0.33, 0.33]                              # high-entropy filler views


def views(*qs: list[float]) -> torch.Tensor:
    """One sample [1, V, 3] whose views have class probabilities qs."""
    return torch.tensor([[[math.log(x) for x in q] for q in qs]])


def zero(feats: torch.Tensor, **hp) -> torch.Tensor:
    return run_stream("zero", feats, EYE3, IDS3, 3, logit_scale=1.0, **hp)


def close(tensor: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(tensor.float(), torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0)


def test_the_single_most_confident_view_decides():
    # V = 10, keep 10% -> one view: the lowest-entropy one (view 3), even though most views lean to class 0.
    kept = [0.1, 0.85, 0.05]
    qs = [[0.6, 0.2, 0.2]] * 3 + [kept] + [[0.6, 0.2, 0.2]] * 6
    close(zero(views(*qs)), [[(0 + kept[0]) / 2, (1 + kept[1]) / 2, (0 + kept[2]) / 2]])


def test_majority_vote_beats_the_mean_probability():
    # V = 30 -> three kept views; two vote class 2, one (very confident) votes class 0, whose mean probability
    # is nevertheless the highest. The vote wins.
    a, b, c = [0.998, 0.001, 0.001], [0.479, 0.001, 0.52], [0.47, 0.01, 0.52]
    post = zero(views(a, *[FLAT] * 10, b, *[FLAT] * 10, c, *[FLAT] * 7))
    mean = [(a[i] + b[i] + c[i]) / 3 for i in range(3)]
    assert mean[0] > mean[2]
    close(post, [[(1 + mean[0]) / 4, (0 + mean[1]) / 4, (2 + mean[2]) / 4]])
    assert int(post.argmax()) == 2


def test_a_tied_vote_goes_to_the_higher_mean_probability():
    # V = 20 -> two kept views voting 0 and 2; class 2's mean probability is higher.
    a, b = [0.9, 0.02, 0.08], [0.05, 0.03, 0.92]
    post = zero(views(a, *[FLAT] * 9, b, *[FLAT] * 9))
    mean = [(a[i] + b[i]) / 2 for i in range(3)]
    close(post, [[(1 + mean[0]) / 3, (0 + mean[1]) / 3, (1 + mean[2]) / 3]])
    assert int(post.argmax()) == 2
    # the same views in the other order: the tie-break does not depend on view order
    assert int(zero(views(b, *[FLAT] * 9, a, *[FLAT] * 9)).argmax()) == 2


def test_at_least_one_view_is_kept_and_keep_one_keeps_all():
    a = [0.7, 0.2, 0.1]
    # V = 3, int(3 * 0.1) = 0 -> still one view
    close(zero(views(FLAT, a, FLAT)), [[(1 + a[0]) / 2, a[1] / 2, a[2] / 2]])
    # keep = 1: all three views vote (0, 0, 0)
    mean = [(2 * FLAT[i] + a[i]) / 3 for i in range(3)]
    close(zero(views(FLAT, a, FLAT), keep=1.0), [[(3 + mean[0]) / 4, mean[1] / 4, mean[2] / 4]])


def test_equal_entropies_keep_the_earlier_view():
    # Every view is a permutation of one distribution: all entropies tie, so view 0 (the original) is kept.
    q = [0.7, 0.2, 0.1]
    post = zero(views([q[1], q[0], q[2]], q, [q[2], q[1], q[0]], *[q] * 7))
    assert int(post.argmax()) == 1


def test_class_probabilities_sum_over_embeddings():
    # Two embeddings per class: each view's class probability is the sum of its embeddings' softmax.
    emb = torch.cat([EYE3, EYE3])
    ids = torch.cat([IDS3, IDS3])
    f = views([0.6, 0.3, 0.1])
    torch.testing.assert_close(run_stream("zero", f, emb, ids, 3, logit_scale=1.0), zero(f), atol=1e-6, rtol=0)


def test_single_view_matches_clip_and_chunks_are_independent():
    gen = torch.Generator().manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(5, 8, generator=gen), dim=1)
    ids = torch.arange(5)
    feats = torch.nn.functional.normalize(torch.randn(300, 8, generator=gen), dim=1)   # > one 256-sample chunk
    clip = run_stream("clip", feats, emb, ids, 5)
    trace = make_method("zero", emb, ids, 5).run(feats[:, None])
    torch.testing.assert_close(trace.posteriors, (torch.nn.functional.one_hot(clip.argmax(1), 5) + clip) / 2,
                               atol=1e-6, rtol=0)
    assert not trace.gated.any() and not trace.gated_prior.any() and bool((trace.selected == -1).all())
    multi = torch.nn.functional.normalize(feats[:, None] + 0.3 * torch.randn(300, 12, 8, generator=gen), dim=-1)
    obj = make_method("zero", emb, ids, 5)
    whole = obj.run(multi).posteriors
    parts = torch.cat([obj.run(multi[:100]).posteriors, obj.run(multi[100:]).posteriors])
    torch.testing.assert_close(parts, whole, atol=1e-6, rtol=0)           # stateless: chunking changes nothing
    torch.testing.assert_close(whole.sum(dim=1), torch.ones(300), atol=1e-5, rtol=0)
