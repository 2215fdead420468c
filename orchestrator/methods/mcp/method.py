"""MCP (Chen et al., ICCV 2025, "Multi-Cache Enhanced Prototype Learning"), training-free, as its official code runs
it with --res False (CenturyChen/MCP@f9d063f mcp_runner.py run_test_mcp); MCP++ (--res True, `MCPPlusPlus` below)
adds an AdamW step per sample on text and prototype residuals.

State: three per-class caches kept sorted by loss (lowest first), each entry a feature and its loss; the cached
features of each class as last merged (`memory`, [K, entropy_shot + align_shot, d]) and its prototype, their mean.
Per sample with views X [V, d] (view 0 the original), text prototypes T [K, d], s = logit_scale, H = log2 K:

1. p_v = softmax(s T x_v); the confident views are the max(1, int(V keep)) of lowest -sum p log(p + 1e-6):
   p_conf = their mean probability, its argmax y_a, h_a = -sum p_conf log(max(p_conf, 1e-8)).
2. The query: f = x_0, z = s T f, h = entropy of softmax(z) (query 'original'), or on ImageNet-A (query
   'confident') TDA's: the kept views (lowest entropy of softmax(s T x_v)) give f = their mean feature (not
   renormalised), z = their mean logits, h = the entropy of their mean softmax. y_e = argmax z.
3. Entropy cache, class y_e: TDA's update_cache with (f, h): append while there is room, else replace the last
   (highest loss) entry when h is lower; the list is re-sorted (stable).
4. Align cache, class y_a, with (x_0, h_a): the class centre c = center P_y + (1 - center) T_y where the class
   has a prototype P_y, else T_y; append while there is room, else replace the last entry when h_a is lower and
   |x_0 - c| < |last - c|.
5. Merge, for y_e and y_a: the class's align entries then its entropy entries become its memory rows (zero
   beyond), and P = their mean.
6. Negative cache: with q = h / H in (0.2, 0.5), z_n = s T f + pos_alpha * (TDA's positive cache logits of
   the entropy cache's entries, pos_beta); h_n its softmax entropy, y_n its argmax; if h_n / H in (0.2, 0.5)
   the negative cache of y_n takes (f, h_n, mask of softmax(z_n) in (0.03, 1)); if h_n / H <= 0.2 the entropy
   cache of y_n takes (f, h_n), without a merge (the memory of y_n waits for y_n's next merge).
7. p_cache = softmax(z + pos_alpha exp(-pos_beta (1 - P_k . f)) [classes with a prototype] - neg_alpha *
   (TDA's negative cache logits, neg_beta)).
8. Read-out: for each class k, the keys are its memory rows and T_k, normalised (zero rows stay zero), the weights
   exp(-memory_beta (1 - key . x_0)); a_k = normalize(sum of weight * key); p_mem = softmax(s A x_0).
9. posterior = (p_conf + memory_weight p_mem + cache_weight p_cache) / (1 + memory_weight + cache_weight).

Trace: selected = y_e, gated = a cache changed, gated_prior always False.

This follows the code (the paper's text was not at hand to compare line by line), except where the code cannot be
followed online:
- The official code does not fix the fusion weights of step 9: after the stream it searches memory_weight and
  cache_weight over [0.001 .. 1000] against the test labels and reports the best accuracy. Here they are
  hyperparameters (1 and 1 by default); a sweep over the official grid gives the same oracle choice.
- The read-out's scale is s (the official 100. is CLIP's scale, the default here).
- int(V keep) is floored at one view, which only matters below 1 / keep views (the official code takes an empty
  mean there); the entropy orders are stable (the official argsort leaves ties unspecified).
- The official code runs in float16 (clip.load's half model, autocast); this runs in float32.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from orchestrator.methods.base import Method, StageTimer, Trace
from orchestrator.methods.dpe.method import ADAM_EPS, ALIGN_TEMPERATURE, WEIGHT_DECAY
from orchestrator.methods.prototypes import class_prototypes, mean_prob_entropy
from orchestrator.methods.numerics import avg_entropy
from orchestrator.methods.tda.method import NEG_ENTROPY_BOUNDS, NEG_MASK_BOUNDS
from orchestrator.methods.views import kept_count, logit_confidence_order


INFO_NCE_WEIGHT, PUSH_WEIGHT = 0.5, 0.2  # MCP++'s loss weights (run_test_mcp: lamda, gamma)


class SortedCache:
    """Per-class entries [K, shot, d] with their losses [K, shot] (inf where empty), each class's filled slots in
    the official list's order: by loss, an entry placed after those of equal loss (Python's stable sort)."""

    def __init__(self, num_classes: int, shot: int, dim: int, device: torch.device, values: int = 0) -> None:
        self.shot = shot
        self.keys = torch.zeros(num_classes, shot, dim, dtype=torch.float32, device=device)
        self.loss = torch.full((num_classes, shot), math.inf, dtype=torch.float32, device=device)
        self.values = (torch.zeros(num_classes, shot, values, dtype=torch.float32, device=device) if values
                       else None)
        self.count = torch.zeros(num_classes, dtype=torch.int64, device=device)

    def full(self, k: int) -> bool:
        return int(self.count[k]) == self.shot

    def worst(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The last entry of a full class: (its key, its loss)."""
        return self.keys[k, self.shot - 1], self.loss[k, self.shot - 1]

    def offer(self, k: int, key: torch.Tensor, loss: torch.Tensor, value: torch.Tensor | None = None) -> bool:
        """TDA's update_cache: append while class k has room, else replace its last entry when `loss` is lower."""
        if self.full(k) and not bool(loss < self.loss[k, self.shot - 1]):
            return False
        self.place(k, key, loss, value)
        return True

    def place(self, k: int, key: torch.Tensor, loss: torch.Tensor, value: torch.Tensor | None = None) -> None:
        """Insert into class k (dropping its last entry when full) where the official re-sort puts it."""
        c = int(self.count[k])
        kept = c if c < self.shot else c - 1
        pos = int((self.loss[k, :kept] <= loss).sum())
        rows = [self.keys, self.loss] + ([self.values] if self.values is not None else [])
        for t, new in zip(rows, (key, loss, value)):
            t[k, pos + 1:kept + 1] = t[k, pos:kept].clone()
            t[k, pos] = new
        self.count[k] = kept + 1

    def rows(self, k: int) -> torch.Tensor:
        return self.keys[k, :int(self.count[k])]

    def class_sums(self, f: torch.Tensor, beta: float) -> torch.Tensor:
        """[K] TDA's positive cache logits (before alpha): exp(-beta (1 - key . f)) summed per class."""
        filled = torch.isfinite(self.loss)
        return (torch.exp(-beta * (1.0 - self.keys @ f)) * filled).sum(1)

    def value_sums(self, f: torch.Tensor, beta: float) -> torch.Tensor:
        """[K] TDA's negative cache logits (before alpha): the weights times the entries' masks."""
        filled = torch.isfinite(self.loss)
        weights = torch.exp(-beta * (1.0 - self.keys @ f)) * filled
        return torch.einsum("ks,ksj->j", weights, self.values)


class MCP(Method):
    """Entropy, align and negative caches, per-class prototypes of the cached features, and their read-out."""

    name = "mcp"

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                 **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        d, device, K = class_embeddings.shape[1], class_embeddings.device, num_classes
        self.text = class_prototypes(class_embeddings, class_ids, num_classes)
        self.entropy = SortedCache(K, hparams["entropy_shot"], d, device)
        self.align = SortedCache(K, hparams["align_shot"], d, device)
        self.neg = SortedCache(K, hparams["neg_shot"], d, device, values=K)
        # the merged cached features, normalised as the read-out takes them (zero rows stay zero)
        self.memory = torch.zeros(K, hparams["entropy_shot"] + hparams["align_shot"], d, dtype=torch.float32,
                                  device=device)
        self.prototypes = torch.zeros(K, d, dtype=torch.float32, device=device)
        self.has_prototype = torch.zeros(K, dtype=torch.bool, device=device)
        self.log2_k = math.log2(K)

    def _merge(self, k: int) -> None:
        """update_cache_joint for class k: its align then entropy entries, their mean its prototype."""
        rows = torch.cat([self.align.rows(k), self.entropy.rows(k)])
        self.memory[k] = 0.0
        self.memory[k, :rows.shape[0]] = F.normalize(rows, dim=1)
        self.prototypes[k] = rows.mean(0)
        self.has_prototype[k] = True

    def _offer_align(self, k: int, x0: torch.Tensor, h: torch.Tensor) -> bool:
        """update_align_cache for class k."""
        cache = self.align
        if cache.full(k):
            text = self.text[k]
            centre = (self.hp["center"] * self.prototypes[k] + (1.0 - self.hp["center"]) * text
                      if bool(self.has_prototype[k]) else text)
            worst_key, worst_loss = cache.worst(k)
            if not (bool(h < worst_loss) and bool((x0 - centre).norm() < (worst_key - centre).norm())):
                return False
        cache.place(k, x0, h)
        return True

    def _step(self, views: torch.Tensor, timer: StageTimer) -> tuple[torch.Tensor, int, bool]:
        hp, s = self.hp, self.hp["logit_scale"]
        lo, hi = NEG_ENTROPY_BOUNDS
        x0 = views[0]
        with timer("logits"):
            view_logits = s * views @ self.text.T                                     # [V, K]
            kept = kept_count(views.shape[0], hp["keep"])
            p_conf = self._confident_probability(view_logits)
            y_a = int(p_conf.argmax())
            h_a = -(p_conf * torch.log(p_conf.clamp_min(1e-8))).sum()
            if hp["query"] == "original":
                query = torch.zeros(1, dtype=torch.int64, device=views.device)
                f, z = x0, view_logits[0]
                h = -(torch.softmax(z, 0) * torch.log_softmax(z, 0)).sum()
            else:
                query = logit_confidence_order(view_logits[None])[0, :kept]
                f, z = views[query].mean(0), view_logits[query].mean(0)
                h = avg_entropy(view_logits[query])
            y_e = int(z.argmax())
        with timer("update"):
            changed = self.entropy.offer(y_e, f, h)
            changed = self._offer_align(y_a, x0, h_a) or changed
            for k in {y_e, y_a}:
                self._merge(k)
            if lo < float(h / self.log2_k) < hi:
                z_n = s * (self.text @ f) + hp["pos_alpha"] * self.entropy.class_sums(f, hp["pos_beta"])
                p_n = torch.softmax(z_n, 0)
                h_n = -(p_n * torch.log_softmax(z_n, 0)).sum()
                y_n, q_n = int(z_n.argmax()), float(h_n / self.log2_k)
                if lo < q_n < hi:
                    mask = ((p_n > NEG_MASK_BOUNDS[0]) & (p_n < NEG_MASK_BOUNDS[1])).float()
                    changed = self.neg.offer(y_n, f, h_n, mask) or changed
                elif q_n <= lo:
                    changed = self.entropy.offer(y_n, f, h_n) or changed
        with timer("posterior"):
            negative = hp["neg_alpha"] * self.neg.value_sums(f, hp["neg_beta"])
        p_conf, p_cache = self._cache_posteriors(views, query, f, z, p_conf, negative, timer)
        with timer("posterior"):
            keys = torch.cat([self.memory, self.text[:, None]], dim=1)                 # [K, S + 1, d]
            weights = torch.exp(-hp["memory_beta"] * (1.0 - keys @ x0))
            read = F.normalize(torch.einsum("ks,ksd->kd", weights, keys), dim=1)
            p_mem = torch.softmax(s * (read @ x0), 0)
            w_mem, w_cache = hp["memory_weight"], hp["cache_weight"]
            post = (p_conf + w_mem * p_mem + w_cache * p_cache) / (1.0 + w_mem + w_cache)
        return post, y_e, changed

    def _confident_probability(self, view_logits: torch.Tensor) -> torch.Tensor:
        """select_confident_samples: the mean probability of the views of lowest -sum p log(p + 1e-6)."""
        probs = torch.softmax(view_logits, dim=1)
        entropy = -(probs * torch.log(probs + 1e-6)).sum(1)
        return probs[torch.argsort(entropy, stable=True)[:kept_count(probs.shape[0], self.hp["keep"])]].mean(0)

    def _class_positive(self, f: torch.Tensor, keys: torch.Tensor, cached: torch.Tensor) -> torch.Tensor:
        """compute_cache_key_logits: pos_alpha exp(-pos_beta (1 - key . f)) of the keys [C, d] of the classes
        `cached`, as logits [K]."""
        weights = self.hp["pos_alpha"] * torch.exp(-self.hp["pos_beta"] * (1.0 - keys @ f))
        return torch.zeros(self.num_classes, dtype=f.dtype, device=f.device).index_add(0, cached, weights)

    def _cache_posteriors(self, views: torch.Tensor, query: torch.Tensor, f: torch.Tensor, z: torch.Tensor,
                          p_conf: torch.Tensor, negative: torch.Tensor,
                          timer: StageTimer) -> tuple[torch.Tensor, torch.Tensor]:
        """Step 7: (the confident views' posterior as step 1 gave it, p_cache); `query`: the views f and z average."""
        with timer("posterior"):
            cached = torch.nonzero(self.has_prototype).flatten()
            return p_conf, torch.softmax(z + self._class_positive(f, self.prototypes[cached], cached) - negative, 0)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"entropy_keys": self.entropy.keys.clone(), "entropy_loss": self.entropy.loss.clone(),
                "align_keys": self.align.keys.clone(), "align_loss": self.align.loss.clone(),
                "neg_keys": self.neg.keys.clone(), "neg_loss": self.neg.loss.clone(),
                "neg_values": self.neg.values.clone(), "memory": self.memory.clone(),
                "prototypes": self.prototypes.clone()}

    def _run(self, features: torch.Tensor) -> Trace:
        return self.run_steps(features)


class MCPPlusPlus(MCP):
    """MCP++ (--res True): MCP with one AdamW step per sample on residuals of the text embeddings and of the
    prototype cache's keys (mcp_runner.py run_test_mcp, its is_res branches, with --tta_steps 1).

    Per sample, after MCP's cache updates (steps 1-6), with zero residuals R_t [K, d] and R_c [C, d] (C: the classes
    with a prototype), T' = normalize(T + R_t), P' = normalize(P + R_c) and the negative cache's logits N:
    loss = H(softmax(z(T') + pos(P') - N)) + 0.5 InfoNCE + 0.2 mean_c -log(1 - cos(P'_c, Q_c) + 1e-7), where z(T')
    is step 2's logits through T', Q_c the mean of class c's negative-cache entries (zero where it has none), and
    InfoNCE (temperature 0.01) is the official call's: on P'^T and T'[cached]^T, [d, C] each, so its d rows are the
    samples (the code passes them untransposed). One AdamW step (fresh, eps 1e-3, weight decay 0.1; lr_text,
    lr_image). Then p_conf is step 1's rule on softmax(s T'_stepped x_v), and p_cache = softmax(z + pos(normalize(P))
    - N + pos(P'_stepped) - N): the official final logits keep the step's own terms (computed with the zero
    residuals) and add the stepped ones, so both cache terms count twice. The rest is MCP's.

    The official cumulative average of the text (clip_weights_global) never runs: its gate is the entropy of the
    softmax of a posterior (final_logits was already softmaxed), at least ln 2 - 1 / log2 K of log2 K, never
    below 0.1 (and `num_avg` is never initialised there); the text stays the initial one, as it does here.
    """

    name = "mcp_pp"

    def _cache_posteriors(self, views: torch.Tensor, query: torch.Tensor, f: torch.Tensor, z: torch.Tensor,
                          p_conf: torch.Tensor, negative: torch.Tensor,
                          timer: StageTimer) -> tuple[torch.Tensor, torch.Tensor]:
        hp, s = self.hp, self.hp["logit_scale"]
        cached = torch.nonzero(self.has_prototype).flatten()
        keys = self.prototypes[cached]
        count = self.neg.count[cached]
        neg_keys = self.neg.keys[cached].sum(1) / count.clamp(min=1)[:, None].float()
        with timer("update"):
            r_text = torch.zeros_like(self.text, requires_grad=True)
            r_keys = torch.zeros_like(keys, requires_grad=True)
            optimizer = torch.optim.AdamW([{"params": [r_text], "lr": hp["lr_text"]},
                                           {"params": [r_keys], "lr": hp["lr_image"]}],
                                          eps=ADAM_EPS, weight_decay=WEIGHT_DECAY)
            with torch.enable_grad():
                text = F.normalize(self.text + r_text, dim=1)
                new_keys = F.normalize(keys + r_keys, dim=1)
                z_text = (s * views[query] @ text.T).mean(0)
                loss = mean_prob_entropy((z_text + self._class_positive(f, new_keys, cached) - negative)[None])
                rows_k, rows_t = F.normalize(new_keys.T, dim=1), F.normalize(text[cached].T, dim=1)
                loss = loss + INFO_NCE_WEIGHT * F.cross_entropy(
                    rows_k @ rows_t.T / ALIGN_TEMPERATURE, torch.arange(rows_k.shape[0], device=f.device))
                cos = F.cosine_similarity(new_keys, neg_keys, dim=1)
                loss = loss - PUSH_WEIGHT * torch.log(1.0 - cos + 1e-7).mean()
                optimizer.zero_grad()
                loss.backward()
            optimizer.step()
        with timer("posterior"):
            stepped_text = F.normalize(self.text + r_text.detach(), dim=1)
            p_conf = self._confident_probability(s * views @ stepped_text.T)
            first = self._class_positive(f, F.normalize(keys, dim=1), cached)
            stepped = self._class_positive(f, F.normalize(keys + r_keys.detach(), dim=1), cached)
            return p_conf, torch.softmax(z + first - negative + stepped - negative, 0)

