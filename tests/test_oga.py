"""OGA against the per-batch transcription of its official code, on a stream where its adaptation changes
predictions, at the official batch size (32) and at batch size 1."""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.data.synthetic import make_synthetic
from orchestrator.methods import make_method, run_stream
from orchestrator.methods.oga.reference import run_oga_reference
from orchestrator.registry import method_card

K = 10


@pytest.fixture(scope="module")
def bench():
    return make_synthetic("label_shift", num_classes=K, dim=16, n=640, seed=1)


def _check(bench, batch_size, **hparams):
    trace = make_method("oga", bench.class_embeddings, bench.class_ids, K, batch_size=batch_size,
                        **hparams).run(bench.features)
    posteriors, stored = run_oga_reference(bench.features, bench.class_embeddings, bench.class_ids, K, batch_size,
                                           **hparams)
    assert torch.equal(trace.predictions, posteriors.argmax(1))
    torch.testing.assert_close(trace.posteriors, posteriors, rtol=1e-5, atol=1e-6)
    assert torch.equal(trace.gated, stored)
    return trace


def _clip(bench):
    return run_stream("clip", bench.features, bench.class_embeddings, bench.class_ids, K)


@pytest.mark.parametrize("batch_size", [32, 1])
def test_oga_equals_the_official_transcription(bench, batch_size):
    trace = _check(bench, batch_size)
    assert int((trace.predictions != _clip(bench).argmax(1)).sum()) > 0, "the stream must make the adaptation act"
    assert bool(trace.state["memory_filled"].sum(1).gt(2).any())  # the covariance was refitted


@pytest.mark.parametrize("hparams", [{"cov_estimator": "ridge", "normalize_mu": True},
                                     {"cov_estimator": "moore_penrose", "map_tau": 0.5, "shot_capacity": 4}])
def test_oga_options_equal_the_transcription(bench, hparams):
    trace = _check(bench, 32, **hparams)
    assert not torch.allclose(trace.posteriors, _clip(bench), atol=1e-3)


def test_oga_card_runs_at_32_and_parts_at_multiples_of_it_equal_one_run(bench):
    assert method_card("oga").batch_size == 32
    whole = make_method("oga", bench.class_embeddings, bench.class_ids, K, batch_size=32).run(bench.features)
    method = make_method("oga", bench.class_embeddings, bench.class_ids, K, batch_size=32)
    parts = [method.run(bench.features[s:s + 96]) for s in range(0, 640, 96)]
    assert torch.equal(torch.cat([p.posteriors for p in parts]), whole.posteriors)


def _between_a_stored_entropy_and_its_float16():
    """Two classes in d = 4, batches of 1, 2 slots a class: s0 (confident) and s1 fill class 0's slots, s1's
    entropy e1 above its float16 value; s2's entropy lies between the two, its feature far from s1's along a third
    axis; then samples of both classes. Each entropy is the method's own float32 zero-shot entropy."""
    from orchestrator.methods.oga.method import zero_shot

    emb = torch.eye(4)[:2]

    def sample(theta: float, third: float = 0.0) -> torch.Tensor:
        return torch.nn.functional.normalize(torch.tensor([math.cos(theta), math.sin(theta), third, 0.0]), dim=0)

    def entropy(x: torch.Tensor) -> float:
        return float(zero_shot(x[None], emb, 100.0)[1][0])

    theta1 = 0.76                             # logits 3.6 apart: an entropy of about 0.1
    while not torch.tensor(entropy(sample(theta1))).half().float() < entropy(sample(theta1)):
        theta1 += 1e-4
    e1 = entropy(sample(theta1))
    target = (float(torch.tensor(e1).half()) + e1) / 2
    lo, hi = 0.0, theta1                      # the entropy grows with theta here: bisect for the gap's middle
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if entropy(sample(mid, 0.5)) < target else (lo, mid)
    s2 = sample(lo, 0.5)
    assert float(torch.tensor(e1).half()) < entropy(s2) < e1
    # then samples near the class boundary, less confident than s1 (class 0 keeps s0 and s1 or s2), on both
    # sides of the third axis
    rest = torch.stack([sample(math.pi / 4 + 0.004 * (j - 4), 0.5 * (-1) ** j) for j in range(9)])
    return emb, torch.cat([sample(0.01)[None], sample(theta1)[None], s2[None], rest])


@pytest.mark.parametrize("state_dtype", ["float32", "float16"])
def test_a_float16_memory_drops_a_sample_between_a_stored_entropy_and_its_float16(state_dtype):
    """The official float16 memory compares an entropy with the stored float16 values: s2 is dropped there and
    kept in float32, and the class mean, so the later predictions, follow (tau 1 lets the Gaussian term move
    them). Each dtype is its transcription's."""
    emb, features = _between_a_stored_entropy_and_its_float16()
    hp = {"shot_capacity": 2, "map_tau": 1.0, "state_dtype": state_dtype}
    trace = make_method("oga", emb, torch.arange(2), 2, batch_size=1, **hp).run(features)
    posteriors, stored = run_oga_reference(features, emb, torch.arange(2), 2, 1, **hp)
    assert torch.equal(trace.gated, stored)
    assert trace.gated[:3].tolist() == [True, True, state_dtype == "float32"]
    torch.testing.assert_close(trace.posteriors, posteriors, rtol=1e-5, atol=1e-6)
    other = "float16" if state_dtype == "float32" else "float32"
    apart = make_method("oga", emb, torch.arange(2), 2, batch_size=1, **{**hp, "state_dtype": other})
    assert bool((apart.run(features).predictions != trace.predictions).any())


def test_a_float16_memory_follows_its_transcription_on_a_stream(bench):
    trace = _check(bench, 32, state_dtype="float16")
    assert trace.state["memory_entropy"].dtype == torch.float32
    assert torch.equal(trace.state["memory_entropy"].half().float(), trace.state["memory_entropy"])
