"""Zero (Farina et al., NeurIPS 2024): test-time augmentation with the softmax temperature taken to zero.

Per sample with view features [V, d] (view 0 the original image, the rest augmentations), as the official
code (FarinaMatteo/zero, ttas/zero.py):

1. each view's class probabilities q_v = softmax(logit_scale * U f_v) summed into the K classes (as `clip`);
2. keep the confident views: the int(V * keep) views with the lowest entropy of q_v, at least one
   (keep is the code's gamma, default 0.3; int(...) as its confidence filter; ties go to the earlier view);
3. each kept view votes for argmax q_v (zero temperature); the prediction is the majority vote.
4. A tie between voted classes (tie_break):
   - 'after_k' (default, the official code): `greedy_break(ties, l[k:])` with k = int(V * keep) and l the
     views' logits in the loader's order, not the confidence filter's: the first view from index k on
     whose argmax is among the tied classes decides (kept views among them, discarded views before index k
     never). If none is (the code then restricts view k's logits to the tied classes through its
     break_sample_tie, whose `logit[~ties]` on an int tensor indexes the wrong entries: we follow its
     evident intent), the tied class with the highest probability in view k wins.
   - 'discarded': the same greedy rule over the DISCARDED views in confidence order, what `l[k:]` reads as
     if l were sorted by the filter (the rule this module ran as the default before it was checked against
     the code line by line; kept for comparison).
   - 'mean_prob': the tied class with the higher mean probability over the kept views.
   With every view kept (l[k:] empty: the official code fails there) the most confident view decides among
   the tied classes, for both greedy rules.

The posterior is the vote histogram with one extra soft vote, post = (votes + extra) / (kept + 1), so
it sums to 1 and its argmax is exactly the tie-broken majority vote:
- 'mean_prob': extra = mean_q, the kept views' mean probability. If class a has more votes than b it
  leads by a whole vote, which mean_q[b] - mean_q[a] <= 1 - 2 mean_q[a] < 1 cannot overturn (a got a
  vote, so mean_q[a] > 0); on a tie the higher mean_q wins, as the rule says.
- 'after_k' and 'discarded': extra = (onehot(winner) + mean_q) / 2. Over any class b the winner gains at least
  1/2 - (mean_q[b] - mean_q[winner]) / 2 > 0 on top of its votes (the same bound), so it wins ties and
  keeps every lead.
Episodic (`episodic.py`): samples are processed in vectorised chunks, and a pack's configs with one
logit_scale and state_dtype share the views' posteriors.

Precision: float32 by default. The official code runs a half CLIP under autocast (run.py; ttas/zero.py
`zero`): the view features, text features and logits l = z_img z_txt^T are float16, l / temp is a float16
division by temp = 1 / exp(logit_scale) rounded to float16, the softmaxes are float32 (autocast), and the zero
temperature is float16's eps (2^-10), not float32's. `state_dtype: float16` reproduces that on the run's
inputs rounded to float16 (products as a half GEMM: float32 accumulation, one rounding; the views ranked by
the official entropy -(p * log p), NaN where p underflows, such a view last). There the votes
are no longer one-hot: softmax(l / 2^-10) over float16 logits whose top values lie a few float16 steps
apart splits a view's vote between them, so the vote is the sum of the kept views' soft votes p_bar; a tie
(equal maxima of p_bar) is broken by `tie_break` as above and the official p_bar[winner] += 1 applied, and
the posterior is that vector over its sum, (p_bar + tied * onehot(winner)) / (kept + tied).
"""

from __future__ import annotations

import torch

from orchestrator.methods.episodic import Episodic
from orchestrator.methods.numerics import product
from orchestrator.methods.views import confidence_order, kept_count, view_posteriors

HALF_EPS = torch.finfo(torch.float16).eps  # the official zero temperature in float16 (finfo(l_filt.dtype).eps)


def class_sum(probs: torch.Tensor, class_ids: torch.Tensor, num_classes: int) -> torch.Tensor:
    """[..., M] probabilities over the class embeddings summed into their K classes."""
    return probs.new_zeros(*probs.shape[:-1], num_classes).index_add_(-1, class_ids, probs)


def greedy_winner(votes: torch.Tensor, q: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
    """[c] the tie-broken vote: votes [c, K], view posteriors q [c, V, K], the views the official greedy_break
    walks [c, R] in its order (module docstring): the first whose argmax is a tied class, else the tied class
    most probable in the first of them."""
    tied = votes == votes.max(dim=1, keepdim=True).values                          # [c, K]
    winner = votes.argmax(dim=1)
    rest_q = torch.gather(q, 1, rest[..., None].expand(-1, -1, q.shape[-1]))       # [c, R, K]
    rest_votes = rest_q.argmax(dim=-1)
    in_tie = torch.gather(tied, 1, rest_votes)                                     # [c, R]
    first = in_tie.int().argmax(dim=1)                                             # first True (0 if none)
    by_view = torch.gather(rest_votes, 1, first[:, None])[:, 0]
    fallback = torch.where(tied, rest_q[:, 0], -1.0).argmax(dim=1)
    broken = torch.where(in_tie.any(dim=1), by_view, fallback)
    return torch.where(tied.sum(dim=1) > 1, broken, winner)


def greedy_views(order: torch.Tensor, k: int, rule: str) -> torch.Tensor:
    """[c, R] the views a greedy tie-break walks: 'after_k' views k.. in the loader's order, 'discarded' the
    discarded views in confidence order; with every view kept, the most confident view alone."""
    c, v = order.shape
    if k >= v:
        return order[:, :1]
    if rule == "after_k":
        return torch.arange(k, v, device=order.device).expand(c, -1)
    return order[:, k:]


class Zero(Episodic):
    """Majority vote of the confident augmented views' argmax predictions (hparams: its registry card)."""

    name = "zero"
    chunk = 256
    shared_hparams = ("logit_scale", "state_dtype")

    def shared(self, chunk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The views' class posteriors [c, V, K], their confidence order [c, V] and, in float16, the views'
        float16 logits [c, V, M] (module docstring)."""
        if self.hp["state_dtype"] == "float32":
            q = view_posteriors(chunk, self.class_embeddings, self.class_ids, self.num_classes,
                                self.hp["logit_scale"])
            return q, confidence_order(q), None
        half = torch.float16
        logits = product(chunk.to(half), self.class_embeddings.to(half).T)
        temp = 1.0 / torch.tensor(self.hp["logit_scale"], dtype=half)       # the model's temp, in float16
        q = class_sum(torch.softmax((logits / temp).float(), dim=-1), self.class_ids, self.num_classes)
        # the official confidence_filter's entropy, -(p * p.log()): a view with an underflowed p is NaN, ranked last
        order = torch.argsort(-(q * q.log()).sum(-1), dim=1, stable=True)
        return q, order, logits

    def solve(self, chunk: torch.Tensor, shared: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
              start: int) -> torch.Tensor:
        q, order, logits = shared
        K = self.num_classes
        k = kept_count(chunk.shape[1], self.hp["keep"])
        q_kept = torch.gather(q, 1, order[:, :k, None].expand(-1, -1, K))
        mean_q = q_kept.mean(dim=1)
        if logits is not None:  # float16: the official soft votes (module docstring)
            kept_logits = torch.gather(logits, 1, order[:, :k, None].expand(-1, -1, logits.shape[-1]))
            soft = class_sum(torch.softmax((kept_logits / HALF_EPS).float(), dim=-1), self.class_ids, K)
            votes = soft.sum(dim=1)
            tied = ((votes == votes.max(dim=1, keepdim=True).values).sum(dim=1) > 1).float()[:, None]
            winner = self._winner(votes, mean_q, q, order, k)
            return (votes + tied * torch.nn.functional.one_hot(winner, K)) / (k + tied)
        votes = torch.nn.functional.one_hot(q_kept.argmax(dim=-1), K).sum(dim=1).float()
        if self.hp["tie_break"] == "mean_prob":
            extra = mean_q
        else:
            extra = (torch.nn.functional.one_hot(self._winner(votes, mean_q, q, order, k), K) + mean_q) / 2
        return (votes + extra) / (k + 1)

    def _winner(self, votes: torch.Tensor, mean_q: torch.Tensor, q: torch.Tensor, order: torch.Tensor,
                k: int) -> torch.Tensor:
        """[c] the class the tie-broken vote picks (`tie_break`)."""
        if self.hp["tie_break"] != "mean_prob":
            return greedy_winner(votes, q, greedy_views(order, k, self.hp["tie_break"]))
        tied = votes == votes.max(dim=1, keepdim=True).values
        return torch.where(tied, mean_q, -1.0).argmax(dim=1)
