"""DMN-ZS against a float64 per-sample reference written from the official code (dmn_main.py direct_inference,
DualMem.update_memory_bank / get_image_pred), hand cases, chunking, errors, and a synthetic sanity check."""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.methods import make_method, run_stream
from orchestrator.methods.dmn_zs.reference import official_dmn_zs
from tests.view_streams import accuracy, softmax, unit, view_stream


pytestmark = pytest.mark.usefixtures("one_thread")


def check_against_reference(feats, emb, ids, k, **hp):
    trace = make_method("dmn_zs", emb, ids, k, **hp).run(feats)
    names = {"logit_scale": "scale"}
    post, labels, written, count = official_dmn_zs(feats, emb, **{names.get(key, key): v for key, v in hp.items()})
    assert torch.equal(trace.predictions, post.argmax(1))
    torch.testing.assert_close(trace.posteriors.double(), post, atol=1e-5, rtol=0)
    assert torch.equal(trace.selected, labels) and torch.equal(trace.gated, written)
    assert torch.equal(trace.state["memory_count"], count)
    return trace


# At logit scale 100 near-one-hot views tie in float32 entropy (log(p + 1e-6) rounds), so the memory's entropy
# ranking can differ from float64; at 20 the float32 method agrees with the float64 reference to 1e-5.
def test_matches_the_reference_over_a_long_stream():
    feats, emb, ids, k, _ = view_stream("label_shift", num_classes=10, dim=32, n=3000, views=10, seed=21)
    trace = check_against_reference(feats, emb, ids, k, keep=0.2, logit_scale=20.0)
    count = trace.state["memory_count"]
    assert int(count.max()) == 50                          # some classes fill their memory ...
    assert 0 < int((~trace.gated).sum())                   # ... and then refuse high-entropy samples
    filled_and_replaced = int(trace.gated.sum()) - int(count.sum())
    assert filled_and_replaced > 0                         # ... and replace their worst entries
    clip = run_stream("clip", feats[:, 0], emb, ids, k, logit_scale=20.0)
    assert int((trace.predictions != clip.argmax(1)).sum()) > 0


def test_matches_the_reference_with_a_small_memory_and_other_weights():
    feats, emb, ids, k, _ = view_stream("temporal", num_classes=8, dim=24, n=500, views=6, seed=22)
    check_against_reference(feats, emb, ids, k, memory_size=3, beta=2.0, memory_weight=10.0, keep=0.5,
                            logit_scale=20.0)


def test_matches_the_reference_at_k_1000():
    feats, emb, ids, k, _ = view_stream("iid", num_classes=1000, dim=64, n=60, views=8, seed=23, noise=0.5)
    check_against_reference(feats, emb, ids, k, keep=0.25)


# ------------------------------------------------------------------------------------------- by hand (K = d = 2)

def dot(a, b):
    return sum(x * y for x, y in zip(a, b))


def read_out(x, keys_per_class, beta, scale):
    """Per class: normalise(sum_j exp(-beta (1 - key_j . x)) key_j); then softmax(scale * a_k . x)."""
    rows = []
    for keys in keys_per_class:
        weighted = [sum(math.exp(-beta * (1 - dot(key, x))) * key[i] for key in keys) for i in range(2)]
        rows.append(unit(weighted))
    return softmax([scale * dot(r, x) for r in rows])


HAND = {"logit_scale": 2.0, "beta": 3.0, "memory_weight": 0.5, "memory_size": 1}
E1, E2 = [1.0, 0.0], [0.0, 1.0]


def test_one_sample_by_hand():
    x = unit([0.8, 0.6])
    text_post = softmax([2.0 * x[0], 2.0 * x[1]])
    memory_post = read_out(x, [[x, E1], [E2]], beta=3.0, scale=2.0)       # class 0 remembers x
    expected = [(t + 0.5 * m) / 1.5 for t, m in zip(text_post, memory_post)]
    trace = make_method("dmn_zs", torch.eye(2), torch.arange(2), 2, **HAND).run(torch.tensor([[x]]))
    torch.testing.assert_close(trace.posteriors, torch.tensor([expected], dtype=torch.float32), atol=1e-6, rtol=0)
    assert trace.selected.tolist() == [0] and trace.gated.tolist() == [True]
    h = -sum(p * math.log(p + 1e-8) for p in text_post)
    torch.testing.assert_close(trace.state["memory_entropy"], torch.tensor([[h], [0.0]]), atol=1e-6, rtol=0)


def test_a_full_memory_keeps_the_lower_entropy_sample():
    a, worse, better = unit([0.8, 0.6]), unit([0.7, 0.65]), unit([0.95, 0.2])
    trace = make_method("dmn_zs", torch.eye(2), torch.arange(2), 2, **HAND).run(torch.tensor([[a], [worse], [better]]))
    assert trace.gated.tolist() == [True, False, True]
    # `worse` is read against the memory holding `a`; `better` against the memory holding itself
    for i, (x, held) in enumerate(((worse, a), (better, better)), start=1):
        text_post = softmax([2.0 * x[0], 2.0 * x[1]])
        memory_post = read_out(x, [[held, E1], [E2]], beta=3.0, scale=2.0)
        expected = [(t + 0.5 * m) / 1.5 for t, m in zip(text_post, memory_post)]
        torch.testing.assert_close(trace.posteriors[i], torch.tensor(expected), atol=1e-6, rtol=0)
    torch.testing.assert_close(trace.state["memory"][0, 0], torch.tensor(better), atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------------------ contract

def test_chunks_continue_the_state_and_posteriors_are_distributions():
    feats, emb, ids, k, _ = view_stream("temporal", num_classes=6, dim=16, n=300, views=6, seed=24)
    whole = make_method("dmn_zs", emb, ids, k, memory_size=4).run(feats)
    obj = make_method("dmn_zs", emb, ids, k, memory_size=4)
    parts = [obj.run(feats[:120]), obj.run(feats[120:])]
    assert torch.equal(torch.cat([p.posteriors for p in parts]), whole.posteriors)
    assert all(torch.equal(parts[1].state[key], whole.state[key]) for key in whole.state)
    torch.testing.assert_close(whole.posteriors.sum(1), torch.ones(300), atol=1e-5, rtol=0)


def test_zero_memory_weight_is_zero_shot_clip_on_the_original_view():
    feats, emb, ids, k, _ = view_stream("iid", num_classes=6, dim=16, n=100, views=4, seed=25)
    torch.testing.assert_close(run_stream("dmn_zs", feats, emb, ids, k, memory_weight=0.0),
                               run_stream("clip", feats[:, 0], emb, ids, k), atol=1e-5, rtol=0)


def test_several_rows_per_class_are_averaged_and_renormalised():
    feats, emb, ids, k, _ = view_stream("iid", num_classes=5, dim=16, n=60, views=4, seed=26, templates_per_class=3)
    merged = torch.nn.functional.normalize(torch.stack([emb[ids == c].mean(0) for c in range(k)]), dim=1)
    torch.testing.assert_close(run_stream("dmn_zs", feats, emb, ids, k),
                               run_stream("dmn_zs", feats, merged, torch.arange(k), k), atol=1e-6, rtol=0)


@pytest.mark.parametrize("hp,message", [
    ({"memory_size": 0}, r"dmn_zs: hparam 'memory_size' must be an integer >= 1 \(.*\), got 0"),
    ({"memory_size": 2.5}, r"dmn_zs: hparam 'memory_size' must be an integer >= 1 \(.*\), got 2.5"),
    ({"beta": -1.0}, r"dmn_zs: hparam 'beta' must be a number >= 0 \(.*\), got -1.0"),
    ({"memory_weight": "high"}, r"dmn_zs: hparam 'memory_weight' must be a number >= 0 \(.*\), got 'high'"),
    ({"keep": 2}, r"dmn_zs: hparam 'keep' must be a number in \(0, 1\] \(.*\), got 2"),
])
def test_bad_hparams_are_named(hp, message):
    with pytest.raises(ValueError, match=message):
        make_method("dmn_zs", torch.eye(3), torch.arange(3), 3, **hp)


def test_sanity_beats_zero_shot_clip_on_a_shifted_synthetic_stream():
    # A sanity check of the mechanism on the simulator, not a claim about real data: the memory of confident
    # test features moves each class towards its image-side centre, which zero-shot CLIP misses.
    feats, emb, ids, k, labels = view_stream("iid", num_classes=10, dim=64, n=800, views=8, seed=8, shift=2.5,
                                             noise=0.8)
    clip = run_stream("clip", feats[:, 0], emb, ids, k)
    dmn = run_stream("dmn_zs", feats, emb, ids, k, keep=0.25)
    acc_clip = accuracy(clip, labels)
    acc_dmn = accuracy(dmn, labels)
    assert acc_dmn > acc_clip + 0.03, (acc_dmn, acc_clip)
