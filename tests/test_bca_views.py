"""The BCA family on augmented views [n, V, d]: view_selection='adaptive' against a per-sample reference
written from the public code (TTABC bca.py: BCAState.assign_label with select_confident_samples), and
view_selection='fixed' exactly equal to running on the views selected once (`select_views`)."""

from __future__ import annotations

import pytest
import torch

from orchestrator.clip import select_views
from orchestrator.methods import make_method, run_stream
from orchestrator.methods.bca.reference import official_bca
from orchestrator.methods.views import lowest_entropy_views, view_posteriors
from orchestrator.registry import method_card


def view_stream(n: int = 150, k: int = 8, d: int = 16, views: int = 20, seed: int = 2):
    gen = torch.Generator().manual_seed(seed)
    emb = torch.nn.functional.normalize(torch.randn(k, d, generator=gen), dim=1)
    labels = torch.randint(k, (n,), generator=gen)
    base = emb[labels] + 0.5 * torch.randn(n, d, generator=gen)
    feats = torch.nn.functional.normalize(base[:, None] + 0.6 * torch.randn(n, views, d, generator=gen), dim=-1)
    return feats, emb, torch.arange(k), k


# n1 small so that U moves a lot and the adaptive selection departs from the prompt-based one; logit scale
# 20 so that the gates fire on part of the stream only.
SCALE = 20.0
CASES = {
    "bca": ({"tau": 0.95, "n1": 4, "n2": 6, "logit_scale": SCALE},
            {"n1": 4, "n2": 6, "tau_u": 0.95, "tau_v": 0.95, "scale": SCALE}),
    "la": ({"tau": 0.95, "n1": 4, "logit_scale": SCALE},
           {"n1": 4, "n2": 6, "tau_u": 0.95, "tau_v": 2.0, "scale": SCALE}),
    "pa": ({"tau": 0.95, "n2": 6, "logit_scale": SCALE},
           {"n1": 4, "n2": 6, "tau_u": 2.0, "tau_v": 0.95, "scale": SCALE}),
}


@pytest.mark.parametrize("select_on", ["posterior", "likelihood"])
@pytest.mark.parametrize("method", sorted(CASES))
def test_adaptive_selection_follows_the_public_code(method, select_on):
    feats, emb, ids, k = view_stream()
    ours_hp, ref_hp = CASES[method]
    trace = make_method(method, emb, ids, k, select_on=select_on, **ours_hp).run(feats)
    ref = official_bca(feats, emb, select=select_on, **ref_hp)
    assert torch.equal(trace.predictions, ref["post"].argmax(1))
    torch.testing.assert_close(trace.posteriors, ref["post"], atol=1e-5, rtol=0)
    assert torch.equal(trace.selected, ref["row"])
    assert torch.equal(trace.gated, ref["gated"] & (method != "pa"))
    assert torch.equal(trace.gated_prior, ref["gated_prior"] & (method != "la"))
    assert len(feats) // 4 < int(torch.maximum(ref["gated"], ref["gated_prior"]).sum()) < len(feats) * 3 // 4
    torch.testing.assert_close(trace.state["U"], ref["U"], atol=1e-5, rtol=0)
    torch.testing.assert_close(trace.state["V"], ref["V"], atol=1e-5, rtol=0)


def test_adaptive_selection_changes_the_views_and_the_results():
    # The views kept against the adapted U differ from those kept once against the prompt embeddings on part
    # of the stream, and 'fixed' gives other results than 'adaptive' there.
    feats, emb, ids, k = view_stream()
    ours_hp, ref_hp = CASES["bca"]
    ref = official_bca(feats, emb, **ref_hp)
    fixed = lowest_entropy_views(view_posteriors(feats, emb, ids, k, SCALE), 0.1).sort(dim=1).values
    changed = sum(ref["kept"][i] != fixed[i].tolist() for i in range(len(feats)))
    assert changed > len(feats) // 20
    adaptive = make_method("bca", emb, ids, k, **ours_hp).run(feats)
    once = make_method("bca", emb, ids, k, view_selection="fixed", **ours_hp).run(feats)
    assert not torch.allclose(adaptive.posteriors, once.posteriors, atol=1e-3)


@pytest.mark.parametrize("method", ["la", "pa", "bca"])
def test_fixed_selection_is_exactly_the_views_selected_once(method):
    feats, emb, ids, k = view_stream()
    hp = {**CASES[method][0], "view_selection": "fixed"}
    on_views = make_method(method, emb, ids, k, **hp).run(feats)
    on_means = make_method(method, emb, ids, k, **hp).run(select_views(feats, emb, ids, k))
    assert torch.equal(on_views.posteriors, on_means.posteriors)
    assert torch.equal(on_views.selected, on_means.selected) and torch.equal(on_views.gated, on_means.gated)
    assert all(torch.equal(on_views.state[key], on_means.state[key]) for key in on_means.state)


@pytest.mark.parametrize("view_selection", ["adaptive", "fixed"])
def test_a_single_view_is_exactly_the_single_view_path(view_selection):
    feats, emb, ids, k = view_stream()
    hp = {**CASES["bca"][0], "view_selection": view_selection}
    flat = make_method("bca", emb, ids, k, **hp).run(feats[:, 0])
    single = make_method("bca", emb, ids, k, **hp).run(feats[:, :1])
    assert torch.equal(single.posteriors, flat.posteriors)
    assert all(torch.equal(single.state[key], flat.state[key]) for key in flat.state)


def test_adaptive_chunks_continue_the_state():
    feats, emb, ids, k = view_stream(n=80)
    whole = make_method("bca", emb, ids, k, **CASES["bca"][0]).run(feats)
    obj = make_method("bca", emb, ids, k, **CASES["bca"][0])
    parts = [obj.run(feats[:50]), obj.run(feats[50:])]
    assert torch.equal(torch.cat([p.posteriors for p in parts]), whole.posteriors)
    assert all(torch.equal(parts[1].state[key], whole.state[key]) for key in whole.state)


def test_view_selection_defaults_and_errors():
    for method in ("la", "pa", "bca"):
        assert method_card(method).defaults()["view_selection"] == "adaptive"
        assert method_card(method).wants_views({}) and not method_card(method).wants_views({"view_selection": "fixed"})
    assert "view_selection" not in method_card("clip").defaults() and not method_card("clip").wants_views({})
    feats, emb, ids, k = view_stream(n=4)
    with pytest.raises(ValueError, match=r"bca: hparam 'view_selection' must be one of \['adaptive', 'fixed'\] "
                                         r"\(augmented views: .*\), got 'once'$"):
        run_stream("bca", feats, emb, ids, k, view_selection="once")
    with pytest.raises(ValueError, match=r"bca: features must have shape \[n, d\] or \[n, V, d\] "
                                         r"\(augmented views, view 0 the original\), got \(4, 20, 16, 1\)$"):
        run_stream("bca", feats[..., None], emb, ids, k)
