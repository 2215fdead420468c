"""CLIP backbones (open_clip), prompt templates and class embeddings, image views and view selection."""

from orchestrator.clip.backbone import (
    Backbone,
    BackboneSpec,
    WeightsNotFoundError,
    load_backbone,
    resolve_weights,
)
from orchestrator.clip.prompts import TEMPLATE_SET_NAMES, class_embeddings, resolve_templates
from orchestrator.clip.selection import select_views
from orchestrator.clip.views import VIEW_KINDS, ViewConfig, parse_views

__all__ = [
    "Backbone",
    "BackboneSpec",
    "TEMPLATE_SET_NAMES",
    "VIEW_KINDS",
    "ViewConfig",
    "WeightsNotFoundError",
    "class_embeddings",
    "load_backbone",
    "parse_views",
    "resolve_templates",
    "resolve_weights",
    "select_views",
]
