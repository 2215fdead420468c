"""RLCF one sample at a time, transcribed from the official test_time_tuning and CLIPRewards (mzhaoshuai/RLCF@0996a5d
TPT/tpt_cls_rl.py, TPT/clip_reward.py) with process_batch 0, reward_process 1, reward_amplify 0: TPT's prompt learner
(`orchestrator.methods.tpt.reference.PromptLearner`) and a fresh AdamW per sample, in the dtype of its inputs
(tests run it in float64). The tests hold `rlcf` to it."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from orchestrator.methods.prompt import PromptText
from orchestrator.methods.tpt.reference import PromptLearner, select_confident_samples

CLIPSCORE_WEIGHT = 2.5


def clip_score(class_features: torch.Tensor, image_features: torch.Tensor, class_index: torch.Tensor,
               sample_k: int) -> torch.Tensor:
    """CLIPRewards.CLIPScore(pairwise=False): each selected view's features repeated sample_k times against its
    sampled classes' text features."""
    text_features = class_features[class_index]
    image_features = torch.repeat_interleave(image_features, sample_k, dim=0)
    similarity = CLIPSCORE_WEIGHT * torch.sum(text_features * image_features, dim=-1)
    return torch.maximum(similarity, torch.zeros_like(similarity)).squeeze()


def rewards_post_process(clip_score: torch.Tensor) -> torch.Tensor:
    """reward_process 1, reward_amplify 0: minus the mean over the last axis (the view's K samples)."""
    if clip_score.shape[-1] > 1:
        clip_score = clip_score - torch.mean(clip_score, dim=-1, keepdim=True)
    return clip_score.flatten()


def in_dtype(text: PromptText, dtype: torch.dtype) -> PromptText:
    """The text side with its tower (and a learned context) in `dtype`."""
    ctx = None if text.ctx is None else text.ctx.to(dtype)
    return PromptText(copy.deepcopy(text.tower).to(dtype), text.tokens, text.n_ctx, ctx=ctx)


def run_rlcf_reference(views: torch.Tensor, teacher_views: torch.Tensor, teacher_classes: torch.Tensor,
                       text: PromptText, lr: float, weight_decay: float, steps: int, keep: float, sample_k: int,
                       logit_scale: float) -> torch.Tensor:
    """[n, V, d] student views, [n, V, D] the teacher's, [K, D] its class text features -> [n, K] posteriors."""
    learner = PromptLearner(in_dtype(text, views.dtype))
    optimizer = torch.optim.AdamW([learner.ctx], lr, weight_decay=weight_decay)
    optim_state = copy.deepcopy(optimizer.state_dict())
    out = []
    for images, reward_images in zip(views, teacher_views):
        with torch.no_grad():
            learner.reset()
        optimizer.load_state_dict(optim_state)
        selected_idx, image_features = None, None
        for _ in range(steps):
            with torch.enable_grad():
                if selected_idx is not None:
                    output = logit_scale * images[selected_idx] @ learner.text_features().t()
                else:
                    output = logit_scale * images @ learner.text_features().t()
                    selected_idx = select_confident_samples(output, keep)
                    output = output[selected_idx]
                    image_features = reward_images[selected_idx]       # reward_model.set_image_features
                bs = output.shape[0]
                value, index = torch.topk(output, sample_k, dim=-1)
                flatten_index = index.flatten()
                with torch.no_grad():
                    score = clip_score(teacher_classes, image_features, flatten_index, sample_k)
                    rewards = rewards_post_process(score.reshape(bs, -1))
                rep_output = torch.repeat_interleave(output, sample_k, dim=0)
                all_loss = F.cross_entropy(rep_output, flatten_index, reduction="none")
                loss = torch.mean(rewards * all_loss)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        with torch.no_grad():
            out.append(F.softmax(logit_scale * images[0] @ learner.text_features().t(), dim=-1))
    return torch.stack(out)
