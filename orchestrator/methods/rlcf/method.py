"""RLCF (Zhao et al., "Test-Time Adaptation with CLIP Reward for Zero-Shot Generalization in Vision-Language Models",
ICLR 2024), its TPT-style prompt variant, as its official code runs it (mzhaoshuai/RLCF@0996a5d TPT/tpt_cls_rl.py,
TPT/clip_reward.py; scripts/rlcf-prompt.sh and rlcf-prompt-fine.sh).

Episodic, per sample with student views X [V, d] (view 0 the original image) and the teacher's features of the same
views Z [V, D] (a larger CLIP, ViT-L/14 for a ViT-B/16 student; its class text features U [K, D] from "a photo of
a {name}.", the student prompt learner's tokenized prompts, CLIPRewards.set_class_features):

1. the context is reset to its init; the confident views S (int(V * keep) of lowest entropy at the initial
   context) are chosen once, at the first step, and the teacher's features of those views are kept
   (reward_model.set_image_features(inputs[selected_idx]));
2. a fresh AdamW (lr, weight_decay) takes `steps` steps on the context, each on the student's logits
   o_v = s x_v T^T of the views v in S: the top-`sample_k` classes c of each o_v (torch.topk: the "sampling" is
   the top K), their reward r_vc = max(0, 2.5 <U_c, z_v>) (CLIPScore at clipscore_weight 2.5) minus its mean over
   the view's K classes (reward_process 1, process_batch 0, reward_amplify 0: no division by the std), and the
   loss mean_{v, c} r_vc * CE(o_v, c), the policy gradient of REINFORCE with the mean as baseline. The rewards
   are recomputed each step (the top K moves with the context) and carry no gradient;
3. the posterior is softmax(s x_0 T^T) with the tuned context (as TPT).

Where the code, the paper and this port differ:
- Precision: the official code runs the student and the teacher under fp16 autocast with a GradScaler (TPT's);
  here float32.
- The teacher sees the views the student sees. The official code hands the reward model the student's
  preprocessed 224-px views, resized bicubically to the teacher's resolution where it differs (ViT-L/14@336px);
  here the teacher's features are the feature cache's for the same images and views (the views are seeded per
  image, so a teacher at the student's resolution and normalisation, ViT-L/14 for ViT-B/16, sees the very pixels),
  and a teacher at another resolution would have its views drawn at its own resolution.
- The teacher is frozen, so its features do not depend on the context: its image features of every view and its
  class text features are read once from the cache (`orchestrator.sweep.pieces.with_teacher`), not encoded per
  sample.
- The scripts start the context from CoOp's 16-shot ImageNet context (--load); here from "a photo of a" unless the
  spec names a learned `context` (as for TPT).
- "Sampling" is the code's: the K classes of highest student logit (torch.topk), not draws from the student's
  policy; and the baseline is the mean reward of each view's K classes (process_batch 0; 1 would take the mean
  over all the confident views' samples). The code's options that the scripts leave off are left out: the
  entropy regulariser (--min_entropy_reg), the rewards' division by their std (--reward_amplify), several
  teachers (--multiple_reward_models). The paper's text was not at hand: this follows the code throughout.
- The image-encoder variant (tune_cls_rl.py, scripts/rlcf-tune.sh: the whole vision tower tuned by AdamW at lr 1e-5
  on the same reward, per sample over its 64 augmented views) is not built: `orchestrator.methods.encoder` decodes
  one eval-transformed image a sample, so it would need the augmented views decoded through the tower's copy (the
  teacher's could still come from the cache).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from orchestrator.methods.base import Trace
from orchestrator.methods.prompt import TEACHER_CLASSES, TEACHER_VIEWS, PromptTuning

CLIPSCORE_WEIGHT = 2.5  # CLIPRewards' clipscore_weight, the CLIPScore paper's w (never changed by the scripts)


def rewards(teacher_views: torch.Tensor, teacher_classes: torch.Tensor, sampled: torch.Tensor) -> torch.Tensor:
    """[B, k, D] the teacher's features of the confident views, [K, D] its class text features and [B, k, S] the
    sampled classes -> [B, k, S] CLIPScore max(0, 2.5 cos) minus its mean over each view's S classes."""
    score = (CLIPSCORE_WEIGHT * torch.einsum("bvsd,bvd->bvs", teacher_classes[sampled], teacher_views)).clamp(min=0)
    return score - score.mean(dim=-1, keepdim=True)


class RLCF(PromptTuning):
    """TPT's context tuning on the teacher's reward of the student's top-K classes (module docstring)."""

    name = "rlcf"

    def run(self, features: torch.Tensor, auxiliary: Mapping[str, torch.Tensor] | None = None) -> Trace:
        """As every method's, with the teacher's features of the same samples in `auxiliary`: TEACHER_VIEWS [n, V,
        D] (its features of the same views) and TEACHER_CLASSES [K, D] (its class text features)."""
        views, classes = (auxiliary or {}).get(TEACHER_VIEWS), (auxiliary or {}).get(TEACHER_CLASSES)
        shape = tuple(getattr(features, "shape", ()))
        if not isinstance(views, torch.Tensor) or views.dtype != torch.float32 or views.ndim != 3 \
                or views.shape[:2] != shape[:2] or not isinstance(classes, torch.Tensor) \
                or classes.dtype != torch.float32 or classes.shape != (self.num_classes, views.shape[2]):
            got = {k: tuple(v.shape) if isinstance(v, torch.Tensor) else type(v).__name__
                   for k, v in (auxiliary or {}).items()}
            raise ValueError(f"{self.name}: reads its teacher's features: auxiliary={{{TEACHER_VIEWS!r}: float32 "
                             f"[{', '.join(map(str, shape[:2]))}, D] (the teacher's features of the same views), "
                             f"{TEACHER_CLASSES!r}: float32 [{self.num_classes}, D] (its class text features)}}, "
                             f"got {got or None}")
        self._teacher: tuple[torch.Tensor, torch.Tensor] | None = (views, classes)
        try:
            return super().run(features)
        finally:  # the teacher's features are the trial's (its stream's), not the method's state
            self._teacher = self._classes = self._confident = None

    def optimizer(self, ctx: torch.Tensor) -> torch.optim.Optimizer:
        return torch.optim.AdamW([ctx], lr=self.hp["lr"], weight_decay=self.hp["weight_decay"])

    def solve(self, chunk: torch.Tensor, shared: torch.Tensor, start: int) -> torch.Tensor:
        views, self._classes = self._teacher
        rows = views[start:start + chunk.shape[0]]
        self._confident = torch.gather(rows, 1, shared[..., None].expand(-1, -1, rows.shape[-1]))   # [B, k, D]
        return super().solve(chunk, shared, start)

    def loss(self, logits: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """[B] mean over the confident views and their top-K classes of reward times cross-entropy."""
        sampled = logits.topk(self.hp["sample_k"], dim=-1).indices                              # [B, k, S]
        with torch.no_grad():
            reward = rewards(self._confident, self._classes, sampled)
        ce = logits.logsumexp(dim=-1, keepdim=True) - logits.gather(-1, sampled)                # [B, k, S]
        return (reward * ce).flatten(1).mean(dim=1)

    @classmethod
    def check_hparams(cls, hp: dict[str, Any], num_embeddings: int, num_classes: int) -> dict[str, Any]:
        if hp["sample_k"] > num_classes:
            raise ValueError(f"rlcf: hparam 'sample_k' must be at most the number of classes ({num_classes}): the "
                             f"official torch.topk samples that many distinct classes, got {hp['sample_k']}")
        return hp
