"""Auxiliary encoders: DINOv2 from a checkpoint in the official format against a forward pass written from the
official model's equations, and its features cached beside CLIP's, once per entry and shared."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import orchestrator.features.cache as cache_module
from orchestrator.clip import BackboneSpec
from orchestrator.clip.auxiliary import ARCHS, AuxiliaryEncoder, AuxiliarySpec
from orchestrator.clip.testing import (TINY_VIT, build_dataset, official_dinov2_state, register_tiny_models,
                                       write_dinov2_checkpoint)
from orchestrator.features import FeatureCache, load_benchmark

ARCH = "bca-tiny-dinov2"


def official_cls(state: dict, pixels: torch.Tensor, heads: int) -> torch.Tensor:
    """DinoVisionTransformer.forward_features(x)['x_norm_clstoken'] in float64, from the official code's
    equations: patch embedding, the class token, the position grid interpolated per forward (bicubic, scale
    (g + 0.1) / M, no antialias), the registers after the class token, pre-norm blocks with LayerScale, the
    final norm."""
    s = {k: v.double() for k, v in state.items()}
    x = F.conv2d(pixels.double(), s["patch_embed.proj.weight"], s["patch_embed.proj.bias"], stride=14)
    b, width, g, _ = x.shape
    x = torch.cat([s["cls_token"].expand(b, -1, -1), x.flatten(2).transpose(1, 2)], dim=1)
    pos = s["pos_embed"]
    m = int(math.isqrt(pos.shape[1] - 1))
    patches = pos[:, 1:]
    if m != g:
        patches = F.interpolate(patches.reshape(1, m, m, width).permute(0, 3, 1, 2), mode="bicubic", antialias=False,
                                scale_factor=((g + 0.1) / m, (g + 0.1) / m)).permute(0, 2, 3, 1).reshape(1, g * g, width)
    x = x + torch.cat([pos[:, :1], patches], dim=1)
    x = torch.cat([x[:, :1], s["register_tokens"].expand(b, -1, -1), x[:, 1:]], dim=1)
    depth = len({k.split(".")[1] for k in s if k.startswith("blocks.")})
    for i in range(depth):
        p = {k[len(f"blocks.{i}."):]: v for k, v in s.items() if k.startswith(f"blocks.{i}.")}
        h = F.layer_norm(x, (width,), p["norm1.weight"], p["norm1.bias"], eps=1e-6)
        q, k, v = (h @ p["attn.qkv.weight"].T + p["attn.qkv.bias"]).reshape(b, -1, 3, heads, width // heads) \
            .permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(width // heads), dim=-1) @ v
        a = a.transpose(1, 2).reshape(b, -1, width) @ p["attn.proj.weight"].T + p["attn.proj.bias"]
        x = x + p["ls1.gamma"] * a
        h = F.layer_norm(x, (width,), p["norm2.weight"], p["norm2.bias"], eps=1e-6)
        h = F.gelu(h @ p["mlp.fc1.weight"].T + p["mlp.fc1.bias"]) @ p["mlp.fc2.weight"].T + p["mlp.fc2.bias"]
        x = x + p["ls2.gamma"] * h
    return F.layer_norm(x, (width,), s["norm.weight"], s["norm.bias"], eps=1e-6)[:, 0]


@pytest.mark.parametrize("size", [70, 64])  # the checkpoint's 5x5 grid as it is, and interpolated to 4x4
def test_dinov2_checkpoint_in_the_official_format_gives_the_official_cls_token(tmp_path, size):
    path = write_dinov2_checkpoint(tmp_path / "dinov2_tiny_reg4_pretrain.pth", ARCH, grid=5)
    encoder = AuxiliaryEncoder(AuxiliarySpec("dinov2", ARCH, str(path)), size, "cpu")
    pixels = torch.randn(3, 3, size, size, generator=torch.Generator().manual_seed(1))
    got = encoder.encode_images(pixels)
    want = F.normalize(official_cls(official_dinov2_state(ARCH, 5), pixels, ARCHS[ARCH][2]), dim=-1)
    assert got.dtype == torch.float32 and got.shape == (3, ARCHS[ARCH][0])
    # float32 against float64 through two blocks of width 32: a few float32 roundings of unit-scale activations
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)


def test_a_checkpoint_of_another_architecture_is_refused_naming_it(tmp_path):
    state = {k: v for k, v in official_dinov2_state(ARCH).items() if not k.startswith("blocks.1.")}  # one block
    torch.save(state, tmp_path / "shallow.pth")
    with pytest.raises(ValueError, match=r"shallow.pth does not fit DINOv2 arch 'bca-tiny-dinov2'"):
        AuxiliaryEncoder(AuxiliarySpec("dinov2", ARCH, str(tmp_path / "shallow.pth")), 70, "cpu")
    torch.save({"weight": torch.zeros(1)}, tmp_path / "other.pth")
    with pytest.raises(ValueError, match="not a DINOv2 checkpoint with registers in the official format"):
        AuxiliaryEncoder(AuxiliarySpec("dinov2", ARCH, str(tmp_path / "other.pth")), 70, "cpu")


def test_auxiliary_features_are_cached_once_beside_clip_and_shared(tmp_path, monkeypatch):
    register_tiny_models()
    build_dataset("dtd", tmp_path / "data", num_classes=3, per_class=2)
    aux = AuxiliarySpec("dinov2", ARCH, str(write_dinov2_checkpoint(tmp_path / "tiny.pth", ARCH)))
    kwargs = dict(views="augmix2", num_workers=0, device="cpu")
    bench = load_benchmark("dtd", tmp_path / "data", tmp_path / "cache", TINY_VIT, auxiliary=(aux,), **kwargs)
    feats = bench.auxiliary["dinov2"]
    assert feats.shape == (6, ARCHS[ARCH][0]) and feats.dtype == torch.float32
    torch.testing.assert_close(feats.norm(dim=-1), torch.ones(6), atol=2e-3, rtol=0)  # float16 storage
    entries = sorted(p.name for p in (tmp_path / "cache" / "features").iterdir() if not p.name.endswith(".lock"))
    assert len(entries) == 2  # CLIP's entry and DINOv2's, side by side

    # the entry holds every view of the same images: view 0 is the original, as the benchmark hands it on
    entry = FeatureCache(tmp_path / "cache").get_or_encode_auxiliary(aux, BackboneSpec(TINY_VIT), "dtd",
                                                                    tmp_path / "data", "augmix2", 1, num_workers=0,
                                                                    device="cpu")
    assert not entry.encoded and entry.features.shape == (6, 3, ARCHS[ARCH][0])
    assert entry.image_ids == bench.image_ids
    torch.testing.assert_close(entry.features[:, 0], feats)

    def refuse(*args, **kwargs):
        raise AssertionError("an encoder was loaded")

    monkeypatch.setattr(cache_module, "AuxiliaryEncoder", refuse)
    monkeypatch.setattr(cache_module, "shared_backbone", refuse)
    again = load_benchmark("dtd", tmp_path / "data", tmp_path / "cache", TINY_VIT, auxiliary=(aux,), **kwargs)
    torch.testing.assert_close(again.auxiliary["dinov2"], feats)
