"""DeYO (Lee et al., "Entropy is not Enough for Test-Time Adaptation: From the Perspective of Disentangled Factors",
ICLR 2024) on CLIP's image encoder, as its official code runs it (Jhyun17/DeYO@35ce821 methods/deyo.py with
config.py's defaults: aug_type 'patch', filter_ent, filter_plpd, reweight_ent and reweight_plpd on).

Per batch x (`orchestrator.methods.encoder`: logits = s * normalize(f(x)) T^T), with E = margin * ln K and
E0 = margin_e0 * ln K, `steps` times (forward_and_adapt_deyo):
1. outputs = logits(x); e = softmax entropy; S1 = {e < E} (none: no step);
2. x' = the images of S1 with their patches shuffled: each image cut into patch_len x patch_len patches (after a
   resize to a multiple of patch_len, and back), the patches put in a random order per image; under no_grad,
   p' = softmax(logits(x')); with p = softmax(outputs) on S1 and c = argmax p, PLPD = p_c - p'_c;
3. S2 = {PLPD > plpd_threshold} within S1 (none: no step); loss = mean over S2 of e * (exp(-(e - E0)) + exp(PLPD))
   with the weights detached; backward; SGD (momentum 0.9) steps; zero_grad;
4. the batch is predicted by softmax(outputs) of the last step's first forward, as DeYO.forward returns them; the
   trace's `gated` marks S2.

Which code this follows: the official deyo.py. Its collect_params is SAR's (skipping 'layer4', 'blocks.9-11',
'norm.': on open_clip's names RN50's layer4 and ViT-B's top three resblocks, as TTABC applies it to CLIP); TTABC's
CLIP version predicts with a second forward after the update under fp16 autocast, this keeps DeYO's own (float32;
precision 'amp_fp16' autocasts the forwards). DeYO's episodic flag calls a reset that its class never sets up (no
saved state), so the official runs are continual, and so is this. The shuffle's permutation is drawn from a
generator seeded with the number of samples seen before the batch (the official code draws from torch's global
generator), so a run is reproducible and a resumed run draws what an uninterrupted one does.
"""

from __future__ import annotations

from typing import Any

import torch
import torchvision

from orchestrator.methods.encoder import EncoderMethod, entropy_margin, norm_parameters, softmax_entropy
from orchestrator.methods.sar.method import SKIP


def patch_shuffle(x: torch.Tensor, patch_len: int, generator: torch.Generator) -> torch.Tensor:
    """[b, c, H, H] images with their patch_len x patch_len patches in a random order per image (DeYO's 'patch'
    augmentation: resize to a multiple of patch_len, shuffle, resize back)."""
    side = x.shape[-1]
    resize_t = torchvision.transforms.Resize(((side // patch_len) * patch_len, (side // patch_len) * patch_len))
    resize_o = torchvision.transforms.Resize((side, side))
    x = resize_t(x)
    b, c, h, w = x.shape[0], x.shape[1], x.shape[2] // patch_len, x.shape[3] // patch_len
    patches = x.reshape(b, c, patch_len, h, patch_len, w).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, c, h, w)
    perm = torch.argsort(torch.rand(b, patches.shape[1], generator=generator), dim=-1).to(x.device)
    patches = patches[torch.arange(b, device=x.device).unsqueeze(-1), perm]
    x = patches.reshape(b, patch_len, patch_len, c, h, w).permute(0, 3, 1, 4, 2, 5).reshape(b, c, patch_len * h,
                                                                                           patch_len * w)
    return resize_o(x)


class DeYO(EncoderMethod):
    name = "deyo"

    def __init__(self, *args: Any, **hparams: Any) -> None:
        self.seen = 0
        super().__init__(*args, **hparams)

    def parameters_to_adapt(self, model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
        return norm_parameters(model, SKIP)

    def make_optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.hp["lr"], momentum=0.9)

    def extra_state(self) -> dict[str, torch.Tensor]:
        return {"seen": torch.tensor(self.seen, dtype=torch.int64)}

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        self.seen = int(state["seen"])

    def adapt(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        K = self.num_classes
        margin, margin_e0 = entropy_margin(self.hp["margin"], K), entropy_margin(self.hp["margin_e0"], K)
        generator = torch.Generator().manual_seed(self.seen)
        self.seen += images.shape[0]
        used = torch.zeros(images.shape[0], dtype=torch.bool, device=images.device)
        for _ in range(self.hp["steps"]):
            used = torch.zeros_like(used)
            outputs = self.logits(images)
            self.optimizer.zero_grad()
            entropies = softmax_entropy(outputs)
            first = torch.where(entropies < margin)[0]
            if len(first) == 0:
                continue
            shuffled = patch_shuffle(images[first].detach(), self.hp["patch_len"], generator)
            with torch.no_grad():
                outputs_prime = self.logits(shuffled)
            prob, prob_prime = outputs[first].softmax(1), outputs_prime.softmax(1)
            cls1 = prob.argmax(dim=1)[:, None]
            plpd = (torch.gather(prob, 1, cls1) - torch.gather(prob_prime, 1, cls1)).reshape(-1)
            second = torch.where(plpd > self.hp["plpd_threshold"])[0]
            if len(second) == 0:
                continue
            kept, plpd = entropies[first][second], plpd[second]
            coeff = 1 / torch.exp(kept.clone().detach() - margin_e0) + 1 / torch.exp(-1.0 * plpd.clone().detach())
            kept.mul(coeff).mean(0).backward()
            self.optimizer.step()
            self.optimizer.zero_grad()
            used[first[second]] = True
        return outputs.detach(), used


