"""Tent (Wang et al., "Tent: Fully Test-Time Adaptation by Entropy Minimization", ICLR 2021) on CLIP's image encoder,
as its official code runs it (DequanWang/tent@7d236b4 tent.py; defaults cfgs/tent.yaml).

Per batch x of the stream (`orchestrator.methods.encoder`: logits = s * normalize(f(x)) T^T, zero-shot CLIP through
the adapted tower):
1. episodic runs first restore the initial parameters and optimiser state (Tent.reset);
2. `steps` times: outputs = logits(x); loss = mean over the batch of the softmax entropy of outputs; backward; the
   optimiser steps, then zero_grad (forward_and_adapt);
3. the batch is predicted by softmax(outputs) of the last step's forward, as Tent.forward returns them: the
   prediction comes from the forward that adapts, before its own update.

Which code this follows, and where it differs:
- The parameters are the affine scale and shift of every norm layer of the vision tower (BatchNorm on the batch's
  statistics, Tent's configure_model). Tent's collect_params takes BatchNorm2d only, which a ViT does not have;
  TTABC's CLIP version (walawalagoose/TTABC ttabc/model_selection/tent.py) takes LayerNorm, BatchNorm and GroupNorm,
  and so does this (the only choice that adapts CLIP's ViT at all).
- TTABC predicts each batch with a second, no-grad forward after the update, and runs the forward under fp16 autocast
  with a GradScaler; this follows Tent's own code (the adapting forward's outputs, one forward per step) in float32;
  precision 'amp_fp16' autocasts the forward as TTABC does, without the GradScaler (a scaler's unscaled step equals
  the plain one where no gradient overflows).
- The optimiser: cfgs/tent.yaml's Adam (lr 1e-3, betas (0.9, 0.999), no weight decay); 'sgd' is the repository's
  ImageNet setting (momentum 0.9, lr 0.00025 at batch 64).
"""

from __future__ import annotations

import torch

from orchestrator.methods.encoder import EncoderMethod, softmax_entropy


class Tent(EncoderMethod):
    name = "tent"

    def make_optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        if self.hp["optimizer"] == "adam":
            return torch.optim.Adam(params, lr=self.hp["lr"], betas=(0.9, 0.999), weight_decay=0.0)
        return torch.optim.SGD(params, lr=self.hp["lr"], momentum=0.9)

    def adapt(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for _ in range(self.hp["steps"]):
            outputs = self.logits(images)
            softmax_entropy(outputs).mean(0).backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
        return outputs.detach(), torch.ones(images.shape[0], dtype=torch.bool, device=images.device)
