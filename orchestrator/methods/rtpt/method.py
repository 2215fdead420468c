"""R-TPT (Sheng et al., "R-TPT: Improving Adversarial Robustness of Vision-Language Models through Test-Time
Prompt Tuning", CVPR 2025), as its official code runs it on clean images (TomSheng21/R-TPT@961483d, rtpt.py with
--eps 0).

Episodic, per sample with views X [V, d] (view 0 the original):

1. the context is reset to "a photo of a" and a fresh AdamW (lr 5e-3) takes `steps` steps minimising the MEAN OF
   THE PER-VIEW ENTROPIES of the int(V * keep) lowest-entropy views (entropy_avg: the paper's loss keeps only this
   term of TPT's marginal entropy);
2. every view's logits z_v = s x_v T^T are taken with the tuned context;
3. reliability: each view's score is the mean of its `neighbours` (20) highest cosine similarities to the other
   views (get_top_sim); w = softmax(score / 0.01); the output is sum_v w_v z_v, and its posterior the softmax of
   that weighted logit (the code's prediction is its argmax; it reports no probabilities).

Where the code and the paper or this port differ:
- get_top_sim masks similarities >= 1.0 to leave a view out of its own neighbours; in float32 a unit feature's
  self-similarity is often just below 1, so the code keeps it there at random. `exclude: self` (default) leaves
  the view itself out, as the paper says and the mask intends; `exclude: code` is the literal mask.
- Fewer than neighbours + 1 views: the neighbours are all the others (the code would fail); one view: it alone.
- Float32 throughout (the code runs without autocast or a scaler); int(V * keep) views in the loss, as the code
  counts them, none refused (as TPT: the code's loss would be NaN, its step weight decay alone); the softmax
  scale is the logit_scale hparam. Adversarial attacks (--eps > 0) are not part of this method.
"""

from __future__ import annotations

import torch

from orchestrator.methods.prompt import PromptTuning


def view_entropy_mean(logits: torch.Tensor) -> torch.Tensor:
    """[B, k, K] -> [B]: the mean over views of each view's softmax entropy (entropy_avg)."""
    return (-(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)).mean(dim=-1)


def reliability_weights(views: torch.Tensor, neighbours: int, temperature: float, exclude: str) -> torch.Tensor:
    """[B, V, d] view features -> [B, V] softmax(score / temperature), score = mean of the top neighbours'
    similarities (get_top_sim)."""
    V = views.shape[1]
    if V == 1:
        return views.new_ones(views.shape[0], 1)
    sim = views @ views.transpose(1, 2)
    if exclude == "self":
        sim = sim.masked_fill(torch.eye(V, dtype=torch.bool, device=views.device), float("-inf"))
    else:
        sim = sim.masked_fill(sim >= 1.0, float("-inf"))
    score = sim.topk(min(neighbours, V - 1), dim=-1).values.mean(dim=-1)
    return torch.softmax(score / temperature, dim=-1)


class RTPT(PromptTuning):
    """R-TPT: per-view entropy minimised on the context, a reliability-weighted ensemble of the tuned views."""

    name = "rtpt"

    def loss(self, logits: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return view_entropy_mean(logits)

    def predict(self, chunk: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        logits = self.hp["logit_scale"] * chunk @ features.transpose(1, 2)                  # [B, V, K]
        w = reliability_weights(chunk, self.hp["neighbours"], self.hp["reliability_temp"], self.hp["exclude"])
        return torch.softmax(torch.einsum("bv,bvk->bk", w, logits), dim=-1)
