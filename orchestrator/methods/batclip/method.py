"""BATCLIP (Maharana et al., "BATCLIP: Bimodal Online Test-Time Adaptation for CLIP", ICCV 2025) as its official
code runs it (sarthaxxxxx/BATCLIP@7a3b716 classification/methods/ours.py, utils/losses.py, models/model.py; defaults
cfgs/imagenet_c/ours.yaml).

Per batch x of the stream, with the class prompts P ("a photo of a {name}.", the config's one template), `steps`
times (OURS.forward_and_adapt):
1. f = the vision tower's features of x (not normalised), g = the text tower's features of P, both through the
   adapted towers; logits = s * normalize(f) normalize(g)^T;
2. pseudo-labels y = argmax softmax(logits); for each class c among them (ascending), m_c = the mean of f over
   {y = c}; the projection loss I2T = mean over those classes of m_c . normalize(g)_c (m_c not normalised, as
   I2TLoss computes it), the spread loss InterMean = sum over pairs c != c' of 1 - cos(m_c, m_c');
3. loss = mean entropy of softmax(logits) - I2T - InterMean; backward; the optimiser steps;
4. the batch is predicted by softmax(logits) of the last step's forward, as forward_and_adapt returns them.

What it updates: the affine scale and shift of every LayerNorm / BatchNorm / GroupNorm of the whole CLIP model, the
image and the text encoder both (its configure_model and collect_params walk the ZeroShotCLIP wrapper, whose text
encoder is kept and run every step: CLIP.FREEZE_TEXT_ENCODER False in every config), BatchNorm on the batch's
statistics. The text side is the prompt-tuning path's (`orchestrator.methods.prompt.PromptText`: the backbone's text
tower and the class prompts "a photo of a {name}.", exactly the configs' PROMPT_TEMPLATE), adapted on a copy.

Which code this follows, and where it differs:
- The paper adapts the LayerNorm parameters of both encoders; the code collects every norm layer's (the same on a
  ViT, and a ResNet's BatchNorm too), as this does. I2TLoss projects the mean of the raw (not normalised) image
  features onto the unit text feature while InterMeanLoss normalises its means; this follows the code.
- The official step runs the forward under CUDA fp16 autocast with a GradScaler (init scale 1000) even where its
  config says PRECISION fp32. Float32 is the default here; precision 'amp_fp16' autocasts the two towers' forwards
  (the loss and the optimiser in float32, no scaler: an unscaled step equals a scaled one where nothing overflows).
- walawalagoose/TTABC ttabc/model_selection/batclip.py resets the model before every batch (episodic), always uses
  AdamW at its own lr, and predicts each batch with a second, no-grad forward after the update. This follows the
  original: continual along the stream (MODEL.EPISODIC False; `episodic: true` resets as its base class does), the
  config's optimiser, and the adapting forward's prediction.
- The official configs per benchmark: ImageNet-C AdamW lr 5e-4 at batches of 64; CIFAR-10-C AdamW 1e-3 and
  CIFAR-100-C Adam 5e-4, both at 200; weight decay 0.01 throughout. The card's `lr` and `optimizer` default to them
  per benchmark (ImageNet-C's elsewhere); its batch size is ImageNet-C's 64, and a CIFAR-C sweep sets
  `batch_size: 200` as the configs do (a card has one official batch size).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F

from orchestrator.methods.encoder import EncoderMethod, norm_parameters, softmax_entropy
from orchestrator.methods.prompt import check_prompt_text

TEXT = "text."  # the text tower's parameters' names in the run's state


def class_means(labels: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """[U, d] the mean of `features` [b, d] over each pseudo-label in `labels` [b], labels ascending (torch.unique's
    order, as I2TLoss and InterMeanLoss walk them)."""
    present, index = torch.unique(labels, sorted=True, return_inverse=True)
    sums = features.new_zeros(len(present), features.shape[1]).index_add_(0, index, features)
    return sums / torch.bincount(index, minlength=len(present)).to(features.dtype)[:, None]


def batclip_loss(logits: torch.Tensor, image_features: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """Mean entropy - I2T - InterMean (module docstring) of the logits [b, K], the raw image features [b, d] and the
    unit class text features [K, d]."""
    labels = logits.softmax(1).argmax(1)
    means = class_means(labels, image_features)
    i2t = (means * text[torch.unique(labels, sorted=True)]).sum(1).mean()
    unit = F.normalize(means, dim=1)
    inter = (1 - unit @ unit.T).fill_diagonal_(0).sum()
    return softmax_entropy(logits).mean(0) - i2t - inter


class BATCLIP(EncoderMethod):
    name = "batclip"

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int, *, vision: Any,
                 text: Any, **hparams: Any) -> None:
        prompts = check_prompt_text(self.name, text, num_classes, class_embeddings.device)
        self.text_tower = copy.deepcopy(prompts.tower).float()
        self.tokens, self.eot = prompts.tokens, prompts.tokens.argmax(dim=-1)
        super().__init__(class_embeddings, class_ids, num_classes, vision=vision, **hparams)

    def parameters_to_adapt(self, model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
        return norm_parameters(model) + [(TEXT + name, p) for name, p in norm_parameters(self.text_tower)]

    def make_optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        adam = torch.optim.AdamW if self.hp["optimizer"] == "adamw" else torch.optim.Adam
        return adam(params, lr=self.hp["lr"], betas=(0.9, 0.999), weight_decay=self.hp["weight_decay"])

    def adapt(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for _ in range(self.hp["steps"]):
            with torch.autocast("cuda", dtype=torch.float16, enabled=self.hp["precision"] == "amp_fp16"):
                image_features = self.model(images)
                text_features = self.text_tower(self.text_tower.embed(self.tokens), self.eot)
            image_features, text = image_features.float(), F.normalize(text_features.float(), dim=-1)
            logits = self.hp["logit_scale"] * F.normalize(image_features, dim=-1) @ text.T
            loss = batclip_loss(logits, image_features, text)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
        return logits.detach(), torch.ones(images.shape[0], dtype=torch.bool, device=images.device)
