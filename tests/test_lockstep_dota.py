"""DOTA in lockstep equals DOTA run alone, stream by stream (views and one view), and a pack routes it there."""

from __future__ import annotations

import pytest
import torch

from orchestrator.methods import make_method, run_traces_many
from orchestrator.methods.lockstep import run_lockstep
from orchestrator.methods.dota.lockstep import _State
from tests.lockstep_checks import assert_same_trace
from tests.view_streams import view_stream

# Every hparam differs somewhere. Of 8 views keep 0.1 and 0.2 keep 1, keep 0.3 keeps 2; logit_scale 50 makes a
# third group. Configs 0 and 2 share (mu, counts, D) and their (sigma, epsilon), so also their factor.
CONFIGS = [
    {},
    {"sigma": 0.004, "epsilon": 1e-3, "rho": 0.05, "eta": 3.0},
    {"keep": 0.2, "rho": 0.02, "eta": 1.0},
    {"keep": 0.3, "rho": 0.05, "eta": 2.0},
    {"keep": 0.3, "sigma": 0.001, "epsilon": 0.0, "rho": 0.03, "eta": 3.0},
    {"logit_scale": 50.0, "keep": 0.3, "sigma": 0.003, "rho": 0.05, "eta": 3.0},
]


def _stream():
    """Views that are other samples of the class, so that the Gaussians learn something CLIP lacks."""
    feats, emb, ids, K, _ = view_stream(num_classes=20, dim=16, n=300, views=8, noise=0.8, class_views=True)
    return feats, emb, ids, K


def _check(feats, emb, ids, K, configs):
    """The lockstep traces against the single runs; also how many predictions the Gaussian term changed from
    zero-shot CLIP's on the kept views' mean logits (the same config with eta 0), per config."""
    traces = run_lockstep([make_method("dota", emb, ids, K, **c) for c in configs], feats)
    changed = []
    for config, lock in zip(configs, traces):
        single = make_method("dota", emb, ids, K, **config).run(feats)
        assert_same_trace(single, lock, str(config))
        # The states are the loop's own arithmetic on the same tensors (dota/lockstep.py): equal bit for bit.
        assert all(torch.equal(single.state[key], lock.state[key]) for key in single.state), config
        zero_shot = make_method("dota", emb, ids, K, **{**config, "eta": 0.0}).run(feats)
        assert float((lock.posteriors - zero_shot.posteriors).abs().max()) > 1e-3, config
        changed.append(int((lock.predictions != zero_shot.predictions).sum()))
    return traces, changed


def test_dota_lockstep_equals_each_stream_run_alone_on_views():
    feats, emb, ids, K = _stream()
    traces, changed = _check(feats, emb, ids, K, CONFIGS)
    # One kept view of 8 is the most confident one, whose saturated posterior the Gaussian term moves without
    # flipping; with two kept views it changes predictions, in both logit_scale groups.
    assert all(changed[3:]) and max(changed) < 300, changed
    # One (mu, counts, D) per (logit_scale, kept count): keep 0.1 and 0.2 share one, keep 0.3 and scale 50 not.
    assert torch.equal(traces[0].state["mu"], traces[2].state["mu"])
    assert traces[0].state.scatter is traces[1].state.scatter is traces[2].state.scatter
    assert not torch.equal(traces[0].state["mu"], traces[3].state["mu"])
    assert not torch.equal(traces[3].state["mu"], traces[5].state["mu"])
    assert not torch.equal(traces[0].state["precision"], traces[1].state["precision"])
    assert not torch.equal(traces[3].state["precision"], traces[4].state["precision"])
    assert not torch.equal(traces[0].posteriors, traces[2].posteriors)
    # 'sigma' is formed on each access: a fresh tensor, the stream's own sigma I on its diagonal.
    first = traces[0].state["sigma"]
    first.zero_()
    assert not torch.equal(traces[0].state["sigma"], first)
    assert not torch.equal(traces[0].state["sigma"], traces[1].state["sigma"])


def test_dota_lockstep_equals_each_stream_run_alone_on_one_view():
    feats, emb, ids, K = _stream()
    traces, changed = _check(feats[:, :1], emb, ids, K, CONFIGS)
    assert all(changed) and max(changed) < 300, changed
    assert traces[0].state.scatter is traces[3].state.scatter          # one view: keep changes nothing


@pytest.mark.parametrize("views", [8, 1])
def test_a_pack_with_dota_equals_the_separate_runs(views):
    feats, emb, ids, K = _stream()
    feats = feats[:200, :views]
    configs = [{"method": "dota", "keep": 0.3, "sigma": 0.004}, {"method": "dmn_zs"}, {"method": "dota"},
               {"method": "zero"}, {"method": "dota", "logit_scale": 50.0, "rho": 0.05, "eta": 3.0}]
    traces = run_traces_many(feats, emb, ids, K, configs)
    for config, trace in zip(configs, traces):
        hparams = {k: v for k, v in config.items() if k != "method"}
        assert_same_trace(make_method(config["method"], emb, ids, K, **hparams).run(feats), trace, str(config))
        assert isinstance(trace.state, _State) == (config["method"] == "dota")    # DOTA went through lockstep
