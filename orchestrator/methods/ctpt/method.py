"""C-TPT (Yoon et al., "C-TPT: Calibrated Test-Time Prompt Tuning for Vision-Language Models via Text Feature
Dispersion", ICLR 2024), as its official code runs it (hee-suk-yoon/C-TPT@085e6c2, tpt_classification.py with
--run_type tpt_ctpt, clip/custom_clip.py).

TPT (`orchestrator.methods.tpt.method`) with one more loss term: the loss of a step is

    avg_entropy(confident views) - lambda * ATFD,   ATFD = mean_k |t_k - mean_j t_j|

over the class text features t_k of the step's forward (L2-normalised, the code's l2_norm_mean_training).
lambda (--lambda_term) is 50 in the fine-grained script and 20 in the ImageNet script, which also passes
--I_augmix: AugMix views on ImageNet and its variants as well (TPT takes crops there).

Where the code and the paper or this port differ, this follows the code: float32 instead of its fp16 autocast
over float32 weights and its GradScaler carried across samples (as TPT); int(V * keep) views as its code counts
them, none refused (as TPT: its dispersion term alone would move the prompt); the softmax scale is the logit_scale
hparam. The paper's temperature-scaled variant (run_type ..._ts, a fixed temperature per architecture) is not
part of C-TPT's method and is left out.
"""

from __future__ import annotations

import torch

from orchestrator.methods.prompt import PromptTuning, avg_entropy


def text_dispersion(features: torch.Tensor) -> torch.Tensor:
    """[B, K, d] class text features -> [B] average text feature dispersion (ATFD)."""
    return torch.linalg.vector_norm(features - features.mean(dim=1, keepdim=True), dim=-1).mean(dim=-1)


class CTPT(PromptTuning):
    """TPT's entropy minus lambda times the text features' dispersion."""

    name = "ctpt"

    def loss(self, logits: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return avg_entropy(logits) + (-self.hp["lambda_term"] * text_dispersion(features))
