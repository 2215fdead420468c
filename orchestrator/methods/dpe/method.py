"""DPE (Zhang et al., NeurIPS 2024, "Dual Prototype Evolving"), as its official code runs it
(zhangce01/DPE-CLIP@fecae5a, main_dpe.py run_test_dpe, utils.py get_clip_logits, configs/*.yaml).

State: the global textual prototypes W [K, d] (start: the class prototypes, see prototypes.class_prototypes)
and a visual cache of `shot` (feature, entropy) entries per predicted class (TDA's cache rule). Per sample with
views X [V, d] (view 0 the original image), s = logit_scale:

1. Confident views against normalize(W): the max(1, int(V * keep)) views of lowest softmax entropy; f = their
   mean feature (not renormalised), pred = argmax of their mean logits, h = entropy of their mean probability
   (a single view: its own softmax entropy).
2. The cache admits (f, h / log2 K) into class pred (TDA's update_cache); each cached class c has the
   prototype k_c = mean of its entries.
3. One AdamW step (fresh optimizer, eps 1e-3, weight decay 0.1; lr_text, lr_image) on zero-initialised
   residuals R_t [K, d] and R_v [C, d] (C cached classes): with W' = normalize(W + R_t), k' = normalize(k + R_v),
   logits z = s W' f + alpha * sum_c exp(-beta (1 - k'_c . f)) e_c, the loss is
   H(softmax(z)) + align * InfoNCE(k', W'[cached]) (temperature 0.01, each cache prototype against its own
   class's text prototype, the other cached classes as negatives).
4. Prediction with the stepped residuals: z as above on view 0 (`predict_views: original`), or on the
   confident views re-selected against the stepped W' (`confident`, the official ImageNet-A branch).
5. If H(softmax(z)) / log2 K < tau_global, W <- W * n / (n + 1) + W' / (n + 1) with n the number of such
   updates so far, counting this one (the official cumulative average; W is not renormalised, every use is).

Trace: selected = the cache class pred, gated = the cache admitted the sample, gated_prior always False;
state: text (W), text_updates (n), cache_keys / cache_entropy (TDA's layout, entropy inf where empty).

Where the official code differs from the paper, this follows the code:
- The entropy loss is that of softmax(mean confident-view logits + cache logits), one distribution for the
  averaged views, rather than TPT's entropy of the views' averaged probabilities; the cache logits use the
  mean confident feature f.
- The visual prototypes do not evolve themselves: R_v is rebuilt from zero every sample and acts on that
  sample's prediction only; the cache contents (TDA's rule) are what persists.
- The official code runs in fp16 under autocast, and its residuals are float16 Parameters (main_dpe.py:163,
  171, 177) that AdamW steps in float16: there the second moment (1 - beta2) g^2 underflows for |g| below
  about 5e-3, the denominator falls to eps, and a step reaches up to about 5 lr instead of at most lr. This
  runs in float32 with torch.optim.AdamW's arithmetic by default (float16's underflow is a property of the
  dtype, not of the method); `state_dtype: float16` keeps the residuals in float16 and steps them with
  torch's float16 AdamW (the gradients reach them rounded to float16; the rest stays float32, no autocast).
- InfoNCE normalises its inputs again; they are unit vectors already, so this skips that no-op.
Views: the official protocol uses AugMix (63 + the original) on ImageNet and its variants and the single
original view on the ten cross-domain sets (utils.py:201-215; the card's `views: protocol`). Text: the official class prototypes average the dataset's
templates and its CuPL prompts (gpt3_prompts/CuPL_prompts_<dataset>.json), one unit embedding per prompt:
pass them as several rows per class (M > K), which are averaged and renormalised here.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from orchestrator.methods.base import Method, StageTimer, Trace
from orchestrator.methods.prototypes import class_prototypes, confident_views, mean_prob_entropy
from orchestrator.methods.caches import ClassCache

ADAM_EPS = 1e-3
WEIGHT_DECAY = 0.1
ALIGN_TEMPERATURE = 0.01


class DPE(Method):
    """Dual prototype evolving: textual prototypes averaged over confident samples, a visual cache, and one
    AdamW step per sample on residuals of both."""

    name = "dpe"

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                 **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        d, device = class_embeddings.shape[1], class_embeddings.device
        self.text = class_prototypes(class_embeddings, class_ids, num_classes)
        self.text_updates = 0
        self.cache = ClassCache(num_classes, hparams["shot"], d, device, with_values=False)
        self.cache_mean = torch.zeros(num_classes, d, dtype=torch.float32, device=device)
        self.cached = torch.zeros(num_classes, dtype=torch.bool, device=device)


    def _confident(self, views: torch.Tensor, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(mean confident feature, mean confident logits, entropy of their mean probability) against `text`."""
        logits = self.hp["logit_scale"] * views @ text.T
        idx = confident_views(logits, self.hp["keep"])
        return views[idx].mean(0), logits[idx].mean(0), mean_prob_entropy(logits[idx])

    def _cache_logits(self, f: torch.Tensor, keys: torch.Tensor, cached: torch.Tensor) -> torch.Tensor:
        hp = self.hp
        affinity = torch.exp(-hp["beta"] * (1.0 - keys @ f))
        out = torch.zeros(self.num_classes, dtype=f.dtype, device=f.device)
        return out.index_add(0, cached, hp["alpha"] * affinity)

    def _residuals(self, f: torch.Tensor, keys: torch.Tensor,
                   cached: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One AdamW step from zero on the text and cache residuals (the official per-sample optimizer)."""
        hp = self.hp
        dtype = torch.float16 if hp["state_dtype"] == "float16" else self.text.dtype
        r_text = torch.zeros_like(self.text, dtype=dtype, requires_grad=True)
        r_image = torch.zeros_like(keys, dtype=dtype, requires_grad=True)
        optimizer = torch.optim.AdamW([{"params": [r_text], "lr": hp["lr_text"]},
                                       {"params": [r_image], "lr": hp["lr_image"]}],
                                      eps=ADAM_EPS, weight_decay=WEIGHT_DECAY)
        with torch.enable_grad():
            text = F.normalize(self.text + r_text, dim=1)
            new_keys = F.normalize(keys + r_image, dim=1)
            logits = hp["logit_scale"] * text @ f + self._cache_logits(f, new_keys, cached)
            loss = mean_prob_entropy(logits[None])
            if hp["align"] > 0:
                pairs = new_keys @ text[cached].T / ALIGN_TEMPERATURE
                loss = loss + hp["align"] * F.cross_entropy(pairs, torch.arange(len(cached), device=f.device))
            optimizer.zero_grad()
            loss.backward()
        optimizer.step()
        return r_text.detach(), r_image.detach()

    def _step(self, views: torch.Tensor, timer: StageTimer) -> tuple[torch.Tensor, int, bool]:
        """One sample: (posterior [K], the cache class, whether the cache admitted it)."""
        hp, K = self.hp, self.num_classes
        with timer("logits"):
            f, mean_logits, h = self._confident(views, F.normalize(self.text, dim=1))
            pred = int(mean_logits.argmax())
        with timer("update"):
            admitted = self.cache.offer(pred, f, float(h) / math.log2(K))
            if admitted:
                filled = torch.isfinite(self.cache.entropy[pred])
                self.cache_mean[pred] = self.cache.keys[pred][filled].mean(0)
                self.cached[pred] = True
            cached = torch.nonzero(self.cached).flatten()
            keys = self.cache_mean[cached]
            r_text, r_image = self._residuals(f, keys, cached)
        with timer("posterior"):
            text = F.normalize(self.text + r_text, dim=1)
            if hp["predict_views"] == "original":
                f_pred = views[0]
                clip_logits = hp["logit_scale"] * text @ f_pred
            else:
                f_pred, clip_logits, _ = self._confident(views, text)
            logits = clip_logits + self._cache_logits(f_pred, F.normalize(keys + r_image, dim=1), cached)
            post = torch.softmax(logits, dim=0)
        with timer("update"):
            if float(mean_prob_entropy(logits[None])) / math.log2(K) < hp["tau_global"]:
                self.text_updates += 1
                n = self.text_updates
                self.text = self.text * (n / (n + 1)) + text / (n + 1)
        return post, pred, admitted

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"text": self.text.clone(), "text_updates": torch.tensor(self.text_updates, dtype=torch.int64),
                "cache_keys": self.cache.keys.clone(), "cache_entropy": self.cache.entropy.clone()}

    def _run(self, features: torch.Tensor) -> Trace:
        return self.run_steps(features)
