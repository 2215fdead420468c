"""Test helpers shared by every test suite: tiny open_clip models and tiny datasets in the real layouts.

Nothing here touches the network. The tiny models are ordinary open_clip configs registered with
`open_clip.add_model_config`, so they run exactly the code path of the paper's backbones (random weights:
pretrained=None, or a checkpoint file saved from one). The dataset builders write a few small images per
class in each layout of docs/real-data.md, for end-to-end tests of readers, cache and sweep.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from orchestrator.data.datasets import EUROSAT_RENAMES, imagenet_wnids
from orchestrator.registry import DATASETS, canonical_dataset, paper_datasets
from orchestrator.registry.corruptions import CORRUPTIONS

TINY_VIT = "bca-tiny-vit"  # 2-layer width-128 ViT at 64 px, patch 16, 64-d embeddings: ~7.2M parameters
TINY_RN = "bca-tiny-rn"  # ModifiedResNet [1, 1, 1, 1] width 16 at 64 px: the RN50 code path, ~6.9M parameters
# SigLIP's head (a learned logit bias: open_clip's sigmoid scoring) and text tower (open_clip's custom text tower
# without a causal mask, pooled at the last token, as ViT-B-16-SigLIP.json) on TINY_VIT's vision tower, with CLIP's
# tokenizer (SigLIP's own needs transformers and the Hugging Face Hub); random init as open_clip's: logit scale
# 1 / 0.07, bias -10
TINY_SIGLIP = "bca-tiny-sig"  # not "siglip": open_clip gives a name with it SigLIP's T5 tokenizer

_TEXT = {"context_length": 77, "vocab_size": 49408, "width": 128, "heads": 2, "layers": 2}
_VIT = {"image_size": 64, "layers": 2, "width": 128, "patch_size": 16, "head_width": 64}
TINY_CONFIGS = {
    TINY_VIT: {"embed_dim": 64, "vision_cfg": _VIT, "text_cfg": _TEXT},
    TINY_RN: {"embed_dim": 64, "vision_cfg": {"image_size": 64, "layers": [1, 1, 1, 1], "width": 16,
                                              "head_width": 64}, "text_cfg": _TEXT},
    TINY_SIGLIP: {"embed_dim": 64, "init_logit_bias": -10, "custom_text": True, "vision_cfg": _VIT,
                  "text_cfg": {**_TEXT, "context_length": 64, "no_causal_mask": True, "proj_bias": True,
                               "pool_type": "last", "norm_kwargs": {"eps": 1e-6}}},
}


def write_model_config(name: str, directory: str | Path) -> Path:
    """Write tiny config `name` as <directory>/<name>.json (what a sweep spec's backbone `config` points at,
    so Ray trial processes register it too); returns the file."""
    path = Path(directory) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(TINY_CONFIGS[name]))
    return path


def register_tiny_models() -> tuple[str, ...]:
    """Register the tiny configs with open_clip in this process (idempotent); returns their model names."""
    import open_clip

    missing = [name for name in TINY_CONFIGS if name not in open_clip.list_models()]
    if missing:
        directory = Path(tempfile.mkdtemp(prefix="bca-tiny-models-"))
        for name in missing:
            write_model_config(name, directory)
        open_clip.add_model_config(directory)
    return tuple(TINY_CONFIGS)


def official_dinov2_state(arch: str = "bca-tiny-dinov2", grid: int = 5, seed: int = 0) -> dict:
    """A random DINOv2 state dict in the official checkpoint's format (facebookresearch/dinov2
    DinoVisionTransformer with 4 registers: its key names and shapes, a `grid` x `grid` position grid, non-trivial
    LayerScale and norms), as `dinov2_vitl14_reg4_pretrain.pth` holds the real weights."""
    import torch

    from orchestrator.clip.auxiliary import ARCHS, PATCH, REGISTERS

    width, depth, _ = ARCHS[arch]
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 0.1) -> torch.Tensor:
        return scale * torch.randn(*shape, generator=gen)

    state = {"cls_token": rand(1, 1, width), "pos_embed": rand(1, 1 + grid * grid, width),
             "register_tokens": rand(1, REGISTERS, width), "mask_token": rand(1, width),
             "patch_embed.proj.weight": rand(width, 3, PATCH, PATCH, scale=0.05), "patch_embed.proj.bias": rand(width),
             "norm.weight": 1 + rand(width), "norm.bias": rand(width)}
    for b in range(depth):
        for name, shape in (("norm1.weight", (width,)), ("norm1.bias", (width,)),
                            ("attn.qkv.weight", (3 * width, width)),
                            ("attn.qkv.bias", (3 * width,)), ("attn.proj.weight", (width, width)),
                            ("attn.proj.bias", (width,)), ("ls1.gamma", (width,)), ("norm2.weight", (width,)),
                            ("norm2.bias", (width,)), ("mlp.fc1.weight", (4 * width, width)),
                            ("mlp.fc1.bias", (4 * width,)), ("mlp.fc2.weight", (width, 4 * width)),
                            ("mlp.fc2.bias", (width,)), ("ls2.gamma", (width,))):
            state[f"blocks.{b}.{name}"] = (1 + rand(*shape)) if name.startswith("norm") and "weight" in name \
                else rand(*shape, scale=0.5 if "ls" in name else 0.2)
    return state


def write_dinov2_checkpoint(path: str | Path, arch: str = "bca-tiny-dinov2", grid: int = 5, seed: int = 0) -> Path:
    """`official_dinov2_state` saved as the official .pth is (a plain torch.save of the state dict)."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(official_dinov2_state(arch, grid, seed), path)
    return path


# --------------------------------------------------------------------------------------------- images


def image_pixels(label: int, index: int, size: int = 32, noise: float = 25.0) -> np.ndarray:
    """uint8 [size, size, 3]: a colour that depends on the class (so features differ by class), plus seeded noise."""
    rng = np.random.default_rng(1000 * label + index)
    base = np.array([(53 * label) % 256, (97 * label + 80) % 256, (151 * label + 160) % 256], dtype=np.float32)
    return np.clip(base + rng.normal(0, noise, size=(size, size, 3)), 0, 255).astype(np.uint8)


def write_image(path: Path, label: int, index: int, size: int = 32, noise: float = 25.0) -> None:
    """A small image of `image_pixels`, as PNG or JPEG by the file's suffix."""
    pixels = image_pixels(label, index, size, noise)
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower()
    Image.fromarray(pixels).save(path, format="PNG" if suffix == ".png" else "JPEG")


def write_corrupt_image(path: Path, truncated: bool = False) -> None:
    """Overwrite `path` with bytes no decoder recognises, or (truncated=True) with the first half of a JPEG."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if truncated:
        write_image(path, label=0, index=0, size=64)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(b"this is not an image")


def _file_names(per_class: int, ext: str) -> list[str]:
    """Image names including ones with 'sh' in them, which the public reader's listing helper drops."""
    names = ["sketch_0", "fish_1", "img_2", "img_3", "shadow_4", "img_5"]
    return [f"{names[i % len(names)]}{'' if i < len(names) else i}{ext}" for i in range(per_class)]


# --------------------------------------------------------------------------------------------- layouts


def _wnid_layout(base: Path, wnids: list[str], per_class: int, ext: str) -> None:
    for label, wnid in enumerate(wnids):
        for i, name in enumerate(_file_names(per_class, ext)):
            write_image(base / wnid / name, label, i)


def _split_layout(data_root: Path, name: str, num_classes: int, per_class: int) -> None:
    info = DATASETS[name]
    folder = data_root / info.folder
    if name == "eurosat":
        raw = list(EUROSAT_RENAMES)[:num_classes]
        # the split file may already carry the renamed names (CoOp's do): mix both forms
        classes = [EUROSAT_RENAMES[c] if i % 2 else c for i, c in enumerate(raw)]
    else:
        classes = [f"class_{k}_name" for k in range(num_classes)]
    entries = []
    for label, cname in enumerate(classes):
        for i, fname in enumerate(_file_names(per_class, ".jpg")):
            rel = f"{cname.replace(' ', '_')}/{fname}"
            write_image(folder / info.image_dir / rel, label, i)
            entries.append([rel, label, cname])
    split = {"train": entries[:1], "val": [], "test": entries}
    (folder / info.split_file).write_text(json.dumps(split))


def _aircraft_layout(data_root: Path, num_classes: int, per_class: int) -> None:
    folder = data_root / DATASETS["aircraft"].folder
    variants = [f"7{k}7-{100 + k}" for k in range(num_classes)]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "variants.txt").write_text("\n".join(variants) + "\n")
    lines = []
    for label, variant in enumerate(variants):
        for i in range(per_class):
            image = f"{1000000 + 10 * label + i}"
            write_image(folder / "images" / f"{image}.jpg", label, i)
            lines.append(f"{image} {variant}")
    (folder / "images_variant_test.txt").write_text("\n".join(lines) + "\n")


def build_dataset(name: str, data_root: str | Path, num_classes: int = 3, per_class: int = 2) -> Path:
    """Write a tiny copy of dataset `name` in its real layout under data_root; returns the dataset folder.

    ImageNet / -Sketch use the first ImageNet WordNet ids, -A / -R ids from their 200-class lists (every
    other one, so labels differ from folder positions), -V2 the class folders 0, 2, 10, ... (numeric order
    differs from string order). File names include 'sh' ('sketch_0', 'fish_1', 'shadow_4').
    """
    name = canonical_dataset(name)
    root = Path(data_root)
    info = DATASETS[name]
    table = imagenet_wnids()
    if name in ("imagenet", "imagenet-sketch"):
        _wnid_layout(root / info.folder / info.image_dir, table["imagenet"][:num_classes], per_class, ".JPEG")
    elif name in ("imagenet-a", "imagenet-r"):
        _wnid_layout(root / info.folder / info.image_dir, table[name][1:2 * num_classes:2], per_class, ".jpg")
    elif name == "imagenet-v2":
        base = root / info.folder / info.image_dir
        for k in range(num_classes):
            label = 0 if k == 0 else 2 * 5 ** (k - 1)  # 0, 2, 10, 50, ...: '10' sorts before '2' as strings
            for i in range(per_class):
                write_image(base / str(label) / f"{k}{i}abc.jpeg", label, i)
    elif name == "aircraft":
        _aircraft_layout(root, num_classes, per_class)
    else:
        _split_layout(root, name, num_classes, per_class)
    return root / info.folder


def build_corrupted(name: str, data_root: str | Path, corruptions: tuple[str, ...] = CORRUPTIONS,
                    num_classes: int = 3, per_class: int = 2) -> Path:
    """A tiny copy of corruption benchmark `name` (imagenet-c, cifar10-c, cifar100-c) in its released layout,
    every severity of each corruption given; returns its folder. Each image is a class colour whose noise grows
    with the severity (a stand-in: the fixture tests the layouts, not the corruptions). ImageNet-C: JPEG files in
    the first WordNet-id folders; CIFAR-C: `<corruption>.npy` uint8 [5 x num_classes x per_class, 32, 32, 3],
    severities stacked in order, and `labels.npy`."""
    from orchestrator.registry.corruptions import BENCHMARKS, FOLDERS, SEVERITIES, benchmark_key

    bench = BENCHMARKS[benchmark_key(name)]
    folder = Path(data_root) / bench.folder
    labels = [label for label in range(num_classes) for _ in range(per_class)]
    for c, corruption in enumerate(corruptions):
        if bench.kind == FOLDERS:
            wnids = imagenet_wnids()["imagenet"][:num_classes]
            for severity in SEVERITIES:
                for label, wnid in enumerate(wnids):
                    for i in range(per_class):
                        write_image(folder / corruption / str(severity) / wnid / f"ILSVRC2012_val_{label}{i:07d}.JPEG",
                                    label, 100 * c + i, noise=10.0 * severity)
        else:
            folder.mkdir(parents=True, exist_ok=True)
            rows = [image_pixels(label, 100 * c + i % per_class, 32, 10.0 * severity) for severity in SEVERITIES
                    for i, label in enumerate(labels)]
            np.save(folder / f"{corruption}.npy", np.stack(rows))
    if bench.kind != FOLDERS:
        np.save(folder / "labels.npy", np.array(labels * len(SEVERITIES), dtype=np.int64))
    return folder


def build_all(data_root: str | Path, num_classes: int = 3, per_class: int = 2) -> None:
    for name in paper_datasets():
        build_dataset(name, data_root, num_classes, per_class)


# ---------------------------------------------------------------------------------- learned starting points


def _dassl_training_state(param, epoch: int) -> dict:
    """The optimizer and scheduler entries of a Dassl checkpoint (CoOp's and MaPLe's configs: SGD, a cosine schedule
    behind a constant warmup epoch), a few steps in. Dassl's warmup scheduler keeps the cosine one as an attribute,
    so its state_dict, saved as the `scheduler` entry, pickles that scheduler (and its SGD optimizer) as objects."""
    import torch

    class Warmup(torch.optim.lr_scheduler.LRScheduler):
        def __init__(self, optimizer, successor, cons_lr: float) -> None:
            self.successor, self.warmup_epoch, self.cons_lr = successor, 1, cons_lr
            super().__init__(optimizer)

        def get_lr(self) -> list[float]:
            return [self.cons_lr for _ in self.base_lrs]

    optimizer = torch.optim.SGD([param], lr=0.0035, momentum=0.9, weight_decay=5e-4)
    scheduler = Warmup(optimizer, torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epoch), 1e-5)
    for _ in range(2):
        param.grad = torch.ones_like(param)
        optimizer.step()
        scheduler.step()
    return {"epoch": epoch, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "val_result": None}


def write_coop_context(directory: str | Path, model: str, class_names: list[str], n_ctx: int = 4, seed: int = 0,
                       epoch: int = 50, class_specific: bool = False) -> Path:
    """A CoOp context file as CoOp's trainer saves one (Dassl's save_checkpoint): `<directory>/prompt_learner/
    model.pth.tar-<epoch>`, {state_dict: {ctx, token_prefix, token_suffix}, epoch, optimizer, scheduler,
    val_result} (`_dassl_training_state`), for the classes given and the (random-weights) model named; ctx [n_ctx, width] (class_specific:
    [K, n_ctx, width]) drawn as CoOp initialises it (normal, std 0.02) from `seed`; returns the file."""
    import torch

    from orchestrator.clip.backbone import load_backbone

    register_tiny_models()
    backbone = load_backbone(model, None, "cpu")
    tokens = backbone.tokenizer([" ".join(["X"] * n_ctx) + f" {n.replace('_', ' ')}." for n in class_names])
    with torch.no_grad():
        embedding = backbone.model.token_embedding(tokens)
    width = int(embedding.shape[-1])
    g = torch.Generator().manual_seed(seed)
    ctx = 0.02 * torch.randn(*((len(class_names),) if class_specific else ()), n_ctx, width, generator=g)
    path = Path(directory) / "prompt_learner" / f"model.pth.tar-{epoch}"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {"ctx": ctx, "token_prefix": embedding[:, :1], "token_suffix": embedding[:, 1 + n_ctx:]},
                **_dassl_training_state(torch.nn.Parameter(ctx.clone()), epoch)}, path)
    return path


def write_maple_context(directory: str | Path, model: str = TINY_VIT, n_ctx: int = 2, depth: int = 2,
                        seed: int = 0, epoch: int = 5, class_names: tuple[str, ...] = ("dog", "cat")) -> Path:
    """A MaPLe checkpoint as its trainer saves one (Dassl's save_checkpoint of the whole CustomCLIP):
    `<directory>/MultiModalPromptLearner/model.pth.tar-<epoch>`, {state_dict, epoch, optimizer, scheduler,
    val_result}, the state_dict with the prompt learner's keys and shapes (`orchestrator.clip.context.load_maple`)
    for the (random-weights) model named, its token_prefix / token_suffix buffers for `class_names`, and some of
    CLIP's own weights beside them as the released files hold them all. ctx and the compound prompts are drawn from
    `seed` (normal, std 0.5: a tiny random tower's features then move visibly), the projections as nn.Linear
    initialises them; returns the file."""
    import torch

    from orchestrator.clip.backbone import load_backbone
    from orchestrator.clip.maple import class_tokens

    register_tiny_models()
    backbone = load_backbone(model, None, "cpu")
    clip = backbone.model
    w_t, w_v = int(clip.positional_embedding.shape[-1]), int(clip.visual.conv1.out_channels)
    with torch.no_grad():
        embedding = clip.token_embedding(class_tokens(backbone.tokenizer, list(class_names), n_ctx))
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):  # nn.Linear's init draws from the global generator
        torch.manual_seed(seed)
        proj, *layers = [torch.nn.Linear(w_t, w_v) for _ in range(depth)]
    state = {"prompt_learner.ctx": 0.5 * torch.randn(n_ctx, w_t, generator=g),
             "prompt_learner.proj.weight": proj.weight.detach(), "prompt_learner.proj.bias": proj.bias.detach()}
    for i, layer in enumerate(layers):
        state[f"prompt_learner.compound_prompts_text.{i}"] = 0.5 * torch.randn(n_ctx, w_t, generator=g)
        state[f"prompt_learner.compound_prompt_projections.{i}.weight"] = layer.weight.detach()
        state[f"prompt_learner.compound_prompt_projections.{i}.bias"] = layer.bias.detach()
    state.update({"prompt_learner.token_prefix": embedding[:, :1], "prompt_learner.token_suffix": embedding[:, 1 + n_ctx:],
                  "image_encoder.proj": clip.visual.proj.detach(),
                  "image_encoder.conv1.weight": clip.visual.conv1.weight.detach(), "text_encoder.text_projection":
                  clip.text_projection.detach(), "logit_scale": clip.logit_scale.detach()})
    path = Path(directory) / "MultiModalPromptLearner" / f"model.pth.tar-{epoch}"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": state, **_dassl_training_state(torch.nn.Parameter(state["prompt_learner.ctx"].clone()),
                                                             epoch)}, path)
    return path


def write_promptalign_statistics(directory: str | Path, model: str = TINY_VIT, n_ctx: int = 2, seed: int = 0,
                                 layers: int | None = None) -> tuple[Path, Path]:
    """PromptAlign's source statistics as its code saves them (`torch.save` of one tensor each,
    `<directory>/ImgNetpre_vis_means.pt` and `ImgNetpre_vis_vars.pt`): [layers, 1 + patches + n_ctx, width] for the
    (random-weights) model named, means normal and variances |normal| drawn from `seed`; `layers`: another count
    than the tower's (a wrong file). Returns (means, vars)."""
    import torch

    from orchestrator.clip.backbone import load_backbone

    register_tiny_models()
    visual = load_backbone(model, None, "cpu").model.visual
    shape = (len(visual.transformer.resblocks) if layers is None else layers,
             int(visual.positional_embedding.shape[0]) + n_ctx, int(visual.conv1.out_channels))
    g = torch.Generator().manual_seed(seed)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = directory / "ImgNetpre_vis_means.pt", directory / "ImgNetpre_vis_vars.pt"
    torch.save(torch.randn(*shape, generator=g), paths[0])
    torch.save(torch.randn(*shape, generator=g).abs(), paths[1])
    return paths


def promptalign_files(directory: str | Path, model: str = TINY_VIT) -> dict[str, str]:
    """A method entry's files for PromptAlign on the (random-weights) model named: a MaPLe context and source
    statistics written under `directory` ({context, vis_means, vis_vars}), for the suites that run every method."""
    context = write_maple_context(Path(directory) / "maple", model, n_ctx=2, depth=2)
    means, variances = write_promptalign_statistics(Path(directory) / "statistics", model, n_ctx=2)
    return {"context": str(context), "vis_means": str(means), "vis_vars": str(variances)}
