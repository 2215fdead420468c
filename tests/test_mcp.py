"""MCP and MCP++ against a float64 per-sample reference written from the official code (CenturyChen/MCP
mcp_runner.py run_test_mcp with --res False and True), on streams where its three caches fill, replace and feed
each other and MCP++'s step moves the posteriors; chunking, the fusion's limits and errors."""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.methods import make_method, run_stream
from orchestrator.methods.mcp.reference import official_mcp
from orchestrator.registry import method_card
from tests.view_streams import view_stream

pytestmark = pytest.mark.usefixtures("one_thread")

# The posteriors are softmaxes (and their mean) of logits s T f + alpha (cache sums): float32 rounds each logit
# by about (s + alpha * shot) * 2^-24 (~3e-6 at s = 30 with a full cache), and a softmax moves by at most the
# logits' largest change; 1e-5 bounds that with room, 20x the float32 machine epsilon of a posterior near 1.
ATOL = 1e-5


def check_against_reference(feats, emb, k, dataset_a=False, method="mcp", **hp):
    trace = make_method(method, emb, torch.arange(k), k, **hp).run(feats)
    post, labels, caches, events = official_mcp(feats, emb, {**method_card(method).defaults(), **hp}, dataset_a,
                                                res=method == "mcp_pp")
    assert torch.equal(trace.predictions, post.argmax(1))
    torch.testing.assert_close(trace.posteriors.double(), post, atol=ATOL, rtol=0)
    assert trace.selected.tolist() == labels
    for name, key in (("entropy", "entropy_loss"), ("align", "align_loss"), ("negative", "neg_loss")):
        for c in range(k):
            expected = [float(e[1]) for e in caches[name].get(c, [])]
            held = trace.state[key][c]
            assert bool(torch.isinf(held[len(expected):]).all())
            torch.testing.assert_close(held[:len(expected)].double(), torch.tensor(expected, dtype=torch.float64),
                                       atol=ATOL, rtol=0)
    return trace, events


def test_matches_the_reference_where_every_cache_acts():
    feats, emb, _, k, _ = view_stream("label_shift", num_classes=10, dim=24, n=150, views=8, seed=3)
    trace, events = check_against_reference(feats, emb, k, logit_scale=20.0, entropy_shot=3, align_shot=2,
                                            neg_shot=2)
    # the align cache replaced entries by the distance rule, the negative cache took samples, and the negative
    # branch fed the entropy cache
    assert min(events.values()) > 0, events
    assert not trace.gated.all() and trace.gated.any()


def test_matches_the_reference_on_the_imagenet_a_branch():
    feats, emb, _, k, _ = view_stream("temporal", num_classes=8, dim=24, n=300, views=8, seed=3)
    _, events = check_against_reference(feats, emb, k, dataset_a=True, logit_scale=30.0, keep=0.3,
                                        query="confident", memory_weight=0.3, cache_weight=3.0, center=0.5)
    assert min(events.values()) > 0, events


def test_matches_the_reference_at_k_200():
    feats, emb, _, k, _ = view_stream("iid", num_classes=200, dim=64, n=40, views=8, seed=5, noise=0.5)
    check_against_reference(feats, emb, k, keep=0.25)


# MCP++'s AdamW step divides each gradient entry by its magnitude plus eps = 1e-3 (as DPE's, tests/test_dpe.py):
# float32 rounding of a near-zero entry moves a residual by up to lr / eps times it, which the logit scale
# multiplies; at logit scale 20 to 30 and lr <= 1e-3 the posteriors stay within ATOL.
@pytest.mark.parametrize("scenario,n,dataset_a,hp", [
    ("label_shift", 75, False, {"logit_scale": 20.0, "entropy_shot": 3, "align_shot": 2, "neg_shot": 2,
                                "lr_text": 1e-3, "lr_image": 1e-3}),
    ("temporal", 120, True, {"logit_scale": 30.0, "keep": 0.3, "query": "confident", "lr_text": 5e-4,
                             "lr_image": 1e-3}),
])
def test_mcp_pp_matches_the_reference_and_its_step_acts(scenario, n, dataset_a, hp):
    feats, emb, ids, k, _ = view_stream(scenario, num_classes=10, dim=24, n=n, views=8, seed=3)
    trace, events = check_against_reference(feats, emb, k, dataset_a, method="mcp_pp", **hp)
    assert min(events.values()) == 0 == events["global_gate"], events   # the text average never runs
    assert min(v for key, v in events.items() if key != "global_gate") > 0, events
    mcp = make_method("mcp", emb, ids, k, **{key: v for key, v in hp.items() if not key.startswith("lr")})
    assert (mcp.run(feats).posteriors - trace.posteriors).abs().max() > 0.05


@pytest.mark.parametrize("method", ["mcp", "mcp_pp"])
def test_chunks_continue_the_state_and_posteriors_are_distributions(method):
    feats, emb, ids, k, _ = view_stream("temporal", num_classes=6, dim=16, n=100, views=6, seed=24)
    whole = make_method(method, emb, ids, k, logit_scale=20.0).run(feats)
    obj = make_method(method, emb, ids, k, logit_scale=20.0)
    parts = [obj.run(feats[:40]), obj.run(feats[40:])]
    assert torch.equal(torch.cat([p.posteriors for p in parts]), whole.posteriors)
    assert all(torch.equal(parts[1].state[key], whole.state[key]) for key in whole.state)
    torch.testing.assert_close(whole.posteriors.sum(1), torch.ones(100), atol=1e-5, rtol=0)


def test_without_the_cache_posteriors_it_is_the_confident_views_mean_probability():
    feats, emb, ids, k, _ = view_stream("iid", num_classes=5, dim=16, n=50, views=10, seed=2)
    trace = make_method("mcp", emb, ids, k, memory_weight=0.0, cache_weight=0.0, keep=0.2).run(feats)
    probs = torch.softmax(100.0 * feats @ emb.T, dim=-1)
    entropy = -(probs * torch.log(probs + 1e-6)).sum(-1)
    kept = torch.argsort(entropy, dim=1, stable=True)[:, :2]
    expected = torch.stack([probs[i, kept[i]].mean(0) for i in range(50)])
    torch.testing.assert_close(trace.posteriors, expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("hp,message", [
    ({"entropy_shot": 0}, r"mcp: hparam 'entropy_shot' must be an integer >= 1 \(.*\), got 0"),
    ({"center": 1.5}, r"mcp: hparam 'center' must be a number in \[0, 1\] \(.*\), got 1.5"),
    ({"query": "mean"}, r"mcp: hparam 'query' must be one of \['original', 'confident'\] \(.*\), got 'mean'"),
    ({"cache_weight": -1}, r"mcp: hparam 'cache_weight' must be a number >= 0 \(.*\), got -1"),
])
def test_bad_hparams_are_named(hp, message):
    with pytest.raises(ValueError, match=message):
        make_method("mcp", torch.eye(3), torch.arange(3), 3, **hp)


def test_the_official_configs_are_the_per_dataset_defaults():
    card = method_card("mcp")
    assert (card.defaults("dtd")["pos_alpha"], card.defaults("dtd")["pos_beta"]) == (5.0, 7.0)
    assert card.defaults("imagenet-a")["query"] == "confident" and card.defaults("imagenet")["query"] == "original"
    assert math.isclose(card.defaults("sun397")["pos_beta"], 2.0)


def test_several_rows_per_class_are_averaged_and_renormalised():
    feats, emb, ids, k, _ = view_stream("iid", num_classes=5, dim=16, n=40, views=4, seed=26, templates_per_class=3)
    merged = torch.nn.functional.normalize(torch.stack([emb[ids == c].mean(0) for c in range(k)]), dim=1)
    torch.testing.assert_close(run_stream("mcp", feats, emb, ids, k),
                               run_stream("mcp", feats, merged, torch.arange(k), k), atol=1e-6, rtol=0)
