"""O-TPT (Sharifdeen et al., CVPR 2025, "O-TPT: Orthogonality Constraints for Calibrating Test-time Prompt Tuning in
Vision-Language Models"), as its official code runs it (ashshaksharifdeen/O-TPT@a09933f otpt_classification.py
with --run_type tpt_otpt, clip/custom_clip_iptp_bas.py).

TPT (`orchestrator.methods.tpt.method`) with one more loss term: the loss of a step is

    avg_entropy(confident views) + lambda * mean_i | H_i G_i - e_i |

over the class text features T [K, d] of the step's forward (L2-normalised): G = T T^T, and H_i the Householder
reflection I - 2 v_i v_i^T with v_i the unit vector along G_i - |G_:,i| e_i. That reflection maps G_i onto
|G_i| e_i (G is symmetric, so its column norm is its row norm), so the term is exactly mean_i (|G_i| - 1), which
is what this computes, as a function of the context and so in its gradient too: the K reflections of K x K
matrices the code builds (K^3 work per step) are left out. The reference (`reference.py`) transcribes the code's
Householder path and the tests hold the two together. |G_i| >= G_ii = 1, so the term is zero only where the class
text features are orthogonal.

lambda (--lambda_term) is 18 in the fine-grained script and 2 in the ImageNet script, which also passes
--I_augmix: AugMix views on ImageNet and its variants as well (TPT takes crops there).

Where the code and this port differ: float32 instead of its fp16 autocast and GradScaler (as TPT); the softmax
scale is the logit_scale hparam; the code's Householder path is NaN where a row of G is already |G_i| e_i (the
text features orthogonal), where this gives the term's value, 0. The paper's temperature-scaled variant is not
part of O-TPT's method and is left out.
"""

from __future__ import annotations

import torch

from orchestrator.methods.prompt import PromptTuning, avg_entropy


def orthogonality(features: torch.Tensor) -> torch.Tensor:
    """[B, K, d] class text features -> [B] mean over classes of |row i of their Gram matrix| - 1 (the official
    Householder term)."""
    gram = features @ features.transpose(1, 2)
    return (torch.linalg.vector_norm(gram, dim=-1) - 1.0).mean(dim=-1)


class OTPT(PromptTuning):
    """TPT's entropy plus lambda times the text features' departure from orthogonality."""

    name = "otpt"

    def loss(self, logits: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return avg_entropy(logits) + self.hp["lambda_term"] * orthogonality(features)
