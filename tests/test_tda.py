"""TDA's caches and logits against hand computation; TDA + PA; the per-dataset defaults."""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.methods import make_method, run_stream
from orchestrator.methods.tda.method import class_logits
from orchestrator.methods.tda.reference import official_tda
from orchestrator.methods.views import gather_views, lowest_entropy_views
from orchestrator.registry import method_card

EYE2 = torch.eye(2)
IDS2 = torch.tensor([0, 1])
NO_NEG = {"neg_alpha": 0.0}  # the negative cache weighs nothing


def unit(xs: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in xs))
    return [x / norm for x in xs]


def softmax(xs: list[float]) -> list[float]:
    e = [math.exp(x) for x in xs]
    return [v / sum(e) for v in e]


def entropy(ps: list[float]) -> float:
    return -sum(p * math.log(p) for p in ps)


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


def close(tensor: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(tensor.float(), torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0)


def test_one_sample_sees_itself_in_the_positive_cache():
    # The public code updates the caches before computing the sample's own logits.
    f = unit([0.8, 0.6])
    assert entropy(softmax(f)) > 0.5                  # (K = 2: gating entropy = nats / log2(2)) no negative
    trace = make_method("tda", EYE2, IDS2, 2, logit_scale=1.0, pos_alpha=2.0, pos_beta=5.0).run(torch.tensor([f]))
    close(trace.posteriors, [softmax([f[0] + 2.0 * math.exp(-5.0 * (1 - dot(f, f))), f[1]])])
    assert trace.gated.tolist() == [True] and trace.selected.tolist() == [-1]
    close(trace.state["pos_keys"][0, 0], f)
    close(trace.state["pos_entropy"][0], [entropy(softmax(f)), math.inf, math.inf])


def test_two_samples_of_one_class_share_its_slot():
    f1, f2 = unit([0.8, 0.6]), unit([0.9, 0.3])
    trace = make_method("tda", EYE2, IDS2, 2, logit_scale=1.0, pos_alpha=1.5, pos_beta=3.0, **NO_NEG).run(
        torch.tensor([f1, f2]))
    affinity = math.exp(-3.0 * (1 - dot(f1, f2))) + math.exp(-3.0 * (1 - dot(f2, f2)))
    close(trace.posteriors[1], softmax([f2[0] + 1.5 * affinity, f2[1]]))
    # ranked by entropy: f2 is the more confident sample
    close(trace.state["pos_entropy"][0].sort().values, sorted([entropy(softmax(f1)), entropy(softmax(f2))]) + [math.inf])


def test_full_slot_keeps_the_lowest_entropy_entries():
    a, worse, better = unit([0.8, 0.6]), unit([0.7, 0.65]), unit([0.95, 0.2])
    losses = [entropy(softmax(x)) for x in (a, worse, better)]
    assert losses[1] > losses[0] > losses[2]
    trace = make_method("tda", EYE2, IDS2, 2, logit_scale=1.0, pos_shot=1, pos_alpha=2.0, pos_beta=4.0,
                        **NO_NEG).run(torch.tensor([a, worse, better]))
    assert trace.gated.tolist() == [True, False, True]
    # `worse` is scored against the cache holding only `a`
    close(trace.posteriors[1], softmax([worse[0] + 2.0 * math.exp(-4.0 * (1 - dot(a, worse))), worse[1]]))
    close(trace.state["pos_keys"][0, 0], better)


def test_equal_entropy_does_not_replace():
    f = unit([0.8, 0.6])
    trace = make_method("tda", EYE2, IDS2, 2, logit_scale=1.0, pos_shot=1, **NO_NEG).run(torch.tensor([f, f]))
    assert trace.gated.tolist() == [True, False]


def test_negative_cache_masks_uncertain_classes():
    # Three classes, U = I, logit scale 5: p ~ [0.894, 0.096, 0.010]; gating entropy ~0.235 is in (0.2, 0.5),
    # and the mask (0.03 < p < 1) keeps classes 0 and 1.
    f = unit([1.0, 0.5, 0.0])
    logits = [5.0 * x for x in f]
    p = softmax(logits)
    assert 0.2 < entropy(p) / math.log2(3) < 0.5 and p[2] < 0.03 < p[1]
    hp = {"logit_scale": 5.0, "pos_alpha": 2.0, "pos_beta": 5.0, "neg_alpha": 0.5, "neg_beta": 1.0}
    trace = make_method("tda", torch.eye(3), torch.arange(3), 3, **hp).run(torch.tensor([f]))
    weight_pos = 2.0 * math.exp(-5.0 * (1 - dot(f, f)))
    weight_neg = 0.5 * math.exp(-1.0 * (1 - dot(f, f)))
    expected = softmax([logits[0] + weight_pos - weight_neg, logits[1] - weight_neg, logits[2]])
    close(trace.posteriors, [expected])
    close(trace.state["neg_values"][0, 0], [1.0, 1.0, 0.0])
    close(trace.state["neg_keys"][0, 0], f)


def test_negative_cache_ignores_samples_outside_the_entropy_band():
    f = unit([0.8, 0.6])                              # gating entropy ~0.69 > 0.5
    trace = make_method("tda", EYE2, IDS2, 2, logit_scale=1.0).run(torch.tensor([f]))
    assert bool(torch.isinf(trace.state["neg_entropy"]).all())


def _stream(n: int = 400, k: int = 4, d: int = 12, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    emb = torch.nn.functional.normalize(torch.randn(k, d, generator=gen), dim=1)
    labels = torch.randint(k, (n,), generator=gen)
    feats = torch.nn.functional.normalize(emb[labels] + 0.9 * torch.randn(n, d, generator=gen), dim=1)
    return feats, emb, torch.arange(k), k


def test_caches_hold_the_lowest_entropy_samples_per_predicted_class():
    feats, emb, ids, k = _stream()
    scale = 10.0
    trace = make_method("tda", emb, ids, k, logit_scale=scale, pos_shot=3, neg_shot=2).run(feats)
    clip = run_stream("clip", feats, emb, ids, k, logit_scale=scale)
    loss = -(clip * clip.log()).sum(dim=1)
    pred = clip.argmax(dim=1)
    banded = (loss / math.log2(k) > 0.2) & (loss / math.log2(k) < 0.5)
    assert 0 < int(banded.sum()) < feats.shape[0]
    for c in range(k):
        for prefix, shot, eligible in (("pos", 3, pred == c), ("neg", 2, (pred == c) & banded)):
            kept = trace.state[f"{prefix}_entropy"][c]
            expected = loss[eligible].sort().values[:shot]
            torch.testing.assert_close(kept[torch.isfinite(kept)].sort().values, expected, atol=1e-5, rtol=0)


def test_posteriors_are_distributions_and_chunks_continue_the_state():
    feats, emb, ids, k = _stream()
    for method in ("tda", "tda_pa"):
        whole = make_method(method, emb, ids, k, logit_scale=10.0).run(feats)
        torch.testing.assert_close(whole.posteriors.sum(dim=1), torch.ones(feats.shape[0]), atol=1e-5, rtol=0)
        obj = make_method(method, emb, ids, k, logit_scale=10.0)
        parts = [obj.run(feats[:150]), obj.run(feats[150:])]
        assert torch.equal(torch.cat([p.posteriors for p in parts]), whole.posteriors)
        assert all(torch.equal(parts[1].state[key], whole.state[key]) for key in whole.state)


def test_caches_weighing_nothing_give_clip():
    feats, emb, ids, k = _stream(n=100)
    tda = run_stream("tda", feats, emb, ids, k, pos_alpha=0.0, neg_alpha=0.0)
    # clip's blocked products and TDA's per-sample ones round differently (by thread count and kernel): 1e-5 is
    # the methods' agreement contract
    torch.testing.assert_close(tda, run_stream("clip", feats, emb, ids, k), atol=1e-5, rtol=0)


def test_several_embeddings_per_class_combine_by_log_sum_exp():
    # Duplicating every embedding adds log 2 to every class logit: the posterior is unchanged.
    feats, emb, ids, k = _stream(n=200)
    once = run_stream("tda", feats, emb, ids, k, logit_scale=10.0)
    twice = run_stream("tda", feats, torch.cat([emb, emb]), torch.cat([ids, ids]), k, logit_scale=10.0)
    torch.testing.assert_close(once, twice, atol=1e-5, rtol=0)
    logits = torch.tensor([1.0, 2.0, 3.0, 0.5])
    close(class_logits(logits, torch.tensor([1, 0, 1, 2]), 3),
          [2.0, math.log(math.exp(1.0) + math.exp(3.0)), 0.5])


def test_tda_pa_with_tau_above_one_is_tda():
    feats, emb, ids, k = _stream()
    tda = make_method("tda", emb, ids, k, logit_scale=10.0).run(feats)
    tda_pa = make_method("tda_pa", emb, ids, k, logit_scale=10.0, tau=1.0).run(feats)
    torch.testing.assert_close(tda_pa.posteriors, tda.posteriors, atol=1e-5, rtol=0)
    assert torch.equal(tda_pa.gated, tda.gated)
    assert not tda_pa.gated_prior.any()
    assert torch.equal(tda_pa.state["V"], torch.eye(k))


def test_tda_pa_adapts_the_selected_prior_row():
    f = unit([0.8, 0.6])
    trace = make_method("tda_pa", EYE2, IDS2, 2, logit_scale=1.0, pos_alpha=2.0, pos_beta=5.0, tau=0.5,
                        n2=3).run(torch.tensor([f]))
    post = softmax([f[0] + 2.0, f[1]])                # |f| = 1: the sample's own cache entry adds alpha
    close(trace.posteriors, [post])
    assert trace.selected.tolist() == [0] and trace.gated_prior.tolist() == [True]
    close(trace.state["V"], [[(3 * 1.0 + post[0]) / 4, (3 * 0.0 + post[1]) / 4], [0.0, 1.0]])
    close(trace.state["C2"], [4.0, 3.0])


def test_tda_pa_prior_changes_later_posteriors():
    feats, emb, ids, k = _stream()
    trace = make_method("tda_pa", emb, ids, k, logit_scale=10.0, tau=0.5).run(feats)
    tda = make_method("tda", emb, ids, k, logit_scale=10.0).run(feats)
    assert 0 < int(trace.gated_prior.sum()) < feats.shape[0]
    V = trace.state["V"]
    torch.testing.assert_close(V.sum(dim=1), torch.ones(k), atol=1e-5, rtol=0)
    assert not torch.allclose(trace.posteriors, tda.posteriors, atol=1e-3)


@pytest.mark.parametrize("name,expected", [
    ("imagenet", (2.0, 5.0)), ("ImageNet-A", (2.0, 5.0)), ("imagenet_v2", (1.0, 8.0)), ("imagenet-r", (1.0, 8.0)),
    ("imagenet_sketch", (2.363, 7.45)), ("caltech101", (5.0, 5.0)), ("dtd", (2.0, 3.0)), ("eurosat", (4.0, 8.0)),
    ("fgvc_aircraft", (2.0, 2.0)), ("food101", (1.0, 1.0)), ("oxford_flowers", (1.0, 5.0)),
    ("oxford_pets", (2.0, 7.0)), ("stanford_cars", (1.0, 7.0)), ("SUN397", (2.0, 3.0)), ("ucf101", (3.0, 8.0)),
])
def test_tda_defaults_per_dataset(name, expected):
    for method in ("tda", "tda_pa"):
        defaults = method_card(method).defaults(name)
        assert (defaults["pos_alpha"], defaults["pos_beta"]) == expected
        assert (defaults["neg_alpha"], defaults["neg_beta"]) == (0.117, 1.0)


def test_tda_defaults_outside_the_benchmarks_are_imagenets():
    assert method_card("tda").defaults("synthetic_iid") == method_card("tda").defaults()
    assert (method_card("tda").defaults()["pos_alpha"], method_card("tda").defaults()["pos_beta"]) == (2.0, 5.0)


# ---------------------------------------------------------------------------- augmented views [n, V, d]

def _view_stream(n: int = 300, k: int = 6, d: int = 12, views: int = 20, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    emb = torch.nn.functional.normalize(torch.randn(k, d, generator=gen), dim=1)
    labels = torch.randint(k, (n,), generator=gen)
    base = emb[labels] + 0.8 * torch.randn(n, d, generator=gen)
    feats = torch.nn.functional.normalize(base[:, None] + 0.9 * torch.randn(n, views, d, generator=gen), dim=-1)
    return feats, emb, torch.arange(k), k


VIEW_HP = {"logit_scale": 8.0, "pos_alpha": 2.0, "pos_beta": 5.0, "neg_alpha": 0.117, "neg_beta": 1.0,
           "pos_shot": 3, "neg_shot": 2}


def test_views_follow_the_official_entropy_and_prob_map():
    feats, emb, ids, k = _view_stream()
    trace = make_method("tda", emb, ids, k, **VIEW_HP).run(feats)
    expected, pos, neg = official_tda(feats, emb, VIEW_HP)
    torch.testing.assert_close(trace.posteriors, expected, atol=2e-6, rtol=0)
    assert sum(len(v) for v in neg.values()) >= k      # the negative cache is in play
    for c in range(k):
        for prefix, cache in (("pos", pos), ("neg", neg)):
            kept = trace.state[f"{prefix}_entropy"][c]
            losses = sorted(float(e[1]) for e in cache.get(c, []))
            torch.testing.assert_close(kept[torch.isfinite(kept)].sort().values, torch.tensor(losses), atol=1e-6,
                                       rtol=0)
        for entry in neg.get(c, []):                   # prob_map: the mean of the kept views' softmaxes
            row = int(torch.argmin((trace.state["neg_entropy"][c] - entry[1]).abs()))
            mask = ((entry[2] > 0.03) & (entry[2] < 1.0)).float()
            assert torch.equal(trace.state["neg_values"][c, row], mask)


def test_views_differ_from_the_mean_logits_rule():
    # Taking the entropy from softmax(mean logits), as the method did before, ranks the caches differently:
    # the official avg_entropy changes cache entries and predictions on this stream.
    feats, emb, ids, k = _view_stream()
    views = make_method("tda", emb, ids, k, **VIEW_HP).run(feats)
    mean_feats = gather_views(feats, lowest_entropy_views(torch.softmax(
        VIEW_HP["logit_scale"] * feats @ emb.T, dim=-1), 0.1)).mean(dim=1)
    mean_rule = make_method("tda", emb, ids, k, **VIEW_HP).run(mean_feats)
    assert not torch.allclose(views.state["pos_entropy"], mean_rule.state["pos_entropy"], atol=1e-3)
    assert not torch.allclose(views.posteriors, mean_rule.posteriors, atol=1e-3)


@pytest.mark.parametrize("method", ["tda", "tda_pa"])
def test_a_single_view_is_exactly_the_single_view_path(method):
    feats, emb, ids, k = _stream()
    hp = {"logit_scale": 10.0, **({"tau": 0.5} if method == "tda_pa" else {})}
    flat = make_method(method, emb, ids, k, **hp).run(feats)
    single = make_method(method, emb, ids, k, **hp).run(feats[:, None])
    assert torch.equal(single.posteriors, flat.posteriors) and torch.equal(single.gated, flat.gated)
    assert all(torch.equal(single.state[key], flat.state[key]) for key in flat.state)


def test_tda_pa_on_views_with_tau_above_one_is_tda():
    feats, emb, ids, k = _view_stream()
    tda = make_method("tda", emb, ids, k, **VIEW_HP).run(feats)
    tda_pa = make_method("tda_pa", emb, ids, k, **VIEW_HP, tau=1.0).run(feats)
    torch.testing.assert_close(tda_pa.posteriors, tda.posteriors, atol=1e-5, rtol=0)
    assert torch.equal(tda_pa.gated, tda.gated)


@pytest.mark.parametrize("method", ["tda", "tda_pa"])
def test_cache_products_over_filled_entries_equal_the_full_capacity_products(method):
    # Each sample's cache logits come from the filled entries only; recomputed over the whole [K, shot]
    # capacity from the state the sample saw (caches update before its logits), empty slots weighing zero,
    # they are the same up to float32 rounding, and so are the predictions.
    feats, emb, ids, k = _stream(n=150)
    hp = {"logit_scale": 10.0, "pos_alpha": 2.0, "pos_beta": 5.0, "neg_alpha": 0.5, "neg_beta": 1.0,
          **({"tau": 1.0} if method == "tda_pa" else {})}
    obj = make_method(method, emb, ids, k, **hp)
    filled = []
    for i in range(feats.shape[0]):
        trace = obj.run(feats[i:i + 1])
        f, st = feats[i], trace.state
        weights = {p: torch.where(torch.isfinite(st[f"{p}_entropy"]),
                                  torch.exp(-(hp[f"{p}_beta"] - hp[f"{p}_beta"] * (st[f"{p}_keys"] @ f))), 0.0)
                   for p in ("pos", "neg")}
        full = (10.0 * emb @ f + 2.0 * weights["pos"].sum(dim=1)
                - 0.5 * weights["neg"].flatten() @ st["neg_values"].flatten(0, 1))
        torch.testing.assert_close(trace.posteriors[0], torch.softmax(full, dim=0), atol=1e-6, rtol=0)
        assert int(trace.predictions[0]) == int(full.argmax())
        filled.append(int(torch.isfinite(st["neg_entropy"]).sum()))
    assert filled[0] <= 1 < filled[-1]                  # partly filled caches at first, fuller later


def test_a_zero_capacity_is_refused_because_the_official_code_runs_it_as_one():
    """kdiAAA/TDA's update_cache gives a class its first entry whatever the capacity (tda_runner.py:39-40,
    `else: cache[pred] = [item]`): its transcription with pos_shot / neg_shot 0 holds one entry per class and
    predicts as capacity 1, which `tda` reproduces; 0 itself is refused, naming the hparam."""
    feats, emb, ids, k = _view_stream()
    zero, pos, neg = official_tda(feats, emb, {**VIEW_HP, "pos_shot": 0, "neg_shot": 0})
    one, _, _ = official_tda(feats, emb, {**VIEW_HP, "pos_shot": 1, "neg_shot": 1})
    assert pos and all(len(entries) == 1 for entries in (*pos.values(), *neg.values()))
    assert torch.equal(zero, one)
    ours = make_method("tda", emb, ids, k, **{**VIEW_HP, "pos_shot": 1, "neg_shot": 1}).run(feats).posteriors
    torch.testing.assert_close(ours, zero, atol=2e-6, rtol=0)
    for name in ("pos_shot", "neg_shot"):
        with pytest.raises(ValueError, match=rf"tda: hparam '{name}' must be an integer >= 1 .*official code keeps "
                                             rf"one even at 0.*got 0"):
            method_card("tda").resolve({name: 0})


# ---------------------------------------------------------------------------- float16, as the public code runs

@pytest.mark.parametrize("views", [20, 1])
@pytest.mark.parametrize("scale", [10.0, 20.0])
def test_float16_reproduces_the_official_float16_loop(views, scale):
    """`state_dtype: float16` against kdiAAA/TDA's loop in float16 (reference.official_tda, dtype float16): the
    same posteriors bit for bit and the same cache losses, on streams where both caches act."""
    feats, emb, ids, k = _view_stream(n=400, k=30, d=32, views=views)
    hp = {**VIEW_HP, "logit_scale": scale}
    x = feats if views > 1 else feats[:, 0]
    trace = make_method("tda", emb, ids, k, **hp, state_dtype="float16").run(x)
    expected, pos, neg = official_tda(feats, emb, hp, dtype=torch.float16)
    assert torch.equal(trace.posteriors, expected)
    assert sum(len(v) for v in neg.values()) > 0 and trace.gated.any()
    for c in range(k):
        for prefix, cache in (("pos", pos), ("neg", neg)):
            kept = trace.state[f"{prefix}_entropy"][c]
            assert kept[torch.isfinite(kept)].sort().values.tolist() == sorted(float(e[1]) for e in cache.get(c, []))
    float32 = make_method("tda", emb, ids, k, **hp).run(x).posteriors
    assert not torch.equal(trace.posteriors, float32)         # the option acts: float16 rounding moves posteriors


def test_a_pack_runs_float16_tda_configs_on_their_own_loop():
    from orchestrator.methods.many import run_traces_many

    feats, emb, ids, k = _view_stream(n=200, k=12, d=16)
    hparams = [VIEW_HP, {**VIEW_HP, "state_dtype": "float16"}, {**VIEW_HP, "pos_alpha": 1.0}]
    traces = run_traces_many(feats, emb, ids, k, [{"method": "tda", **hp} for hp in hparams])
    for hp, trace in zip(hparams, traces):
        alone = make_method("tda", emb, ids, k, **hp).run(feats)
        assert torch.equal(trace.predictions, alone.predictions)
        torch.testing.assert_close(trace.posteriors, alone.posteriors, atol=1e-6, rtol=0)
    assert torch.equal(traces[1].posteriors, make_method("tda", emb, ids, k, **hparams[1]).run(feats).posteriors)
