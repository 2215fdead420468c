"""DPE against a float64 per-sample reference written from the official code (main_dpe.py run_test_dpe), hand
cases, chunking, errors, and a synthetic sanity check."""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.methods import make_method, run_stream
from orchestrator.methods.dpe.reference import adamw_first_step, adamw_first_step_float16, official_dpe
from tests.view_streams import accuracy, softmax, unit, view_stream


pytestmark = pytest.mark.usefixtures("one_thread")


def check_against_reference(feats, emb, ids, k, atol=1e-5, **hp):
    trace = make_method("dpe", emb, ids, k, **hp).run(feats)
    post, preds, admitted, updates, W, stepped = official_dpe(feats, emb, **hp)
    assert torch.equal(trace.predictions, post.argmax(1))
    torch.testing.assert_close(trace.posteriors.double(), post, atol=atol, rtol=0)
    assert torch.equal(trace.selected, preds) and torch.equal(trace.gated, admitted)
    assert int(trace.state["text_updates"]) == updates
    torch.testing.assert_close(trace.state["text"].double(), W, atol=atol, rtol=0)
    return trace, stepped, updates


# The AdamW step divides each gradient entry by its magnitude plus eps = 1e-3, so float32 rounding of a near-zero
# gradient entry moves the residual by up to lr / eps times that rounding, and the logit scale multiplies it
# again. At logit_scale 20 the float32 method stays within 1e-5 of the float64 reference; at the official 100 it
# stays within a few 1e-4 with identical predictions (the last test of this group).
SCALE_20 = {"logit_scale": 20.0}


def test_matches_the_reference_over_a_long_stream():
    feats, emb, ids, k, _ = view_stream("label_shift", num_classes=10, dim=32, n=2000, views=10, seed=3)
    trace, stepped, updates = check_against_reference(feats, emb, ids, k, keep=0.2, align=0.5, **SCALE_20)
    admitted = int(trace.gated.sum())
    filled = int(torch.isfinite(trace.state["cache_entropy"]).sum())
    assert filled < admitted < 2000             # caches fill, then replace some entries and refuse others
    assert 0 < updates < 2000                   # the global text prototypes evolve
    assert int(stepped.sum()) > 0               # the residual step changes some predictions


def test_matches_the_reference_with_confident_view_prediction_and_no_alignment():
    feats, emb, ids, k, _ = view_stream("iid", num_classes=8, dim=24, n=300, views=10, seed=4)
    check_against_reference(feats, emb, ids, k, keep=0.3, align=0.0, predict_views="confident", lr_text=1e-2,
                            lr_image=2e-3, alpha=3.0, beta=8.0, **SCALE_20)


def test_matches_the_reference_at_k_1000():
    feats, emb, ids, k, _ = view_stream("iid", num_classes=1000, dim=64, n=40, views=4, seed=5, noise=0.5)
    check_against_reference(feats, emb, ids, k, keep=0.25, **SCALE_20)


def test_matches_the_reference_at_the_official_scale_within_float32_amplification():
    feats, emb, ids, k, _ = view_stream("label_shift", num_classes=10, dim=32, n=400, views=10, seed=3)
    _, stepped, updates = check_against_reference(feats, emb, ids, k, atol=5e-4, keep=0.2)
    assert updates > 0 and int(stepped.sum()) > 0


def test_float16_residuals_follow_the_official_float16_step():
    """state_dtype float16 (the official residuals' dtype): the reference's residuals take torch's float16 AdamW
    step operation by operation; the float32 default differs from it."""
    feats, emb, ids, k, _ = view_stream("label_shift", num_classes=10, dim=32, n=400, views=10, seed=3)
    trace, _, updates = check_against_reference(feats, emb, ids, k, keep=0.2, state_dtype="float16", **SCALE_20)
    default = make_method("dpe", emb, ids, k, keep=0.2, **SCALE_20).run(feats)
    assert updates > 0 and not torch.equal(trace.posteriors, default.posteriors)
    assert int((trace.predictions != default.predictions).sum()) >= 1


def test_a_float16_step_underflows_to_lr_times_g_over_eps():
    grad = torch.tensor([1e-3, -2e-3, 0.5])
    step = adamw_first_step_float16(grad, 6e-4, 1e-3, 0.1).float()
    # |g| = 1e-3, 2e-3: (1 - beta2) g^2 is below float16's smallest subnormal, so the step is lr g / eps (up to
    # float16 rounding), as large as lr and 2 lr; |g| = 0.5 keeps its second moment and steps by about lr
    torch.testing.assert_close(step, torch.tensor([-6e-4, 1.2e-3, -6e-4]), atol=0, rtol=2e-3)
    assert float(adamw_first_step(grad.double(), 6e-4, 1e-3, 0.1)[0]) == pytest.approx(-6e-4 * 1e-3 / (1e-3 + 1e-3))


def test_the_lockstep_runs_float16_configs_on_their_own_loop():
    from orchestrator.methods.dpe.lockstep import run_dpe_lockstep

    feats, emb, ids, k, _ = view_stream("iid", num_classes=6, dim=16, n=60, views=8, seed=2)
    configs = [{"keep": 0.25}, {"keep": 0.25, "state_dtype": "float16"}, {"lr_text": 1e-3}]
    traces = run_dpe_lockstep([make_method("dpe", emb, ids, k, **c) for c in configs], feats)
    alone = run_dpe_lockstep([make_method("dpe", emb, ids, k, **c) for c in configs[::2]], feats)
    assert torch.equal(traces[1].posteriors, make_method("dpe", emb, ids, k, **configs[1]).run(feats).posteriors)
    assert torch.equal(traces[0].posteriors, alone[0].posteriors)
    assert torch.equal(traces[2].posteriors, alone[1].posteriors)


# ------------------------------------------------------------------------------------------- by hand (K = d = 2)

def entropy(ps):
    return -sum(p * math.log(p) for p in ps if p > 0)


def hand_logits(f, text, key, cls, scale, alpha, beta):
    """Single view, one cached class `cls` with prototype `key`: z = s W f + alpha exp(-beta (1 - k.f)) e_cls."""
    z = [scale * sum(a * b for a, b in zip(w, f)) for w in text]
    z[cls] += alpha * math.exp(-beta * (1 - sum(a * b for a, b in zip(key, f))))
    return z


def hand_step(f, text, key, cls, hp):
    """The AdamW step with the gradient from central differences: (stepped text, stepped key)."""
    flat = [x for row in text for x in row] + list(key)

    def loss(params):
        t = [unit(params[0:2]), unit(params[2:4])]
        kk = unit(params[4:6])
        value = entropy(softmax(hand_logits(f, t, kk, cls, hp["logit_scale"], hp["alpha"], hp["beta"])))
        # InfoNCE over the single cached class is -log softmax([x])[0] = 0.
        return value

    eps = 1e-6
    grad = []
    for j in range(6):
        up, down = list(flat), list(flat)
        up[j] += eps
        down[j] -= eps
        grad.append((loss(up) - loss(down)) / (2 * eps))
    lr = [hp["lr_text"]] * 4 + [hp["lr_image"]] * 2
    step = [-lr[j] * g / (abs(g) + 1e-3) for j, g in enumerate(grad)]
    stepped = [a + b for a, b in zip(flat, step)]
    return [unit(stepped[0:2]), unit(stepped[2:4])], unit(stepped[4:6])


HAND = {"logit_scale": 2.0, "alpha": 1.5, "beta": 2.0, "lr_text": 0.05, "lr_image": 0.1, "tau_global": 0.1}


def test_one_sample_by_hand():
    f = unit([0.8, 0.6])
    text0 = [[1.0, 0.0], [0.0, 1.0]]
    text, key = hand_step(f, text0, f, 0, HAND)
    expected = softmax(hand_logits(f, text, key, 0, 2.0, 1.5, 2.0))
    trace = make_method("dpe", torch.eye(2), torch.arange(2), 2, **HAND).run(torch.tensor([[f]]))
    torch.testing.assert_close(trace.posteriors, torch.tensor([expected], dtype=torch.float32), atol=1e-6, rtol=0)
    assert trace.selected.tolist() == [0] and trace.gated.tolist() == [True]
    assert entropy(expected) / math.log2(2) > 0.1 and int(trace.state["text_updates"]) == 0
    # the step moved the posterior away from the unstepped one, towards lower entropy
    assert entropy(expected) < entropy(softmax(hand_logits(f, text0, f, 0, 2.0, 1.5, 2.0))) - 1e-3


def test_two_samples_by_hand_with_a_global_update():
    # A confident first sample (tau_global 0.9) moves W to the average of W and its stepped prototypes; the second
    # sample's cache prototype of class 0 is the mean of both features.
    hp = {**HAND, "tau_global": 0.9}
    f1, f2 = unit([0.9, 0.3]), unit([0.7, 0.5])
    text0 = [[1.0, 0.0], [0.0, 1.0]]
    text1, key1 = hand_step(f1, text0, f1, 0, hp)
    post1 = softmax(hand_logits(f1, text1, key1, 0, 2.0, 1.5, 2.0))
    assert entropy(post1) / math.log2(2) < 0.9
    W = [[(a + b) / 2 for a, b in zip(r0, r1)] for r0, r1 in zip(text0, text1)]
    W_unit = [unit(r) for r in W]
    assert 2.0 * sum(a * b for a, b in zip(W_unit[0], f2)) > 2.0 * sum(a * b for a, b in zip(W_unit[1], f2))
    key = [(a + b) / 2 for a, b in zip(f1, f2)]
    text2, key2 = hand_step(f2, W, key, 0, hp)
    post2 = softmax(hand_logits(f2, text2, key2, 0, 2.0, 1.5, 2.0))
    trace = make_method("dpe", torch.eye(2), torch.arange(2), 2, **hp).run(torch.tensor([[f1], [f2]]))
    torch.testing.assert_close(trace.posteriors, torch.tensor([post1, post2], dtype=torch.float32), atol=1e-6, rtol=0)
    assert trace.gated.tolist() == [True, True] and trace.selected.tolist() == [0, 0]


# ------------------------------------------------------------------------------------------------------ contract

def test_chunks_continue_the_state_and_posteriors_are_distributions():
    feats, emb, ids, k, _ = view_stream("temporal", num_classes=6, dim=16, n=240, views=6, seed=6)
    whole = make_method("dpe", emb, ids, k, keep=0.34).run(feats)
    obj = make_method("dpe", emb, ids, k, keep=0.34)
    parts = [obj.run(feats[:100]), obj.run(feats[100:])]
    assert torch.equal(torch.cat([p.posteriors for p in parts]), whole.posteriors)
    assert all(torch.equal(parts[1].state[key], whole.state[key]) for key in whole.state)
    torch.testing.assert_close(whole.posteriors.sum(1), torch.ones(240), atol=1e-5, rtol=0)
    assert whole.posteriors.dtype == torch.float32 and not whole.gated_prior.any()


def test_several_rows_per_class_are_averaged_and_renormalised():
    feats, emb, ids, k, _ = view_stream("iid", num_classes=5, dim=16, n=60, views=4, seed=7, templates_per_class=3)
    assert emb.shape[0] == 15
    merged = torch.nn.functional.normalize(torch.stack([emb[ids == c].mean(0) for c in range(k)]), dim=1)
    torch.testing.assert_close(run_stream("dpe", feats, emb, ids, k, keep=0.5),
                               run_stream("dpe", feats, merged, torch.arange(k), k, keep=0.5), atol=1e-6, rtol=0)


@pytest.mark.parametrize("hp,message", [
    ({"lr_text": 0.0}, r"dpe: hparam 'lr_text' must be a number > 0 \(AdamW learning rate of the textual residual\), got 0.0"),
    ({"shot": 0}, r"dpe: hparam 'shot' must be an integer >= 1 \(cache entries per class\), got 0"),
    ({"keep": 1.5}, r"dpe: hparam 'keep' must be a number in \(0, 1\] \(fraction of lowest-entropy views kept\), got 1.5"),
    ({"predict_views": "mean"}, r"dpe: hparam 'predict_views' must be one of \['original', 'confident'\] \(.*\), got 'mean'"),
    ({"align": -1}, r"dpe: hparam 'align' must be a number >= 0 \(.*\), got -1"),
    ({"lr": 0.1}, r"unknown hparam 'lr' for method 'dpe'"),
])
def test_bad_hparams_are_named(hp, message):
    with pytest.raises(ValueError, match=message):
        make_method("dpe", torch.eye(3), torch.arange(3), 3, **hp)


def test_single_view_features_need_the_view_axis():
    with pytest.raises(ValueError, match=r"dpe: features must have shape \[n, V, d\].*add a view axis"):
        run_stream("dpe", torch.eye(3), torch.eye(3), torch.arange(3), 3)


def test_sanity_beats_zero_shot_clip_on_a_shifted_synthetic_stream():
    # A sanity check of the mechanism on the simulator, not a claim about real data: the cache and the evolving
    # text prototypes move each class towards its image-side centre, which zero-shot CLIP misses.
    feats, emb, ids, k, labels = view_stream("iid", num_classes=10, dim=64, n=800, views=8, seed=8, shift=2.5,
                                             noise=0.8)
    clip = run_stream("clip", feats[:, 0], emb, ids, k)
    dpe = run_stream("dpe", feats, emb, ids, k, keep=0.25)
    acc_clip = accuracy(clip, labels)
    acc_dpe = accuracy(dpe, labels)
    assert acc_dpe > acc_clip + 0.02, (acc_dpe, acc_clip)
