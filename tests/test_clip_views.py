"""Image views (single, seeded AugMix, seeded crops) and run-time confident-view selection."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from orchestrator.clip import load_backbone, parse_views, select_views
from orchestrator.clip.selection import confident_view_indices
from orchestrator.clip.testing import TINY_VIT, register_tiny_models, write_image
from orchestrator.clip.views import AUGMIX_VIEWS, ViewConfig, ViewTransform


@pytest.fixture(scope="module")
def backbone():
    register_tiny_models()
    return load_backbone(TINY_VIT, None, device="cpu")


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    path = tmp_path_factory.mktemp("img") / "x.jpg"
    write_image(path, label=1, index=0, size=80)
    return Image.open(path).convert("RGB")


def _transform(backbone, views):
    return ViewTransform(parse_views(views, seed=1), backbone.preprocess, backbone.resolved.preprocess)


def test_parse_views():
    assert parse_views("single").num_views == 1 and parse_views("single").seed is None
    full = parse_views("augmix", seed=3)
    assert full.num_views == 1 + AUGMIX_VIEWS == 64 and full.seed == 3
    assert parse_views("augmix8").num_views == 9
    crops = parse_views("crops")
    assert crops.kind == "crops" and crops.num_views == 64 and crops.name == "crops" and crops.seed == 1
    assert parse_views("crops8").num_views == 9 and parse_views("crops8").name == "crops8"
    with pytest.raises(ValueError, match="unknown views 'augmax'"):
        parse_views("augmax")
    with pytest.raises(ValueError, match="unknown views 'crops0'"):
        parse_views("crops0")
    with pytest.raises(ValueError, match="unknown view kind 'cutout'"):
        ViewConfig("cutout")


def test_single_seed_is_not_part_of_the_identity():
    assert parse_views("single", seed=1).identity() == parse_views("single", seed=2).identity()
    assert parse_views("augmix", seed=1).identity() != parse_views("augmix", seed=2).identity()
    assert parse_views("crops", seed=1).identity() != parse_views("crops", seed=2).identity()
    assert parse_views("crops").identity()["kind"] == "crops"
    assert parse_views("crops").identity() != parse_views("augmix").identity()


def test_single_view_is_the_backbone_preprocess(backbone, image):
    views = _transform(backbone, "single")(image, "x")
    assert views.shape == (1, 3, 64, 64)  # the tiny model's own input size, not a hard-coded 224
    torch.testing.assert_close(views[0], backbone.preprocess(image))


def test_augmix_views_are_seeded_per_image(backbone, image):
    t = _transform(backbone, "augmix")
    views = t(image, "a/b.jpg")
    assert views.shape == (64, 3, 64, 64)
    torch.testing.assert_close(views[0], backbone.preprocess(image))  # view 0 = the original image
    assert not torch.allclose(views[1], views[2])
    torch.manual_seed(123)  # the global RNG state does not matter ...
    torch.testing.assert_close(t(image, "a/b.jpg"), views)
    assert not torch.allclose(t(image, "a/c.jpg")[1:], views[1:])  # ... the image id does
    other_seed = ViewTransform(parse_views("augmix", seed=2), backbone.preprocess, backbone.resolved.preprocess)
    assert not torch.allclose(other_seed(image, "a/b.jpg")[1:], views[1:])


def test_crop_views_are_seeded_per_image_and_are_not_augmix(backbone, image):
    t = _transform(backbone, "crops")
    views = t(image, "a/b.jpg")
    assert views.shape == (64, 3, 64, 64)  # the model's input size
    torch.testing.assert_close(views[0], backbone.preprocess(image))
    assert not torch.allclose(views[1], views[2])
    torch.manual_seed(123)
    torch.testing.assert_close(t(image, "a/b.jpg"), views)
    assert not torch.allclose(t(image, "a/c.jpg")[1:], views[1:])
    other_seed = ViewTransform(parse_views("crops", seed=2), backbone.preprocess, backbone.resolved.preprocess)
    assert not torch.allclose(other_seed(image, "a/b.jpg")[1:], views[1:])
    augmix = _transform(backbone, "augmix")(image, "a/b.jpg")
    assert not torch.allclose(augmix[1:], views[1:])


def test_crop_view_is_a_normalised_resized_crop_with_flip(backbone, image):
    """Each crop view is exactly RandomResizedCrop + RandomHorizontalFlip of the raw image, then the model's
    normalisation, with no AugMix: redo the transform by hand from the same seeded draws."""
    from torchvision import transforms as T
    from torchvision.transforms import functional as TF

    from orchestrator.clip.views import _item_seed

    cfg = backbone.resolved.preprocess
    views = _transform(backbone, "crops2")(image, "x")
    torch.manual_seed(_item_seed(1, "x"))
    expected = []
    for _ in range(2):
        top, left, h, w = T.RandomResizedCrop.get_params(image, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))
        crop = TF.resized_crop(image, top, left, h, w, [64, 64], T.InterpolationMode.BILINEAR, antialias=True)
        if torch.rand(1) < 0.5:
            crop = TF.hflip(crop)
        expected.append(TF.normalize(TF.to_tensor(crop), cfg["mean"], cfg["std"]))
    torch.testing.assert_close(views[1:], torch.stack(expected))


def test_augmix_leaves_the_global_rng_alone(backbone, image):
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    _transform(backbone, "augmix4")(image, "x")
    torch.testing.assert_close(torch.rand(3), expected)


def _unit(*rows):
    return F.normalize(torch.tensor(rows, dtype=torch.float32), dim=-1)


def test_select_views_keeps_the_lowest_entropy_views_and_averages_without_renormalising():
    emb = _unit([1, 0, 0], [0, 1, 0])
    ids = torch.tensor([0, 1])
    # 10 views: view 3 and 7 point at a class (confident), the others sit between the classes
    views = _unit(*([[1, 1, 0.2]] * 10))
    views[3] = _unit([1, 0.05, 0])[0]
    views[7] = _unit([0.05, 1, 0])[0]
    feats = views.unsqueeze(0)
    idx = confident_view_indices(feats, emb, ids, 2, logit_scale=100.0, keep=0.2)
    assert sorted(idx[0].tolist()) == [3, 7]
    out = select_views(feats, emb, ids, 2, logit_scale=100.0, keep=0.2)
    torch.testing.assert_close(out[0], (views[3] + views[7]) / 2)
    assert out[0].norm() < 0.99  # the mean of two different unit vectors: kept as is, not renormalised


def test_select_views_keeps_ten_percent_rounded_down_at_least_one():
    feats = F.normalize(torch.randn(5, 64, 8, generator=torch.Generator().manual_seed(0)), dim=-1)
    emb = F.normalize(torch.randn(4, 8, generator=torch.Generator().manual_seed(1)), dim=-1)
    ids = torch.arange(4)
    assert confident_view_indices(feats, emb, ids, 4).shape == (5, 6)  # int(64 * 0.1), as the public code
    assert confident_view_indices(feats[:, :5], emb, ids, 4).shape == (5, 1)
    out = select_views(feats, emb, ids, 4, chunk=2)  # chunking does not change the result
    torch.testing.assert_close(out, select_views(feats, emb, ids, 4))
    assert out.shape == (5, 8) and out.dtype == torch.float32


def test_select_views_scores_classes_not_embeddings():
    """With M = K*t embeddings, a view's entropy is over the K classes (embeddings of a class pooled)."""
    emb = _unit([1, 0, 0], [0, 1, 0], [0.9, 0, 0.1], [0, 0.9, 0.1])  # two embeddings per class
    ids = torch.tensor([0, 1, 0, 1])
    views = torch.stack([_unit([1, 0.02, 0.05])[0], _unit([1, 1, 0])[0]]).unsqueeze(0)
    idx = confident_view_indices(views, emb, ids, 2, keep=0.5)
    assert idx.tolist() == [[0]]


def test_select_views_rejects_bad_input():
    with pytest.raises(ValueError, match=r"\[n, V, d\]"):
        select_views(torch.zeros(3, 4), torch.zeros(2, 4), torch.arange(2), 2)
    with pytest.raises(ValueError, match="keep must be in"):
        select_views(torch.zeros(1, 3, 4), torch.zeros(2, 4), torch.arange(2), 2, keep=0.0)


@pytest.mark.parametrize("severity", [1, 3])
def test_pil_augmix_draws_the_same_augmentations_as_torchvision(image, severity):
    """Same seed, same sampled operations and weights: pixels differ only by the PIL vs tensor kernels'
    interpolation (a fraction of a grey level on average), while another seed differs by ~20 levels."""
    import numpy as np
    from torchvision import transforms as T

    from orchestrator.clip.views import PilAugMix

    ours = PilAugMix(severity=severity, all_ops=False)
    theirs = T.AugMix(severity=severity, all_ops=False)
    same, other = [], []
    for seed in range(12):
        torch.manual_seed(seed)
        a = np.asarray(ours(image), dtype=np.float64)
        torch.manual_seed(seed)
        b = np.asarray(theirs(image), dtype=np.float64)
        torch.manual_seed(seed + 100)
        c = np.asarray(theirs(image), dtype=np.float64)
        same.append(np.abs(a - b).mean())
        other.append(np.abs(c - b).mean())
    assert max(same) < 1.5 and np.mean(same) < 0.5
    assert np.mean(other) > 10
