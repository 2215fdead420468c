"""What the sweep needs to know about real backbones and template sets, asked of orchestrator.clip.

Imported only when a spec names a real dataset, so synthetic sweeps never import open_clip.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from pathlib import Path

from orchestrator.clip.prompts import cupl_file, resolve_templates
from orchestrator.data.datasets import ImageList
from orchestrator.data.listing import read_dataset


def template_counts(template_set: str, dataset: str) -> tuple[int, int]:
    """(templates in the set for this dataset, class embeddings per class: 1 when the set is ensembled). 'cupl'
    counts the dataset's own templates (its per-class descriptions come on top, one ensembled embedding)."""
    tset = resolve_templates("dataset" if template_set == "cupl" else template_set, dataset=dataset)
    return len(tset.templates), 1 if tset.ensemble else len(tset.templates)


@functools.cache
def dataset_listing(name: str, data_root: str) -> ImageList:
    """A real dataset's image list (read once per process: validation, the dry run and the resume check share it)."""
    return read_dataset(name, data_root)


def dataset_listing_issue(name: str, data_root: str) -> str | None:
    """What is wrong with a dataset's folder under an existing data root (missing, empty, bad layout), or None."""
    try:
        dataset_listing(name, data_root)
    except (OSError, ValueError) as exc:  # DatasetLayoutError names the folder and the layout expected
        return str(exc)
    return None


def listing_fingerprint(name: str, data_root: str) -> str:
    """The short form of the dataset's current image-list fingerprint, as runs record it (`data_fingerprint`)."""
    return dataset_listing(name, data_root).fingerprint()[:16]
def effective_templates(template_set: str, dataset: str, data_root: str | None) -> tuple[str, str | None]:
    """(the template set a dataset's runs use, a note when it is not the one asked for): 'cupl' without its
    prompt file under the data root falls back to the dataset's own templates, and the runs record that."""
    if template_set != "cupl" or data_root is None or cupl_file(data_root, dataset).is_file():
        return template_set, None
    return "dataset", (f"templates 'cupl' for {dataset}: {cupl_file(data_root, dataset)} is absent, so its runs use "
                       f"the dataset's own templates (recorded as templates=dataset); put the file from DPE's or "
                       f"DMN's repository there to use CuPL prompts")


# The weights the paper's published numbers were measured with: OpenAI's CLIP files, whose download URLs (in
# open_clip's pretrained configs) are named by the sha256 of the file.
PUBLISHED_TAG = "openai"


def published_tag(model: str, checkpoint: str) -> str | None:
    """PUBLISHED_TAG when the checkpoint file is OpenAI's published file of this model (its sha256 is the one the
    official URL records), else None: a checkpoint is comparable with the published numbers only when known to
    be those weights."""
    import open_clip

    from orchestrator.clip.backbone import file_sha256

    url = (open_clip.get_pretrained_cfg(model.replace("/", "-"), PUBLISHED_TAG) or {}).get("url", "")
    recorded = re.search(r"/([0-9a-f]{64})/[^/]+$", url)
    if recorded is None or not Path(checkpoint).is_file():
        return None
    return PUBLISHED_TAG if file_sha256(checkpoint) == recorded.group(1) else None


@functools.cache
def sigmoid_logits(model: str, tag: str | None, checkpoint: str | None) -> tuple[float, float] | None:
    """(learned logit scale, logit bias) of a backbone that scores with a sigmoid (SigLIP), read from its weights
    (random weights: its config's initial values); None for a softmax (CLIP) backbone. Raises WeightsNotFoundError
    where a tag's weights are not on this machine."""
    from orchestrator.clip.backbone import BackboneSpec, backbone_head, learned_logits, resolve_weights
    from orchestrator.registry.backbones import SIGMOID

    if backbone_head(model) != SIGMOID:
        return None
    return learned_logits(resolve_weights(BackboneSpec(model, checkpoint or tag)))


def register_model_config(path: str) -> None:
    """Make a custom open_clip model config (a JSON file named <model>.json) known in this process."""
    import open_clip

    open_clip.add_model_config(path)


def teacher_backbone(model: str) -> tuple[str, str | None]:
    """(model, pretrained tag or None for random weights) of a teacher a method's `teacher` hparam names, its config
    known to open_clip in this process (the toy-size test configs are registered here, as a trial needs them)."""
    import open_clip

    from orchestrator.registry.backbones import teacher_pretrained

    if open_clip.get_model_config(model) is None:
        from orchestrator.clip.testing import TINY_CONFIGS, register_tiny_models

        if model in TINY_CONFIGS:
            register_tiny_models()
    return model, teacher_pretrained(model)


def backbone_issue(model: str, pretrained: str | None, checkpoint: str | None,
                   config: str | None) -> tuple[str, str] | None:
    """(field, message) for a backbone that cannot be loaded as written, else None.

    Checks what needs no weights: the model config exists (open_clip's or the `config` file), the pretrained tag
    is one open_clip knows for the model, the checkpoint file exists. Whether tag weights are on disk is
    checked where they are loaded (a trial), since on a cluster only the workers may hold them.
    """
    import open_clip

    if config is not None:
        path = Path(config)
        if not path.is_file():
            return "config", f"file {path} does not exist; expected an open_clip model config JSON"
        if path.stem != model:
            return "config", f"open_clip names a config after its file: expected {model}.json, got {path.name}"
        try:
            json.loads(path.read_text())
        except ValueError as exc:
            return "config", f"{path} is not valid JSON ({exc}); expected an open_clip model config"
        register_model_config(str(path))
    cfg = open_clip.get_model_config(model.replace("/", "-"))
    if cfg is None:
        return "model", (f"unknown open_clip model {model!r}; expected one of open_clip.list_models() (e.g. RN50, "
                         f"ViT-B-16, ViT-L-14) or a `config` JSON file")
    hf_tokenizer = cfg.get("text_cfg", {}).get("hf_tokenizer_name") or "siglip" in model.lower()
    if hf_tokenizer and importlib.util.find_spec("transformers") is None:
        return "model", (f"{model}'s tokenizer (a Hugging Face tokenizer, as SigLIP's) needs the transformers "
                         f"package, which is not installed here; expected `pip install transformers`, and the "
                         f"tokenizer's files in the Hugging Face cache")
    if checkpoint is not None and not Path(checkpoint).is_file():
        return "checkpoint", f"file {checkpoint} does not exist; expected an open_clip or OpenAI checkpoint file"
    if pretrained is not None:
        tags = open_clip.list_pretrained_tags_by_model(model.replace("/", "-"))
        if pretrained not in tags:
            return "pretrained", (f"unknown tag {pretrained!r} for {model}; expected one of: {', '.join(tags) or 'none'}"
                                  f" (or give a local file as checkpoint, or pretrained: random for random weights)")
    return None
