"""The backbones the project knows by name: one record each, plain data (no torch, no open_clip).

Any open_clip config runs (a spec may name one of open_clip.list_models() or a `config` file); a record adds what
the rest of the project asks of a named backbone: its label in tables, the tag of its published weights, how it
scores an image against a class, and its image encoder's measured GPU rate (the dry run's projection,
`benchmarks.gpu` section 3).

Scoring (`head`): CLIP is trained with a softmax over the batch at its learned logit scale (100 in OpenAI's
weights, clamped there), SigLIP with a per-pair sigmoid, sigmoid(s cos + b), at its learned scale s and bias b.
open_clip builds the bias exactly for configs with `init_logit_bias`, so `head_of_config` reads the head of any
config; a test holds each record's `head` to its config. What each method does on a sigmoid backbone is its
card's `sigmoid` rule (`orchestrator.registry.card.SIGMOID_RULES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

SOFTMAX = "softmax"
SIGMOID = "sigmoid"
HEADS = (SOFTMAX, SIGMOID)


@dataclass(frozen=True)
class BackboneCard:
    """model: open_clip's config name; label: as tables and papers write it; tag: open_clip's tag of its
    published weights; head: 'softmax' (CLIP) or 'sigmoid' (SigLIP: a learned logit bias); gpu_images_per_s: its
    image encoder's images/s on the H100 of `orchestrator.sweep.cost.GPU_RATES_LOGS[0]` (fp16, batch 64; None: not
    measured, the dry run names it unpriced); source: the paper of its weights."""

    model: str
    label: str
    tag: str
    head: str
    source: str
    gpu_images_per_s: float | None = None

    def __post_init__(self) -> None:
        if self.head not in HEADS:
            raise ValueError(f"backbone {self.model!r}: head must be one of {HEADS}, got {self.head!r}")


BACKBONES: Mapping[str, BackboneCard] = {b.model: b for b in (
    BackboneCard("RN50", "RN50", "openai", SOFTMAX, "CLIP (Radford et al., ICML 2021)", 4612.0),
    BackboneCard("ViT-B-16", "ViT-B/16", "openai", SOFTMAX, "CLIP (Radford et al., ICML 2021)", 6378.0),
    BackboneCard("ViT-B-32", "ViT-B/32", "openai", SOFTMAX, "CLIP (Radford et al., ICML 2021)"),
    BackboneCard("ViT-L-14", "ViT-L/14", "openai", SOFTMAX, "CLIP (Radford et al., ICML 2021)", 2631.0),
    BackboneCard("ViT-B-16-SigLIP", "SigLIP ViT-B/16", "webli", SIGMOID, "SigLIP (Zhai et al., ICCV 2023)"),
)}


def backbone_card(model: str) -> BackboneCard | None:
    """The record of an open_clip model name (OpenAI's 'ViT-B/16' spelling accepted), None for other configs."""
    return BACKBONES.get(model.replace("/", "-"))


# The hparam by which a method names a CLIP teacher (RLCF): a second backbone whose features of the run's images and
# views, and of its class prompts, come from the feature cache (`orchestrator.sweep.pieces.with_teacher`).
TEACHER = "teacher"


def names_teacher(card: Any) -> bool:
    """Whether a method's card names a CLIP teacher (declares the TEACHER hparam)."""
    return any(h.name == TEACHER for h in card.hparams)


def teacher_pretrained(model: str) -> str | None:
    """The weights a teacher loads: a registered backbone's published tag, else None (random weights: the toy-size
    test configs a teacher may also name)."""
    card = backbone_card(model)
    return None if card is None else card.tag


def head_of_config(config: Mapping[str, Any]) -> str:
    """'sigmoid' for an open_clip model config that gives a logit bias (open_clip's CLIP then has one), else
    'softmax'."""
    return SIGMOID if config.get("init_logit_bias") is not None else SOFTMAX
