"""BoostAdapter (Zhang et al., NeurIPS 2024): TDA's caches plus a per-sample boosting cache built from the
sample's own confident views.

As the official `run_test_tda` in boostadapter mode (taolinzhang/BoostAdapter runner.py), per
sample with view features F [V, d] (view 0 the original image), class embeddings T [K, d] and view
logits L_v = logit_scale * T F_v, view entropies e_v = H(softmax(L_v)) in nats:

1. query: with one view, or query='original', f = F_0, l = L_0, H = e_0, pm = softmax(L_0); with
   query='confident' and V > 1, over the int(keep V) lowest-entropy views S: f = mean F_S (not
   renormalised), l = mean L_S, pm = mean softmax(L_S), H = H(pm). pred = argmax l.
2. positive cache (kept): (f, H) offered to class pred by TDA's rule (the pos_shot lowest-entropy entries).
3. boosting cache (this sample only): a copy of the positive cache; each of the int(keep V) lowest-entropy
   views v (view 0 a candidate), in increasing e_v, joins class argmax L_v as (F_v, e_v); each class keeps
   its pos_shot + delta lowest-entropy entries (a stable sort: earlier entries win ties).
4. negative cache (kept): if 0.2 < H / log2(K) < 0.5, (f, H, mask(pm)) joins class pred, FIFO: a class
   holding more than neg_shot entries drops its oldest (TDA instead keeps the lowest-entropy ones).
5. logits = l + pos_alpha * sum over boosting-cache entries of exp(-pos_beta (1 - f.k)) onehot(class)
   - neg_alpha * sum over negative entries of exp(-neg_beta (1 - f.k)) mask, with mask = 0.03 < pm < 1;
   the posterior is their softmax. Steps 2-4 come first, so a sample sees its own entries.

Paper vs code: the code is followed throughout. The paper's boosting samples are "filtered" augmented views
and it presents the negative cache as TDA's; the code takes the int(0.1 V) lowest-entropy views of all V
(view 0 included, so in query='original' mode view 0 can count twice: once as the positive entry, once as
a boosting view) and makes the negative cache FIFO. The query mode is per dataset in the code
(`infer_ori_image`: view 0 for the ten cross-domain sets, the confident mean for ImageNet-A/V2/R/Sketch;
ImageNet runs with a single view, so it has no boosting views and is TDA with a FIFO negative cache).
`delta` is read from the dataset's YAML (imagenet.yaml has none; it is unused there). The official code
runs in fp16; ours in float32, with ties broken by the lower view index (the official argsort is not
stable).

Official code takes one text embedding per class: the class prototypes (`class_prototypes`: each class's
rows averaged and renormalised, the official prompt ensemble).

Trace: `gated` = the sample entered the positive or the negative cache; `selected` -1. State: the kept
caches as TDA's ('pos_keys' [K, pos_shot, d], 'pos_entropy' [K, pos_shot], inf for empty entries,
'neg_keys', 'neg_entropy', 'neg_values' [K, neg_shot, K] the masks); the boosting cache is never kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from orchestrator.methods.base import Method, StageTimer, Trace, empty_trace
from orchestrator.methods.prototypes import class_prototypes
from orchestrator.methods.caches import ClassCache
from orchestrator.methods.tda.method import NEG_ENTROPY_BOUNDS, NEG_MASK_BOUNDS

QUERY_CHUNK = 256  # samples whose queries are computed at once: bounds the [chunk, V, K] view logits in memory


class FifoClassCache(ClassCache):
    """BoostAdapter's negative cache: per class the newest `shot` entries, whatever their entropy."""

    def offer(self, k: int, key: torch.Tensor, loss: float, value: torch.Tensor | None = None) -> bool:
        if self.shot == 0:
            return False
        ranking = self.ranking[k]  # here in arrival order
        if len(ranking) == self.shot:
            _, slot, row = ranking.pop(0)
        else:
            slot, row = len(ranking), self.new_row(k)
        ranking.append((loss, slot, row))
        self.store(k, slot, row, key, loss, value)
        return True


@dataclass
class Queries:
    """The stateless part of a chunk of samples, computed at once: each sample's cache query and its
    boosting views (`boost_*` [n, b], in increasing entropy). The per-sample step is `update` then
    `cache_logits` of (the caches, sample i of a Queries)."""

    feature: torch.Tensor       # [n, d] the query f
    logits: torch.Tensor        # [n, K] l
    entropy: torch.Tensor       # [n] H (nats)
    mask: torch.Tensor          # [n, K] the negative cache's value, 0.03 < pm < 1
    boost_feature: torch.Tensor  # [n, b, d] F_v
    boost_class: torch.Tensor   # [n, b] argmax of each view's logits
    boost_entropy: torch.Tensor  # [n, b] e_v


def entropy_nats(probs: torch.Tensor) -> torch.Tensor:
    """H(p) over the last axis, accurate for near one-hot p: the top class's term comes from the others'
    total mass delta, -(1 - delta) log1p(-delta), since 1 - delta itself rounds to 1 in float32. Cache
    entries are ranked by these entropies, and confident views' entropies are often below 1e-6."""
    rest = probs.scatter(-1, probs.argmax(dim=-1, keepdim=True), 0.0)
    delta = rest.sum(dim=-1)
    return -torch.special.xlogy(rest, rest).sum(dim=-1) - (1 - delta) * torch.log1p(-delta)


@dataclass
class ScoredViews:
    """A chunk of views [n, V, d] scored against the classes at one logit scale: what the queries and the
    boosting views of every query mode and keep are chosen from."""

    features: torch.Tensor  # [n, V, d] F
    logits: torch.Tensor    # [n, V, K] L_v
    probs: torch.Tensor     # [n, V, K] softmax(L_v)
    entropy: torch.Tensor   # [n, V] e_v
    order: torch.Tensor     # [n, V] the views by increasing entropy (ties: the lower view index)


def score_views(features: torch.Tensor, text: torch.Tensor, logit_scale: float) -> ScoredViews:
    """Step 1's per-view numbers for a chunk [n, V, d], shared by every query mode and keep."""
    logits = logit_scale * features @ text.T
    probs = torch.softmax(logits, dim=-1)
    entropy = entropy_nats(probs)
    return ScoredViews(features, logits, probs, entropy, torch.argsort(entropy, dim=1, stable=True))


def queries(views: ScoredViews, hp: dict[str, Any]) -> Queries:
    """Steps 1 and the boosting-view choice of step 3 for a chunk of views scored at hp's logit_scale."""
    features, logits, view_probs, view_entropy = views.features, views.logits, views.probs, views.entropy
    n, V, _ = features.shape
    order = views.order[:, :int(V * hp["keep"])]
    rows = torch.arange(n, device=features.device)[:, None]
    if V == 1 or hp["query"] == "original":
        feature, query_logits, pm, entropy = features[:, 0], logits[:, 0], view_probs[:, 0], view_entropy[:, 0]
    else:
        feature, query_logits = features[rows, order].mean(dim=1), logits[rows, order].mean(dim=1)
        pm = view_probs[rows, order].mean(dim=1)
        entropy = entropy_nats(pm)
    lo, hi = NEG_MASK_BOUNDS
    return Queries(feature, query_logits, entropy, ((pm > lo) & (pm < hi)).float(), features[rows, order],
                   torch.gather(logits.argmax(dim=-1), 1, order), torch.gather(view_entropy, 1, order))


class BoostAdapter(Method):
    """TDA's positive and negative caches, the positive one boosted per sample by its confident views
    (hparams and their per-dataset defaults, the official configs/*.yaml: its registry card)."""

    name = "boostadapter"

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                 **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        self.text = class_prototypes(class_embeddings, class_ids, num_classes)
        d, device = class_embeddings.shape[1], class_embeddings.device
        self.pos = ClassCache(num_classes, hparams["pos_shot"], d, device, with_values=False)
        self.neg = FifoClassCache(num_classes, hparams["neg_shot"], d, device, with_values=True)

    def _run(self, features: torch.Tensor) -> Trace:
        hp, K = self.hp, self.num_classes
        n, V, _ = features.shape
        self.check_views(V)
        posteriors, selected, gated, gated_prior = empty_trace(n, K, features.device)
        timer = StageTimer()
        for start in range(0, n, QUERY_CHUNK):
            with timer("logits"):
                q = queries(score_views(features[start:start + QUERY_CHUNK], self.text, hp["logit_scale"]), hp)
            for j in range(q.logits.shape[0]):
                with timer("update"):
                    gated[start + j] = self.update(q, j)
                with timer("logits"):
                    logits = q.logits[j] + self.cache_logits(q, j)
                with timer("posterior"):
                    posteriors[start + j] = torch.softmax(logits, dim=0)
        state = {**self.pos.state("pos"), **self.neg.state("neg")}
        return Trace(posteriors, selected, gated, gated_prior, state=state, timings=timer.seconds)

    def check_views(self, views: int) -> None:
        """The confident query needs a view to average (checked per run: V comes with the features)."""
        hp = self.hp
        if views > 1 and hp["query"] == "confident" and int(views * hp["keep"]) == 0:
            raise ValueError(f"boostadapter: query='confident' averages the int(keep * V) most confident views, "
                             f"which is none for keep = {hp['keep']} and V = {views}; use more views, a larger "
                             f"keep or query='original'")

    def update(self, q: Queries, i: int) -> bool:
        """Steps 2 and 4: offer sample i's query to the kept caches; True if it entered either."""
        f, loss = q.feature[i], float(q.entropy[i])
        pred = int(torch.argmax(q.logits[i]))
        entered = self.pos.offer(pred, f, loss)
        lo, hi = NEG_ENTROPY_BOUNDS
        if lo < loss / math.log2(self.num_classes) < hi:
            entered = self.neg.offer(pred, f, loss, q.mask[i]) or entered
        return entered

    def cache_logits(self, q: Queries, i: int) -> torch.Tensor:
        """Step 5's cache terms [K] for sample i: the boosting cache's and the negative cache's."""
        hp, f, pos = self.hp, q.feature[i], self.pos
        # Over the filled entries only (compact rows), as the public code's lists: not the K * shot capacity.
        pos_weights = pos.weights(f, hp["pos_beta"])
        positive = torch.zeros(self.num_classes, dtype=pos_weights.dtype, device=f.device)
        positive.index_add_(0, pos.row_classes[:pos.filled], pos_weights)
        boost_classes = q.boost_class[i].tolist()
        if boost_classes:
            boost_weights = torch.exp(-1.0 * (hp["pos_beta"] - hp["pos_beta"] * (q.boost_feature[i] @ f)))
            boost_entropy = q.boost_entropy[i].tolist()
            capacity = hp["pos_shot"] + hp["delta"]
            for c in set(boost_classes):
                # The class's entries in rank order: its kept positive entries, then its boosting views
                # (already in increasing entropy); a stable sort by entropy, truncated to the capacity.
                entries = [(loss, pos_weights[row]) for loss, _, row in pos.ranking[c]]
                entries += [(e, w) for e, cls, w in zip(boost_entropy, boost_classes, boost_weights) if cls == c]
                entries.sort(key=lambda entry: entry[0])
                positive[c] = torch.stack([w for _, w in entries[:capacity]]).sum()
        negative = self.neg.value_sums(f, hp["neg_beta"])
        return hp["pos_alpha"] * positive - hp["neg_alpha"] * negative
