"""Lockstep over stream orders and grid points on augmented views: BCA's adaptive view selection and TDA, stream
g = features[orders[g]], each trace equal to that stream run alone (tests/lockstep_checks.py)."""

from __future__ import annotations

import pytest
import torch

from orchestrator.methods import make_method, run_traces_many
from orchestrator.methods.lockstep import run_lockstep
from tests.lockstep_checks import assert_same_trace
from tests.view_streams import view_stream

# BCA: n1 small and logit scale 20, so that U moves and the gates fire on part of the stream only (as in
# tests/test_bca_views.py); every update rule and both selections.
BCA_CONFIGS = [
    ("bca", {"tau": 0.95, "n1": 4, "n2": 6, "logit_scale": 20.0}),
    ("bca", {"tau": 0.9, "n1": 6, "n2": 3, "logit_scale": 20.0, "update": "momentum", "select_on": "posterior"}),
    ("la", {"tau": 0.9, "n1": 4, "logit_scale": 25.0, "update": "decay", "decay": 0.7}),
    ("pa", {"tau": 0.95, "n2": 6, "logit_scale": 20.0}),
    ("bca", {"tau": 0.95, "n1": 4, "n2": 6, "logit_scale": 20.0, "view_selection": "fixed"}),
    ("bca", {"tau": 0.95, "n1": 4, "n2": 6, "logit_scale": 20.0, "state_dtype": "float16"}),
]
TDA_CONFIGS = [
    {},
    {"pos_alpha": 1.0, "pos_beta": 8.0, "neg_alpha": 0.3, "neg_beta": 2.0},
    {"pos_shot": 1, "neg_shot": 3, "logit_scale": 50.0},
    {"pos_shot": 1, "neg_shot": 1, "logit_scale": 20.0},
]


def _orders(n_total: int, n: int, count: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(n_total, generator=gen)[:n] for _ in range(count)])


def _grid(configs, orders_per_config: int, n_total: int, n: int):
    """Every config over `orders_per_config` orders: (configs [G], orders [G, n]), G = configs x orders."""
    orders = _orders(n_total, n, orders_per_config)
    pairs = [(c, o) for c in configs for o in range(orders_per_config)]
    return [c for c, _ in pairs], orders[[o for _, o in pairs]]


def test_bca_adaptive_views_over_orders_and_grid_points_equal_each_stream_alone():
    feats, emb, ids, k, _ = view_stream(num_classes=8, dim=16, n=200, views=20, view_noise=2.0, seed=2)
    configs, orders = _grid(BCA_CONFIGS, 2, 200, 120)
    methods = [make_method(name, emb, ids, k, **hp) for name, hp in configs]
    traces = run_lockstep(methods, feats, orders)
    for (name, hp), order, lock in zip(configs, orders, traces):
        single = make_method(name, emb, ids, k, **hp).run(feats[order])
        assert_same_trace(single, lock, f"{name} {hp}")
        # the adaptive parts act: some samples gate, others do not
        fired = int(torch.maximum(lock.gated, lock.gated_prior).sum())
        assert 10 < fired < 110, (name, hp, fired)
    # the orders differ, so do the streams' states
    assert not torch.equal(traces[0].state["U"], traces[1].state["U"])


@pytest.mark.parametrize("method", ["tda", "tda_pa"])
def test_tda_views_over_orders_and_grid_points_equal_each_stream_alone(method):
    feats, emb, ids, k, _ = view_stream(num_classes=30, dim=16, n=400, views=12, seed=4)
    prior = {"tau": 0.3, "n2": 10} if method == "tda_pa" else {}
    configs, orders = _grid([dict(c, **prior) for c in TDA_CONFIGS], 2, 400, 250)
    traces = run_lockstep([make_method(method, emb, ids, k, **c) for c in configs], feats, orders)
    for config, order, lock in zip(configs, orders, traces):
        assert_same_trace(make_method(method, emb, ids, k, **config).run(feats[order]), lock, str(config))
    assert 0 < int(traces[0].gated.sum()) < 250
    assert not torch.equal(traces[0].state["pos_keys"], traces[1].state["pos_keys"])


def test_every_runner_takes_orders_in_the_pack_path():
    """run_traces_many with orders: runners that step orders together (BCA views, TDA, DMN-ZS), one that does
    not (DOTA: the streams of each order together) and on one feature per sample (the BCA engine: each order's
    streams together; TDA: the orders together)."""
    feats, emb, ids, k, _ = view_stream(num_classes=10, dim=16, n=120, views=10, seed=5)
    configs = [{"method": "bca", "tau": 0.9, "n1": 4, "logit_scale": 20.0}, {"method": "tda"},
               {"method": "dmn_zs"}, {"method": "bca", "tau": 0.9, "n1": 4, "logit_scale": 20.0}, {"method": "dota"}]
    orders = _orders(120, 80, 5)
    traces = run_traces_many(feats, emb, ids, k, configs, orders=orders)
    for config, order, lock in zip(configs, orders, traces):
        hp = {key: v for key, v in config.items() if key != "method"}
        assert_same_trace(make_method(config["method"], emb, ids, k, **hp).run(feats[order]), lock, str(config))
    flat = [configs[0], {"method": "pa", "tau": 0.5, "n2": 5}, {"method": "tda"}]
    for config, order, lock in zip(flat, orders[:3], run_traces_many(feats[:, 0], emb, ids, k, flat, orders=orders[:3])):
        hp = {key: v for key, v in config.items() if key != "method"}
        assert_same_trace(make_method(config["method"], emb, ids, k, **hp).run(feats[order, 0]), lock, str(config))


def test_bad_orders_are_named():
    feats, emb, ids, k, _ = view_stream(num_classes=5, dim=8, n=20, views=4)
    with pytest.raises(ValueError, match=r"orders index features' 20 rows: expected values in \[0, 19\], got \[0, 20\]"):
        run_traces_many(feats, emb, ids, k, [{"method": "tda"}], orders=torch.tensor([[0, 20]]))
    with pytest.raises(ValueError, match=r"orders must be an int64 tensor \[G, n\] on cpu with G = 2 streams"):
        run_traces_many(feats, emb, ids, k, [{"method": "tda"}] * 2, orders=torch.tensor([[0, 1]]))
