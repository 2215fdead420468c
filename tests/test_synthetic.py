import pytest
import torch

from orchestrator.data.synthetic import SYNTHETIC_SCENARIOS, make_synthetic


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
