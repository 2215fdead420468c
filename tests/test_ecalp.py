"""ECALP against its reference (the whole graph rebuilt at every sample, float64), chunking, ties, several
embeddings per class, and refused inputs."""

from __future__ import annotations

import pytest
import torch

from orchestrator.data.synthetic import make_synthetic
from orchestrator.methods import make_method, run_stream
from orchestrator.methods.ecalp.reference import ecalp_reference, neighbours
from orchestrator.methods.prototypes import class_prototypes

DEFAULTS = {"k_image": 8, "k_text": 3, "edge_power": 10, "alpha": 1.0, "iterations": 3, "graph": "exact"}
# The posterior is softmax(10^4 * y) with y = O(1): float32 rounding of y (~1e-7 relative over a few hundred
# summed edges) moves a logit by up to ~1e-2, and a posterior by at most a quarter of that: 2.5e-3.
POSTERIOR_ATOL = 2.5e-3

pytestmark = pytest.mark.usefixtures("one_thread")


def _bench(k: int = 10, d: int = 32, n: int = 150, seed: int = 0, kind: str = "iid"):
    bench = make_synthetic(kind, num_classes=k, dim=d, n=n, seed=seed)
    return bench, (bench.class_embeddings, bench.class_ids, bench.num_classes)


def _reference(features, bench, **hp):
    text = class_prototypes(bench.class_embeddings, bench.class_ids, bench.num_classes)
    return ecalp_reference(features.double(), text.double(), **{**DEFAULTS, **hp})


@pytest.mark.parametrize("seed,hp", [
    (0, {}),
    (1, {"alpha": 0.7}),                                   # the paper's propagation, with the Y0 term
    (2, {"k_image": 3, "k_text": 1, "edge_power": 4, "iterations": 5}),
    (3, {"graph": "official"}),
    (4, {"graph": "official", "k_image": 3, "alpha": 0.7}),
])
def test_matches_the_reference(seed, hp):
    bench, args = _bench(seed=seed)
    trace = make_method("ecalp", *args, **hp).run(bench.features)
    expected = _reference(bench.features, bench, **hp)
    assert torch.equal(trace.predictions, expected.argmax(dim=1))
    torch.testing.assert_close(trace.posteriors.double(), expected, atol=POSTERIOR_ATOL, rtol=0)
    torch.testing.assert_close(trace.posteriors.sum(dim=1), torch.ones(150), atol=1e-5, rtol=0)
    # propagation acts: it changes many zero-shot predictions
    clip = run_stream("clip", bench.features, *args).argmax(dim=1)
    assert int((trace.predictions != clip).sum()) >= 10
    assert trace.selected.eq(-1).all() and not trace.gated.any() and not trace.gated_prior.any()


def test_the_first_sample_is_predicted_as_clip_does():
    # its graph is the sample twice and its k_text classes: every propagated score of class t is a multiple of
    # (f . t)^p / sqrt(2 (f . t)^p), which grows with f . t where it is positive (the top classes here), so the
    # argmax is CLIP's
    for seed in range(5):
        bench, args = _bench(n=1, seed=seed)
        clip = run_stream("clip", bench.features, *args)
        assert torch.equal(run_stream("ecalp", bench.features, *args).argmax(dim=1), clip.argmax(dim=1))


@pytest.mark.parametrize("graph", ["exact", "official"])
def test_equal_similarities_go_to_the_earlier_sample(graph):
    # every sample three times: the k-NN lists are full of exact ties, which both sides break by stream position
    bench, args = _bench(n=40, seed=3)
    features = bench.features.repeat_interleave(3, dim=0)
    trace = make_method("ecalp", *args, graph=graph).run(features)
    expected = _reference(features, bench, graph=graph)
    assert torch.equal(trace.predictions, expected.argmax(dim=1))
    torch.testing.assert_close(trace.posteriors.double(), expected, atol=POSTERIOR_ATOL, rtol=0)


def _class_after_class(seed: int, n: int = 100):
    bench, args = _bench(n=n, seed=seed)
    return bench, args, bench.features[torch.sort(bench.labels, stable=True).indices]


def _lists(method, features, k_image):
    """The method's image k-NN lists [i + 2, min(k_image, i + 2)] after each sample, fed one at a time."""
    C = method.num_classes
    for i in range(features.shape[0]):
        method.run(features[i:i + 1])
        _, target, _ = method._graph()
        K = min(k_image, i + 2)
        yield (target[:(i + 2) * K] - C).view(i + 2, K)


@pytest.mark.parametrize("graph,k_image", [("exact", 8), ("official", 8), ("official", 3)])
def test_the_lists_are_the_references_at_every_sample(graph, k_image):
    """Class after class (every early sample of one class): list by list, with the second node's ties."""
    for seed in (1, 2):
        bench, args, features = _class_after_class(seed)
        text = class_prototypes(*args)
        expected = neighbours(features.double(), text.double(), k_image, graph)
        method = make_method("ecalp", *args, k_image=k_image, graph=graph)
        for i, (got, (_, near)) in enumerate(zip(_lists(method, features, k_image), expected)):
            assert torch.equal(got, near), (seed, i)


def test_the_official_store_loses_a_true_neighbour_of_an_early_sample():
    """The official store (reference.py's transcription of dynamic_graph_expansion) against the exact lists on a
    class-after-class stream: from sample k_image = 8 on, a row of samples 0..8 misses a sample nearer than its
    last entry, which never returns to it, until later samples push it out of the exact list too; every later
    row, and the second node's, is the exact one."""
    bench, args, features = _class_after_class(1)
    text = class_prototypes(*args).double()
    exact = neighbours(features.double(), text, 8, "exact")
    official = neighbours(features.double(), text, 8, "official")
    lost, steps = set(), []
    for i, ((S, a), (_, b)) in enumerate(zip(exact, official)):
        differ = [r for r in range(i + 2) if not torch.equal(a[r], b[r])]
        assert all(r <= 8 for r in differ), i
        for r in differ:
            missing = set(a[r].tolist()) - set(b[r].tolist())
            assert missing and all(S[r, j] > S[r, b[r, -1]] for j in missing), (i, r)
            lost |= {(r, j) for j in missing}
        assert not any(j in b[r] for r, j in lost), i
        steps += [i] if differ else []
    assert steps[0] == 8 and len(steps) > 3


@pytest.mark.parametrize("graph", ["exact", "official"])
def test_chunks_continue_the_graph(graph):
    bench, args = _bench(n=200, seed=4, kind="label_shift")
    whole = make_method("ecalp", *args, graph=graph).run(bench.features)
    obj = make_method("ecalp", *args, graph=graph)
    parts = [obj.run(bench.features[:1]), obj.run(bench.features[1:70]), obj.run(bench.features[70:70]),
             obj.run(bench.features[70:])]
    assert torch.equal(torch.cat([p.posteriors for p in parts]), whole.posteriors)


def test_several_embeddings_per_class_are_averaged():
    templates = make_synthetic("iid", num_classes=10, dim=32, n=100, seed=0, templates_per_class=3)
    averaged = class_prototypes(templates.class_embeddings, templates.class_ids, 10)
    many = run_stream("ecalp", templates.features, templates.class_embeddings, templates.class_ids, 10)
    one = run_stream("ecalp", templates.features, averaged, torch.arange(10), 10)
    torch.testing.assert_close(many, one, atol=1e-5, rtol=0)


@pytest.mark.parametrize("hp,message", [
    ({"k_image": 0}, r"ecalp: hparam 'k_image' must be an integer >= 1 \(image neighbours"),
    ({"k_text": 2.5}, r"ecalp: hparam 'k_text' must be an integer >= 1 .*got 2.5"),
    ({"edge_power": 0}, r"ecalp: hparam 'edge_power' must be an integer >= 1"),
    ({"alpha": 1.5}, r"ecalp: hparam 'alpha' must be a number in \[0, 1\] \(propagation"),
    ({"iterations": 0}, r"ecalp: hparam 'iterations' must be an integer >= 1"),
    ({"graph": "paper"}, r"ecalp: hparam 'graph' must be one of \['exact', 'official'\]"),
    ({"gamma": 10.0}, r"unknown hparam 'gamma' for method 'ecalp'"),
])
def test_bad_hparams_are_named(hp, message):
    with pytest.raises(ValueError, match=message):
        make_method("ecalp", torch.eye(3), torch.arange(3), 3, **hp)


def test_bad_features_are_named():
    method = make_method("ecalp", torch.eye(3), torch.arange(3), 3)
    with pytest.raises(ValueError, match=r"ecalp: features must have shape \[n, d\], got \(2, 4, 3\)"):
        method.run(torch.ones(2, 4, 3))
    with pytest.raises(ValueError, match="ecalp: features contain non-finite values"):
        method.run(torch.tensor([[1.0, float("nan"), 0.0]]))
    with pytest.raises(ValueError, match="ecalp: batch_size must be 1"):
        make_method("ecalp", torch.eye(3), torch.arange(3), 3, batch_size=4)
