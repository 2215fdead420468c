"""TDA (Karmanov et al., CVPR 2024): training-free dynamic adapter with positive and negative caches,
and `tda_pa`: TDA's likelihood with BCA's prior adaptation (the supplementary's "TDA + PA").

TDA, per sample f, exactly as the public code (kdiAAA/TDA) runs it:

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

Augmented views (features [n, V, d], view 0 the original, V > 1), as the public code's get_clip_logits:
each view's class logits and softmax are computed, the PROTOCOL_KEEP (10%) views with the lowest softmax
entropy are kept (at least one; ties go to the earlier view), and
- f (the cache key) = the mean of the kept views' features (not renormalised);
- logits = the mean of the kept views' per-embedding logits, clip_logits = their per-class log-sum-exp
  (for M = K exactly the code's mean of the kept views' logits), pred = argmax clip_logits;
- loss = the entropy of the kept views' AVERAGED PROBABILITIES (the code's avg_entropy: log-mean-exp of
  their log-softmaxes), not the entropy of softmax(clip_logits);
- prob_map = the mean of the kept views' softmaxes (the negative cache's value).
A single view (V = 1, or features [n, d]) takes the single-view branch above, as the code does.

Precision: float32 by default. The public code runs everything in float16 (clip.load on CUDA gives a half
model: the features, the text weights, the logits, the entropies, the cache keys and values, the cache logits
and the final logits are float16; the loss that ranks the caches is a float16 value). `state_dtype: float16`
(tda only) reproduces that on the run's inputs rounded to float16: every tensor above is float16, in the
public code's order of operations ((logit_scale * f) @ W, final = clip + pos - neg in two roundings), and the
posterior is the float32 softmax of the float16 final logits (their argmax is the public code's prediction).
float32 stays the default: what float16 changes is rounding, not the method (docs/methods.md, Dtypes).

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

import math
from typing import Any, Iterator

import torch

from orchestrator.methods.base import Method, StageTimer, Trace, empty_trace
from orchestrator.methods.caches import ClassCache
from orchestrator.methods.numerics import avg_entropy, product
from orchestrator.methods.bca.reference import blend, update_weights
from orchestrator.methods.views import PROTOCOL_KEEP, gather_views, lowest_entropy_logit_views

NEG_ENTROPY_BOUNDS = (0.2, 0.5)
NEG_MASK_BOUNDS = (0.03, 1.0)

def class_logits(logits: torch.Tensor, class_ids: torch.Tensor | None, num_classes: int) -> torch.Tensor:
    """Per-class log-sum-exp of per-embedding logits [..., M] -> [..., K]; exact for single-embedding classes.
    `class_ids` None says row k is class k's only embedding: the logits are returned as they are (what the
    log-sum-exp of one term gives, bit for bit, without its scatter over [..., M])."""
    if class_ids is None:
        return logits
    shape = (*logits.shape[:-1], num_classes)
    index = class_ids.expand(logits.shape)
    top = torch.full(shape, -math.inf, dtype=logits.dtype, device=logits.device)
    top = top.scatter_reduce(-1, index, logits, reduce="amax")
    sums = torch.zeros(shape, dtype=logits.dtype, device=logits.device)
    sums = sums.index_add(-1, class_ids, torch.exp(logits - top[..., class_ids]))
    return top + torch.log(sums)


VIEW_CHUNK_FLOATS = {"cpu": 1 << 20}
VIEW_CHUNK_FLOATS_OTHER = 1 << 26


def view_chunk(features: torch.Tensor, num_embeddings: int) -> int:
    """Samples per chunk of the view path for views [n, V, d] against M class embeddings."""
    budget = VIEW_CHUNK_FLOATS.get(features.device.type, VIEW_CHUNK_FLOATS_OTHER)
    return max(1, budget // (features.shape[1] * num_embeddings))


class TDA(Method):
    """TDA with positive and negative caches (per-dataset pos_alpha / pos_beta: its registry card)."""

    name = "tda"
    with_prior = False

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                 **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        d, device = class_embeddings.shape[1], class_embeddings.device
        identity = class_ids.shape[0] == num_classes and torch.equal(
            class_ids, torch.arange(num_classes, device=class_ids.device))
        self.logit_classes = None if identity else class_ids  # class_logits' argument
        # tda_pa has no float16 option: BCA's prior update is float32 (its card has no state_dtype)
        self.dtype = torch.float16 if hparams.get("state_dtype") == "float16" else torch.float32
        self.embeddings = class_embeddings.to(self.dtype)
        self.pos = ClassCache(num_classes, hparams["pos_shot"], d, device, with_values=False, dtype=self.dtype)
        self.neg = ClassCache(num_classes, hparams["neg_shot"], d, device, with_values=True, dtype=self.dtype)
        if self.with_prior:
            m = class_embeddings.shape[0]
            self.V = torch.nn.functional.one_hot(class_ids, num_classes).float()
            self.C2 = torch.full((m,), float(hparams["n2"]), dtype=torch.float32, device=device)

    def _single_view(self, features: torch.Tensor, timer: StageTimer) -> Iterator[tuple[torch.Tensor, ...]]:
        """Per sample (f, per-embedding logits, clip_logits, prob_map, loss): the code's single-view branch."""
        for f in features:
            with timer("logits"):
                if self.dtype == torch.float16:  # the public code's order: (logit_scale * f) @ W, each rounded
                    logits = product(self.hp["logit_scale"] * f, self.embeddings.T)
                else:
                    logits = self.hp["logit_scale"] * (self.embeddings @ f)
                clip_logits = class_logits(logits, self.logit_classes, self.num_classes)
                prob_map = torch.softmax(clip_logits, dim=0)
                loss_t = -(prob_map * torch.log_softmax(clip_logits, dim=0)).sum()
            yield f, logits, clip_logits, prob_map, loss_t

    def view_queries(self, chunk: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A chunk of samples' views [c, V, d] -> per sample (f, per-embedding logits, clip_logits, prob_map,
        loss) from its kept views (module docstring), each with a leading [c] axis."""
        logits = product(self.hp["logit_scale"] * chunk, self.embeddings.T)         # [c, V, M], as the code orders it
        view_logits = class_logits(logits, self.logit_classes, self.num_classes)          # [c, V, K]
        kept = lowest_entropy_logit_views(view_logits, PROTOCOL_KEEP)
        kept_logits = gather_views(view_logits, kept)
        f = gather_views(chunk, kept).mean(dim=1)
        mean_logits = gather_views(logits, kept).mean(dim=1)
        clip_logits = class_logits(mean_logits, self.logit_classes, self.num_classes)
        prob_map = torch.softmax(kept_logits, dim=-1).mean(dim=1)
        return f, mean_logits, clip_logits, prob_map, avg_entropy(kept_logits)

    def _views(self, features: torch.Tensor, timer: StageTimer) -> Iterator[tuple[torch.Tensor, ...]]:
        """The same per sample from its kept views; stateless, so computed in chunks (`view_chunk`)."""
        chunk = view_chunk(features, self.embeddings.shape[0])
        for start in range(0, features.shape[0], chunk):
            with timer("logits"):
                queries = self.view_queries(features[start:start + chunk])
            yield from zip(*queries)

    def _run(self, features: torch.Tensor) -> Trace:
        return self._pass(features, adapt=True)

    def frozen(self, features: torch.Tensor) -> torch.Tensor:
        return self._pass(features, adapt=False).posteriors

    def _pass(self, features: torch.Tensor, adapt: bool) -> Trace:
        """The stream's rows from the caches (and prior) as they go; `adapt` False: from them as they are, no
        sample entering a cache or moving the prior (the official order offers a sample to the caches before its
        own logits, so this is not the first part of an adapting step)."""
        hp, K = self.hp, self.num_classes
        n = features.shape[0]
        posteriors, selected, gated, gated_prior = empty_trace(n, K, features.device)
        lo_entropy, hi_entropy = NEG_ENTROPY_BOUNDS
        lo_mask, hi_mask = NEG_MASK_BOUNDS
        log2_k = math.log2(K)
        timer = StageTimer()
        if features.ndim == 3 and features.shape[1] == 1:
            features = features[:, 0]
        features = features.to(self.dtype)
        samples = self._single_view(features, timer) if features.ndim == 2 else self._views(features, timer)
        for i, (f, logits, clip_logits, prob_map, loss_t) in enumerate(samples):
            with timer("logits"):
                loss = float(loss_t)
                entropy = float(loss_t / log2_k)
                pred = int(torch.argmax(clip_logits))
            with timer("update"):
                entered = adapt and self.pos.offer(pred, f, loss)
                if adapt and lo_entropy < entropy < hi_entropy:
                    mask = ((prob_map > lo_mask) & (prob_map < hi_mask)).to(self.dtype)
                    entered = self.neg.offer(pred, f, loss, mask) or entered
                gated[i] = entered
            with timer("logits"):
                positive = self.pos.class_sums(f, hp["pos_beta"])
                negative = self.neg.value_sums(f, hp["neg_beta"])
                adjustment = hp["pos_alpha"] * positive - hp["neg_alpha"] * negative
            if not self.with_prior:
                with timer("posterior"):
                    if self.dtype == torch.float16:  # the public code's two roundings: final += pos; final -= neg
                        final = (clip_logits + hp["pos_alpha"] * positive) - hp["neg_alpha"] * negative
                    else:
                        final = clip_logits + adjustment
                    posteriors[i] = torch.softmax(final.float(), dim=0)
                continue
            with timer("posterior"):
                p = torch.softmax(logits + adjustment[self.class_ids], dim=0)
                post = p @ self.V
                post = post / post.sum()
                posteriors[i] = post
            if not adapt:
                continue
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
