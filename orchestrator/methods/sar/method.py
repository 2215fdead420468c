"""SAR (Niu et al., "Towards Stable Test-Time Adaptation in Dynamic Wild World", ICLR 2023) on CLIP's image
encoder, as its official code runs it (mr-eggplant/SAR@492c1ad sar.py, sam.py, main.py).

Per batch x (`orchestrator.methods.encoder`: logits = s * normalize(f(x)) T^T), with margin E0 = margin * ln K:
1. episodic runs first restore the initial parameters, optimiser state and moving average (SAR.reset);
2. `steps` times (forward_and_adapt_sar): outputs = logits(x); e = softmax entropy; the reliable set S1 = {e < E0};
   loss = mean of e over S1, backward; SAM's first step moves the parameters to w + rho g / ||g||; e2 = entropy of
   logits(x) there, restricted to S1; S2 = {e2 < E0}; loss2 = mean of e2 over S2; if loss2 is a number the moving
   average ema = loss2 (first) or 0.9 ema + 0.1 loss2; loss2's gradient at the perturbed point steps SGD (momentum
   0.9) from w (SAM's second step); if ema < reset_constant, the model and optimiser are reset (recovery; the
   official SAR.forward then sets the moving average back to its value, so it is kept, not cleared);
3. the batch is predicted by softmax(outputs) of the last step's first forward, as SAR.forward returns them; the
   trace's `gated` marks the images of the update's loss (S1 then S2).

Which code this follows: the official sar.py. Its collect_params skips module names containing 'layer4', 'blocks.9',
'blocks.10', 'blocks.11' or 'norm.' (the top of a ResNet and of ViT-Base); on open_clip's names the same substrings
skip RN50's layer4 and ViT-B's transformer.resblocks.9-11, exactly as walawalagoose/TTABC
ttabc/model_selection/sar.py applies the rule to CLIP. TTABC predicts with a second forward after the update under
fp16 autocast; this keeps SAR's own (the first forward's outputs, float32; precision 'amp_fp16' autocasts the
forwards). An empty reliable set gives a NaN loss whose gradient is zero, as in the official code: the step still
applies SGD's momentum, and the moving average is not updated.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from orchestrator.methods.encoder import SAM, EncoderMethod, entropy_margin, norm_parameters, softmax_entropy

SKIP = ("layer4", "blocks.9", "blocks.10", "blocks.11", "norm.")  # sar.py collect_params


class SAR(EncoderMethod):
    name = "sar"

    def __init__(self, *args: Any, **hparams: Any) -> None:
        self.ema: float | None = None
        super().__init__(*args, **hparams)

    def parameters_to_adapt(self, model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
        return norm_parameters(model, SKIP)

    def make_optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        optimizer = torch.optim.SGD(params, lr=self.hp["lr"], momentum=0.9)
        self.sam = SAM(optimizer, self.hp["rho"])
        return optimizer

    def extra_state(self) -> dict[str, torch.Tensor]:
        return {"ema": torch.tensor(math.nan if self.ema is None else self.ema, dtype=torch.float64)}

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        value = float(state["ema"])
        self.ema = None if math.isnan(value) else value

    def adapt(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        margin = entropy_margin(self.hp["margin"], self.num_classes)
        used = torch.zeros(images.shape[0], dtype=torch.bool, device=images.device)
        for _ in range(self.hp["steps"]):
            self.optimizer.zero_grad()
            outputs = self.logits(images)
            entropies = softmax_entropy(outputs)
            first = torch.where(entropies < margin)[0]
            entropies[first].mean(0).backward()
            self.sam.first_step()
            entropies2 = softmax_entropy(self.logits(images))[first]
            second = torch.where(entropies2 < margin)[0]
            loss2 = entropies2[second].mean(0)
            value = loss2.item()
            if not math.isnan(value):
                self.ema = value if self.ema is None else 0.9 * self.ema + (1 - 0.9) * value
            loss2.backward()
            self.sam.second_step()
            used = torch.zeros_like(used)
            used[first[second]] = True
            if self.ema is not None and self.ema < self.hp["reset_constant"]:
                ema = self.ema
                self.load_state_tensors(self.initial)
                self.ema = ema  # SAR.forward: reset() clears it, then `self.ema = ema` sets it back
        return outputs.detach(), used
