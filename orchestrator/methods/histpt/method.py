"""HisTPT (Zhang, Huang, Zhang, Shao, Lu, "Historical Test-time Prompt Tuning for Vision Foundation Models", NeurIPS
2024) on CLIP's text encoder, as its official code builds its memory (jingyi0000/HisTPT@aaf5479: the SEEM
segmentation port, modeling/language/vlpencoder.py update_st_memory, update_hard_memory, update_ema_prompt,
compute_similarity; modeling/architectures/seem_model_v1.py forward_seg_coop), on TPT's classification path.

Online: the context is carried along the stream (never reset) with one torch.optim.AdamW made once, and three
memories of class text features T [K, d] (the prompt's, L2-normalised) are kept:
    local  [L, K, d]  the text features of the last L samples, newest first (L = memory_size, 32), with each
                      one's entropy e [L];
    hard   [L, K, d]  per sample, the mean of the local entries of the `hard_top` (16) highest entropies,
                      newest first;
    global [K, d]     a moving average: g <- m g + (1 - m) (local[-1] + hard[-1]) / 2 (m = ema_momentum, 0.99),
                      the oldest entries of the two banks.
Per sample with views X [V, d] (view 0 the original image), as forward_seg_coop orders it:

1. T = the text features at the current context (with gradients); z = s X T^T; the int(V * keep) views of lowest
   entropy are kept (TPT's select_confident_samples, chosen at the first step);
2. the memory takes T (detached) and e = the mean softmax entropy of the kept views' z: pushed to the front of
   local (the first sample fills every entry, and every hard entry, with it, and starts global at T), then hard
   takes the mean of the local entries of top-k entropy (torch.topk), then global its average;
3. the pseudo-label: on the original view, each memory's logits z_b = s x_0 M_b^T, M_b the mean of local, the mean
   of hard, and global, as they are (not renormalised); weights w = softmax_b(-H(z_b)) (lower entropy, more
   weight); y = argmax softmax(sum_b w_b z_b);
4. `steps` AdamW steps on the context, each on the mean cross-entropy of the kept views' logits against y (the
   memory and y are the sample's, taken once);
5. the posterior is softmax(s x_0 T^T) with the tuned context.
So the first sample trains on its own zero-shot label, and from the second on the memory's labels regularise the
prompt, which keeps what it learnt along the stream. The outputs depend on the stream's order: no shards, no
lockstep; a resumed run replays its stream from the start.

Where the official code, the paper and TTABC (walawalagoose/TTABC ttabc/model_selection/histpt.py, a CLIP port)
differ, and what this follows:
- The official code is the segmentation port only (SEEM: an image's 101 query logits where CLIP has a sample's
  views); no classification code was released. The classification path is TPT's (the paper reports HisTPT on image
  classification too): views as TPT's loader gives them, 4 context tokens from "a photo of a", AdamW at TPT's lr,
  the confident views (as TTABC); the entropy a sample is stored with is that of the views the loss reads (the
  official code: all of the logits its loss reads; TTABC: the confident views).
- That entropy is the softmax entropy (TTABC's; the paper's method section was not at hand to check its equation).
  The official code computes -sum z exp(z) on the raw logits, TPT's avg_entropy without its log-softmax, which is
  not an entropy; it only ranks the local entries for the hard memory.
- The memory takes the prompt's text features from the sample's forward, before its step, and the pseudo-label
  is taken after that update (the official order); TTABC updates the memory after tuning, with the tuned
  features.
- The global memory averages in the oldest entries of the local and hard banks (the official local[-1],
  hard[-1]: what is about to leave them); TTABC averages in the banks' means.
- The pseudo-label is the argmax of the entropy-weighted fusion of the three memories' logits (official); TTABC
  fuses their probabilities into a soft label and renormalises the memories' means.
- The official code runs one optimiser step per image; `steps` > 1 repeats the step on the same pseudo-label
  (TTABC: the memory does not change between steps, so its label does not either).
- Defaults: the official memory sizes and momentum (32, 16, 0.99) are written into its code, the same for every
  dataset; lr, steps and keep are TPT's (5e-3, 1, 0.1), the arguments TTABC's port shares with its TPT family
  (its optimiser's lr, --tta_steps, --selection_p). No per-dataset defaults.
- Precision: float32 throughout (the official code's fp16 autocast is left out, as TPT's). s is the logit_scale
  hparam.
The class embeddings a sweep passes are not used: the class text features are the prompt's own, from the text
tower. `reference.py` is the plain per-sample transcription the tests hold this to.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from orchestrator.methods.base import Method, StageTimer, Trace
from orchestrator.methods.prompt import ClassPrompts, PromptText, confident_views, selected_views


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Softmax entropy over the last axis."""
    return -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)


class HisTPT(Method):
    """Historical test-time prompt tuning: the context carried along the stream, regularised by the pseudo-labels
    of three memories of its past text features (module docstring)."""

    name = "histpt"

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int, *,
                 text: PromptText, **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        self.prompts = ClassPrompts(self.name, text, num_classes, class_embeddings.device)
        self.ctx = self.prompts.ctx_init.clone().requires_grad_(True)
        self.optimizer = torch.optim.AdamW([self.ctx], lr=self.hp["lr"])   # made once: carried along the stream
        self.local: torch.Tensor | None = None    # [L, K, d], newest first; None before the first sample
        self.entropies: torch.Tensor | None = None  # [L]
        self.hard: torch.Tensor | None = None     # [L, K, d], newest first
        self.glob: torch.Tensor | None = None     # [K, d]

    @classmethod
    def check_hparams(cls, hp: dict[str, Any], num_embeddings: int, num_classes: int) -> dict[str, Any]:
        if hp["hard_top"] > hp["memory_size"]:
            raise ValueError(f"histpt: hard_top ({hp['hard_top']}) must be at most memory_size "
                             f"({hp['memory_size']}): the hard memory averages that many of the local memory's "
                             f"entries")
        return hp

    def _run(self, features: torch.Tensor) -> Trace:
        selected_views(self.name, features.shape[1], self.hp["keep"])    # refused before any work, empty or not
        return self.run_steps(features)

    def remember(self, feats: torch.Tensor, e: torch.Tensor) -> None:
        """The memory's update with a sample's text features [K, d] and entropy (module docstring step 2)."""
        L, m = self.hp["memory_size"], self.hp["ema_momentum"]
        if self.local is None:
            self.local = feats.expand(L, -1, -1).clone()
            self.entropies = e.expand(L).clone()
            self.hard = self.local.clone()
            self.glob = feats.clone()
            return
        self.local = torch.cat([feats[None], self.local[:-1]])
        self.entropies = torch.cat([e[None], self.entropies[:-1]])
        top = torch.topk(self.entropies, self.hp["hard_top"]).indices
        self.hard = torch.cat([self.local[top].mean(0)[None], self.hard[:-1]])
        self.glob = m * self.glob + (1 - m) * (0.5 * (self.local[-1] + self.hard[-1]))

    def pseudo_label(self, x0: torch.Tensor) -> torch.Tensor:
        """The fused memories' label of the original view [d] (module docstring step 3)."""
        banks = torch.stack([self.glob, self.local.mean(0), self.hard.mean(0)])      # [3, K, d]
        logits = self.hp["logit_scale"] * banks @ x0                                 # [3, K]
        weights = torch.softmax(-entropy(logits), dim=0)
        return torch.softmax((weights[:, None] * logits).sum(0), dim=-1).argmax()

    def _step(self, views: torch.Tensor, timer: StageTimer) -> tuple[torch.Tensor, int, bool]:
        scale = self.hp["logit_scale"]
        keep, label = None, None
        for _ in range(self.hp["steps"]):
            with timer("logits"), torch.enable_grad():
                feats = self.prompts.features(self.ctx[None])[0]
                z = scale * views @ feats.T
            with timer("update"):
                if keep is None:  # the memory and the pseudo-label once per sample, at its first forward
                    with torch.no_grad():
                        keep = confident_views(z.detach()[None], self.hp["keep"], self.name)[0]
                        self.remember(feats.detach(), entropy(z.detach()[keep]).mean())
                        label = self.pseudo_label(views[0])
                with torch.enable_grad():
                    loss = F.cross_entropy(z[keep], label.expand(len(keep)))
                    self.optimizer.zero_grad()
                    loss.backward()
                self.optimizer.step()
        with timer("posterior"), torch.no_grad():
            post = torch.softmax(scale * self.prompts.features(self.ctx[None])[0] @ views[0], dim=-1)
        return post, -1, False
