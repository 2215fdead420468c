"""Zero: confident-view filtering, majority vote, the tie-breaks and the posterior's form.

With U = identity rows and logit_scale 1, a view feature log(q) has class probabilities exactly q. The vote
mechanics are checked with the 'mean_prob' tie-break (whose posterior is (votes + mean_q) / (kept + 1));
the official 'discarded' tie-break against a per-sample reference written from the official code.
"""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.methods import make_method, run_stream
from orchestrator.registry import method_card

EYE3 = torch.eye(3)
IDS3 = torch.arange(3)
FLAT = [0.34, 0.33, 0.33]                              # high-entropy filler views


def views(*qs: list[float]) -> torch.Tensor:
    """One sample [1, V, 3] whose views have class probabilities qs."""
    return torch.tensor([[[math.log(x) for x in q] for q in qs]])


def zero(feats: torch.Tensor, **hp) -> torch.Tensor:
    """The vote mechanics: 10% of the views kept, ties to the higher mean probability."""
    return run_stream("zero", feats, EYE3, IDS3, 3, **{"logit_scale": 1.0, "keep": 0.1, "tie_break": "mean_prob",
                                                       **hp})


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
    torch.testing.assert_close(run_stream("zero", f, emb, ids, 3, logit_scale=1.0, keep=0.1, tie_break="mean_prob"),
                               zero(f), atol=1e-6, rtol=0)


def test_single_view_matches_clip_and_chunks_are_independent():
    gen = torch.Generator().manual_seed(0)
    emb = torch.nn.functional.normalize(torch.randn(5, 8, generator=gen), dim=1)
    ids = torch.arange(5)
    feats = torch.nn.functional.normalize(torch.randn(300, 8, generator=gen), dim=1)   # > one 256-sample chunk
    clip = run_stream("clip", feats, emb, ids, 5)
    trace = make_method("zero", emb, ids, 5).run(feats[:, None])
    onehot = torch.nn.functional.one_hot(clip.argmax(1), 5)
    torch.testing.assert_close(trace.posteriors, (onehot + (onehot + clip) / 2) / 2, atol=1e-6, rtol=0)
    assert not trace.gated.any() and not trace.gated_prior.any() and bool((trace.selected == -1).all())
    multi = torch.nn.functional.normalize(feats[:, None] + 0.3 * torch.randn(300, 12, 8, generator=gen), dim=-1)
    obj = make_method("zero", emb, ids, 5)
    whole = obj.run(multi).posteriors
    parts = torch.cat([obj.run(multi[:100]).posteriors, obj.run(multi[100:]).posteriors])
    torch.testing.assert_close(parts, whole, atol=1e-6, rtol=0)           # stateless: chunking changes nothing
    torch.testing.assert_close(whole.sum(dim=1), torch.ones(300), atol=1e-5, rtol=0)


# ------------------------------------------------------------------- the official defaults and tie rule

def official_zero_vote(q: torch.Tensor, gamma: float, tie_break: str = "after_k") -> int:
    """One sample's prediction as FarinaMatteo/zero computes it (ttas/zero.py with utils/tools.py
    greedy_break): q [V, K] view probabilities. A tie walks l[k:], the views from index k = int(V gamma) on in
    the loader's order ('after_k', the code; 'discarded': the discarded views in confidence order). Where none
    of them votes for a tied class the code's break_sample_tie restricts the first of them to the tied classes
    (as intended; its `~ties` indexing of an int tensor is a bug); with every view kept the most confident view
    stands in."""
    entropy = -(q * q.log()).sum(1)
    order = torch.argsort(entropy, stable=True).tolist()
    k = max(1, int(q.shape[0] * gamma))
    votes = torch.bincount(q[order[:k]].argmax(1), minlength=q.shape[1])
    ties = [c for c in range(q.shape[1]) if votes[c] == votes.max()]
    if len(ties) == 1:
        return ties[0]
    rest = order[:1] if k >= len(order) else list(range(k, len(order))) if tie_break == "after_k" else order[k:]
    for v in rest:
        if int(q[v].argmax()) in ties:
            return int(q[v].argmax())
    return max(ties, key=lambda c: float(q[rest[0], c]))


def test_official_defaults():
    assert method_card("zero").defaults() == {"keep": 0.3, "logit_scale": 100.0, "tie_break": "after_k",
                                              "state_dtype": "float32"}


def test_a_tie_goes_to_the_first_discarded_view_voting_a_tied_class():
    # V = 10, keep 0.3 -> three kept views voting 0, 2 and 1: a three-way tie. The discarded views in
    # confidence order vote 1 (entropy lowest among them), then 0. Class 1 wins although class 0 has the
    # highest mean probability among the kept views (which 'mean_prob' picks).
    kept = [[0.97, 0.02, 0.01], [0.02, 0.01, 0.97], [0.03, 0.95, 0.02]]
    discarded = [[0.1, 0.8, 0.1], [0.6, 0.2, 0.2]] + [FLAT] * 5
    feats = views(*discarded[:1], *kept, *discarded[1:])
    post = zero(feats, keep=0.3, tie_break="discarded")
    assert int(post.argmax()) == 1 == official_zero_vote(torch.tensor([discarded[0], *kept, *discarded[1:]]), 0.3,
                                                         "discarded")
    assert int(zero(feats, keep=0.3).argmax()) == 0                 # mean_prob: class 0's mean is highest
    mean = torch.tensor(kept).mean(0)
    close(post, ((torch.ones(3) + (torch.tensor([0.0, 1.0, 0.0]) + mean) / 2) / 4)[None].tolist())


def test_a_discarded_view_voting_an_untied_class_is_skipped():
    # V = 10, keep 0.2 -> two kept views tie classes 0 and 2; the most confident discarded view votes 1 (not
    # tied) and is skipped; the next votes 2.
    kept = [[0.96, 0.02, 0.02], [0.03, 0.02, 0.95]]
    discarded = [[0.1, 0.8, 0.1], [0.15, 0.15, 0.7]] + [FLAT] * 6
    q = torch.tensor([*kept, *discarded])
    assert official_zero_vote(q, 0.2, "discarded") == 2
    assert int(zero(views(*kept, *discarded), keep=0.2, tie_break="discarded").argmax()) == 2
    assert int(zero(views(*kept, *discarded), keep=0.2).argmax()) == 0


def test_without_a_discarded_vote_for_a_tied_class_the_first_discarded_view_decides_among_them():
    # Kept views tie 0 and 2; every discarded view votes 1; the first discarded view prefers 2 over 0.
    kept = [[0.96, 0.02, 0.02], [0.03, 0.02, 0.95]]
    discarded = [[0.1, 0.6, 0.3]] + [[0.3, 0.4, 0.3]] * 7
    q = torch.tensor([*kept, *discarded])
    assert official_zero_vote(q, 0.2, "discarded") == 2
    assert int(zero(views(*kept, *discarded), keep=0.2, tie_break="discarded").argmax()) == 2
    # every view kept: the most confident view (class 0 at 0.96) decides among the tied classes 0 and 1
    both = [[0.96, 0.03, 0.01], [0.02, 0.97, 0.01], [0.5, 0.4, 0.1], [0.45, 0.5, 0.05]]
    for rule in ("after_k", "discarded"):
        assert official_zero_vote(torch.tensor(both), 1.0, rule) == 1  # the most confident view is view 1
        assert int(zero(views(*both), keep=1.0, tie_break=rule).argmax()) == 1


def test_a_tie_walks_the_views_from_index_k_in_the_loaders_order():
    # V = 10, keep 0.2 -> k = 2. The kept views (the two most confident) are views 5 and 7 and tie classes 0
    # and 2. The official l[k:] walks views 2, 3, ... in loader order: view 2 votes 1 (not tied), view 3 votes
    # 2, so 2 wins. The discarded views in confidence order start with view 8 (voting 0), so 'discarded' picks 0.
    q = [FLAT] * 10
    q[5], q[7] = [0.96, 0.02, 0.02], [0.03, 0.02, 0.95]
    q[2], q[3], q[8] = [0.2, 0.6, 0.2], [0.3, 0.25, 0.45], [0.85, 0.1, 0.05]
    q = torch.tensor(q)
    assert official_zero_vote(q, 0.2) == 2 and official_zero_vote(q, 0.2, "discarded") == 0
    assert int(zero(views(*q.tolist()), keep=0.2, tie_break="after_k").argmax()) == 2  # the card's default
    assert int(zero(views(*q.tolist()), keep=0.2, tie_break="discarded").argmax()) == 0


@pytest.mark.parametrize("rule", ["after_k", "discarded"])
def test_greedy_tie_breaks_match_the_official_rule_on_a_random_stream(rule):
    # Three classes and 20 views (6 kept): ties are common. Every prediction equals the official rule's, the
    # posterior rows sum to 1, and the rule really differs from 'mean_prob' (and from the other greedy rule).
    gen = torch.Generator().manual_seed(5)
    q = torch.softmax(2.5 * torch.randn(400, 20, 3, generator=gen), dim=-1)
    feats = q.log()
    post = run_stream("zero", feats, EYE3, IDS3, 3, logit_scale=1.0, tie_break=rule)
    expected = torch.tensor([official_zero_vote(q[i], 0.3, rule) for i in range(400)])
    assert torch.equal(post.argmax(1), expected)
    torch.testing.assert_close(post.sum(1), torch.ones(400), atol=1e-6, rtol=0)
    votes = torch.nn.functional.one_hot(
        torch.gather(q, 1, torch.argsort(-(q * q.log()).sum(-1), dim=1, stable=True)[:, :6, None]
                     .expand(-1, -1, 3)).argmax(-1), 3).sum(1)
    ties = int(((votes == votes.max(1, keepdim=True).values).sum(1) > 1).sum())
    assert ties > 40
    other = run_stream("zero", feats, EYE3, IDS3, 3, logit_scale=1.0, tie_break="mean_prob").argmax(1)
    assert int((other != expected).sum()) > 5
    greedy = {"after_k": "discarded", "discarded": "after_k"}[rule]
    assert int((run_stream("zero", feats, EYE3, IDS3, 3, logit_scale=1.0, tie_break=greedy).argmax(1)
                != expected).sum()) > 0


def test_tie_break_must_be_a_known_rule():
    with pytest.raises(ValueError, match=r"zero: hparam 'tie_break' must be one of \['after_k', 'discarded', 'mean_prob'\] "
                                         r"\(a tied vote: .*\), got 'vote'$"):
        make_method("zero", EYE3, IDS3, 3, tie_break="vote")


# ------------------------------------------------------------------- float16, as the official run computes it

def _stream(n: int = 300, k: int = 20, d: int = 32, seed: int = 1, twins: bool = False):
    """64 views per sample. twins: classes in pairs of near-duplicate embeddings with CLIP-like cosines (about
    0.3), where float16's zero temperature splits votes between a pair; else well-separated classes, where
    votes are whole and ties frequent."""
    gen = torch.Generator().manual_seed(seed)
    if twins:
        base = torch.nn.functional.normalize(torch.randn(k // 2, d, generator=gen), dim=1)
        twin = torch.nn.functional.normalize(base + 0.01 * torch.randn(k // 2, d, generator=gen), dim=1)
        emb = torch.stack([base, twin], 1).reshape(k, d)
        labels = torch.randint(k, (n,), generator=gen)
        centre = 0.3 * emb[labels] + torch.nn.functional.normalize(torch.randn(n, d, generator=gen), dim=1)
        noise = 0.3 * torch.nn.functional.normalize(torch.randn(n, 64, d, generator=gen), dim=-1)
        return torch.nn.functional.normalize(centre[:, None] + noise, dim=-1), emb, k
    emb = torch.nn.functional.normalize(torch.randn(k, d, generator=gen), dim=1)
    labels = torch.randint(k, (n,), generator=gen)
    centre = emb[labels] + 0.8 * torch.randn(n, d, generator=gen)
    return torch.nn.functional.normalize(centre[:, None] + 0.9 * torch.randn(n, 64, d, generator=gen), dim=-1), emb, k


@pytest.mark.parametrize("twins, scale", [(True, 100.0), (False, 10.0), (False, 20.0)])
def test_float16_reproduces_the_official_float16_votes(twins, scale):
    """`state_dtype: float16` against FarinaMatteo/zero's per-sample `zero` in float16 (reference.official_zero):
    the same predictions, and the posterior is the official output p_bar over its sum. The twin stream has
    fractional (soft) votes on most rows, the other whole votes and ties (the tie path)."""
    from orchestrator.methods.zero.reference import official_zero

    feats, emb, k = _stream(twins=twins)
    hp = {"keep": 0.3, "logit_scale": scale, "tie_break": "after_k"}
    post = make_method("zero", emb, torch.arange(k), k, **hp, state_dtype="float16").run(feats).posteriors
    p_bar, tied = official_zero(feats, emb, hp, dtype=torch.float16)
    assert torch.equal(post.argmax(1), p_bar.argmax(1))
    torch.testing.assert_close(post * (19 + tied.float()[:, None]), p_bar, atol=1e-5, rtol=0)
    soft = ((p_bar - p_bar.round()).abs() > 1e-3).any(1)
    assert soft.float().mean() > 0.3 if twins else tied.any()
    float32 = make_method("zero", emb, torch.arange(k), k, **hp).run(feats).posteriors
    assert not torch.equal(post, float32)


def test_a_pack_runs_float16_zero_configs_apart_from_float32_ones():
    from orchestrator.methods.many import run_traces_many

    feats, emb, k = _stream(n=120, twins=True)
    hparams = [{}, {"state_dtype": "float16"}, {"state_dtype": "float16", "keep": 0.5}, {"keep": 0.5}]
    traces = run_traces_many(feats, emb, torch.arange(k), k, [{"method": "zero", **hp} for hp in hparams])
    for hp, trace in zip(hparams, traces):
        assert torch.equal(trace.posteriors, make_method("zero", emb, torch.arange(k), k, **hp).run(feats).posteriors)
