"""Confident-view selection for augmented views (the public protocol of TDA's and BCA's code).

Done at run time, not at encode time, because it depends on the class embeddings (the prompts): for each
sample the views' class posteriors are computed against the given class embeddings, the `keep` fraction
with the lowest softmax entropy is kept, and the sample's feature is the mean of the kept views' features,
not renormalised, as the public code does. This is TDA's fixed rule (selected once, against the prompt
embeddings): what every single-view method is given, and the BCA family's view_selection='fixed'. TDA and
the BCA family's default view_selection='adaptive' take the views themselves (orchestrator.methods).
"""

from __future__ import annotations

import torch

from orchestrator.methods.views import PROTOCOL_KEEP, confident_view_means, lowest_entropy_views, view_posteriors
from orchestrator.methods.hparams import CLIP_LOGIT_SCALE


def confident_view_indices(
    view_features: torch.Tensor,
    class_embeddings: torch.Tensor,
    class_ids: torch.Tensor,
    num_classes: int,
    logit_scale: float = CLIP_LOGIT_SCALE,
    keep: float = PROTOCOL_KEEP,
) -> torch.Tensor:
    """[n, V, d] -> [n, k] indices of the k = max(1, int(V * keep)) lowest-entropy views (as int() truncates)."""
    post = view_posteriors(view_features, class_embeddings, class_ids, num_classes, logit_scale)
    return lowest_entropy_views(post, keep)


def select_views(
    view_features: torch.Tensor,
    class_embeddings: torch.Tensor,
    class_ids: torch.Tensor,
    num_classes: int,
    logit_scale: float = CLIP_LOGIT_SCALE,
    keep: float = PROTOCOL_KEEP,
    chunk: int = 1024,
) -> torch.Tensor:
    """[n, V, d] view features -> [n, d] mean of each sample's confident views (float32, not renormalised).

    Processed `chunk` samples at a time so ImageNet-scale view sets need little extra memory.
    """
    if view_features.ndim != 3:
        raise ValueError(f"select_views needs view features [n, V, d]; got shape {tuple(view_features.shape)}")
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be in (0, 1]; got {keep}")
    return confident_view_means(view_features, class_embeddings, class_ids, num_classes, logit_scale, keep, chunk)
