"""OnZeta against a float64 transcription of the official loop, hand-checked steps, chunking, errors, and a
synthetic sanity check."""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.data.synthetic import make_synthetic
from orchestrator.methods import make_method, run_stream
from orchestrator.methods.onzeta.reference import official_onzeta

DEFAULTS = {"tau_t": 0.01, "tau_i": 0.04, "cw": 0.5, "cr": 20.0, "alpha": 1.0, "beta": 0.8}


def softmax(xs: list[float]) -> list[float]:
    e = [math.exp(x) for x in xs]
    return [v / sum(e) for v in e]


def close(tensor: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(tensor.float(), torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0)


def _bench(k: int = 100, d: int = 64, n: int = 3000, seed: int = 0):
    bench = make_synthetic("iid", num_classes=k, dim=d, n=n, seed=seed)
    return bench, (bench.class_embeddings, bench.class_ids, bench.num_classes)


@pytest.mark.parametrize("k,d,n", [(100, 64, 3000), (1000, 64, 200)])
def test_matches_the_official_loop(k, d, n):
    bench, args = _bench(k, d, n)
    trace = make_method("onzeta", *args).run(bench.features)
    combo, w, rho = official_onzeta(bench.features, bench.class_embeddings, n, **DEFAULTS)
    assert torch.equal(trace.predictions, combo.argmax(dim=1))
    torch.testing.assert_close(trace.posteriors.double(), combo, atol=1e-5, rtol=0)
    torch.testing.assert_close(trace.state["W"].double(), w.T, atol=1e-4, rtol=0)
    torch.testing.assert_close(trace.state["rho"].double(), rho, atol=1e-4, rtol=0)
    # both adaptive parts act: the dual variable shifts class odds by more than e^0.5 and the proxies left the text
    assert float(trace.state["rho"].max()) > 0.5
    assert float((trace.state["W"] - bench.class_embeddings).norm(dim=1).median()) > 0.05
    assert int(trace.state["step"]) == n


def test_one_and_two_steps_by_hand():
    # K = 2, d = 2, T = I; tau_t = 0.5 and tau_i = 1 make p and q differ from the first sample on.
    x1, x2 = [0.8, 0.6], [0.6, 0.8]
    hp = {"tau_t": 0.5, "tau_i": 1.0, "cw": 0.5, "cr": 2.0, "alpha": 1.0, "beta": 0.8, "n_total": 2}
    trace = make_method("onzeta", torch.eye(2), torch.arange(2), 2, **hp).run(torch.tensor([x1, x2]))

    q1 = softmax([x1[0] / 0.5, x1[1] / 0.5])                            # rho = 0
    p1 = softmax(x1)                                                    # W = T
    b1 = 0.8 * math.sqrt(1 / 2)
    rho = [max(0.0, 0.0 - 2.0 * (q1[k] - 0.5)) for k in range(2)]       # rlr = cr / sqrt(1)
    assert rho[0] == 0.0 and rho[1] > 0                                 # class 0 was over-predicted
    W = [[float(k == j) - 0.5 * (p1[k] - q1[k]) * x1[j] for j in range(2)] for k in range(2)]
    W = [[v / math.hypot(*row) for v in row] for row in W]
    close(trace.posteriors[0], [b1 * p1[k] + (1 - b1) * q1[k] for k in range(2)])

    q2 = softmax([x2[k] / 0.5 + rho[k] for k in range(2)])
    p2 = softmax([sum(W[k][j] * x2[j] for j in range(2)) for k in range(2)])
    close(trace.posteriors[1], [0.8 * p2[k] + 0.2 * q2[k] for k in range(2)])          # b2 = beta at the end
    rho = [max(0.0, rho[k] - 2.0 / math.sqrt(2) * (q2[k] - 0.5)) for k in range(2)]
    W = [[W[k][j] - 0.5 / math.sqrt(2) * (p2[k] - q2[k]) * x2[j] for j in range(2)] for k in range(2)]
    W = [[v / math.hypot(*row) for v in row] for row in W]
    close(trace.state["rho"], rho)
    close(trace.state["W"], W)
    assert trace.selected.tolist() == [-1, -1] and not trace.gated.any() and not trace.gated_prior.any()


def test_chunks_continue_the_state_and_n_total_defaults_to_the_first_call():
    bench, args = _bench(n=600)
    whole = make_method("onzeta", *args).run(bench.features)            # n_total = 600 from this call
    obj = make_method("onzeta", *args, n_total=600)
    parts = [obj.run(bench.features[:250]), obj.run(bench.features[250:])]
    torch.testing.assert_close(torch.cat([p.posteriors for p in parts]), whole.posteriors, atol=1e-6, rtol=0)
    for key in ("W", "rho", "step"):
        torch.testing.assert_close(parts[1].state[key], whole.state[key], atol=1e-6, rtol=0)
    torch.testing.assert_close(whole.posteriors.sum(dim=1), torch.ones(600), atol=1e-5, rtol=0)


def test_running_past_n_total_is_refused():
    bench, args = _bench(n=100)
    obj = make_method("onzeta", *args)
    obj.run(bench.features[:60])                                        # n_total = 60 from the first call
    with pytest.raises(ValueError, match=r"onzeta: the stream runs past n_total = 60 samples \(this call would "
                                         r"reach 100\); hparam 'n_total' must be the whole stream's length"):
        obj.run(bench.features[60:])
    with pytest.raises(ValueError, match="runs past n_total = 50"):
        make_method("onzeta", *args, n_total=50).run(bench.features)
    obj = make_method("onzeta", *args)
    obj.run(bench.features[:0])                                         # an empty call does not fix N
    assert torch.equal(obj.run(bench.features).posteriors, run_stream("onzeta", bench.features, *args))


def test_several_embeddings_per_class_are_averaged_like_the_official_templates():
    bench, _ = _bench(n=300)
    templates = make_synthetic("iid", num_classes=100, dim=64, n=300, seed=0, templates_per_class=3)
    averaged = torch.nn.functional.normalize(
        templates.class_embeddings.view(3, 100, 64).sum(dim=0), dim=1)
    many = run_stream("onzeta", bench.features, templates.class_embeddings, templates.class_ids, 100)
    one = run_stream("onzeta", bench.features, averaged, torch.arange(100), 100)
    torch.testing.assert_close(many, one, atol=1e-5, rtol=0)


@pytest.mark.parametrize("hp,message", [
    ({"tau_t": 0.0}, r"onzeta: hparam 'tau_t' must be a number > 0 \(temperature of the text label q"),
    ({"tau_i": -1}, r"onzeta: hparam 'tau_i' must be a number > 0"),
    ({"cw": -0.1}, r"onzeta: hparam 'cw' must be a number >= 0 \(proxy learning rate constant.*got -0.1"),
    ({"cr": float("nan")}, r"onzeta: hparam 'cr' must be a number >= 0"),
    ({"beta": 1.5}, r"onzeta: hparam 'beta' must be a number in \[0, 1\] \(final weight of the proxy label"),
    ({"n_total": 0}, r"onzeta: hparam 'n_total' must be an integer >= 1 or null \(stream length N.*got 0$"),
    ({"n_total": 10.5}, r"onzeta: hparam 'n_total' must be an integer >= 1 or null .*got 10.5"),
    ({"lr": 0.1}, r"unknown hparam 'lr' for method 'onzeta'"),
])
def test_bad_hparams_are_named(hp, message):
    with pytest.raises(ValueError, match=message):
        make_method("onzeta", torch.eye(3), torch.arange(3), 3, **hp)


@pytest.mark.parametrize("seed", [0, 1])
def test_sanity_beats_clip_on_a_synthetic_domain_shift(seed):
    # A sanity check, not a claim about real data: the image centres sit away from the text anchors (the
    # simulator's modality gap and shift), which the vision proxies learn to follow.
    bench, args = _bench(d=128, n=3000, seed=seed)
    clip = (run_stream("clip", bench.features, *args).argmax(1) == bench.labels).float().mean()
    onzeta = (run_stream("onzeta", bench.features, *args).argmax(1) == bench.labels).float().mean()
    assert onzeta > clip + 0.03
