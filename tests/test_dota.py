"""DOTA against a float64 transcription of the official class (dota.py), hand-checked steps, the precision
against the plain inverse, chunking, errors, and a synthetic sanity check."""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.data.synthetic import make_synthetic
from orchestrator.methods import make_method, run_stream
from orchestrator.methods.dota.method import gaussian_scores
from orchestrator.methods.dota.reference import official_dota
from orchestrator.registry import method_card, paper_datasets

IMAGENET = {"epsilon": 1e-4, "eta": 0.2, "rho": 0.005, "sigma": 0.002}
EUROSAT = {"epsilon": 1e-4, "eta": 3.0, "rho": 0.05, "sigma": 0.002}       # a Gaussian term that weighs in early


def close(tensor: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(tensor.float(), torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0)


def _views(k: int, d: int, n: int, views: int, seed: int = 0, noise: float = 0.5):
    """A synthetic stream with `views` views per sample: view 0 the sample, the rest noisy copies."""
    bench = make_synthetic("iid", num_classes=k, dim=d, n=n, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    extra = bench.features[:, None] + noise * torch.randn(n, views - 1, d, generator=gen) / math.sqrt(d)
    feats = torch.cat([bench.features[:, None], torch.nn.functional.normalize(extra, dim=-1)], dim=1)
    return bench, feats


@pytest.mark.parametrize("k,d,n,views,hp", [
    (20, 32, 2000, 1, IMAGENET),
    (20, 64, 1000, 16, EUROSAT),
    (50, 64, 300, 64, {**EUROSAT, "epsilon": 0.002}),
    (1000, 16, 60, 1, EUROSAT),
])
def test_matches_the_official_code(k, d, n, views, hp):
    bench, feats = _views(k, d, n, views)
    trace = make_method("dota", bench.class_embeddings, bench.class_ids, k, **hp).run(feats)
    logits, state = official_dota(feats, bench.class_embeddings, **hp)
    assert torch.equal(trace.predictions, logits.argmax(dim=1))
    torch.testing.assert_close(trace.posteriors.double(), logits.softmax(dim=1), atol=1e-5, rtol=0)
    for key in ("mu", "counts"):
        torch.testing.assert_close(trace.state[key].double(), state[key], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(trace.state["sigma"].double(), state["sigma"], atol=1e-7, rtol=1e-4)
    torch.testing.assert_close(trace.state["precision"].double(), state["precision"], atol=1e-2, rtol=1e-4)
    # the Gaussian term acts: it moves the posteriors away from zero-shot CLIP's (the kept views' mean logits)
    zero_shot = run_stream("dota", feats, bench.class_embeddings, bench.class_ids, k, **{**hp, "eta": 0.0})
    assert float((zero_shot - trace.posteriors).abs().max()) > 0.05


def test_one_and_two_steps_by_hand():
    # K = 2, d = 2, T = I, logit scale 1 (soft labels far from one-hot), one view.
    sigma, eps, rho = 0.5, 0.1, 0.5
    x1, x2 = [0.8, 0.6], [0.6, 0.8]
    hp = {"sigma": sigma, "epsilon": eps, "rho": rho, "eta": 10.0, "logit_scale": 1.0}
    trace = make_method("dota", torch.eye(2), torch.arange(2), 2, **hp).run(torch.tensor([[x1], [x2]]))

    def softmax(xs):
        e = [math.exp(x) for x in xs]
        return [v / sum(e) for v in e]

    # Sample 1: every mu_k is the same 0.001 vector, so the Gaussian scores tie and the posterior is CLIP's.
    p1 = softmax(x1)
    close(trace.posteriors[0], p1)
    m0 = [0.001, 0.001]
    c = [1 + p1[0], 1 + p1[1]]
    mu = [[(p1[k] * x1[j] + m0[j]) / c[k] for j in range(2)] for k in range(2)]
    r = [x1[j] - m0[j] for j in range(2)]
    sig = [[[(sigma * (i == j) + p1[k] * r[i] * r[j]) / c[k] for j in range(2)] for i in range(2)]
           for k in range(2)]
    A = [[(1 - eps) * (sig[0][i][j] + sig[1][i][j]) / 2 + eps * (i == j) for j in range(2)] for i in range(2)]
    det = A[0][0] * A[1][1] - A[0][1] * A[1][0]
    lam = [[A[1][1] / det, -A[0][1] / det], [-A[1][0] / det, A[0][0] / det]]

    def quad(a, b):
        return sum(a[i] * lam[i][j] * b[j] for i in range(2) for j in range(2))

    # Sample 2: w = rho * mean(c) / 1 = rho * 1.5 (the soft labels of one sample add 1 to the counts).
    g = [quad(x2, mu[k]) - 0.5 * quad(mu[k], mu[k]) for k in range(2)]
    w = rho * (c[0] + c[1]) / 2
    assert abs(g[0] - g[1]) > 0.01                                      # the scores no longer tie
    close(trace.posteriors[1], softmax([x2[k] + w * g[k] for k in range(2)]), atol=1e-5)
    p2 = softmax(x2)
    close(trace.state["counts"], [c[k] + p2[k] for k in range(2)])
    close(trace.state["mu"], [[(p2[k] * x2[j] + c[k] * mu[k][j]) / (c[k] + p2[k]) for j in range(2)]
                              for k in range(2)])
    sig2 = [[[(c[k] * sig[k][i][j] + p2[k] * (x2[i] - mu[k][i]) * (x2[j] - mu[k][j])) / (c[k] + p2[k])
              for j in range(2)] for i in range(2)] for k in range(2)]
    close(trace.state["sigma"], sig2)
    assert trace.selected.tolist() == [-1, -1] and not trace.gated.any() and not trace.gated_prior.any()


def test_precision_without_an_inverse_equals_the_plain_inverse():
    # The state keeps a Cholesky factor and never inverts; the reported precision must be the official
    # inverse((1 - eps) mean_k Sigma_k + eps I), and the scores the ones that inverse gives.
    bench, feats = _views(30, 48, 400, 1)
    eps = 1e-3
    method = make_method("dota", bench.class_embeddings, bench.class_ids, 30, epsilon=eps)
    trace = method.run(feats)
    sigma = trace.state["sigma"].double()
    plain = torch.linalg.inv((1 - eps) * sigma.mean(dim=0) + eps * torch.eye(48, dtype=torch.float64))
    torch.testing.assert_close(trace.state["precision"].double(), plain, atol=1e-3, rtol=1e-4)
    mu, xbar = trace.state["mu"].double(), bench.features[0].double()
    scores = xbar @ plain @ mu.T - 0.5 * ((mu @ plain) * mu).sum(dim=1)
    torch.testing.assert_close(gaussian_scores(method.factor, bench.features[0], method.mu).double(), scores,
                               atol=1e-3, rtol=1e-5)


def test_chunks_continue_the_state():
    bench, feats = _views(20, 32, 300, 16)
    whole = make_method("dota", bench.class_embeddings, bench.class_ids, 20).run(feats)
    obj = make_method("dota", bench.class_embeddings, bench.class_ids, 20)
    parts = [obj.run(feats[:120]), obj.run(feats[120:])]
    assert torch.equal(torch.cat([p.posteriors for p in parts]), whole.posteriors)
    assert all(torch.equal(parts[1].state[key], whole.state[key]) for key in whole.state)
    torch.testing.assert_close(whole.posteriors.sum(dim=1), torch.ones(300), atol=1e-5, rtol=0)


def test_few_views_keep_one_and_one_view_is_the_single_view_path():
    # For 1 < V < 10 the official keeps no view (NaN); here the lowest-entropy view is kept.
    bench, feats = _views(10, 16, 50, 5)
    trace = make_method("dota", bench.class_embeddings, bench.class_ids, 10).run(feats)
    logits, _ = official_dota(feats, bench.class_embeddings, **IMAGENET)
    assert bool(torch.isfinite(trace.posteriors).all())
    torch.testing.assert_close(trace.posteriors.double(), logits.softmax(dim=1), atol=1e-5, rtol=0)


def test_several_embeddings_per_class_are_averaged_like_the_official_templates():
    bench, feats = _views(20, 32, 200, 1)
    templates = make_synthetic("iid", num_classes=20, dim=32, n=10, seed=0, templates_per_class=3)
    averaged = torch.nn.functional.normalize(templates.class_embeddings.view(3, 20, 32).sum(dim=0), dim=1)
    many = run_stream("dota", feats, templates.class_embeddings, templates.class_ids, 20)
    one = run_stream("dota", feats, averaged, torch.arange(20), 20)
    torch.testing.assert_close(many, one, atol=1e-5, rtol=0)


def test_the_card_carries_the_official_per_dataset_configs():
    card = method_card("dota")
    assert card.defaults() == {**IMAGENET, "keep": 0.1, "logit_scale": 100.0}
    assert card.defaults("caltech101")["epsilon"] == 0.002 and card.defaults("food101")["epsilon"] == 4e-5
    assert card.defaults("imagenet-r")["rho"] == 0.0025 and card.defaults("eurosat") == {**EUROSAT, "keep": 0.1,
                                                                                        "logit_scale": 100.0}
    assert all(len(card.hparam(key).per_dataset) == len(paper_datasets()) for key in ("epsilon", "eta", "rho"))
    assert card.takes_views and card.views.kind == "augmix"


@pytest.mark.parametrize("hp,message", [
    ({"epsilon": 1.5}, r"dota: hparam 'epsilon' must be a number in \[0, 1\] \(identity blended into the mean "
                       r"covariance before inverting\), got 1.5"),
    ({"sigma": 0.0}, r"dota: hparam 'sigma' must be a number > 0 \(initial covariance sigma · I of every class\)"),
    ({"eta": -1}, r"dota: hparam 'eta' must be a number >= 0 \(cap of the Gaussian score's weight"),
    ({"rho": "0.1"}, r"dota: hparam 'rho' must be a number >= 0 .*, got '0.1'"),
    ({"keep": 0}, r"dota: hparam 'keep' must be a number in \(0, 1\] \(fraction of the views kept"),
    ({"logit_scale": -100}, r"dota: hparam 'logit_scale' must be a number > 0"),
    ({"alpha": 1.0}, r"unknown hparam 'alpha' for method 'dota'"),
])
def test_bad_hparams_are_named(hp, message):
    with pytest.raises(ValueError, match=message):
        make_method("dota", torch.eye(3), torch.arange(3), 3, **hp)


def test_single_view_features_need_a_view_axis():
    with pytest.raises(ValueError, match=r"dota: features must have shape \[n, V, d\].*add a view axis"):
        run_stream("dota", torch.eye(3), torch.eye(3), torch.arange(3), 3)


@pytest.mark.parametrize("seed", [0, 1])
def test_sanity_beats_clip_on_a_synthetic_domain_shift(seed):
    # A sanity check, not a claim about real data: the image-side class centres are shifted away from the
    # text anchors, and the per-class Gaussians fitted from soft labels follow them (EuroSAT's eta / rho
    # let the Gaussian term weigh in within a short stream).
    bench = make_synthetic("iid", num_classes=50, dim=64, n=1500, seed=seed)
    args = (bench.class_embeddings, bench.class_ids, bench.num_classes)
    clip = (run_stream("clip", bench.features, *args).argmax(1) == bench.labels).float().mean()
    dota = (run_stream("dota", bench.features[:, None], *args, **EUROSAT).argmax(1)
            == bench.labels).float().mean()
    assert dota > clip + 0.03
