"""COSMIC against a float64 per-sample reference written from the official code (hf618/COSMIC direct_inference with
its scripts' flags), on streams where its CLIP memory replaces entries, its DINOv2 cache fills and re-sorts, and both
graphs are rebuilt on updates and every mac_step samples; chunking; the auxiliary features it needs."""

from __future__ import annotations

import pytest
import torch

from orchestrator.data.synthetic import auxiliary_features, make_synthetic
from orchestrator.methods import make_method
from orchestrator.methods.cosmic.reference import cosmic_reference
from orchestrator.registry import method_card
from tests.view_streams import view_stream

pytestmark = pytest.mark.usefixtures("one_thread")

# The fused scores are p_0 plus clique scores alpha exp(-beta (1 - cos)) of float32 cosines: each rounds by about
# (s + alpha beta) * 2^-24 relative (~2e-6 at s = 30, alpha beta = 10), and the normalised posterior moves by no
# more than its inputs' relative error; 1e-5 bounds that with room. The graphs are thresholds of float32
# similarities: they match the float64 reference's as long as no two similarities lie within float32 rounding of
# each other, which holds on these streams (a mismatch would show as a wrong prediction, not a small drift).
ATOL = 1e-5


def stream(scenario: str, n: int, k: int = 8, seed: int = 3):
    feats, emb, ids, k, labels = view_stream(scenario, num_classes=k, dim=24, n=n, views=8, seed=seed)
    bench = make_synthetic(scenario, num_classes=k, dim=24, n=n, seed=seed)
    return feats, emb, ids, k, {"dinov2": auxiliary_features(bench, seed)}


def check(feats, emb, ids, k, aux, **hp):
    trace = make_method("cosmic", emb, ids, k, **hp).run(feats, aux)
    z, labels = cosmic_reference(feats, aux["dinov2"], emb, **{**method_card("cosmic").defaults(), **hp})
    post = z / z.sum(1, keepdim=True)
    assert torch.equal(trace.predictions, post.argmax(1))
    torch.testing.assert_close(trace.posteriors.double(), post, atol=ATOL, rtol=0)
    assert trace.selected.tolist() == labels
    return trace, post


@pytest.mark.parametrize("scenario,hp", [
    ("label_shift", {"logit_scale": 30.0, "memory_size": 2, "dino_shot": 3, "mac_step": 7}),
    ("temporal", {"logit_scale": 20.0, "memory_size": 3, "dino_shot": 2, "mac_step": 11, "keep": 0.3,
                  "clique_alpha": 2.0, "clique_beta": 5.0, "ratio": 0.3, "clip_clique_weight": 3.0}),
])
def test_matches_the_reference_where_every_part_acts(scenario, hp):
    feats, emb, ids, k, aux = stream(scenario, 90)
    trace, post = check(feats, emb, ids, k, aux, **hp)
    # the caches filled (K shot < n) and kept changing after (replacements), so the graphs were rebuilt both on
    # updates and on the mac_step schedule
    full = k * max(hp["memory_size"], hp["dino_shot"])
    assert trace.gated[:full].any() and trace.gated[full:].any() and not trace.gated.all()
    assert bool((trace.state["memory_count"] == hp["memory_size"]).any())
    # the cliques move the posterior off zero-shot CLIP's
    p0 = torch.softmax(hp["logit_scale"] * feats[:, 0] @ emb.T, dim=1)
    assert float((trace.posteriors - p0).abs().max()) > 0.05


def test_two_parts_equal_one_run():
    feats, emb, ids, k, aux = stream("iid", 60)
    hp = {"logit_scale": 30.0, "memory_size": 2, "dino_shot": 2, "mac_step": 5}
    whole = make_method("cosmic", emb, ids, k, **hp).run(feats, aux)
    method = make_method("cosmic", emb, ids, k, **hp)
    first = method.run(feats[:23], {"dinov2": aux["dinov2"][:23]})
    second = method.run(feats[23:], {"dinov2": aux["dinov2"][23:]})
    torch.testing.assert_close(torch.cat([first.posteriors, second.posteriors]), whole.posteriors, atol=0, rtol=0)


def test_its_auxiliary_features_are_required_and_checked():
    feats, emb, ids, k, aux = stream("iid", 10)
    method = make_method("cosmic", emb, ids, k)
    with pytest.raises(ValueError, match="cosmic: reads the dinov2 auxiliary encoder's features; none were given"):
        method.run(feats)
    with pytest.raises(ValueError, match=r"cosmic: dinov2 features must be float32 \[10, d'\].*got \(9, 24\)"):
        method.run(feats, {"dinov2": aux["dinov2"][:9]})


def test_official_defaults_per_dataset():
    card = method_card("cosmic")
    assert card.auxiliary == ("dinov2",) and card.views.count == 8
    imagenet, dtd = card.defaults("imagenet"), card.defaults("dtd")
    assert (imagenet["memory_size"], imagenet["dino_shot"], dtd["memory_size"], dtd["dino_shot"]) == (16, 16, 8, 8)
    assert (imagenet["clique_alpha"], imagenet["clique_beta"], dtd["clique_alpha"], dtd["clique_beta"]) == (2, 5, 2, 3)
    assert (dtd["clip_degree"], dtd["dino_degree"], dtd["ratio"], dtd["mac_step"]) == (4.0, 5.0, 0.2, 100)
