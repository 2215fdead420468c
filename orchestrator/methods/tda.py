"""TDA (Karmanov et al., CVPR 2024): training-free dynamic adapter with positive and negative caches,
and `tda_pa`: TDA's likelihood with BCA's prior adaptation (the supplementary's "TDA + PA").

TDA, per sample f, exactly as the public code (REFERENCE.md section 3):

1. clip_logits = logit_scale * U f per class; prob_map = softmax(clip_logits); pred = argmax;
   loss = softmax entropy of clip_logits (nats); gating entropy = loss / log2(K) (the code's own mix of bases).
2. Positive cache (pos_shot entries per class): (f, loss) is offered to slot `pred`: appended while the slot
   has room, else it replaces the slot's worst entry when its loss is strictly lower; each slot is kept
   sorted by loss (stable, so among equal losses the older entry ranks first and the newer is replaced).
3. Negative cache (neg_shot per class): (f, loss, prob_map) is offered to slot `pred` the same way, but
   only when 0.2 < gating entropy < 0.5.
4. The caches are updated BEFORE the sample's own logits are computed (as in the public code), then
   final = clip_logits + pos_alpha * A(pos) @ onehot(pos classes) - neg_alpha * A(neg) @ mask(neg prob maps),
   with A(cache) = exp(-beta * (1 - f . keys)) and mask = (prob_map > 0.03) & (prob_map < 1.0).
5. posterior = softmax(final).

With M > K class embeddings (several prompts per class), a class's CLIP logit is the log-sum-exp of its
embeddings' logits, so softmax(clip_logits) is the class-summed softmax over M that `clip` returns; with
one embedding per class (TDA's setting) this is exactly logit_scale * u_k . f.
For AugMix datasets the public code takes the entropy and prob_map from the kept views' individual logits;
here a sample is its averaged feature (the orchestrator's feature contract), so both come from the mean
logits, which are identical to the code's clip_logits. Everything runs in float32 (the public code in fp16).

tda_pa: the prior attaches per class embedding. The cache adjustment of class k is added to the logit of
every embedding of class k, z_m = logit_scale * u_m . f + (pos - neg)[class(m)], so that p = softmax(z)
summed into classes is exactly TDA's posterior; BCA's prior then enters as in Eq. 8: post = p V, with V
[M, K] one-hot at start and adapted by Eq. 9 (count rule, counter C2 = n2) on the row s = argmax_m p[m]
when p[s] > tau. While V is one-hot (e.g. tau >= 1) tda_pa equals tda. The caches are TDA's, untouched by
the prior (they are keyed by the zero-shot prediction).

Trace: `gated` = the sample entered the positive or the negative cache; `gated_prior` = the prior update
fired (tda_pa); `selected` = s for tda_pa, -1 for tda. State: the caches ('pos_keys' [K, pos_shot, d],
'pos_entropy' [K, pos_shot] with inf for empty entries, 'neg_keys', 'neg_entropy', 'neg_values'
[K, neg_shot, K]) and, for tda_pa, 'V' and 'C2'.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import torch

from orchestrator.methods.base import Method, StageTimer, Trace, empty_trace
from orchestrator.methods.reference import blend, update_weights

NEG_ENTROPY_BOUNDS = (0.2, 0.5)
NEG_MASK_BOUNDS = (0.03, 1.0)

def class_logits(logits: torch.Tensor, class_ids: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Per-class log-sum-exp of per-embedding logits [M] -> [K]; exact for classes with a single embedding."""
    top = torch.full((num_classes,), -math.inf, dtype=logits.dtype, device=logits.device)
    top = top.scatter_reduce(0, class_ids, logits, reduce="amax")
    sums = torch.zeros(num_classes, dtype=logits.dtype, device=logits.device)
    sums = sums.index_add(0, class_ids, torch.exp(logits - top[class_ids]))
    return top + torch.log(sums)


class ClassCache:
    """TDA's per-class cache: `shot` entries per class, each slot ranked by entropy (lowest first)."""

    def __init__(self, num_classes: int, shot: int, dim: int, device: torch.device, with_values: bool) -> None:
        self.shot = shot
        self.keys = torch.zeros(num_classes, shot, dim, dtype=torch.float32, device=device)
        self.entropy = torch.full((num_classes, shot), math.inf, dtype=torch.float32, device=device)
        self.values = (torch.zeros(num_classes, shot, num_classes, dtype=torch.float32, device=device)
                       if with_values else None)
        # Per class, the entries' (loss, physical index) in rank order; entries never move physically.
        self.ranking: list[list[tuple[float, int]]] = [[] for _ in range(num_classes)]

    def offer(self, k: int, key: torch.Tensor, loss: float, value: torch.Tensor | None = None) -> bool:
        """TDA's update_cache: append while there is room, else replace the worst if strictly better."""
        if self.shot == 0:
            return False
        ranking = self.ranking[k]
        if len(ranking) < self.shot:
            slot = len(ranking)
        elif loss < ranking[-1][0]:
            slot = ranking.pop()[1]
        else:
            return False
        # Stable re-sort: the new entry goes after every entry with an equal loss.
        ranking.insert(bisect.bisect_right([entry[0] for entry in ranking], loss), (loss, slot))
        self.keys[k, slot] = key
        self.entropy[k, slot] = loss
        if self.values is not None:
            self.values[k, slot] = value
        return True

    def affinity_weights(self, f: torch.Tensor, beta: float) -> torch.Tensor:
        """exp(-beta * (1 - f . key)) per entry [K, shot], zero for empty entries."""
        affinity = self.keys @ f
        weights = torch.exp(-1.0 * (beta - beta * affinity))
        return torch.where(torch.isfinite(self.entropy), weights, torch.zeros_like(weights))

    def state(self, prefix: str) -> dict[str, torch.Tensor]:
        out = {f"{prefix}_keys": self.keys.clone(), f"{prefix}_entropy": self.entropy.clone()}
        if self.values is not None:
            out[f"{prefix}_values"] = self.values.clone()
        return out


class TDA(Method):
    """TDA with positive and negative caches (per-dataset pos_alpha / pos_beta: its registry card)."""

    name = "tda"
    with_prior = False

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                 **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        d, device = class_embeddings.shape[1], class_embeddings.device
        self.pos = ClassCache(num_classes, hparams["pos_shot"], d, device, with_values=False)
        self.neg = ClassCache(num_classes, hparams["neg_shot"], d, device, with_values=True)
        if self.with_prior:
            m = class_embeddings.shape[0]
            self.V = torch.nn.functional.one_hot(class_ids, num_classes).float()
            self.C2 = torch.full((m,), float(hparams["n2"]), dtype=torch.float32, device=device)

    def _run(self, features: torch.Tensor) -> Trace:
        hp, K = self.hp, self.num_classes
        n = features.shape[0]
        posteriors, selected, gated, gated_prior = empty_trace(n, K, features.device)
        lo_entropy, hi_entropy = NEG_ENTROPY_BOUNDS
        lo_mask, hi_mask = NEG_MASK_BOUNDS
        log2_k = math.log2(K)
        timer = StageTimer()
        for i in range(n):
            f = features[i]
            with timer("logits"):
                logits = hp["logit_scale"] * (self.class_embeddings @ f)
                clip_logits = class_logits(logits, self.class_ids, K)
                prob_map = torch.softmax(clip_logits, dim=0)
                loss_t = -(prob_map * torch.log_softmax(clip_logits, dim=0)).sum()
                loss = float(loss_t)
                entropy = float(loss_t / log2_k)
                pred = int(torch.argmax(clip_logits))
            with timer("update"):
                entered = self.pos.offer(pred, f, loss)
                if lo_entropy < entropy < hi_entropy:
                    mask = ((prob_map > lo_mask) & (prob_map < hi_mask)).float()
                    entered = self.neg.offer(pred, f, loss, mask) or entered
                gated[i] = entered
            with timer("logits"):
                positive = self.pos.affinity_weights(f, hp["pos_beta"]).sum(dim=1)
                negative = self.neg.affinity_weights(f, hp["neg_beta"]).flatten() @ self.neg.values.flatten(0, 1)
                adjustment = hp["pos_alpha"] * positive - hp["neg_alpha"] * negative
            if not self.with_prior:
                with timer("posterior"):
                    posteriors[i] = torch.softmax(clip_logits + adjustment, dim=0)
                continue
            with timer("posterior"):
                p = torch.softmax(logits + adjustment[self.class_ids], dim=0)
                post = p @ self.V
                post = post / post.sum()
                posteriors[i] = post
            with timer("update"):
                s = int(torch.argmax(p))
                selected[i] = s
                if float(p[s]) > hp["tau"]:
                    a, b, c_next = update_weights("count", float(self.C2[s]), hp["n2"], 1.0)
                    self.V[s] = blend(self.V[s], post, a, b)
                    self.C2[s] = c_next
                    gated_prior[i] = True
        state = {**self.pos.state("pos"), **self.neg.state("neg")}
        if self.with_prior:
            state.update(V=self.V.clone(), C2=self.C2.clone())
        return Trace(posteriors, selected, gated, gated_prior, state=state, timings=timer.seconds)


class TDAWithPrior(TDA):
    """TDA + PA: TDA's cache likelihood with BCA's prior V (Eqs. 8 and 9) attached per class embedding."""

    name = "tda_pa"
    with_prior = True
