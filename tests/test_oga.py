"""OGA against the per-batch transcription of its official code, on a stream where its adaptation changes
predictions, at the official batch size (32) and at batch size 1."""

from __future__ import annotations

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
