"""The BCA family against hand computation, and the invariants every variant keeps.

Each case runs both implementations: the plain per-sample reference (`reference.bca_family_reference`) and
the method object's `run` (the blocked engine). Hand cases use U = identity rows and logit_scale = 1, so
p = softmax(U f) is easy to write out; features need not be unit vectors for the math (the methods only
expect, not enforce, L2-normalised inputs).
"""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.methods import Trace, make_method, run_stream
from orchestrator.methods.bca.reference import BCAConfig, bca_family_reference, init_state
from orchestrator.registry import method_card


class Runner:
    """A BCA-family method run either by its object (engine) or by the reference loop on the object's state."""

    def __init__(self, impl: str, method: str, emb: torch.Tensor, ids: torch.Tensor, k: int, **hparams) -> None:
        self.impl = impl
        self.method = make_method(method, emb, ids, k, **hparams)

    def run(self, features: torch.Tensor) -> Trace:
        if self.impl == "engine":
            return self.method.run(features)
        m = self.method
        trace = bca_family_reference(features, m.state, m.class_ids, m.num_classes, m.config)
        m.state = trace.state
        return trace


@pytest.fixture(params=["reference", "engine"])
def impl(request) -> str:
    return request.param


def softmax(xs: list[float]) -> list[float]:
    e = [math.exp(x) for x in xs]
    return [v / sum(e) for v in e]


def unit(xs: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in xs))
    return [x / norm for x in xs]


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


EYE2 = t([[1.0, 0.0], [0.0, 1.0]])
IDS2 = torch.tensor([0, 1])
EYE3 = torch.eye(3)
IDS3 = torch.tensor([0, 1, 2])


def close(tensor: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(tensor.float(), torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0)


# ------------------------------------------------------------------------------------------ hand cases

def test_clip_sums_embedding_probabilities_into_classes(impl):
    # M = 4 embeddings, class(m) = m % 2; logit_scale 2.
    emb = t([[1.0, 0.0], [0.0, 1.0], unit([1.0, 1.0]), unit([1.0, -1.0])])
    ids = torch.tensor([0, 1, 0, 1])
    f = unit([0.8, 0.6])
    logits = [2.0 * sum(a * b for a, b in zip(row, f)) for row in emb.tolist()]
    p = softmax(logits)
    trace = Runner(impl, "clip", emb, ids, 2, logit_scale=2.0).run(t([f]))
    close(trace.posteriors, [[p[0] + p[2], p[1] + p[3]]])
    assert trace.selected.tolist() == [-1] and not trace.gated.any() and not trace.gated_prior.any()
    if impl == "engine":
        assert set(trace.state) == {"U", "V"}          # the method object reports no counters for clip


def test_bca_count_two_steps(impl):
    # n1 = n2 = 1, tau = 0.5, logit_scale = 1.
    f1, f2 = [2.0, 0.5], [0.3, 1.2]
    method = Runner(impl, "bca", EYE2, IDS2, 2, tau=0.5, n1=1, n2=1, logit_scale=1.0)
    trace = method.run(t([f1, f2]))

    p1 = softmax(f1)                                  # U = I: logits are f itself
    post1 = p1                                        # V one-hot
    u0 = unit([(1 * 1.0 + f1[0]) / 2, (1 * 0.0 + f1[1]) / 2])          # Eq. 7, s = 0
    v0 = [(1 * 1.0 + post1[0]) / 2, (1 * 0.0 + post1[1]) / 2]          # Eq. 9
    p2 = softmax([u0[0] * f2[0] + u0[1] * f2[1], f2[1]])
    post2 = [p2[0] * v0[0], p2[0] * v0[1] + p2[1]]
    assert p2[1] > 0.5                                # step 2 selects row 1 and passes the gate
    u1 = unit([(1 * 0.0 + f2[0]) / 2, (1 * 1.0 + f2[1]) / 2])
    v1 = [(0.0 + post2[0]) / 2, (1.0 + post2[1]) / 2]

    close(trace.posteriors, [post1, post2])
    assert trace.selected.tolist() == [0, 1]
    assert trace.gated.tolist() == [True, True] and trace.gated_prior.tolist() == [True, True]
    close(trace.state["U"], [u0, u1])
    close(trace.state["V"], [v0, v1])
    close(trace.state["C1"], [2.0, 2.0])
    close(trace.state["C2"], [2.0, 2.0])


def test_la_adapts_only_the_class_embeddings(impl):
    f1, f2 = [2.0, 0.5], [1.0, 0.9]
    trace = Runner(impl, "la", EYE2, IDS2, 2, tau=0.5, n1=3, logit_scale=1.0).run(t([f1, f2]))
    u0 = unit([(3 * 1.0 + f1[0]) / 4, (3 * 0.0 + f1[1]) / 4])
    p2 = softmax([u0[0] * f2[0] + u0[1] * f2[1], f2[1]])
    assert p2[0] > 0.5
    u0_next = unit([(4 * u0[0] + f2[0]) / 5, (4 * u0[1] + f2[1]) / 5])
    close(trace.posteriors, [softmax(f1), p2])
    close(trace.state["U"], [u0_next, [0.0, 1.0]])
    close(trace.state["V"], [[1.0, 0.0], [0.0, 1.0]])
    close(trace.state["C1"], [5.0, 3.0])
    close(trace.state["C2"], [10.0, 10.0])           # pa's counter is untouched (default n2)
    assert trace.gated.tolist() == [True, True] and trace.gated_prior.tolist() == [False, False]


def test_pa_adapts_only_the_prior(impl):
    # Three classes; f = log of the wanted probabilities, so p is exactly that distribution.
    q1, q2 = [0.6, 0.3, 0.1], [0.5, 0.2, 0.3]
    f1, f2 = [math.log(x) for x in q1], [math.log(x) for x in q2]
    trace = Runner(impl, "pa", EYE3, IDS3, 3, tau=0.45, n2=2, logit_scale=1.0).run(t([f1, f2]))
    v0 = [(2 * e + q) / 3 for e, q in zip([1.0, 0.0, 0.0], q1)]
    post2 = [q2[0] * v0[0], q2[0] * v0[1] + q2[1], q2[0] * v0[2] + q2[2]]
    v0_next = [(3 * v + q) / 4 for v, q in zip(v0, post2)]
    close(trace.posteriors, [q1, post2])
    close(trace.state["V"], [v0_next, [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    close(trace.state["U"], EYE3.tolist())
    close(trace.state["C2"], [4.0, 2.0, 2.0])
    close(trace.state["C1"], [30000.0] * 3)
    assert trace.gated.tolist() == [False, False] and trace.gated_prior.tolist() == [True, True]


def test_gate_is_strict_and_skips_low_confidence(impl):
    # tau set to exactly the first sample's float32 confidence: equal does not pass, the larger one does.
    f1, f2 = [math.log(0.6), math.log(0.4)], [math.log(0.3), math.log(0.7)]
    tau = float(torch.softmax(t(f1), dim=0)[0])
    trace = Runner(impl, "bca", EYE2, IDS2, 2, tau=tau, n1=1, n2=1, logit_scale=1.0).run(t([f1, f2]))
    assert trace.gated.tolist() == [False, True]
    assert trace.gated_prior.tolist() == [False, True]
    close(trace.state["C1"], [1.0, 2.0])
    close(trace.state["V"][0], [1.0, 0.0])


def test_separate_gates_for_likelihood_and_prior(impl):
    f = [math.log(0.7), math.log(0.3)]
    trace = Runner(impl, "bca", EYE2, IDS2, 2, tau_likelihood=0.8, tau_prior=0.5, logit_scale=1.0).run(t([f]))
    assert trace.gated.tolist() == [False] and trace.gated_prior.tolist() == [True]
    trace = Runner(impl, "bca", EYE2, IDS2, 2, tau=0.9, tau_prior=0.5, logit_scale=1.0).run(t([f]))
    assert trace.gated.tolist() == [False] and trace.gated_prior.tolist() == [True]   # tau_prior overrides tau


def test_momentum_two_steps(impl):
    # n1 = 1 -> U rate 1/2; n2 = 3 -> V rate 1/4; the rates stay fixed while the counters count.
    q = [0.8, 0.2]
    f = [math.log(x) for x in q]
    trace = Runner(impl, "bca", EYE2, IDS2, 2, tau=0.5, n1=1, n2=3, logit_scale=1.0,
                        update="momentum").run(t([f, f]))
    u0 = unit([0.5 * 1.0 + 0.5 * f[0], 0.5 * 0.0 + 0.5 * f[1]])
    v0 = [0.75 * 1.0 + 0.25 * q[0], 0.75 * 0.0 + 0.25 * q[1]]
    p2 = softmax([u0[0] * f[0] + u0[1] * f[1], f[1]])
    post2 = [p2[0] * v0[0], p2[0] * v0[1] + p2[1]]
    assert p2[0] > 0.5
    u0_next = unit([0.5 * u0[0] + 0.5 * f[0], 0.5 * u0[1] + 0.5 * f[1]])
    v0_next = [0.75 * v0[0] + 0.25 * post2[0], 0.75 * v0[1] + 0.25 * post2[1]]
    close(trace.posteriors, [q, post2])
    close(trace.state["U"][0], u0_next)
    close(trace.state["V"][0], v0_next)
    close(trace.state["C1"], [3.0, 1.0])
    close(trace.state["C2"], [5.0, 3.0])


def test_decay_two_steps(impl):
    # decay 0.5: C' = 0.5 C, r <- (C' r + x) / (C' + 1), C <- C' + 1.
    q = [0.8, 0.2]
    f = [math.log(x) for x in q]
    trace = Runner(impl, "bca", EYE2, IDS2, 2, tau=0.5, n1=2, n2=4, logit_scale=1.0, update="decay",
                        decay=0.5).run(t([f, f]))
    u0 = unit([(1.0 * 1.0 + f[0]) / 2.0, (1.0 * 0.0 + f[1]) / 2.0])            # C1: 2 -> 0.5*2 + 1 = 2
    v0 = [(2.0 * 1.0 + q[0]) / 3.0, (2.0 * 0.0 + q[1]) / 3.0]                  # C2: 4 -> 0.5*4 + 1 = 3
    p2 = softmax([u0[0] * f[0] + u0[1] * f[1], f[1]])
    post2 = [p2[0] * v0[0], p2[0] * v0[1] + p2[1]]
    u0_next = unit([(1.0 * u0[0] + f[0]) / 2.0, (1.0 * u0[1] + f[1]) / 2.0])   # C1: 2 -> 2
    v0_next = [(1.5 * v0[0] + post2[0]) / 2.5, (1.5 * v0[1] + post2[1]) / 2.5]  # C2: 3 -> 2.5
    close(trace.posteriors, [q, post2])
    close(trace.state["U"][0], u0_next)
    close(trace.state["V"][0], v0_next)
    close(trace.state["C1"], [2.0, 2.0])
    close(trace.state["C2"], [2.5, 4.0])


def test_select_on_posterior_picks_the_class_not_the_embedding(impl):
    # Step 1 (n2 = 0) makes V[0] = post1, which leans to class 1; at step 2 the likelihood's argmax is row 0
    # but the posterior's argmax is class 1, so the two selection rules update different rows.
    q1, q2 = [0.4, 0.35, 0.25], [0.5, 0.3, 0.2]
    feats = t([[math.log(x) for x in q1], [math.log(x) for x in q2]])
    post2 = [0.5 * 0.4, 0.5 * 0.35 + 0.3, 0.5 * 0.25 + 0.2]
    by_likelihood = Runner(impl, "pa", EYE3, IDS3, 3, tau=0.3, n2=0, logit_scale=1.0).run(feats)
    by_posterior = Runner(impl, "pa", EYE3, IDS3, 3, tau=0.3, n2=0, logit_scale=1.0,
                               select_on="posterior").run(feats)
    assert by_likelihood.selected.tolist() == [0, 0]
    assert by_posterior.selected.tolist() == [0, 1]
    close(by_posterior.posteriors[1], post2)
    close(by_posterior.state["V"][1], post2)                                 # C2[1] = 0: V[1] becomes post2
    close(by_likelihood.state["V"][0], [(1 * v + p) / 2 for v, p in zip(q1, post2)])  # C2[0] = 1 by now


def test_select_on_posterior_maps_classes_to_permuted_rows(impl):
    # Row m holds class ids[m]; the selected value is always a row index.
    ids = torch.tensor([2, 0, 1])
    q = [0.1, 0.2, 0.7]                               # row 2 (class 1) is the most likely
    trace = Runner(impl, "pa", EYE3, ids, 3, tau=0.5, logit_scale=1.0, select_on="posterior").run(
        t([[math.log(x) for x in q]]))
    close(trace.posteriors, [[0.2, 0.7, 0.1]])
    assert trace.selected.tolist() == [2]


def test_float16_state_rounds_updates_away(impl):
    # With C1 = 30000, C1 * U[s] + f in float16 loses the feature's direction.
    gen = torch.Generator().manual_seed(0)
    d = 512
    emb = torch.nn.functional.normalize(torch.randn(4, d, generator=gen), dim=1)
    target = torch.nn.functional.normalize(emb[0] + torch.nn.functional.normalize(torch.randn(d, generator=gen), dim=0),
                                           dim=0)
    feats = torch.nn.functional.normalize(target + 0.05 * torch.randn(100, d, generator=gen), dim=1)
    moved = {}
    for dtype in ("float32", "float16"):
        trace = Runner(impl, "la", emb, torch.arange(4), 4, tau=0.0, state_dtype=dtype).run(feats)
        assert trace.state["U"].dtype == getattr(torch, dtype)
        assert trace.posteriors.dtype == torch.float32
        assert bool(trace.gated.all()) and bool((trace.selected == 0).all())
        moved[dtype] = trace.state["U"][0].float() - emb[0]
    toward = feats.mean(0) - emb[0]
    toward = toward - (toward @ emb[0]) * emb[0]      # normalisation keeps only the tangential part
    assert torch.nn.functional.cosine_similarity(moved["float32"], toward, dim=0) > 0.99
    assert torch.nn.functional.cosine_similarity(moved["float16"], moved["float32"], dim=0) < 0.5


# ------------------------------------------------------------------------------------------ invariants

# A lower logit scale than CLIP's 100 keeps the toy stream's confidences spread out around tau = 0.6.
SCALE = 10.0


def _stream(n: int = 300, k: int = 5, m_per_class: int = 1, d: int = 16, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    anchors = torch.nn.functional.normalize(torch.randn(k, d, generator=gen), dim=1)
    emb = torch.nn.functional.normalize(anchors.repeat(m_per_class, 1) + 0.3 * torch.randn(k * m_per_class, d,
                                                                                            generator=gen), dim=1)
    ids = torch.arange(k * m_per_class) % k
    labels = torch.randint(k, (n,), generator=gen)
    shift = torch.randn(k, d, generator=gen)
    feats = torch.nn.functional.normalize(anchors[labels] + 0.4 * shift[labels] + 0.6 * torch.randn(n, d, generator=gen),
                                          dim=1)
    return feats, emb, ids, k


def _variant_id(variant) -> str:
    method, options = variant
    return "-".join([method, *(f"{k}={v}" for k, v in options.items())])


VARIANTS = [
    ("la", {}), ("pa", {}), ("bca", {}),
    ("bca", {"update": "momentum"}), ("bca", {"update": "decay", "decay": 0.9}),
    ("bca", {"select_on": "posterior"}), ("la", {"update": "decay"}), ("pa", {"update": "momentum"}),
    ("bca", {"tau_likelihood": 0.5, "tau_prior": 0.9}), ("bca", {"state_dtype": "float16"}),
]


@pytest.mark.parametrize("method,options,m_per_class", [
    pytest.param(method, options, m, id=f"{_variant_id((method, options))}-M={m}K")
    for method, options in VARIANTS for m in (1, 3)
    if m == 1 or options.get("select_on") != "posterior"])     # select_on='posterior' needs M == K
def test_invariants(method, options, m_per_class, impl):
    feats, emb, ids, k = _stream(n=120, m_per_class=m_per_class)
    hp = {"tau": 0.6, "logit_scale": SCALE, **({"n1": 20} if "n1" in method_card(method).defaults() else {}), **options}
    method_obj = Runner(impl, method, emb, ids, k, **hp)
    before = {key: value.clone() for key, value in method_obj.method.state.items()}
    # Run sample by sample to see every state transition.
    for i in range(feats.shape[0]):
        trace = method_obj.run(feats[i:i + 1])
        post = trace.posteriors[0]
        assert post.dtype == torch.float32
        torch.testing.assert_close(post.sum(), torch.tensor(1.0), atol=1e-5, rtol=0)
        assert bool((post >= 0).all())
        s = int(trace.selected[0])
        assert 0 <= s < emb.shape[0]
        after = trace.state
        for key, fired in (("C1", bool(trace.gated[0])), ("C2", bool(trace.gated_prior[0]))):
            changed = torch.nonzero(after[key] != before[key]).flatten().tolist()
            if options.get("update") == "decay":       # C = 1 / (1 - decay) is a fixed point of C <- decay C + 1
                assert set(changed) <= ({s} if fired else set()), (key, i)
            else:
                assert changed == ([s] if fired else []), (key, i)
        for key, fired in (("U", bool(trace.gated[0])), ("V", bool(trace.gated_prior[0]))):
            changed_rows = torch.nonzero((after[key] != before[key]).any(dim=1)).flatten().tolist()
            assert set(changed_rows) <= ({s} if fired else set()), (key, i)
        before = after
    V = before["V"].float()
    assert bool((V >= 0).all())
    atol = 1e-2 if options.get("state_dtype") == "float16" else 1e-5
    torch.testing.assert_close(V.sum(dim=1), torch.ones(V.shape[0]), atol=atol, rtol=0)
    torch.testing.assert_close(torch.linalg.vector_norm(before["U"].float(), dim=1), torch.ones(emb.shape[0]),
                               atol=atol, rtol=0)


@pytest.mark.parametrize("m_per_class", [1, 3])
def test_gates_fire_both_often_and_rarely_in_the_invariant_stream(m_per_class):
    # Guards the invariant test above against a stream where nothing (or everything) happens.
    feats, emb, ids, k = _stream(n=120, m_per_class=m_per_class)
    trace = make_method("bca", emb, ids, k, tau=0.6, n1=20, logit_scale=SCALE).run(feats)
    assert 0.1 < float(trace.gated.float().mean()) < 0.9


@pytest.mark.parametrize("method,options", VARIANTS, ids=[_variant_id(v) for v in VARIANTS])
def test_tau_one_equals_clip(method, options, impl):
    feats, emb, ids, k = _stream(n=300)
    if options.get("state_dtype") == "float16":       # the stored class embeddings are rounded once
        emb_clip = emb.half().float()
    else:
        emb_clip = emb
    clip = run_stream("clip", feats, emb_clip, ids, k, logit_scale=SCALE)
    hp = {**options, "tau": 1.0, "logit_scale": SCALE}  # the gate is p > tau: no probability passes 1
    hp.pop("tau_likelihood", None)
    hp.pop("tau_prior", None)
    trace = Runner(impl, method, emb, ids, k, **hp).run(feats)
    torch.testing.assert_close(trace.posteriors, clip, atol=1e-6, rtol=0)
    assert not trace.gated.any() and not trace.gated_prior.any()


@pytest.mark.parametrize("method,options", VARIANTS[:6], ids=[_variant_id(v) for v in VARIANTS[:6]])
def test_two_chunks_equal_one_run(method, options, impl):
    feats, emb, ids, k = _stream(n=300)
    whole = Runner(impl, method, emb, ids, k, tau=0.6, logit_scale=SCALE, **options).run(feats)
    obj = Runner(impl, method, emb, ids, k, tau=0.6, logit_scale=SCALE, **options)
    first, second = obj.run(feats[:120]), obj.run(feats[120:])
    # The engine's blocks fall elsewhere in a split stream, which may move the last float32 bit.
    atol = 0.0 if impl == "reference" else 1e-6
    torch.testing.assert_close(torch.cat([first.posteriors, second.posteriors]), whole.posteriors, atol=atol, rtol=0)
    for name in ("selected", "gated", "gated_prior"):
        assert torch.equal(torch.cat([getattr(first, name), getattr(second, name)]), getattr(whole, name))
    for key in whole.state:
        torch.testing.assert_close(second.state[key], whole.state[key], atol=atol, rtol=0)


def test_counters_count_gated_samples_per_row(impl):
    feats, emb, ids, k = _stream(m_per_class=2)
    trace = Runner(impl, "bca", emb, ids, k, tau_likelihood=0.5, tau_prior=0.7, n1=7, n2=3,
                        logit_scale=SCALE).run(feats)
    rows = torch.arange(emb.shape[0])[:, None]
    fired_u = ((trace.selected[None] == rows) & trace.gated[None]).sum(dim=1).float()
    fired_v = ((trace.selected[None] == rows) & trace.gated_prior[None]).sum(dim=1).float()
    assert torch.equal(trace.state["C1"], 7 + fired_u)
    assert torch.equal(trace.state["C2"], 3 + fired_v)
    assert 0 < int(trace.gated_prior.sum()) < int(trace.gated.sum()) < feats.shape[0]


def test_decay_of_one_is_count(impl):
    feats, emb, ids, k = _stream(n=300)
    count = Runner(impl, "bca", emb, ids, k, tau=0.6, n1=20, logit_scale=SCALE).run(feats)
    decay = Runner(impl, "bca", emb, ids, k, tau=0.6, n1=20, logit_scale=SCALE, update="decay", decay=1.0).run(feats)
    assert torch.equal(count.posteriors, decay.posteriors)
    for key in count.state:
        assert torch.equal(count.state[key], decay.state[key])


def test_method_object_matches_the_pure_reference_and_leaves_its_input_state():
    feats, emb, ids, k = _stream(n=200)
    cfg = BCAConfig(adapt_likelihood=True, adapt_prior=True, tau_likelihood=0.6, tau_prior=0.6, n1=20, n2=10,
                    logit_scale=SCALE, select_on="likelihood", update="count", decay=0.999, state_dtype="float32")
    state = init_state(emb, ids, k, cfg)
    snapshot = {key: value.clone() for key, value in state.items()}
    ref = bca_family_reference(feats, state, ids, k, cfg)
    assert all(torch.equal(state[key], snapshot[key]) for key in state)
    trace = make_method("bca", emb, ids, k, tau=0.6, n1=20, logit_scale=SCALE).run(feats)
    torch.testing.assert_close(trace.posteriors, ref.posteriors, atol=1e-5, rtol=0)
    assert torch.equal(trace.predictions, ref.predictions)
    assert set(trace.timings) == {"logits", "posterior", "update"}

