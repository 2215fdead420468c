"""Lockstep over stream orders on one feature per sample (and one view per sample for view methods): stream g =
features[orders[g]], G mixing several orders, several grid points and duplicates of one order, each trace equal
to that stream run alone (tests/lockstep_checks.py), on streams where the adaptive parts act."""

from __future__ import annotations

import pytest
import torch

from orchestrator.data.synthetic import make_synthetic
from orchestrator.methods import make_method
from orchestrator.methods.lockstep import run_lockstep, steps_orders
from orchestrator.registry import method_card
from tests.lockstep_checks import assert_same_trace
from tests.test_lockstep import PRIORS, TDA_CONFIGS


def _stream(k: int, d: int, n: int, seed: int = 3):
    bench = make_synthetic("iid", num_classes=k, dim=d, n=n, seed=seed)
    return bench.features, bench.class_embeddings, bench.class_ids


def _grid(configs: list[dict], n_total: int, n: int, orders: int = 3, seed: int = 0):
    """Every config over `orders` orders, plus the first config again on order 0 (a duplicate stream):
    (configs [G], orders [G, n]), the streams interleaved so that a group of one order is not contiguous."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.stack([torch.randperm(n_total, generator=gen)[:n] for _ in range(orders)])
    pairs = [(c, o) for o in range(orders) for c in configs] + [(configs[0], 0)]
    return [c for c, _ in pairs], rows[[o for _, o in pairs]]


def _against_alone(method: str, feats, emb, ids, k, configs, orders):
    traces = run_lockstep([make_method(method, emb, ids, k, **c) for c in configs], feats, orders)
    for config, order, lock in zip(configs, orders, traces):
        assert_same_trace(make_method(method, emb, ids, k, **config).run(feats[order]), lock, f"{method} {config}")
    return traces


@pytest.mark.parametrize("method", ["tda", "tda_pa"])
def test_tda_over_orders_on_single_features_equals_each_stream_alone(method):
    feats, emb, ids = _stream(30, 16, 900)
    configs = [dict(c, **p) if method == "tda_pa" else c for c, p in zip(TDA_CONFIGS, PRIORS)]
    configs, orders = _grid(configs, 900, 600)
    traces = _against_alone(method, feats, emb, ids, 30, configs, orders)
    # the caches fill and replace (more entries taken than slots filled), and the streams of one config differ
    # by order
    for trace in traces:
        filled = sum(int(torch.isfinite(trace.state[key]).sum()) for key in ("pos_entropy", "neg_entropy"))
        assert filled < int(trace.gated.sum()) < 600
    assert bool(torch.isfinite(traces[0].state["pos_entropy"]).all())
    assert not torch.equal(traces[0].state["pos_keys"], traces[len(TDA_CONFIGS)].state["pos_keys"])
    if method == "tda_pa":
        fired = [int(t.gated_prior.sum()) for t in traces]
        assert 0 < min(fired) < 600, fired


def test_the_marker_says_where_a_runner_steps_orders_together():
    """The dry run's count of runs stepped alone and benchmarks.study's column read this."""
    single = {name: steps_orders(method_card(name).lockstep_runner(method_card(name).takes_views), False)
              for name in ("bca", "tda", "tda_pa")}
    assert single == {"bca": False, "tda": True, "tda_pa": True}
    assert steps_orders(method_card("bca").lockstep_runner(True), True)
    assert not steps_orders(None, False)


BOOST_CONFIGS = [
    {},
    {"pos_alpha": 10.0, "pos_beta": 1.0, "neg_shot": 1, "pos_shot": 1, "logit_scale": 50.0},
    {"neg_alpha": 0.3, "neg_beta": 2.0, "neg_shot": 3, "pos_shot": 2},
]


def test_boostadapter_over_orders_on_one_view_equals_each_stream_alone():
    """One view per sample (BoostAdapter's ImageNet protocol, a single-view stream): no boosting views."""
    feats, emb, ids = _stream(30, 16, 700, seed=5)
    configs, orders = _grid(BOOST_CONFIGS, 700, 500)
    traces = _against_alone("boostadapter", feats[:, None], emb, ids, 30, configs, orders)
    filled = sum(int(torch.isfinite(traces[1].state[key]).sum()) for key in ("pos_entropy", "neg_entropy"))
    assert filled < int(traces[1].gated.sum()) < 500   # entries replaced
    assert torch.isfinite(traces[2].state["neg_entropy"]).sum() > 3
    assert not torch.equal(traces[0].state["pos_keys"], traces[len(BOOST_CONFIGS)].state["pos_keys"])


def test_boostadapter_over_orders_on_views_equals_each_stream_alone():
    from tests.view_streams import view_stream

    feats, emb, ids, k, _ = view_stream(num_classes=20, dim=16, n=300, views=16, seed=6)
    configs = BOOST_CONFIGS + [{"query": "confident", "keep": 0.25, "logit_scale": 30.0, "delta": 3}]
    configs, orders = _grid(configs, 300, 200)
    traces = _against_alone("boostadapter", feats, emb, ids, k, configs, orders)
    assert 0 < int(traces[0].gated.sum()) < 200


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("views, block_rows", [(1, 256), (8, 256), (8, 7)])
def test_dpe_over_orders_equals_each_stream_alone(views, block_rows):
    """One view per sample (DPE's cross-domain protocol) and views; block_rows 7: several blocks per stream."""
    from orchestrator.methods.dpe.lockstep import run_dpe_lockstep
    from tests.test_lockstep_dpe import CONFIGS
    from tests.view_streams import view_stream

    feats, emb, ids, k, _ = view_stream("label_shift", num_classes=10, dim=24, n=260, views=views, seed=3)
    configs, orders = _grid(CONFIGS[:3], 260, 200, orders=2)
    traces = run_dpe_lockstep([make_method("dpe", emb, ids, k, **c) for c in configs], feats, block_rows=block_rows,
                              orders=orders)
    for config, order, lock in zip(configs, orders, traces):
        assert_same_trace(make_method("dpe", emb, ids, k, **config).run(feats[order]), lock, str(config))
    assert all(0 < int(t.state["text_updates"]) < 200 for t in traces)
    assert all(int(torch.isfinite(t.state["cache_entropy"]).sum()) < int(t.gated.sum()) for t in traces)
    assert not torch.equal(traces[0].state["text"], traces[3].state["text"])


DMN_CONFIGS = [{}, {"beta": 3.0, "memory_weight": 0.3}, {"memory_size": 2, "keep": 0.5},
               {"memory_size": 2, "keep": 0.5, "beta": 8.0, "memory_weight": 10.0}, {"logit_scale": 50.0}]


@pytest.mark.parametrize("views", [1, 6])
def test_dmn_zs_over_orders_equals_each_stream_alone(views):
    """Memories of several sizes and scales, each read by one or two streams per order."""
    from tests.view_streams import view_stream

    feats, emb, ids, k, _ = view_stream(num_classes=20, dim=16, n=400, views=views, view_noise=0.4, seed=4)
    configs, orders = _grid(DMN_CONFIGS, 400, 300)
    traces = _against_alone("dmn_zs", feats, emb, ids, k, configs, orders)
    assert 0 < int(traces[2].gated.sum()) < 300          # a full memory replaces entries only sometimes
    assert not torch.equal(traces[2].posteriors, traces[3].posteriors)
    assert not torch.equal(traces[0].state["memory"], traces[len(DMN_CONFIGS)].state["memory"])


@pytest.mark.parametrize("fused", [True, False])
def test_onzeta_over_orders_equals_each_stream_alone(fused, monkeypatch):
    """Both step paths, the streams in passes of three, over many blocks and sub-blocks (the orders' blocks
    read each stream's own samples)."""
    from orchestrator.methods.onzeta import lockstep as onzeta_lockstep
    from orchestrator.methods.onzeta.lockstep import run_onzeta_lockstep
    from tests.test_lockstep import ONZETA_CONFIGS

    monkeypatch.setattr(onzeta_lockstep, "CPU_TILE", 3)
    feats, emb, ids = _stream(200, 32, 1500)
    configs, orders = _grid(ONZETA_CONFIGS[:3], 1500, 1200)
    traces = run_onzeta_lockstep([make_method("onzeta", emb, ids, 200, **c) for c in configs], feats, fused=fused,
                                 orders=orders)
    for config, order, lock in zip(configs, orders, traces):
        single = make_method("onzeta", emb, ids, 200, **config).run(feats[order])
        assert_same_trace(single, lock, str(config))
        assert not torch.equal(lock.predictions, (feats[order] @ emb.T).argmax(dim=1))  # the proxies moved
    assert not torch.equal(traces[0].state["W"], traces[3].state["W"])


def test_the_orders_benchmark_compares_both_paths_for_every_runner_stepping_orders(capsys):
    from benchmarks.orders import main

    main(["--quick"])
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert set(rows) == {"method", "TDA", "TDA+PA", "BoostAdapter", "DPE", "DMN-ZS", "OnZeta"}
    assert all("| identical, " in line for name, line in rows.items() if name != "method")
