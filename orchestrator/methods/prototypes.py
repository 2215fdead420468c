"""One text embedding per class, for methods whose official code keeps exactly one (OnZeta, DOTA).

Their official classifiers ensemble prompts by averaging the L2-normalised template embeddings of a class
and renormalising the mean; with several class embeddings per class (M > K, e.g. one per template) this
module does the same, so such methods see the classifier their official code builds. With M = K the
prototypes are the embeddings in class order.
"""

from __future__ import annotations

import torch


def class_prototypes(class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int) -> torch.Tensor:
    """[M, d] embeddings with class_ids [M] -> [K, d]: each class's mean embedding, L2-normalised (float32)."""
    sums = class_embeddings.new_zeros(num_classes, class_embeddings.shape[1])
    sums.index_add_(0, class_ids, class_embeddings)
    return torch.nn.functional.normalize(sums, dim=1)
