"""The blocked engine against the per-sample reference: identical selections, gates, counters and
predictions, posteriors within 1e-5, over long streams for every BCA-family method and option, across
block edge cases, and for many configurations in one call."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from orchestrator.data.synthetic import make_synthetic
from orchestrator.methods import Trace, engine, make_method, run_stream
from orchestrator.methods.engine import _to_half, run_bca_blocked, run_bca_blocked_many
from orchestrator.methods.many import run_stream_many, run_traces_many
from orchestrator.methods.bca.reference import bca_family_reference
from orchestrator.registry import method_card

K, DIM, N_LONG = 12, 48, 20_000

# Two embeddings per class (M = 2K, class(m) = m % K) in a class-correlated order; and one embedding
# per class (M = K) for select_on='posterior', which selects a class. Noisy enough that the gates,
# at the taus below, fire on part of the stream only (a softmax at logit_scale 100 is peaked).
TEMPLATES = make_synthetic("temporal", num_classes=K, dim=DIM, n=N_LONG, seed=5, templates_per_class=2, noise=2.5)
ONE_PER_CLASS = make_synthetic("label_shift", num_classes=K, dim=DIM, n=N_LONG, seed=6, noise=2.5)

# name: (benchmark, method, hparams); together they cover every option. Small n1 / n2 move U and V far
# within a block (many corrections, and block restarts).
LONG_CASES = {
    "clip": (TEMPLATES, "clip", {}),
    "la-float16-momentum": (TEMPLATES, "la", {"tau": 0.9, "state_dtype": "float16", "update": "momentum",
                                              "n1": 50}),
    "pa-decay-scale50": (TEMPLATES, "pa", {"tau": 0.9, "update": "decay", "decay": 0.9, "logit_scale": 50.0}),
    "bca": (TEMPLATES, "bca", {"tau": 0.9}),
    "bca-fast-moving": (TEMPLATES, "bca", {"tau_likelihood": 0.8, "tau_prior": 0.95, "n1": 2, "n2": 1}),
    "bca-momentum": (TEMPLATES, "bca", {"tau": 0.9, "update": "momentum", "n1": 20, "n2": 5}),
    "bca-posterior-decay": (ONE_PER_CLASS, "bca", {"tau": 0.9, "select_on": "posterior", "update": "decay",
                                                   "decay": 0.95, "n1": 20}),
}


def valid_for(method, hparams):
    """The subset of `hparams` that `method` takes (la has no n2, pa no n1, clip neither nor tau)."""
    return {k: v for k, v in hparams.items() if k in method_card(method).defaults()}


def setup(bench, method, hparams):
    m = make_method(method, bench.class_embeddings, bench.class_ids, bench.num_classes, **hparams)
    return m.state, m.config


def reference(bench, method, hparams, features=None):
    state, cfg = setup(bench, method, hparams)
    feats = bench.features if features is None else features
    return bca_family_reference(feats, state, bench.class_ids, bench.num_classes, cfg)


def assert_exact(ref, got):
    """The engine's contract with the reference."""
    assert torch.equal(got.selected, ref.selected)
    assert torch.equal(got.gated, ref.gated)
    assert torch.equal(got.gated_prior, ref.gated_prior)
    assert torch.equal(got.predictions, ref.predictions)
    torch.testing.assert_close(got.posteriors, ref.posteriors, atol=1e-5, rtol=0)
    for key in ("C1", "C2"):
        assert torch.equal(got.state[key], ref.state[key]), key
    for key in ("U", "V"):
        assert got.state[key].dtype == ref.state[key].dtype, key
        torch.testing.assert_close(got.state[key].float(), ref.state[key].float(), atol=1e-5, rtol=0)


def assert_same(a, b):
    """Bitwise-equal runs (same computation, different packing)."""
    for name in ("posteriors", "selected", "gated", "gated_prior"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    for key in a.state:
        assert torch.equal(a.state[key], b.state[key]), key


@pytest.fixture(scope="module")
def long_references():
    return {name: reference(*case) for name, case in LONG_CASES.items()}


@pytest.mark.parametrize("name", list(LONG_CASES))
def test_long_stream_matches_reference(name, long_references):
    bench, method, hparams = LONG_CASES[name]
    ref = long_references[name]
    state, cfg = setup(bench, method, hparams)
    got = run_bca_blocked(bench.features, state, bench.class_ids, bench.num_classes, cfg)
    assert_exact(ref, got)
    if method != "clip":
        # the case is informative: gates fire on part of the stream, not all or nothing
        assert 0.05 < float((ref.gated | ref.gated_prior).float().mean()) < 0.95


def test_many_configs_in_one_call_equal_separate_runs(long_references):
    names = [n for n, (bench, _, _) in LONG_CASES.items() if bench is TEMPLATES]
    states, cfgs = zip(*(setup(*LONG_CASES[n]) for n in names))
    bench = TEMPLATES
    together = run_bca_blocked_many(bench.features, list(states), bench.class_ids, bench.num_classes, list(cfgs))
    for name, state, cfg, got in zip(names, states, cfgs, together):
        alone = run_bca_blocked(bench.features, state, bench.class_ids, bench.num_classes, cfg)
        assert_same(alone, got)
        assert_exact(long_references[name], got)


@pytest.mark.parametrize("threads", [1, 2])
def test_configs_with_equal_logits_share_one_product(threads, monkeypatch, torch_threads):
    """A tau_prior / n2 sweep at one (tau_likelihood, n1) keeps U equal across configs (select_on=
    'likelihood': V never feeds back into U), so they share one logits product per block; select_on=
    'posterior' or another n1 does not. Each result equals its separate run bitwise."""
    torch_threads(threads)
    bench = ONE_PER_CLASS
    feats = bench.features[:3000]
    shared = [{"tau_likelihood": 0.8, "tau_prior": tp, "n1": 20, "n2": n2}
              for tp, n2 in ((0.8, 1), (0.9, 5), (0.95, 50))]
    others = [{"tau_likelihood": 0.8, "n1": 21, "n2": 5}, {"tau": 0.8, "n1": 20, "select_on": "posterior"}]
    states, cfgs = zip(*(setup(bench, "bca", hp) for hp in shared + others))
    products = []
    compute = engine._Products.compute
    monkeypatch.setattr(engine._Products, "compute",
                        lambda self, *args: products.append(len(self.dev) - 5) or compute(self, *args))
    together = run_bca_blocked_many(feats, list(states), bench.class_ids, bench.num_classes, list(cfgs))
    assert sorted(set(products)) == [1, 3]  # one group of three lanes, two of one lane
    monkeypatch.setattr(engine._Products, "compute", compute)
    for hp, state, cfg, got in zip(shared + others, states, cfgs, together):
        assert_same(run_bca_blocked(feats, state, bench.class_ids, bench.num_classes, cfg), got)
        assert_exact(reference(bench, "bca", hp, feats), got)


def test_walk_restarts_blocks_and_stays_exact(monkeypatch):
    """A U row that moves far (n1 = 0: each update replaces the row by the feature) shrinks later samples'
    softmax normaliser; the walk stops there and a fresh block starts at that sample."""
    bench = make_synthetic("temporal", num_classes=K, dim=DIM, n=3000, seed=8)
    calls = []
    walk = engine._walk

    def counting_walk(*args):
        done = walk(*args)
        calls.append((args[0].shape[0], int(done[0])))
        return done

    monkeypatch.setattr(engine, "_walk", counting_walk)
    hparams = {"tau": 0.3, "n1": 0, "n2": 1}
    state, cfg = setup(bench, "bca", hparams)
    got = run_bca_blocked(bench.features, state, bench.class_ids, bench.num_classes, cfg)
    assert any(done < size for size, done in calls)
    assert_exact(reference(bench, "bca", hparams), got)


# ------------------------------------------------------------------------------------------ block edges

SHORT = make_synthetic("temporal", num_classes=5, dim=16, n=200, seed=11, templates_per_class=3)


@pytest.mark.parametrize("n,block", [(1, 64), (1, 1), (5, 64), (63, 64), (64, 64), (65, 64), (200, 64),
                                     (200, 7), (200, 1), (200, 500)])
@pytest.mark.parametrize("method", ["clip", "la", "pa", "bca"])
def test_block_edges(method, n, block):
    hparams = valid_for(method, {"tau": 0.5, "n1": 5, "n2": 3})
    feats = SHORT.features[:n]
    state, cfg = setup(SHORT, method, hparams)
    got = run_bca_blocked(feats, state, SHORT.class_ids, SHORT.num_classes, cfg, block=block)
    assert got.posteriors.shape == (n, SHORT.num_classes)
    assert_exact(reference(SHORT, method, hparams, feats), got)


@pytest.fixture
def torch_threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("threads,block", [(1, 1), (1, 16), (2, 1), (2, 5), (2, 16), (3, 16)])
def test_threads(threads, block, torch_threads):
    """One group of configs uses the threads inside its products; several groups run side by side, one
    thread each. Same results either way, restarts included (n1 = 2 moves U far)."""
    torch_threads(threads)
    cases = [("bca", {"tau": 0.4, "n1": 2, "n2": 1}), ("clip", {}), ("pa", {"tau": 0.4}), ("pa", {"tau": 0.6}),
             ("la", {"tau": 0.4, "n1": 0})]
    states, cfgs = zip(*(setup(SHORT, method, hp) for method, hp in cases))
    got = run_bca_blocked_many(SHORT.features, list(states), SHORT.class_ids, SHORT.num_classes, list(cfgs),
                               block=block)
    assert torch.get_num_threads() == threads
    for (method, hp), trace in zip(cases, got):
        assert_exact(reference(SHORT, method, hp), trace)


def test_gate_fires_on_every_sample():
    hparams = {"tau": 0.0, "n1": 5, "n2": 3}
    state, cfg = setup(SHORT, "bca", hparams)
    got = run_bca_blocked(SHORT.features, state, SHORT.class_ids, SHORT.num_classes, cfg, block=16)
    assert bool(got.gated.all()) and bool(got.gated_prior.all())
    assert_exact(reference(SHORT, "bca", hparams), got)


@pytest.mark.parametrize("tau", [1.0])  # a probability never exceeds 1 (the card's range ends there)
def test_gate_fires_on_no_sample_and_equals_clip(tau):
    state, cfg = setup(SHORT, "bca", {"tau": tau})
    got = run_bca_blocked(SHORT.features, state, SHORT.class_ids, SHORT.num_classes, cfg, block=16)
    assert not bool(got.gated.any()) and not bool(got.gated_prior.any())
    assert_exact(reference(SHORT, "bca", {"tau": tau}), got)
    clip_state, clip_cfg = setup(SHORT, "clip", {})
    clip = run_bca_blocked(SHORT.features, clip_state, SHORT.class_ids, SHORT.num_classes, clip_cfg, block=16)
    assert torch.equal(got.posteriors, clip.posteriors)


def test_float16_prior_adaptation_runs_the_reference():
    """float16 V rounds the reference's own posterior (see engine.needs_reference): the same loop runs."""
    for method in ("pa", "bca"):
        hparams = valid_for(method, {"tau": 0.5, "n1": 5, "n2": 3, "state_dtype": "float16"})
        state, cfg = setup(SHORT, method, hparams)
        assert engine.needs_reference(cfg)
        got = run_bca_blocked(SHORT.features, state, SHORT.class_ids, SHORT.num_classes, cfg, block=16)
        assert_same(reference(SHORT, method, hparams), got)


def test_empty_stream():
    state, cfg = setup(SHORT, "bca", {})
    got = run_bca_blocked(SHORT.features[:0], state, SHORT.class_ids, SHORT.num_classes, cfg)
    assert got.posteriors.shape == (0, SHORT.num_classes) and got.selected.shape == (0,)
    assert torch.equal(got.state["U"], state["U"])


def test_two_chunks_equal_one_run_and_inputs_are_not_modified():
    hparams = {"tau": 0.4, "n1": 5, "n2": 3}
    state, cfg = setup(SHORT, "bca", hparams)
    before = {k: v.clone() for k, v in state.items()}
    whole = run_bca_blocked(SHORT.features, state, SHORT.class_ids, SHORT.num_classes, cfg, block=16)
    first = run_bca_blocked(SHORT.features[:90], state, SHORT.class_ids, SHORT.num_classes, cfg, block=16)
    second = run_bca_blocked(SHORT.features[90:], first.state, SHORT.class_ids, SHORT.num_classes, cfg, block=16)
    for k in state:
        assert torch.equal(state[k], before[k])
    # other block boundaries, so other rounding: equal up to the engine's tolerance
    torch.testing.assert_close(torch.cat([first.posteriors, second.posteriors]), whole.posteriors,
                               atol=1e-5, rtol=0)
    assert torch.equal(torch.cat([first.gated, second.gated]), whole.gated)
    assert torch.equal(second.state["C1"], whole.state["C1"])


def test_timings_cover_every_stage():
    state, cfg = setup(SHORT, "bca", {"tau": 0.4})
    got = run_bca_blocked(SHORT.features, state, SHORT.class_ids, SHORT.num_classes, cfg)
    assert set(got.timings) == {"logits", "posterior", "update"}
    assert all(v >= 0 for v in got.timings.values())


def test_bad_block_size():
    state, cfg = setup(SHORT, "bca", {})
    with pytest.raises(ValueError, match="block"):
        run_bca_blocked(SHORT.features, state, SHORT.class_ids, SHORT.num_classes, cfg, block=0)


# ------------------------------------------------------------------------------------- float16 rounding

def test_to_half_rounds_like_numpy():
    rng = np.random.default_rng(0)
    values = np.concatenate([
        rng.standard_normal(20000).astype(np.float32) * np.float32(10.0) ** rng.integers(-9, 5, 20000),
        # exact ties between two float16 values, subnormal ties, the overflow edge
        (np.arange(1, 2000, dtype=np.float32) + np.float32(0.5)) * np.float32(2.0 ** -10),
        np.arange(1, 200, dtype=np.float32) * np.float32(2.0 ** -25),
        np.array([65504.0, 65519.0, 65520.0, 1e6, -65520.0, 0.0, -0.0], dtype=np.float32),
    ])
    ours = np.array([_to_half(v) for v in values], dtype=np.float32)
    with np.errstate(over="ignore"):  # the overflow to inf is part of what is checked
        expected = values.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(ours, expected)


# --------------------------------------------------------------------------------------- run_stream_many

def test_run_stream_many_equals_separate_run_streams():
    configs = [{"method": "clip"}, {"method": "pa", "tau": 0.4}, {"method": "pa", "tau": 0.5, "n2": 2},
               {"method": "bca", "tau": 0.4, "n1": 5}, {"method": "la", "tau": 0.3, "state_dtype": "float16"},
               {"method": "tda"}]
    args = (SHORT.features, SHORT.class_embeddings, SHORT.class_ids, SHORT.num_classes)
    preds, confs = run_stream_many(*args, configs)
    assert preds.shape == (len(configs), len(SHORT)) and preds.dtype == torch.int64
    assert confs.shape == (len(configs), len(SHORT)) and confs.dtype == torch.float32
    traces = run_traces_many(*args, configs)
    for g, config in enumerate(configs):
        hparams = {k: v for k, v in config.items() if k != "method"}
        alone = run_stream(config["method"], *args, **hparams)
        assert torch.equal(preds[g], alone.argmax(dim=1)), config
        torch.testing.assert_close(confs[g], alone.max(dim=1).values, atol=1e-5, rtol=0)
        torch.testing.assert_close(traces[g].posteriors, alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("configs,match", [
    ([], "non-empty list"),
    ([{"tau": 0.3}], r"configs\[0\].*'method'"),
    ([{"method": "bca"}, {"method": "nope"}], "unknown method 'nope'"),
    ([{"method": "bca", "taus": 0.3}], "unknown hparam 'taus'"),
])
def test_run_stream_many_rejects_bad_configs(configs, match):
    with pytest.raises(ValueError, match=match):
        run_stream_many(SHORT.features, SHORT.class_embeddings, SHORT.class_ids, SHORT.num_classes, configs)


def test_run_stream_many_validates_features():
    with pytest.raises(ValueError, match="features"):
        run_stream_many(SHORT.features.double(), SHORT.class_embeddings, SHORT.class_ids, SHORT.num_classes,
                        [{"method": "bca"}])


# ------------------------------------------------------------------------------------------------ CUDA

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    hparams = {"tau": 0.4, "n1": 5, "n2": 3}
    state, cfg = setup(SHORT, "bca", hparams)
    cpu = run_bca_blocked(SHORT.features, state, SHORT.class_ids, SHORT.num_classes, cfg, block=16)
    gpu_state = {k: v.cuda() for k, v in state.items()}
    gpu = run_bca_blocked(SHORT.features.cuda(), gpu_state, SHORT.class_ids.cuda(), SHORT.num_classes, cfg, block=16)
    assert gpu.posteriors.device.type == "cuda" and gpu.state["U"].device.type == "cuda"
    on_cpu = Trace(gpu.posteriors.cpu(), gpu.selected.cpu(), gpu.gated.cpu(), gpu.gated_prior.cpu(),
                   state={k: v.cpu() for k, v in gpu.state.items()})
    assert_exact(cpu, on_cpu)


@pytest.mark.parametrize("product_threads", [1, 2])
def test_product_threads_change_only_the_thread_count(product_threads, torch_threads):
    """A single group's products run on `product_threads` threads (default one: no barrier to wait at when
    the other core is busy); the results equal the reference either way and torch's setting is restored."""
    torch_threads(2)
    hparams = {"tau": 0.4, "n1": 2, "n2": 1}
    state, cfg = setup(SHORT, "bca", hparams)
    got = run_bca_blocked(SHORT.features, state, SHORT.class_ids, SHORT.num_classes, cfg, block=16,
                          product_threads=product_threads)
    assert torch.get_num_threads() == 2
    assert_exact(reference(SHORT, "bca", hparams), got)


def test_product_threads_must_be_positive():
    state, cfg = setup(SHORT, "bca", {})
    with pytest.raises(ValueError, match="product_threads must be a positive integer, got 0"):
        run_bca_blocked(SHORT.features, state, SHORT.class_ids, SHORT.num_classes, cfg, product_threads=0)
