"""DMN-ZS: the zero-shot, training-free variant of DMN (Zhang et al., CVPR 2024, "Dual Memory Networks"), as its
official code runs it (YBZh/DMN@c6c218c, dmn_main.py direct_inference with --n_shot 0, DualMem.update_memory_bank
and get_image_pred with position 'all', whose zero-initialised biases are never trained without labels).

State: a per-class memory of up to `memory_size` test features with their entropies. Per sample with views
X [V, d] (view 0 the original image), class prototypes T [K, d] (prototypes.class_prototypes), s = logit_scale:

1. p_v = softmax(s T x_v) for every view; the text posterior is p_0 (the original view).
2. The max(1, int(V * keep)) views of lowest entropy -sum p log(p + 1e-6) give the mean probability m; the
   pseudo-label is y = argmax m and h = -sum m log(m + 1e-8).
3. Memory write for class y: append normalize(x_0) while there is room; when full, replace the entry of
   highest entropy if h is lower than it (equal highest entropies: the later slot, which a stable sort gives; the
   official unstable sort leaves it unspecified).
4. Read-out (after the write): for each class k, the keys are its memory entries and its text prototype, the
   weights exp(-beta (1 - key . normalize(x_0))); a_k = normalize(sum of weight * key); p_mem = softmax(s A x_0).
5. posterior = (p_0 + memory_weight * p_mem) / (1 + memory_weight).

Trace: selected = the pseudo-label y, gated = the memory changed (appended or replaced), gated_prior always
False; state: memory [K, memory_size, d] (zero where empty), memory_entropy, memory_count.

Where the official code differs from the paper, this follows the code: the memory stores the original view's
feature (not the augmented views') but chooses its class and entropy from the confident views; the read-out
includes the current sample. The official code picks memory_weight per dataset afterwards, by a grid search
over [0.001 .. 1000] against the test labels: the per-dataset defaults are the weights its own ViT-B/16 logs
report (camera_ready_dmn_tf_*.txt), so they are oracle choices, as in the paper. int(V * keep) is floored at
one view, which only matters below 1 / keep views (the official code takes an empty mean there).
Views: 31 TPT views + the original (random resized crops + flips on ImageNet and its variants, with AugMix
operations on the cross-domain sets). Text: the official prototypes (--text_prompt tip_cupl) average the
dataset's templates and its CuPL prompts (data/gpt3_prompts/CuPL_prompts_<dataset>.json), one unit embedding
per prompt: pass them as several rows per class (M > K), which are averaged and renormalised here.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from orchestrator.methods.base import Method, StageTimer, Trace
from orchestrator.methods.prototypes import class_prototypes
from orchestrator.methods.views import kept_count

class DMNZeroShot(Method):
    """A dynamic per-class memory of confident test features, read by attention and mixed with zero-shot CLIP."""

    name = "dmn_zs"

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                 **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        d, device, size = class_embeddings.shape[1], class_embeddings.device, hparams["memory_size"]
        self.text = class_prototypes(class_embeddings, class_ids, num_classes)
        self.memory = torch.zeros(num_classes, size, d, dtype=torch.float32, device=device)
        self.entropy = torch.zeros(num_classes, size, dtype=torch.float32, device=device)
        self.count = torch.zeros(num_classes, dtype=torch.int64, device=device)
        self.depth = 0  # the fullest class's count: slots beyond it are empty in every class


    def _write(self, k: int, feature: torch.Tensor, h: torch.Tensor) -> bool:
        """The official update_memory_bank for pseudo-label k; True when the memory changed."""
        c = int(self.count[k])
        if c < self.hp["memory_size"]:
            slot = c
            self.count[k] = c + 1
            self.depth = max(self.depth, c + 1)
        else:
            row = self.entropy[k]
            if not bool((h < row).any()):
                return False
            slot = len(row) - 1 - int(torch.argmax(row.flip(0)))
        self.memory[k, slot] = feature
        self.entropy[k, slot] = h
        return True

    def observe(self, views: torch.Tensor, timer: StageTimer) -> tuple[torch.Tensor, int, bool]:
        """Steps 1-3 for one sample: (the original view's text posterior p_0 [K], pseudo-label, memory changed)."""
        hp = self.hp
        with timer("logits"):
            probs = torch.softmax(hp["logit_scale"] * views @ self.text.T, dim=-1)
            entropy = -(probs * torch.log(probs + 1e-6)).sum(-1)
            idx = torch.argsort(entropy, stable=True)[:kept_count(views.shape[0], hp["keep"])]
            mean_prob = probs[idx].mean(0)
            label = int(mean_prob.argmax())
            h = -(mean_prob * torch.log(mean_prob + 1e-8)).sum()
        with timer("update"):
            written = self._write(label, self.memory_feature(views, idx), h)
        return probs[0], label, written

    def memory_feature(self, views: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
        """What the memory stores of a sample: its original view, normalised (`kept`: the confident views)."""
        return F.normalize(views[0], dim=0)

    def _step(self, views: torch.Tensor, timer: StageTimer) -> tuple[torch.Tensor, int, bool]:
        """One sample: (posterior [K], pseudo-label, whether the memory changed)."""
        hp = self.hp
        x0 = views[0]
        text_posterior, label, written = self.observe(views, timer)
        with timer("posterior"):
            p_memory = torch.softmax(hp["logit_scale"] * self.read(x0) @ x0, dim=0)
            post = (text_posterior + hp["memory_weight"] * p_memory) / (1.0 + hp["memory_weight"])
        return post, label, written

    def read(self, x0: torch.Tensor) -> torch.Tensor:
        """Step 4's read-out A [K, d] (unit rows) for the query x_0."""
        query = F.normalize(x0, dim=0)
        memory = self.memory[:, :self.depth]
        text_weight = torch.exp(-self.hp["beta"] * (1.0 - self.text @ query))
        memory_weight = torch.exp(-self.hp["beta"] * (1.0 - memory @ query))
        read = text_weight[:, None] * self.text + torch.einsum("kj,kjd->kd", memory_weight, memory)
        return F.normalize(read, dim=1)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"memory": self.memory.clone(), "memory_entropy": self.entropy.clone(),
                "memory_count": self.count.clone()}

    def _run(self, features: torch.Tensor) -> Trace:
        return self.run_steps(features)
