"""Prompt templates and class embeddings from the text encoder.

Named template sets:
- 'dataset': the dataset's own templates in the public protocol (its registry card);
- 'ensemble7': the 7-template ImageNet ensemble, 'clip80': CLIP's 80 ImageNet templates (both taken from
  open_clip.zero_shot_metadata);
- 'tpt1': "a photo of a {}.", the one prompt TPT-derived code (MTA's official runs) embeds per class;
- 'watt8': the eight templates of WATT's official templates.yaml, one embedding per (template, class) as
  'handcrafted' lays them out (WATT adapts on each template's embeddings and predicts with their average);
- 'handcrafted1'..'handcrafted4': the supplementary's M = K*t sets without ensembling ("a photo of a {}",
  "a origami {}", "art of the {}", "itap of a {}": the first t of them); embedding m is template m // K
  for class m % K.

Ensembled sets: each prompt is L2-normalised, prompts are averaged per class, and the mean is
L2-normalised again (M = K). Text embeddings are cached on disk (keyed by the backbone's identity, the
device's precision, the prompts and the mode) so a sweep's trials do not re-run the text encoder.

With a learned context the class embeddings are its prompts' through the text tower, one per class: CoOp's
(`orchestrator.clip.context.LearnedContext`: "X ... X <name>." with the context in the X's, as CoOp's CustomCLIP
classifies) or MaPLe's (`MapleContext`: its prompted text tower, `orchestrator.clip.maple`). The file's learned
prompts stand in for the template set, and the cache key holds the file's sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import torch
import torch.nn.functional as F

from orchestrator.clip.backbone import (
    Backbone,
    BackboneSpec,
    precision_for,
    resolve_weights,
    shared_backbone,
)
from orchestrator.device import auto_device
from orchestrator.registry import dataset_card
from orchestrator.registry.templates import TEMPLATE_SET_NAMES

HANDCRAFTED = ("a photo of a {}", "a origami {}", "art of the {}", "itap of a {}")
TPT1 = ("a photo of a {}.",)  # CoOp's prompt learner: ctx_init "a_photo_of_a" + " " + class name + "."
# Mehrdad-Noori/WATT@b11de14 templates.yaml, as written there (some end in a full stop, some do not)
WATT8 = ("a photo of a {}", "itap of a {}", "a bad photo of the {}.", "a origami {}.", "a photo of the large {}.",
         "a {} in a video game.", "art of the {}.", "a photo of the small {}.")

_TEXT_CACHE_VERSION = 1


@dataclass(frozen=True)
class TemplateSet:
    name: str
    templates: tuple[str, ...]
    ensemble: bool  # True: average per class (M = K); False: one embedding per (template, class) (M = K*t)
    # class name -> further prompts of that class, averaged with its templates (CuPL's descriptions)
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def _from_open_clip(templates) -> tuple[str, ...]:
    """open_clip ships templates as functions of the class name; turn them into '{}' strings."""
    out = tuple(t("{}") for t in templates)
    bad = [t for t in out if t.count("{}") != 1]
    if bad:
        raise ValueError(f"open_clip templates without exactly one class slot: {bad}")
    return out


def ensemble7() -> tuple[str, ...]:
    from open_clip.zero_shot_metadata import SIMPLE_IMAGENET_TEMPLATES

    return _from_open_clip(SIMPLE_IMAGENET_TEMPLATES)


def clip80() -> tuple[str, ...]:
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES

    return _from_open_clip(OPENAI_IMAGENET_TEMPLATES)


CUPL_DIR = Path("prompts") / "cupl"  # under the data root: where the CuPL prompt files go


def cupl_file(data_root: str | os.PathLike, dataset: str) -> Path:
    """Where the `cupl` template set reads a dataset's CuPL descriptions: <data_root>/prompts/cupl/<file> with
    the file name DPE's and DMN's repositories give it (gpt3_prompts/CuPL_prompts_<dataset>.json)."""
    return Path(data_root) / CUPL_DIR / dataset_card(dataset).cupl


def _cupl(dataset: str, prompts_root: str | os.PathLike | None) -> TemplateSet:
    """The dataset's own templates plus each class's CuPL descriptions, ensembled per class (DPE's prototypes)."""
    if prompts_root is None:
        raise ValueError("templates='cupl' needs the data root that holds prompts/cupl/")
    path = cupl_file(prompts_root, dataset)
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"templates='cupl': {path} does not exist; expected the CuPL prompt file of "
                         f"{dataset} from DPE's or DMN's repository (gpt3_prompts/{path.name})") from None
    except ValueError as exc:
        raise ValueError(f"templates='cupl': {path} is not valid JSON ({exc})") from None
    if not isinstance(table, dict) or not all(isinstance(v, list) for v in table.values()):
        raise ValueError(f"templates='cupl': {path} must map each class name to a list of prompts")
    own = resolve_templates("dataset", dataset=dataset)
    extra = {name.replace("_", " ").strip().lower(): tuple(prompts) for name, prompts in table.items()}
    return TemplateSet(f"cupl:{dataset_card(dataset).name}", own.templates, True, extra)


def resolve_templates(
    templates: str | list[str] | tuple[str, ...], dataset: str | None = None, ensemble: bool | None = None,
    data_root: str | os.PathLike | None = None,
) -> TemplateSet:
    """A named set (TEMPLATE_SET_NAMES) or explicit '{}' templates (ensembled unless ensemble=False); 'cupl' reads
    the dataset's CuPL prompts under `data_root`."""
    if isinstance(templates, str):
        name = templates.strip().lower()
        if name == "cupl":
            if dataset is None:
                raise ValueError("templates='cupl' needs the dataset name (dataset=...)")
            return _cupl(dataset, data_root)
        if name == "dataset":
            if dataset is None:
                raise ValueError("templates='dataset' needs the dataset name (dataset=...)")
            card = dataset_card(dataset)
            own = card.templates
            if isinstance(own, str):  # a named set, e.g. ensemble7
                return TemplateSet(f"dataset:{card.name}", resolve_templates(own).templates, True)
            return TemplateSet(f"dataset:{card.name}", own, True)
        if name == "ensemble7":
            return TemplateSet(name, ensemble7(), True)
        if name == "clip80":
            return TemplateSet(name, clip80(), True)
        if name == "tpt1":
            return TemplateSet(name, TPT1, True)
        if name == "watt8":
            return TemplateSet(name, WATT8, False)
        if name.startswith("handcrafted") and name[len("handcrafted"):] in ("1", "2", "3", "4"):
            return TemplateSet(name, HANDCRAFTED[: int(name[-1])], False)
        raise ValueError(f"unknown template set {templates!r}; named sets: {', '.join(TEMPLATE_SET_NAMES)}, "
                         f"or pass a list of templates with one '{{}}' for the class name")
    templates = tuple(templates)
    bad = [t for t in templates if t.count("{}") != 1]
    if not templates or bad:
        raise ValueError(f"templates must be a non-empty list of strings with exactly one '{{}}'; bad: {bad}")
    return TemplateSet("custom", templates, True if ensemble is None else ensemble)


TextProgress = Callable[[int, int], None] | None  # (prompts encoded, prompts)


def console_progress(label: str) -> Callable[[int, int], None]:
    """A console bar for text encoding (`bca cache`), opened at the first batch, when the total is known."""
    from tqdm.auto import tqdm

    bar = None

    def report(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc=label, unit="prompt", dynamic_ncols=True)
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return report


def _encode(backbone: Backbone, class_names: list[str], tset: TemplateSet, progress: TextProgress = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    if tset.extra:
        return _encode_per_class(backbone, class_names, tset, progress)
    K, t = len(class_names), len(tset.templates)
    # template-major order: row j*K + k is template j for class k, so class(m) = m % K
    prompts = [tmpl.replace("{}", name) for tmpl in tset.templates for name in class_names]
    feats = backbone.encode_texts(prompts, progress=progress).view(t, K, -1)
    if tset.ensemble:
        return F.normalize(feats.mean(dim=0), dim=-1), torch.arange(K, dtype=torch.int64)
    return feats.reshape(t * K, -1).contiguous(), torch.arange(t * K, dtype=torch.int64) % K


def _encode_per_class(backbone: Backbone, class_names: list[str], tset: TemplateSet, progress: TextProgress = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each class's templates and its own further prompts, each L2-normalised, averaged, renormalised (M = K)."""
    missing = [n for n in class_names if n.lower() not in tset.extra]
    if missing:
        raise ValueError(f"template set {tset.name}: no prompts for classes {missing[:5]}"
                         f"{f' and {len(missing) - 5} more' if len(missing) > 5 else ''}; expected every class name "
                         f"as a key")
    prompts = [[t.replace("{}", n) for t in tset.templates] + list(tset.extra[n.lower()]) for n in class_names]
    feats = F.normalize(backbone.encode_texts([p for group in prompts for p in group], progress=progress), dim=-1)
    means = torch.stack([part.mean(dim=0) for part in torch.split(feats, [len(g) for g in prompts])])
    return F.normalize(means, dim=-1), torch.arange(len(class_names), dtype=torch.int64)


def _text_key(identity: dict, precision: str, class_names: list[str], tset: TemplateSet, context=None) -> str:
    prompts = ({f"{context.source.lower()}_sha256": context.sha256} if context is not None else
               {"templates": tset.templates, "ensemble": tset.ensemble,
                **({"extra": dict(tset.extra)} if tset.extra else {})})
    blob = json.dumps({"v": _TEXT_CACHE_VERSION, "backbone": identity, "precision": precision,
                       "classes": class_names, **prompts}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def class_embeddings(
    backbone: Backbone | BackboneSpec,
    class_names: list[str],
    templates: str | list[str] | tuple[str, ...] = "dataset",
    *,
    dataset: str | None = None,
    ensemble: bool | None = None,
    data_root: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
    progress: TextProgress = None,
    context=None,
    **load_kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Class embeddings [M, d] float32 (rows L2-normalised) and class_ids [M] int64 in [0, K).

    backbone may be a loaded Backbone or a BackboneSpec; with a spec and a cache hit no model is loaded.
    cache_dir: where text embeddings are cached (<cache_dir>/text/); None disables the cache. With a cache, one
    process encodes a key while the others wait on its lock and then read its file (ImageNet x 80 templates
    takes minutes on a CPU: two trials must not both pay). progress: hears (prompts done, prompts) per batch.
    context: a learned context (CoOp's `LearnedContext` or MaPLe's `MapleContext`): its prompts' class embeddings
    (M = K) instead of the templates'.
    """
    tset = resolve_templates(templates, dataset, ensemble, data_root)
    device = auto_device(device)  # once, here: the key's precision and the backbone take it as it is
    class_names = list(class_names)
    if not class_names:
        raise ValueError("class_names is empty")
    if isinstance(backbone, Backbone):
        identity, precision = backbone.resolved.identity(), backbone.precision
    else:
        resolved = resolve_weights(backbone, **{k: v for k, v in load_kwargs.items()
                                                if k in ("weights_dir", "allow_download")})
        identity, precision = resolved.identity(), precision_for(device)
    def encode(model: Backbone) -> tuple[torch.Tensor, torch.Tensor]:
        if context is None:
            return _encode(model, class_names, tset, progress)
        from orchestrator.clip.context import MAPLE
        from orchestrator.clip.maple import PromptedEncoder

        emb = (PromptedEncoder(model, context).class_features(class_names) if context.source == MAPLE
               else _coop_features(model, class_names, context))
        if progress is not None:
            progress(len(class_names), len(class_names))
        return emb, torch.arange(len(class_names), dtype=torch.int64)

    if cache_dir is None:
        return encode(backbone if isinstance(backbone, Backbone) else shared_backbone(backbone, device, **load_kwargs))
    from filelock import FileLock

    path = Path(cache_dir) / "text" / f"{_text_key(identity, precision, class_names, tset, context)}.npz"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path.with_suffix(".lock"))):
            if not path.is_file():  # not written by the process that held the lock before this one
                model = backbone if isinstance(backbone, Backbone) else shared_backbone(backbone, device,
                                                                                       **load_kwargs)
                emb, ids = encode(model)
                tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
                np.savez(tmp, embeddings=emb.numpy(), class_ids=ids.numpy())
                os.replace(tmp, path)  # readers never see a half-written file
                return emb, ids
    with np.load(path) as z:
        return torch.from_numpy(z["embeddings"]), torch.from_numpy(z["class_ids"])


@torch.no_grad()
def _coop_features(backbone: Backbone, class_names: list[str], context) -> torch.Tensor:
    """[K, d] float32 on the CPU, L2-normalised: each class's CoOp prompt with the context's vectors through the text
    tower (the classifier a prompt-tuning method starts from, `prompt_text`, before any tuning)."""
    from orchestrator.methods.prompt import ClassPrompts

    text = prompt_text(backbone, class_names, context=context)
    with backbone.autocast():
        feats = ClassPrompts("context", text, len(class_names), backbone.device).init_features
    return F.normalize(feats.float(), dim=-1).cpu()


def prompt_text(backbone: Backbone, class_names: list[str], ctx_init: str | None = None, context=None):
    """What a prompt-tuning method takes (`orchestrator.methods.prompt.PromptText`): the backbone's text tower and
    each class's prompt "<ctx_init> <name>." tokenized as TPT's PromptLearner does (underscores in the names and
    the init read as spaces), its context tokens the init's words, on the backbone's device; with the class names as
    prompted and the backbone's tokenizer, for a method that writes prompts of its own (CLIPArTT). With a learned
    `context` (`orchestrator.clip.context.LearnedContext`) the prompts are CoOp's "X ... X <name>." with one X per
    context vector, and the context starts from its vectors."""
    from orchestrator.methods.prompt import CTX_INIT, PromptText, TextTower

    tower = TextTower(backbone.model)
    if context is not None and context.width != tower.width:
        raise ValueError(f"context file {context.path}: ctx width {context.width} does not fit the backbone's text "
                         f"tower (width {tower.width}); expected a context learnt on the same CLIP model")
    ctx_init = " ".join(["X"] * context.n_ctx) if context is not None else (ctx_init or CTX_INIT).replace("_", " ")
    names = [name.replace("_", " ") for name in class_names]
    tokens = backbone.tokenizer([f"{ctx_init} {name}." for name in names]).to(backbone.device)
    n_ctx = len(ctx_init.split(" "))
    init = backbone.tokenizer([ctx_init])[0].to(backbone.device)
    if not bool((tokens[:, 1:1 + n_ctx] == init[1:1 + n_ctx]).all()) or int(init[1 + n_ctx]) != int(init.max()):
        raise ValueError(f"context init {ctx_init!r}: each word must be one token of the backbone's tokenizer (TPT "
                         f"learns one context vector per word)")
    ctx = None if context is None else context.vectors.to(backbone.device)
    return PromptText(tower, tokens, n_ctx, tuple(names), backbone.tokenizer, ctx)
