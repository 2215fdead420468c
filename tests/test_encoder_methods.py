"""The methods that adapt CLIP's image encoder (Tent, SAR, DeYO, WATT) against per-batch references written from
their official code, run in float64 on open_clip's tiny towers with random weights, on streams where adaptation
changes the predictions; a stream in parts and a restored state equal it at once; the inputs they refuse."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from orchestrator.clip.backbone import load_backbone
from orchestrator.clip.testing import TINY_RN, TINY_VIT, register_tiny_models
from orchestrator.methods import make_method
from orchestrator.methods.deyo.reference import run_reference as deyo_reference
from orchestrator.methods.sar.reference import run_reference as sar_reference
from orchestrator.methods.tent.reference import run_reference as tent_reference
from orchestrator.methods.watt.reference import run_reference as watt_reference

K, N, B = 4, 12, 4
EPS32 = torch.finfo(torch.float32).eps
_TOWERS: dict = {}


def tower(model: str):
    """The tiny tower, N noise images, and class embeddings from the first K images' centred features (random towers
    map every image near one direction; centred, the first K are confident and the rest mixed and unsure)."""
    if model not in _TOWERS:
        register_tiny_models()
        backbone = load_backbone(model, None, "cpu")
        images = torch.randn(N, 3, 64, 64, generator=torch.Generator().manual_seed(0))
        # on one thread, whatever the suite's setting: a random tower's features differ by little, so the centred
        # embeddings (and which images are confident) would follow the summation order of the threads
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            features = backbone.encode_images(images)
        finally:
            torch.set_num_threads(threads)
        _TOWERS[model] = backbone.model.visual, images, F.normalize(features[:K] - features.mean(0), dim=-1)
    return _TOWERS[model]


def zero_shot(vision, images, emb):
    with torch.no_grad():
        return torch.softmax(100.0 * F.normalize(vision.eval()(images), dim=-1) @ emb.T, dim=1)


def check(post: torch.Tensor, reference) -> None:
    """Predictions identical to the float64 reference; posteriors within float32's drift from it: the same reference
    run in float32 measures how far float32 rounding carries through the adaptation on this stream, and the method
    (float32, its own order of operations) may be a few times that away, plus a few ulps of a posterior."""
    truth, in_float32 = reference(torch.float64), reference(torch.float32)
    drift = float((in_float32.double() - truth).abs().max())
    assert torch.equal(post.argmax(1), truth.argmax(1))
    assert float((post.double() - truth).abs().max()) <= 4 * drift + 8 * EPS32


CASES = [(TINY_VIT, {"lr": 0.01}), (TINY_RN, {"lr": 0.01}),
         (TINY_VIT, {"lr": 0.5, "optimizer": "sgd", "steps": 2, "episodic": True})]


@pytest.mark.parametrize("model,hp", CASES)
def test_tent_equals_its_reference_and_adapting_changes_predictions(model, hp):
    vision, images, emb = tower(model)
    post = make_method("tent", emb, torch.arange(K), K, batch_size=B, vision=vision, **hp).run(images).posteriors
    check(post, lambda dtype: tent_reference(images, vision, emb, batch_size=B, dtype=dtype, **hp))
    assert (post.argmax(1) != zero_shot(vision, images, emb).argmax(1)).sum() >= 2


@pytest.mark.parametrize("reset_constant", [0.0, 0.4])
def test_sar_equals_its_reference_through_its_filter_and_recovery(reset_constant):
    """0.0: never recovered, the adaptation changes predictions; 0.4: the confident first batch's loss puts the moving
    average below it, so the model is recovered (reset) along the stream."""
    vision, images, emb = tower(TINY_VIT)
    hp = {"lr": 2.0, "margin": 0.6, "reset_constant": reset_constant}
    trace = make_method("sar", emb, torch.arange(K), K, batch_size=B, vision=vision, **hp).run(images)
    check(trace.posteriors, lambda dtype: sar_reference(images, vision, emb, batch_size=B, dtype=dtype, **hp)[0])
    assert trace.gated.any() and not trace.gated.all()  # the reliable-entropy filter leaves some images out
    if reset_constant:
        assert sar_reference(images, vision, emb, batch_size=B, **hp)[1] >= 1
    else:
        assert (trace.predictions != zero_shot(vision, images, emb).argmax(1)).sum() >= 2


def test_deyo_equals_its_reference_through_its_entropy_and_plpd_filters():
    """A PLPD threshold of 0 keeps the confident images whose prediction the patch shuffle lowers at all."""
    vision, images, emb = tower(TINY_VIT)
    hp = {"lr": 0.5, "margin": 0.8, "plpd_threshold": 0.0}
    trace = make_method("deyo", emb, torch.arange(K), K, batch_size=B, vision=vision, **hp).run(images)
    check(trace.posteriors, lambda dtype: deyo_reference(images, vision, emb, batch_size=B, dtype=dtype, **hp))
    assert trace.gated.any() and not trace.gated.all()
    assert (trace.predictions != zero_shot(vision, images, emb).argmax(1)).sum() >= 2


@pytest.mark.parametrize("variant,noise,order,batch", [
    ("sequential", 0.3, list(range(N)), B),
    # WATT-P: a fresh Adam per template turns a flat loss's rounding noise into steps (the method's docstring), so
    # its stream keeps two confident images of different classes in each batch and the templates near the classes
    ("parallel", 0.1, [0, 1, 4, 5, 6, 7, 2, 3, 8, 9, 10, 11], 6)])
def test_watt_equals_its_reference_through_its_templates_and_averages(variant, noise, order, batch):
    """Three templates (each class's embedding moved a different way), two rounds of two steps each: the class
    embeddings hold one row per (template, class), template-major, as the 'watt8' set lays them out."""
    vision, images, emb = tower(TINY_VIT)
    images = images[order]
    noise = noise * torch.randn(3, *emb.shape, generator=torch.Generator().manual_seed(1))
    templates = F.normalize(emb + noise, dim=-1)
    hp = {"lr": 0.01, "variant": variant, "template_steps": 2, "rounds": 2}
    trace = make_method("watt", templates.reshape(3 * K, -1), torch.arange(3 * K) % K, K, batch_size=batch,
                        vision=vision, **hp).run(images)
    check(trace.posteriors, lambda dtype: watt_reference(images, vision, templates, batch_size=batch, dtype=dtype,
                                                          **hp))
    assert (trace.predictions != zero_shot(vision, images, F.normalize(templates.mean(0), dim=-1)).argmax(1)).sum() >= 2


def test_watt_refuses_unequal_templates_and_a_tower_without_layernorms():
    vision, images, emb = tower(TINY_VIT)
    templates = F.normalize(emb + 0.3 * torch.randn(3, *emb.shape, generator=torch.Generator().manual_seed(1)), dim=-1)
    with pytest.raises(ValueError, match=r"every class needs the same number of embeddings; got \[2, 1, 1, 1\]"):
        make_method("watt", templates[0, [0, 0, 1, 2, 3]], torch.tensor([0, 0, 1, 2, 3]), K, vision=vision)
    with pytest.raises(ValueError, match=r"watt: the vision tower ModifiedResNet has no parameters of the kind"):
        make_method("watt", emb, torch.arange(K), K, vision=tower(TINY_RN)[0])


def test_parts_and_a_restored_state_equal_the_stream_at_once():
    """A continual run fed in parts of whole batches equals it at once, and a fresh method given the state saved
    after the first part (what a resumed run loads from its state file) goes on to the same rows."""
    vision, images, emb = tower(TINY_VIT)
    hp = {"lr": 2.0, "margin": 0.6, "reset_constant": 0.0}

    def sar():
        return make_method("sar", emb, torch.arange(K), K, batch_size=B, vision=vision, **hp)

    whole = sar().run(images)
    first = sar()
    head = first.run(images[:B])
    state = {k: v.numpy() for k, v in head.state.items()}  # as the state file stores it
    resumed = sar()
    resumed.load_state_tensors(state)
    tail = resumed.run(images[B:])
    assert torch.equal(torch.cat([head.posteriors, tail.posteriors]), whole.posteriors)
    assert torch.equal(first.run(images[B:]).posteriors, tail.posteriors)
    assert {k for k in state if k.startswith("opt__")} and "x__ema" in state


def test_what_the_methods_refuse():
    vision, images, emb = tower(TINY_VIT)
    with pytest.raises(ValueError, match=r"tent: adapts CLIP's image encoder, so it needs vision=<the backbone's "
                                         r"vision tower>"):
        make_method("tent", emb, torch.arange(K), K)
    with pytest.raises(ValueError, match=r"tda: takes no vision tower \(vision=...\)"):
        make_method("tda", emb, torch.arange(K), K, vision=vision)
    with pytest.raises(ValueError, match=r"precision 'amp_fp16' \(CUDA fp16 autocast\) needs a CUDA device, the run "
                                         r"is on cpu"):
        make_method("tent", emb, torch.arange(K), K, vision=vision, precision="amp_fp16")
    with pytest.raises(ValueError, match=r"tent: images must be float32 \[n, 3, H, W\]"):
        make_method("tent", emb, torch.arange(K), K, vision=vision).run(images[:, 0])


def test_the_cards_memory_per_image_is_the_measured_one():
    """The cards' mb_per_image is the activation memory one image's step keeps through ViT-B/16's vision tower;
    BATCLIP's text_mb_per_class, one class prompt's through its text tower with the norm layers trainable."""
    import open_clip

    from orchestrator.methods.encoder import saved_bytes_per_image
    from orchestrator.methods.prompt import TextTower
    from orchestrator.registry import method_card, method_cards

    model = open_clip.create_model("ViT-B-16", pretrained=None)
    measured = saved_bytes_per_image(model.visual, 224) / 2**20
    for name in ("tent", "sar", "deyo", "watt"):
        assert method_card(name).image_encoder.mb_per_image == round(measured, 1)
    per_class = TextTower(model).saved_bytes_per_prompt(77, norm=True) / 2**20
    assert method_card("batclip").image_encoder.text_mb_per_class == round(per_class, 1)
    # PromptAlign's text step backpropagates to the first layer's tokens, as a prompt-tuning step does
    assert method_card("promptalign").image_encoder.text_mb_per_class == round(
        TextTower(model).saved_bytes_per_prompt(77) / 2**20, 1)
    assert [c.name for c in method_cards() if c.image_encoder and c.image_encoder.text_mb_per_class] == [
        "promptalign", "batclip"]


def lora_tent(lora):
    """Tent with its card's image_encoder set to LoRA adapters (a method choosing params 'lora')."""
    from dataclasses import replace

    from orchestrator.methods.tent.card import NORM_STEP
    from orchestrator.methods.tent.method import Tent
    from orchestrator.registry import method_card
    from orchestrator.registry.card import ImageEncoderUse

    card = replace(method_card("tent"), image_encoder=ImageEncoderUse("lora", "episodic", NORM_STEP, lora=lora))

    class LoRATent(Tent):
        @classmethod
        def card(cls):
            return card

    return LoRATent


@pytest.mark.parametrize("model,targets,hp", [(TINY_VIT, ("q", "v"), {"lr": 0.05, "steps": 1}),
                                              (TINY_RN, ("q", "k", "v", "out"), {"lr": 5.0, "steps": 1})])
def test_lora_adapters_start_as_clip_and_their_updates_change_predictions(model, targets, hp):
    """B starts at zero, so the first batch (predicted by the forward that adapts, as Tent does) is zero-shot CLIP's
    up to the attention kernels' rounding (a few float32 ulps of a posterior); the steps move A and B alone, and each
    adapted projection is W + (alpha / rank) B A; the state restores them."""
    from orchestrator.registry.card import LoRA

    vision, images, emb = tower(model)
    lora = LoRA(rank=2, alpha=4.0, targets=targets)
    def make():
        method = lora_tent(lora)(emb, torch.arange(K), K, vision=vision, optimizer="adam", episodic=False,
                                 precision="fp32", logit_scale=100.0, **hp)
        method.batch_size = B
        return method

    method = make()
    trace = method.run(images)
    clip = zero_shot(vision, images, emb)
    assert torch.equal(trace.predictions[:B], clip.argmax(1)[:B])
    assert float((trace.posteriors[:B] - clip[:B]).abs().max()) <= 16 * EPS32
    assert (trace.predictions != clip.argmax(1)).sum() >= 2
    names = [name for name, _ in method.adapted]
    assert names and all(".A." in n or ".B." in n for n in names)
    assert all("parametrizations" in k for k in trace.state if k.startswith("enc__"))
    frozen = dict(vision.named_parameters())
    for name, p in method.model.named_parameters():  # the originals and every other weight as CLIP's
        if name.endswith(".original"):
            assert torch.equal(p, frozen[name.replace(".parametrizations", "").replace(".original", "")])
        elif name not in names:
            assert torch.equal(p, frozen[name])
    delta = next(m for m in method.model.modules() if type(m).__name__ == "LoRADelta")
    a, b = delta.A[0].detach(), delta.B[0].detach()
    assert float(b.abs().max()) > 0
    owner = next(m for m in method.model.modules() if hasattr(m, "parametrizations")
                 and delta in [*m.parametrizations.values()][0])
    weight_name = next(iter(owner.parametrizations.keys()))
    original = getattr(owner.parametrizations, weight_name).original
    expected = original.detach().clone()
    expected[: b.shape[0]] += (lora.alpha / lora.rank) * (b @ a)  # the first chosen chunk: q
    if model == TINY_VIT:  # packed q, k, v: v's adapter is on the third chunk, k's untouched
        expected[2 * b.shape[0]:] += (lora.alpha / lora.rank) * (delta.B[1] @ delta.A[1]).detach()
    torch.testing.assert_close(getattr(owner, weight_name).detach(), expected, rtol=0, atol=0)
    resumed = make()  # the adapters and Adam's state as a run's state file gives them back
    resumed.load_state_tensors({k: v.numpy() for k, v in trace.state.items()})
    assert torch.equal(resumed.run(images[:B]).posteriors, method.run(images[:B]).posteriors)


def test_lora_settings_refused_with_their_field():
    from orchestrator.registry.card import ImageEncoderUse, LoRA

    with pytest.raises(ValueError, match=r"LoRA rank must be an int >= 1, got 0"):
        LoRA(rank=0)
    with pytest.raises(ValueError, match=r"LoRA targets must be distinct names of \('q', 'k', 'v', 'out'\), got "
                                         r"\('qkv',\)"):
        LoRA(targets=("qkv",))
    with pytest.raises(ValueError, match=r"image encoder lora is set but params is 'norm'; expected params 'lora'"):
        ImageEncoderUse("norm", False, 1.0, lora=LoRA())
    assert ImageEncoderUse("lora", False, 1.0).lora == LoRA()
