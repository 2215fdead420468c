import pytest
import torch

from orchestrator.data.synthetic import CLIP_LIKE_PRESETS, SYNTHETIC_SCENARIOS, make_clip_like, make_synthetic


@pytest.mark.parametrize("scenario", SYNTHETIC_SCENARIOS)
def test_deterministic_and_well_formed(scenario):
    a = make_synthetic(scenario, num_classes=12, dim=32, n=500, seed=3, templates_per_class=2)
    b = make_synthetic(scenario, num_classes=12, dim=32, n=500, seed=3, templates_per_class=2)
    assert torch.equal(a.features, b.features) and torch.equal(a.labels, b.labels)
    assert a.features.shape == (500, 32) and a.features.dtype == torch.float32
    assert torch.allclose(a.features.norm(dim=1), torch.ones(500), atol=1e-5)
    assert torch.allclose(a.class_embeddings.norm(dim=1), torch.ones(24), atol=1e-5)
    assert torch.equal(a.class_ids, torch.arange(24) % 12)
    assert a.num_classes == 12 and len(a) == 500 and len(set(a.image_ids)) == 500
    assert int(a.labels.min()) >= 0 and int(a.labels.max()) < 12
    c = make_synthetic(scenario, num_classes=12, dim=32, n=500, seed=4, templates_per_class=2)
    assert not torch.equal(a.features, c.features)


def test_label_shift_skews_class_frequencies():
    counts = torch.bincount(make_synthetic("label_shift", num_classes=20, n=4000).labels, minlength=20).float()
    uniform = torch.bincount(make_synthetic("iid", num_classes=20, n=4000).labels, minlength=20).float()
    assert counts.max() / counts.sum() > 3 * uniform.max() / uniform.sum() / 2
    assert counts.std() > 3 * uniform.std()


def test_temporal_stream_has_class_runs():
    labels = make_synthetic("temporal", n=3000, mean_run_length=20).labels
    same_as_previous = (labels[1:] == labels[:-1]).float().mean()
    assert same_as_previous > 0.8  # an i.i.d. stream over 50 classes would give about 0.02


def test_continual_domains_differ():
    bench = make_synthetic("continual", num_classes=5, n=3000, num_domains=3, noise=0.0)
    first, last = bench.features[:1000], bench.features[2000:]
    for c in range(5):
        a, b = first[bench.labels[:1000] == c][0], last[bench.labels[2000:] == c][0]
        assert float(a @ b) < 0.99  # same class, different domain: a different image-side centre


def test_zero_shot_is_informative_but_imperfect():
    bench = make_synthetic("iid", n=2000)
    acc = ((bench.features @ bench.class_embeddings.T).argmax(1) == bench.labels).float().mean()
    assert 0.4 < acc < 0.95


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"scenario": "drift"}, "unknown synthetic scenario 'drift'"),
    ({"num_classes": 1}, "num_classes must be an integer >= 2"),
    ({"noise": -1.0}, "noise must be a finite number >= 0"),
    ({"dirichlet_alpha": 0.0}, "dirichlet_alpha must be > 0"),
])
def test_bad_arguments(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        make_synthetic(**kwargs)


def _zero_shot(bench) -> float:
    return float(((bench.features @ bench.class_embeddings.T).argmax(1) == bench.labels).float().mean())


@pytest.mark.parametrize("preset", sorted(CLIP_LIKE_PRESETS))
def test_clip_like_presets_state_their_zero_shot_accuracy(preset):
    stated = CLIP_LIKE_PRESETS[preset].zero_shot_accuracy
    accs = [_zero_shot(make_clip_like(preset, seed=seed)) for seed in (0, 1, 2)]
    assert abs(sum(accs) / 3 - stated) < 0.01
    assert all(abs(a - stated) < 0.08 for a in accs)


def test_clip_like_is_deterministic_and_well_formed():
    a = make_clip_like("fine_grained", seed=3, n=400, templates_per_class=2)
    b = make_clip_like("fine_grained", seed=3, n=400, templates_per_class=2)
    assert torch.equal(a.features, b.features) and torch.equal(a.labels, b.labels)
    assert torch.equal(a.class_embeddings, b.class_embeddings)
    assert a.features.shape == (400, 128) and a.class_embeddings.shape == (100, 128)
    assert torch.allclose(a.features.norm(dim=1), torch.ones(400), atol=1e-5)
    assert torch.equal(a.class_ids, torch.arange(100) % 50) and a.name == "synthetic-fine_grained"
    assert not torch.equal(a.features, make_clip_like("fine_grained", seed=4, n=400, templates_per_class=2).features)


def _confusions(bench) -> torch.Tensor:
    k = bench.num_classes
    pred = (bench.features @ bench.class_embeddings.T).argmax(1)
    return torch.bincount(bench.labels * k + pred, minlength=k * k).reshape(k, k).double()


def _error_stats(drift: float) -> tuple[float, float, float]:
    """(share of errors inside the group, mean share of a class's errors on its commonest confusion, median
    ratio of that confusion to its reverse) of zero-shot CLIP on imagenet_like (groups of 4)."""
    errors = _confusions(make_clip_like("imagenet_like", seed=0, drift=drift, n=20000))
    errors -= torch.diag(torch.diag(errors))
    group, rows = torch.arange(100) // 4, torch.arange(100)
    top = errors.argmax(1)
    in_group = errors[group[:, None] == group[None, :]].sum() / errors.sum()
    top_share = (errors[rows, top] / errors.sum(1).clamp_min(1)).mean()
    one_way = (errors[rows, top] / (errors[top, rows] + 1)).median()
    return float(in_group), float(top_share), float(one_way)


def test_clip_like_confusions_stay_in_the_group_and_are_asymmetric():
    in_group, top_share, one_way = _error_stats(0.3)
    flat_in_group, flat_top_share, _ = _error_stats(0.0)
    assert in_group > 0.65 and in_group > flat_in_group + 0.1  # 3 of 99 other classes share a group
    assert top_share > flat_top_share + 0.05  # the drift concentrates errors on one neighbour
    assert one_way > 3  # a class's commonest confusion is mostly one-way


def test_clip_like_pull_makes_zero_shot_favour_some_classes():
    def spread(pull: float) -> float:
        bench = make_clip_like("imagenet_like", seed=1, drift=0.0, pull=pull, n=10000)
        counts = torch.bincount((bench.features @ bench.class_embeddings.T).argmax(1), minlength=100).double()
        return float(counts.std() / counts.mean())
    assert spread(0.1) > 1.5 * spread(0.0)


def test_clip_like_skew_and_balance():
    balanced = torch.bincount(make_clip_like("imagenet_like", seed=0).labels, minlength=100).double()
    skewed = torch.bincount(make_clip_like("long_tailed", seed=0).labels, minlength=100).double()
    assert balanced.max() / balanced.min() < 3
    # Zipf(1) over 100 classes: the 10 commonest hold H_10 / H_100 = 56% of the samples (balanced: 10%).
    assert skewed.sort(descending=True).values[:10].sum() / 5000 > 0.45
    assert balanced.sort(descending=True).values[:10].sum() / 5000 < 0.15


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"preset": "cifar"}, "unknown clip-like preset 'cifar'; expected one of imagenet_like, fine_grained"),
    ({"preset": "fine_grained", "alpha": 1}, "unknown clip-like parameter 'alpha'"),
    ({"preset": "fine_grained", "group_size": 7}, "group_size must divide num_classes 50, got 7"),
    ({"preset": "fine_grained", "text_similarity": 1.0}, r"text_similarity must be a number in \[0, 1\), got 1.0"),
    ({"preset": "fine_grained", "drift": 1.5}, r"drift must be a number in \[0, 1\], got 1.5"),
    ({"preset": "fine_grained", "group_size": 1}, "drift 0.3 needs group_size >= 2"),
    ({"preset": "fine_grained", "skew": -1.0}, "skew must be a finite number >= 0, got -1.0"),
    ({"preset": "fine_grained", "n": 0}, "n must be an integer >= 1, got 0"),
])
def test_clip_like_bad_arguments(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        make_clip_like(**kwargs)
