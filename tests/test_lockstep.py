"""Lockstep streams equal the single-stream methods, stream by stream, and the pack path uses them."""

from __future__ import annotations

import pytest
import torch

from orchestrator.data.synthetic import make_synthetic
from orchestrator.methods import make_method, run_traces_many
from orchestrator.methods.lockstep import run_lockstep
from orchestrator.methods.onzeta import lockstep as onzeta_lockstep
from orchestrator.methods.onzeta.lockstep import run_onzeta_lockstep
from orchestrator.methods.tda.lockstep import run_tda_lockstep
from benchmarks.drift import drift_tolerances
from tests.lockstep_checks import assert_same_trace
from tests.view_streams import view_stream

TDA_CONFIGS = [
    {},
    {"pos_alpha": 1.0, "pos_beta": 8.0, "neg_alpha": 0.3, "neg_beta": 2.0},
    {"pos_shot": 1, "neg_shot": 3, "logit_scale": 50.0},
    {"pos_shot": 1, "neg_shot": 1, "pos_alpha": 0.0},
]
PRIORS = [{"tau": 0.3, "n2": 10}, {"tau": 0.5, "n2": 5}, {"tau": 0.2, "n2": 50}, {"tau": 0.95, "n2": 10}]
ONZETA_CONFIGS = [{}, {"tau_i": 0.05, "cw": 0.3}, {"cr": 5.0, "alpha": 0.5, "beta": 0.5}, {"tau_t": 0.02, "n_total": 3000}]


def _stream(k: int, d: int, n: int):
    bench = make_synthetic("iid", num_classes=k, dim=d, n=n, seed=3)
    return bench.features, bench.class_embeddings, bench.class_ids


@pytest.mark.parametrize("method, fused", [("tda", None), ("tda_pa", True), ("tda_pa", False)])
def test_tda_lockstep_equals_each_stream_run_alone(method, fused):
    """TDA+PA's prior walk both ways: compiled (a CPU's default) and as torch operations (elsewhere)."""
    feats, emb, ids = _stream(30, 16, 1500)
    configs = [dict(c, **p) if method == "tda_pa" else c for c, p in zip(TDA_CONFIGS, PRIORS)]
    traces = run_tda_lockstep([make_method(method, emb, ids, 30, **c) for c in configs], feats, fused=fused)
    for config, lock in zip(configs, traces):
        single = make_method(method, emb, ids, 30, **config).run(feats)
        assert_same_trace(single, lock, str(config))
    # The adaptive parts act: both caches take entries and replace them, the prior gate fires and misses.
    assert 0 < int(traces[0].gated.sum()) < 1500
    assert torch.isfinite(traces[3].state["neg_entropy"]).sum() > 10
    assert bool(torch.isfinite(traces[0].state["pos_entropy"]).all())
    if method == "tda_pa":
        fired = [int(t.gated_prior.sum()) for t in traces]
        assert min(fired) > 0 and min(fired) < 1500, fired
        assert not torch.equal(traces[0].state["V"], traces[1].state["V"])


@pytest.mark.parametrize("method", ["tda", "tda_pa"])
def test_tda_lockstep_on_views_equals_each_stream_run_alone(method):
    """On augmented views each cache's query is its kept views' mean, which depends on logit_scale: three
    scales here, over more than one of TDA's view chunks."""
    feats, emb, ids, k, _ = view_stream(num_classes=30, dim=16, n=600, views=12, seed=4)
    # Config 3 at logit scale 20: the kept views are confident, and only a cooler scale reaches the negative
    # cache's entropy band.
    scaled = TDA_CONFIGS[:3] + [dict(TDA_CONFIGS[3], logit_scale=20.0)]
    configs = [dict(c, **p) if method == "tda_pa" else c for c, p in zip(scaled, PRIORS)]
    traces = run_lockstep([make_method(method, emb, ids, k, **c) for c in configs], feats)
    for config, lock in zip(configs, traces):
        assert_same_trace(make_method(method, emb, ids, k, **config).run(feats), lock, str(config))
    assert 0 < int(traces[0].gated.sum()) < 600
    assert torch.isfinite(traces[3].state["neg_entropy"]).sum() > 10
    # The queries differ by logit_scale: config 2's cache (scale 50) holds other keys than config 0's.
    assert not torch.equal(traces[0].state["pos_keys"][:, :1], traces[2].state["pos_keys"])
    single_view = run_lockstep([make_method(method, emb, ids, k, **configs[1])], feats[:, :1])[0]
    assert_same_trace(make_method(method, emb, ids, k, **configs[1]).run(feats[:, 0]), single_view, "one view")


@pytest.mark.parametrize("fused", [True, False])
def test_onzeta_lockstep_equals_each_stream_run_alone(fused, monkeypatch):
    """Both step paths (numba on a CPU, torch operations elsewhere), the streams in passes of three; the
    stream is long enough for the rows' scales to leave [1/64, 64], where the proxies are made unit again."""
    monkeypatch.setattr(onzeta_lockstep, "CPU_TILE", 3)
    feats, emb, ids = _stream(200, 32, 1500)
    traces = run_onzeta_lockstep([make_method("onzeta", emb, ids, 200, **c) for c in ONZETA_CONFIGS], feats,
                                 fused=fused)
    zero_shot = (feats @ emb.T).argmax(dim=1)
    for config, lock in zip(ONZETA_CONFIGS, traces):
        single = make_method("onzeta", emb, ids, 200, **config).run(feats)
        assert_same_trace(single, lock, str(config),
                          atol=drift_tolerances("onzeta", feats, emb, config, single, floor=1e-5))
        assert not torch.equal(lock.predictions, zero_shot)  # the proxies and rho moved the predictions
        assert int(lock.state["step"]) == 1500


def test_onzeta_lockstep_refuses_a_stream_past_n_total():
    feats, emb, ids = _stream(10, 8, 50)
    with pytest.raises(ValueError, match="n_total = 40"):
        run_lockstep([make_method("onzeta", emb, ids, 10, n_total=40)], feats)


def test_lockstep_takes_methods_whose_cards_name_one_runner():
    feats, emb, ids = _stream(10, 8, 20)
    methods = [make_method("tda", emb, ids, 10), make_method("onzeta", emb, ids, 10)]
    with pytest.raises(ValueError, match="cards name one lockstep runner"):
        run_lockstep(methods, feats)
    views = feats[:, None].expand(-1, 3, -1).contiguous()
    with pytest.raises(ValueError, match=r"cards name one lockstep runner taking features of shape \(20, 3, 8\)"):
        run_lockstep([make_method("onzeta", emb, ids, 10)], views)  # OnZeta's runner takes one feature per sample


def test_a_pack_of_mixed_methods_equals_the_separate_runs():
    feats, emb, ids = _stream(120, 16, 300)  # OnZeta's proxies are stable from K ~ 100 (onzeta.py)
    configs = [{"method": "tda", "pos_alpha": 3.0}, {"method": "bca", "tau": 0.4},
               {"method": "onzeta", "cw": 0.2}, {"method": "tda_pa", "tau": 0.4},
               {"method": "tda", "neg_shot": 4}, {"method": "onzeta"}]
    traces = run_traces_many(feats, emb, ids, 120, configs)
    for config, trace in zip(configs, traces):
        hparams = {k: v for k, v in config.items() if k != "method"}
        single = make_method(config["method"], emb, ids, 120, **hparams).run(feats)
        # OnZeta's early proxy steps amplify rounding: its tolerance follows its float32 drift on this case
        atol = drift_tolerances(config["method"], feats, emb, hparams, single, floor=1e-5)
        assert_same_trace(single, trace, str(config), atol=atol)


def test_dmn_zs_lockstep_equals_each_stream_run_alone():
    """Two memories (memory_size / keep), each read by two streams with their own beta and memory_weight."""
    gen = torch.Generator().manual_seed(4)
    feats, emb, ids = _stream(20, 16, 400)
    views = torch.nn.functional.normalize(feats[:, None] + 0.1 * torch.randn(400, 4, 16, generator=gen), dim=-1)
    views[:, 0] = feats
    configs = [{}, {"beta": 3.0, "memory_weight": 0.3}, {"memory_size": 2, "keep": 0.5},
               {"memory_size": 2, "keep": 0.5, "beta": 8.0, "memory_weight": 10.0}]
    traces = run_lockstep([make_method("dmn_zs", emb, ids, 20, **c) for c in configs], views)
    for config, lock in zip(configs, traces):
        assert_same_trace(make_method("dmn_zs", emb, ids, 20, **config).run(views), lock, str(config))
    assert 0 < int(traces[2].gated.sum()) < 400          # a full memory replaces entries only sometimes
    assert not torch.equal(traces[2].posteriors, traces[3].posteriors)


@pytest.mark.parametrize("method, configs", [
    ("zero", [{}, {"keep": 0.5}, {"keep": 0.1, "tie_break": "mean_prob"}, {"logit_scale": 30.0, "keep": 0.5}]),
    ("mta", [{}, {"lambda_y": 0.5}, {"lambda_q": 1.0}, {"logit_scale": 30.0, "lambda_y": 0.1}]),
])
def test_episodic_lockstep_equals_each_stream_run_alone(method, configs):
    """Configs of one logit_scale share the chunk's view posteriors (Zero) or bandwidths, affinities and Gram
    matrices (MTA), over more than one chunk: every trace is the single-stream one, bit for bit for Zero; MTA
    solves the configs as rows of one solve, whose batched products round as they will."""
    feats, emb, ids, k, _ = view_stream(num_classes=20, dim=16, n=300, views=10, seed=5)
    traces = run_lockstep([make_method(method, emb, ids, k, **c) for c in configs], feats)
    singles = [make_method(method, emb, ids, k, **c).run(feats) for c in configs]
    for config, single, lock in zip(configs, singles, traces):
        if method == "zero":
            assert torch.equal(single.posteriors, lock.posteriors), config
        assert_same_trace(single, lock, str(config))
    # The configs' own hparams act: every config's predictions differ from config 0's somewhere.
    assert all(not torch.equal(singles[0].predictions, s.predictions) for s in singles[1:])


def test_tps_lockstep_equals_each_stream_run_alone():
    """Three shared step directions: (logit_scale 100, one kept view) for the first two streams (keep 0.1 and
    0.15 keep one of 10 views), (100, three) and (50, three) for the last two; every stream its own lr."""
    from tests.view_streams import view_stream

    views, emb, ids, k, _ = view_stream("iid", num_classes=30, dim=32, n=150, views=10, seed=5, noise=3.0)
    configs = [{}, {"lr": 1e-3, "keep": 0.15}, {"lr": 2e-2, "keep": 0.3},
               {"lr": 5e-3, "keep": 0.3, "logit_scale": 50.0}, {"lr": 1e-2, "keep": 0.35, "logit_scale": 50.0}]
    traces = run_lockstep([make_method("tps", emb, ids, k, **c) for c in configs], views)
    zero_shot = (views[:, 0] @ emb.T).argmax(dim=1)
    for config, lock in zip(configs, traces):
        assert_same_trace(make_method("tps", emb, ids, k, **config).run(views), lock, str(config))
        assert 0 < int((lock.predictions != zero_shot).sum()) < 150      # the step moves some predictions
    for a in range(len(configs)):
        for b in range(a):
            assert not torch.equal(traces[a].posteriors, traces[b].posteriors), (a, b)
