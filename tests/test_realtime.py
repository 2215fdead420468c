"""The realtime stream (issue 41): a method whose cost per sample is k times CLIP's adapts on every k-th sample and
predicts the others from its current state (Alfarra et al., ICML 2024). Checked against a plain reference
written from the methods' equations: the frozen posteriors are computed in float64 from the state the method
exposes after its last adapting step."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from orchestrator import registry
from orchestrator.data.streams import Dirichlet, Iid, Realtime, protocol_from_spec
from orchestrator.data.synthetic import synthesize
from orchestrator.methods.base import make_method
from orchestrator.methods.realtime import RealtimeMethod
from orchestrator.sweep.cost import GPU_ENCODER_IMAGES_PER_S, realtime_k
from orchestrator.sweep.load import validate_spec
from orchestrator.sweep.plan import expand, make_trials
from orchestrator.sweep.pieces import settings_of
from orchestrator.sweep.trial import execute_trial
from tests.test_sweep_trial import rows

# A float32 posterior's error against float64: logits of size logit_scale carry about logit_scale * eps32 each,
# and a softmax moves by at most half a logit's change; a few such terms per logit (CLIP, two caches).
TOL = 8 * 100.0 * float(np.finfo(np.float32).eps)
FROZEN = ("clip", "la", "pa", "bca", "tda", "tda_pa")


def test_a_realtime_stream_is_its_base_order_and_checks_its_fields():
    labels = np.repeat(np.arange(4), 10)
    assert np.array_equal(protocol_from_spec({"realtime": {"base": "iid"}}).order(labels, 5).index,
                          Iid().order(labels, 5).index)
    bursty = protocol_from_spec({"realtime": {"base": {"dirichlet": {"gamma": 0.1}}, "k": 3}})
    assert bursty == Realtime(Dirichlet(0.1), 3)
    assert np.array_equal(bursty.order(labels, 2).index, Dirichlet(0.1).order(labels, 2).index)
    with pytest.raises(ValueError, match="realtime k must be an integer >= 1"):
        protocol_from_spec({"realtime": {"base": "iid", "k": 0}})
    with pytest.raises(ValueError, match="realtime base must be iid, dirichlet, separate or longtail"):
        protocol_from_spec({"realtime": {"base": {"continual": ["a", "b"]}}})
    with pytest.raises(ValueError, match="unknown stream realtime field 'every'"):
        protocol_from_spec({"realtime": {"every": 2}})


def test_k_is_the_cost_over_clips_rounded_up_from_the_cards_measured_rates():
    def seconds(method: str, views: int, encoder: float) -> float:
        return views * encoder + 1 / registry.method_card(method).cost.gpu_samples_per_s

    assert realtime_k("clip", 1, None) == 1 and realtime_k("clip", 1, "ViT-B/16") == 1
    encoder = 1 / GPU_ENCODER_IMAGES_PER_S["ViT-B-16"]
    for method, views in (("tda", 1), ("tda", 64), ("bca", 64), ("dpe", 64)):
        expected = math.ceil(seconds(method, views, encoder) / seconds("clip", 1, encoder))
        assert realtime_k(method, views, "ViT-B/16") == expected
    assert realtime_k("tda", 64, "ViT-B/16") > 50  # 64 encoder passes a sample: CLIP's stream passes it by
    with pytest.raises(ValueError, match="backbone 'tiny' has no measured image-encoder rate"):
        realtime_k("tda", 1, "tiny")


def _frozen_reference(method: str, state: dict, f: torch.Tensor, hp: dict, U0: torch.Tensor) -> torch.Tensor:
    """The posterior [K] of feature f from a method's exposed state, adapting nothing, in float64."""
    f = f.double()
    if method in ("clip", "la", "pa", "bca"):  # BCA Eqs. 7-9: softmax of the likelihood, times the prior V
        U = state.get("U", U0).double()
        p = torch.softmax(hp["logit_scale"] * (U @ f), 0)
        post = p @ state["V"].double() if "V" in state else p
        return post / post.sum()
    # TDA: CLIP's logits plus the positive cache's class affinities minus the negative cache's masked ones
    def affinity(prefix: str, beta: float) -> torch.Tensor:
        keys, filled = state[f"{prefix}_keys"].double(), torch.isfinite(state[f"{prefix}_entropy"])
        return torch.where(filled, torch.exp(-beta * (1 - keys @ f)), 0.0)  # [K, shot]

    logits = hp["logit_scale"] * (U0.double() @ f)
    positive = affinity("pos", hp["pos_beta"]).sum(1)
    negative = torch.einsum("ks,ksc->c", affinity("neg", hp["neg_beta"]), state["neg_values"].double())
    adjusted = logits + hp["pos_alpha"] * positive - hp["neg_alpha"] * negative
    p = torch.softmax(adjusted, 0)
    if "V" not in state:
        return p
    post = p @ state["V"].double()
    return post / post.sum()


@pytest.mark.parametrize("method", FROZEN)
def test_a_realtime_method_adapts_on_every_kth_sample_and_predicts_the_rest_from_its_state(method):
    bench = synthesize("label_shift", seed=4, n=90, num_classes=5, dim=16)
    x, U0 = bench.features, bench.class_embeddings
    k = 3
    card = registry.method_card(method)
    hp = card.resolve({"tau": 0.3} if "tau" in card.hparam_names else {})

    def fresh():
        return make_method(method, U0, bench.class_ids, bench.num_classes, **hp)

    realtime = RealtimeMethod(fresh(), k)
    parts = [realtime.run(x[a:b]) for a, b in ((0, 7), (7, 8), (8, 50), (50, 90))]  # parts cut mid-k
    posteriors = torch.cat([t.posteriors for t in parts])
    gated = torch.cat([t.gated | t.gated_prior for t in parts])
    # the adapting steps: the method over the sub-stream of positions 0, k, 2k, ... alone
    plain = fresh()
    states = []
    for p in range(0, len(x), k):
        trace = plain.run(x[p:p + 1])
        assert torch.allclose(posteriors[p], trace.posteriors[0], atol=TOL), p
        assert bool(gated[p]) == bool(trace.gated[0] | trace.gated_prior[0])
        states.append(trace.state)
    assert card.name == "clip" or bool(gated[::k].any()), "the stream must make the method adapt"
    # the rest: predicted from the state the last adapting step left, nothing adapted
    for p in range(len(x)):
        if p % k:
            expected = _frozen_reference(method, states[p // k], x[p], hp, U0).float()
            assert torch.allclose(posteriors[p], expected, atol=TOL), p
            assert not gated[p]
    assert all(torch.equal(parts[-1].state[name], states[-1][name]) for name in states[-1])


def test_a_method_that_cannot_predict_without_adapting_is_refused_by_name(tmp_path):
    spec = {"name": "rt", "results_dir": "results", "stream": {"realtime": {"base": "iid"}},
            "datasets": [{"synthetic": "label_shift", "n": 60, "num_classes": 4, "dim": 16}],
            "methods": [{"method": "clip"}, {"method": "dpe"}], "seeds": [1]}
    with pytest.raises(ValueError) as err:
        validate_spec(spec, base_dir=tmp_path)
    assert "methods[1].method" in str(err.value) and "cannot predict a sample without adapting" in str(err.value)
    assert "bca" in str(err.value) and "tda" in str(err.value)


def test_a_realtime_sweep_records_each_methods_k_and_writes_its_rows(tmp_path):
    spec = validate_spec({
        "name": "rt", "results_dir": "results", "part_rows": 25, "stream": {"realtime": {"base": "iid"}},
        "datasets": [{"synthetic": "label_shift", "n": 60, "num_classes": 4, "dim": 16}],
        "methods": [{"method": "clip"}, {"method": "bca", "tau": 0.3}, {"method": "tda"}], "seeds": [1]},
        base_dir=tmp_path)
    runs = expand(spec)
    ks = {r.method: r.config["realtime_k"] for r in runs}
    assert ks == {m: realtime_k(m, 1, None) for m in ("clip", "bca", "tda")}
    assert ks["clip"] == 1 and ks["tda"] > 1
    trials = make_trials(runs, "auto")
    assert all(len(t.runs) == 1 for t in trials)  # never packed: each interleaves its own steps
    for trial in trials:
        execute_trial(trial, settings_of(spec))
    written = rows(spec.results_dir)
    for run in runs:
        got = written[run.run_id]
        assert len(got) == 60
        k = ks[run.method]
        assert not any(r["gated"] or r["gated_prior"] for r in got if r["sample_idx"] % k)
