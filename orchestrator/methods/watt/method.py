"""WATT (Osowiechi et al., "WATT: Weight Average Test-Time Adaptation of CLIP", NeurIPS 2024) on CLIP's image
encoder, as its official code runs it (Mehrdad-Noori/WATT@89d5089 adapt/watt.py, clip/model.py, main.py).

The class embeddings hold one row per (template, class) (the card's template set 'watt8', WATT's templates.yaml):
T_j [K, d], template j's unit text embeddings, and T [K, d] their per-class mean renormalised (the classifier every
encoder method has). Per batch x of the stream, the encoder and Adam's state first reset to the initial ones
(main.py resets before every batch), then `rounds` (--watt_m) times:
  for each template j, starting from
    - sequential (WATT-S, --watt_type sequential, the official default): the last round's average for the first
      template (round 1: the initial weights and optimiser), the previous template's result for the others;
    - parallel (WATT-P): the last round's average for every template (round 1: the initial weights and optimiser);
  `template_steps` (--watt_l) Adam steps, each: f = normalize(features(x)); pseudo-labels
  y = argmax f T_j^T; the chosen texts t = T_j[y] [b, d]; logits s f t^T [b, b];
  targets = softmax_rows((f f^T + t t^T) / 2 / 0.01);
  loss = mean over images i of -sum_j targets[j, i] log_softmax(s f t^T)[i, j] (cross_entropy(logits.t(),
  targets.t()): the official logits are texts by images); then the weights of the templates are averaged.
The batch's weights are the last average, and it is predicted by softmax(s normalize(features(x)) T^T) (evaluate,
templates averaged, not the reference template alone).

Which code this follows, and where it differs:
- The parameters are the vision tower's LayerNorm affine weights (set_ln_grads, collect_ln_params), so a tower without
  LayerNorms (RN50) has nothing to adapt and is refused.
- Adam's state is never reset between templates or rounds except where the official code reloads the initial state
  (round 1: once for WATT-S, before every template for WATT-P); a later round loads only the averaged weights.
- Where a template's pseudo-labels of a batch are all one class, its loss is flat (every logit of an image equal)
  and its gradient zero up to rounding; a fresh Adam's first step (WATT-P's round 1) scales that rounding noise up
  to about lr, in the official code as here, so such batches are not reproducible across precisions.
- The official step takes the pseudo-labels from a no-grad forward and the loss from a second forward of the same
  weights; this takes both from one forward (the same values), and the targets keep their gradient as there.
- The logit scale is the hparam `logit_scale` (100, CLIP's learned exp(logit_scale) and the pseudo-labels' fixed 100).
- Not offered: --watt_reference_for_evaluation (predict with "a photo of a {}" alone; off by default).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from orchestrator.methods.encoder import EncoderMethod, norm_parameters

TARGET_TEMPERATURE = 0.01  # adapt/watt.py: softmax(((images_similarity + texts_similarity) / 2) / 0.01)


def per_template(class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int) -> torch.Tensor:
    """[M, d] rows, class_ids [M] -> [t, K, d]: row j of each class is its template j (every class needs the same
    number of rows, as a non-ensembled template set lays them out)."""
    counts = torch.bincount(class_ids, minlength=num_classes)
    if not bool((counts == counts[0]).all()) or int(counts[0]) == 0:
        raise ValueError(f"watt: adapts on one text embedding per template and class, so every class needs the same "
                         f"number of embeddings; got {counts.tolist()} (expected a non-ensembled template set such "
                         f"as templates 'watt8')")
    order = torch.argsort(class_ids, stable=True)  # class-major, each class's rows in their order
    return class_embeddings[order].view(num_classes, int(counts[0]), -1).transpose(0, 1).contiguous()


class WATT(EncoderMethod):
    name = "watt"

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int, **hparams: Any
                 ) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        self.templates = per_template(class_embeddings, class_ids, num_classes)

    def parameters_to_adapt(self, model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
        return norm_parameters(model, kinds=(torch.nn.LayerNorm,))

    def make_optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=self.hp["lr"], betas=(0.9, 0.999), weight_decay=0.0)

    def _set_weights(self, weights: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for (_, p), w in zip(self.adapted, weights):
                p.copy_(w)

    def _step(self, images: torch.Tensor, text: torch.Tensor) -> None:
        features = F.normalize(self.encode(images), dim=-1)
        chosen = text[(features.detach() @ text.T).argmax(1)]
        logits = self.hp["logit_scale"] * features @ chosen.T
        targets = torch.softmax((features @ features.T + chosen @ chosen.T) / 2 / TARGET_TEMPERATURE, dim=-1)
        (-targets.T * torch.log_softmax(logits, dim=-1)).sum(1).mean().backward()
        self.optimizer.step()
        self.optimizer.zero_grad()

    def adapt(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        parallel = self.hp["variant"] == "parallel"
        average: list[torch.Tensor] | None = None
        for _ in range(self.hp["rounds"]):
            snapshots = []
            for j, text in enumerate(self.templates):
                if j == 0 or parallel:
                    if average is None:
                        self.load_state_tensors(self.initial)
                    else:
                        self._set_weights(average)
                for _ in range(self.hp["template_steps"]):
                    self._step(images, text)
                snapshots.append([p.detach().clone() for _, p in self.adapted])
            average = [torch.stack(ws).sum(0) / len(ws) for ws in zip(*snapshots)]
        self._set_weights(average)
        with torch.no_grad():
            logits = self.logits(images)
        return logits, torch.ones(images.shape[0], dtype=torch.bool, device=images.device)
