"""Backbone loading through open_clip with tiny registered configs; weights resolution without the network."""

from __future__ import annotations

import time

import pytest
import torch

from orchestrator.clip import BackboneSpec, WeightsNotFoundError, load_backbone, resolve_weights
from orchestrator.clip.backbone import precision_for
from orchestrator.clip.testing import TINY_RN, TINY_VIT, register_tiny_models
from orchestrator.device import auto_device


@pytest.fixture(scope="module", autouse=True)
def tiny_models():
    register_tiny_models()


@pytest.fixture(autouse=True)
def no_downloads(monkeypatch):
    """Any attempt to fetch weights fails the test instead of touching the network."""
    import open_clip

    def refuse(*args, **kwargs):
        raise AssertionError("a test tried to download weights")

    monkeypatch.setattr(open_clip, "download_pretrained", refuse)


def _pixels(n=3, size=64, seed=0):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("model", [TINY_VIT, TINY_RN])
def test_random_backbone_encodes_normalised_float32(model):
    bb = load_backbone(model, None, device="cpu")
    assert bb.device.type == "cpu" and bb.precision == "fp32" and bb.embed_dim == 64
    img = bb.encode_images(_pixels())
    txt = bb.encode_texts(["a photo of a cat.", "a photo of a dog.", "x"])
    for feats in (img, txt):
        assert feats.shape == (3, 64) and feats.dtype == torch.float32
        torch.testing.assert_close(feats.norm(dim=-1), torch.ones(3))
    assert bb.encoder_calls == 3
    assert bb.resolved.preprocess["size"] == 64  # follows the model's own input size


def test_random_init_is_the_same_in_every_process():
    a = load_backbone(TINY_VIT, None, device="cpu")
    b = load_backbone(TINY_VIT, None, device="cpu")
    torch.testing.assert_close(a.encode_images(_pixels()), b.encode_images(_pixels()))


def test_auto_device_and_precision():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert auto_device(None).type == expected and auto_device("auto").type == expected
    assert precision_for(torch.device("cuda")) == "amp_fp16"
    assert precision_for(torch.device("cpu")) == "fp32"


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_state_dict_checkpoint_round_trips(tmp_path, suffix):
    source = load_backbone(TINY_VIT, None, device="cpu")
    with torch.no_grad():  # make the weights differ from the random init the loader starts from
        for p in source.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    path = tmp_path / f"tiny{suffix}"
    if suffix == ".pt":
        torch.save(source.model.state_dict(), path)
    else:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in source.model.state_dict().items()}, str(path))
    loaded = load_backbone(TINY_VIT, str(path), device="cpu")
    assert loaded.resolved.weights_id.startswith("sha256:") and not loaded.resolved.torchscript
    assert loaded.resolved.quick_gelu is False
    torch.testing.assert_close(loaded.encode_images(_pixels()), source.encode_images(_pixels()))
    torch.testing.assert_close(loaded.encode_texts(["a b c"]), source.encode_texts(["a b c"]))


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::FutureWarning")
def test_openai_style_torchscript_archive_loads_with_quick_gelu(tmp_path):
    """OpenAI's originals are TorchScript and trained with QuickGELU; a file carries no activation flag."""
    source = load_backbone(TINY_VIT, None, device="cpu", quick_gelu=True)
    tokens = source.tokenizer(["a", "b"])
    traced = torch.jit.trace(source.model, (_pixels(2), tokens), check_trace=False)
    path = tmp_path / "ViT-tiny.pt"
    traced.save(str(path))

    loaded = load_backbone(TINY_VIT, str(path), device="cpu")
    assert loaded.resolved.torchscript and loaded.resolved.quick_gelu
    torch.testing.assert_close(loaded.encode_images(_pixels()), source.encode_images(_pixels()))

    plain_gelu = load_backbone(TINY_VIT, str(path), device="cpu", quick_gelu=False)
    assert not torch.allclose(plain_gelu.encode_images(_pixels()), source.encode_images(_pixels()), atol=1e-4)


def test_checkpoint_for_another_architecture_is_a_clear_error(tmp_path):
    path = tmp_path / "rn.pt"
    torch.save(load_backbone(TINY_RN, None, device="cpu").model.state_dict(), path)
    with pytest.raises(ValueError, match=f"checkpoint {path} does not fit model '{TINY_VIT}'"):
        load_backbone(TINY_VIT, str(path), device="cpu")


def test_unknown_model_suggests_close_names():
    with pytest.raises(ValueError, match=r"unknown model 'bca-tiny-vt'.*did you mean.*bca-tiny-vit.*add_model_config"):
        resolve_weights(BackboneSpec("bca-tiny-vt"))


def test_openai_slash_names_are_accepted():
    assert resolve_weights(BackboneSpec("ViT-B/16")).model == "ViT-B-16"


def test_missing_weights_file(tmp_path):
    missing = tmp_path / "ViT-B-16.pt"
    with pytest.raises(WeightsNotFoundError, match=f"weights file '{missing}'.*does not exist"):
        resolve_weights(BackboneSpec(TINY_VIT, str(missing)))


def test_unknown_tag_lists_the_models_tags():
    with pytest.raises(ValueError, match=r"'laion9b' is neither a tag of model 'RN50' \(its tags: .*openai"):
        resolve_weights(BackboneSpec("RN50", "laion9b"))


def test_tag_not_on_this_machine_fails_fast_naming_places_and_remedies(tmp_path):
    started = time.perf_counter()
    with pytest.raises(WeightsNotFoundError) as err:
        resolve_weights(BackboneSpec("ViT-B-16", "openai"), weights_dir=str(tmp_path))
    message = str(err.value)
    assert time.perf_counter() - started < 5  # no network attempt behind the user's back
    assert "'ViT-B-16' with tag 'openai'" in message
    assert f"Hugging Face cache {tmp_path}: timm/vit_base_patch16_clip_224.openai/open_clip_model.safetensors" \
        in message
    assert str(tmp_path / "ViT-B-16.pt") in message
    assert "allow_download" in message and "checkpoint file" in message


def test_tag_found_in_the_url_cache(tmp_path):
    (tmp_path / "RN50.pt").write_bytes(b"stand-in")
    resolved = resolve_weights(BackboneSpec("RN50", "openai"), weights_dir=str(tmp_path))
    assert resolved.path == str(tmp_path / "RN50.pt")
    assert resolved.weights_id == "tag:RN50:openai"
    assert resolved.quick_gelu  # the tag says OpenAI's weights use QuickGELU
    assert resolved.preprocess["size"] == 224 and resolved.preprocess["interpolation"] == "bicubic"


def test_tag_found_in_the_hugging_face_cache_layout(tmp_path):
    repo = tmp_path / "models--timm--vit_base_patch16_clip_224.openai"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "open_clip_model.safetensors").write_bytes(b"stand-in")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    resolved = resolve_weights(BackboneSpec("ViT-B-16", "openai"), weights_dir=str(tmp_path))
    assert resolved.path == str(snapshot / "open_clip_model.safetensors")
    assert resolved.quick_gelu


def test_explicit_quick_gelu_overrides_the_tag(tmp_path):
    (tmp_path / "RN50.pt").write_bytes(b"stand-in")
    assert not resolve_weights(BackboneSpec("RN50", "openai", quick_gelu=False), weights_dir=str(tmp_path)).quick_gelu
