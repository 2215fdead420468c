"""BoostAdapter's lockstep streams equal the method run alone, stream by stream, on streams where its caches fill
and replace, its FIFO negative cache drops its oldest entries and its boosting views change predictions."""

from __future__ import annotations

import math

import torch

from orchestrator.methods import make_method, run_traces_many
from orchestrator.methods.boostadapter.method import QUERY_CHUNK, queries, score_views
from orchestrator.methods.lockstep import run_lockstep
from tests.lockstep_checks import assert_same_trace
from tests.view_streams import view_stream

# At V = 16 keep gives 0 (0.05), 1 (0.1, the default), 2 (0.125), 3 (0.2), 4 (0.25) or 4 (0.3) boosting views.
# Streams 0-2 share both caches (they differ in the read-out and the boosting views only), 4 and 5 their query
# and negative cache, 3 and 7 their query; every hparam takes two values or more.
CONFIGS = [
    {},
    {"pos_alpha": 10.0, "pos_beta": 1.0, "delta": 2, "keep": 0.25},
    {"pos_alpha": 10.0, "pos_beta": 1.0, "delta": 2, "keep": 0.05},
    {"neg_alpha": 0.3, "neg_beta": 2.0, "neg_shot": 1, "pos_shot": 1, "delta": 1, "keep": 0.2, "logit_scale": 50.0},
    {"query": "confident", "keep": 0.25, "logit_scale": 30.0, "delta": 3},
    {"query": "confident", "keep": 0.25, "logit_scale": 30.0, "pos_shot": 2, "pos_alpha": 1.0, "neg_beta": 4.0},
    {"query": "confident", "keep": 0.125, "neg_shot": 3, "delta": 1, "logit_scale": 50.0},
    {"logit_scale": 50.0, "keep": 0.3, "delta": 1, "neg_alpha": 0.5},
]


def _lockstep_against_alone(views, emb, ids, k, configs):
    traces = run_lockstep([make_method("boostadapter", emb, ids, k, **c) for c in configs], views)
    for config, lock in zip(configs, traces):
        assert_same_trace(make_method("boostadapter", emb, ids, k, **config).run(views), lock, str(config))
    return traces


def _offers(views, emb, ids, k, config):
    """Per sample the query's class, entropy and feature, and whether it is offered to the negative cache
    (the stream fits in one query chunk, so these are the method's own numbers)."""
    assert views.shape[0] <= QUERY_CHUNK
    method = make_method("boostadapter", emb, ids, k, **config)
    q = queries(score_views(views, method.text, method.hp["logit_scale"]), method.hp)
    band = torch.tensor([0.2 < float(h) / math.log2(k) < 0.5 for h in q.entropy])
    return q.logits.argmax(dim=1), q.entropy, q.feature, band


def _rows(keys):
    """A set of rows [m, d], without the empty (zero) ones: cache keys compared with queries, which can repeat
    (class_views draws views from other samples)."""
    return {tuple(key.tolist()) for key in keys if bool(key.any())}


def test_boostadapter_lockstep_equals_each_stream_run_alone():
    views, emb, ids, k, _ = view_stream("label_shift", n=240, num_classes=10, dim=64, seed=4, views=16,
                                        class_views=True, noise=3.0)
    traces = _lockstep_against_alone(views, emb, ids, k, CONFIGS)
    # The boosting views change predictions: streams 1 and 2 share their caches and differ in keep alone.
    assert int((traces[1].predictions != traces[2].predictions).sum()) > 10
    # Stream 3 (pos_shot 1, neg_shot 1): a full positive class takes a lower-entropy query in place of its
    # entry, and each class's negative entry is its newest offer, not its lowest-entropy one (TDA's rule).
    pred, entropy, feature, band = _offers(views, emb, ids, k, CONFIGS[3])
    replaced = fifo_differs = 0
    for c in range(k):
        offered = torch.nonzero(pred == c).flatten()
        replaced += _rows(traces[3].state["pos_keys"][c]) != _rows(feature[offered[:1]])
        negative = torch.nonzero((pred == c) & band).flatten()
        assert _rows(traces[3].state["neg_keys"][c]) == _rows(feature[negative[-1:]])
        if negative.numel():
            lowest = negative[entropy[negative].argmin()]
            fifo_differs += _rows(feature[negative[-1:]]) != _rows(feature[lowest][None])
    assert replaced > 3 and fifo_differs > 3, (replaced, fifo_differs)
    # neg_shot 3 (stream 6): a full class holds its three newest offers.
    pred, entropy, feature, band = _offers(views, emb, ids, k, CONFIGS[6])
    full = 0
    for c in range(k):
        negative = torch.nonzero((pred == c) & band).flatten()
        assert _rows(traces[6].state["neg_keys"][c]) == _rows(feature[negative[-3:]])
        full += negative.numel() > 3
    assert full > 3
    assert all(0 < int(t.gated.sum()) < 240 for t in traces)


def test_one_view():
    """V = 1: the query is view 0 whatever `query` says, and with keep = 1 view 0 is its own boosting view."""
    views, emb, ids, k, _ = view_stream("label_shift", n=300, num_classes=10, dim=32, seed=6, views=1,
                                        class_views=True)
    configs = [{}, {"keep": 1.0, "delta": 1, "pos_alpha": 4.0, "neg_beta": 2.0},
               {"query": "confident", "neg_shot": 1, "pos_shot": 1, "neg_alpha": 0.5},
               {"logit_scale": 50.0, "keep": 1.0, "pos_shot": 1, "pos_beta": 3.0}]
    traces = _lockstep_against_alone(views, emb, ids, k, configs)
    assert not torch.equal(traces[0].posteriors, traces[1].posteriors)


def test_equal_kept_losses_rank_the_older_entry_first():
    """K = d = 2, T = I, logit scale 1: samples 1 and 2 predict class 0 with the same entropy (equal logit gaps)
    and both stay in class 0 (pos_shot 2); sample 3's boosting view joins class 0 with a lower entropy, and with
    delta 0 the boosting cache keeps it and the older of the tied entries, sample 1."""
    flat = [0.72, 0.69]                                  # views less confident than every other view here
    s1 = torch.tensor([[0.8, 0.6]] + [flat] * 9)
    s2 = torch.tensor([[-0.6, -0.8]] + [flat] * 9)      # the same logit gap as s1's view 0
    s3 = torch.tensor([[0.45, 0.89], [0.99, 0.14]] + [flat] * 8)
    feats = torch.stack([s1, s2, s3])
    configs = [{"logit_scale": 1.0, "pos_shot": 2, "pos_beta": 4.0}, {"logit_scale": 1.0, "pos_shot": 2, "delta": 1}]
    traces = _lockstep_against_alone(feats, torch.eye(2), torch.arange(2), 2, configs)
    entropy = traces[0].state["pos_entropy"][0]
    assert float(entropy[0]) == float(entropy[1])
    f3 = feats[2, 0]
    kept = [math.exp(-4.0 * (1 - float(f3 @ x))) for x in (feats[0, 0], feats[1, 0], feats[2, 1])]
    class0 = float(f3[0]) + 2.0 * (kept[0] + kept[2])  # sample 2 (the newer) drops out, not sample 1
    class1 = float(f3[1]) + 2.0 * math.exp(-4.0 * (1 - float(f3 @ f3)))  # its own entry (f3 is not unit)
    expected = torch.softmax(torch.tensor([class0, class1]), dim=0)
    torch.testing.assert_close(traces[0].posteriors[2], expected, atol=1e-6, rtol=0)


def test_a_pack_routes_boostadapter_to_its_lockstep_runner():
    views, emb, ids, k, _ = view_stream("iid", n=120, num_classes=10, dim=32, seed=7, views=8, class_views=True)
    configs = [{"method": "boostadapter", "keep": 0.25}, {"method": "dmn_zs"},
               {"method": "boostadapter", "pos_alpha": 1.0, "delta": 2, "keep": 0.25}]
    for config, trace in zip(configs, run_traces_many(views, emb, ids, k, configs)):
        hparams = {key: v for key, v in config.items() if key != "method"}
        assert_same_trace(make_method(config["method"], emb, ids, k, **hparams).run(views), trace, str(config))
