"""TPS (Sui et al., "Just Shift It: Test-Time Prototype Shifting"), as its official code runs it
(elaine-sui/TPS@556db0f, shift_classification.py test_time_adapt_eval, model/learnable_shift.py, model/shifter.py;
the per-class shift of scripts/shift/*: --text_shift --do_shift --per_label --tta_steps 1).

Episodic: nothing carries over between samples. Per sample with views X [V, d] (view 0 the original image),
cached prototypes P [K, d] (prototypes.class_prototypes) and s = logit_scale:

1. per-class shifts S [K, d] start at zero; W(S) = normalize(P + S);
2. the max(1, int(V * keep)) views of lowest softmax entropy of s X W(0)^T are kept; the loss is the entropy
   of their mean probability (TPT's avg_entropy);
3. one step of a fresh torch.optim.AdamW (the official optimizer: lr, torch's defaults otherwise, i.e. weight
   decay 0.01, eps 1e-8) on S;
4. the posterior is softmax(s W(S) x_0) on the original view.

Trace: no state, selected = -1, gated and gated_prior False (the step is taken on every sample).

Samples are solved in vectorised chunks, each exactly as alone, without autograd or an optimizer object:
- the gradient is written out: dH/dz from `mean_prob_entropy_grad`, through z = s x . W_k to
  dH/dW_k = s sum_i (dH/dz_ik) x_i, and through W = normalize(P + S) at S = 0 to
  dH/dS_k = G_k - W_k (W_k . G_k) with G_k = dH/dW_k / |P_k|;
- AdamW's first step from zero state is closed-form (`adamw.py`), in the order of torch's
  _single_tensor_adamw: the decay of S = 0 is nothing, m = (1 - b1) g, v = (1 - b2) g g, denom =
  sqrt(v) / sqrt(1 - b2) + eps, and S = -(lr / (1 - b1)) q with q = m / denom (torch divides
  (lr / (1 - b1)) m by denom: one rounding apart);
- the shifted prototypes are never formed: with a = lr / (1 - b1), (P_k + S_k) . x0 = P_k . x0 - a q_k . x0
  and |P_k + S_k|^2 = |P_k|^2 - 2 a q_k . P_k + a^2 |q_k|^2, so q is reduced to three numbers per class
  as it is computed, one block of classes at a time (memory stays bounded at any K), and each learning rate
  costs O(K) per sample on top (`Episodic`: a pack's configs of equal logit_scale and kept count share
  one q).
The step's entries are -lr g / (|g| + eps): an entry of g near eps in a large row is known to float32 only up
to about eps (AdamW's eps amplifies the cancellation in F.normalize's backward), so on rare samples any
float32 evaluation, the official one included, sits visibly away from a float64 run in the posterior: there
is no float32 bound. tests/test_tps.py compares this path and the official float32 computation with float64
(at K = 1000 both below 5e-4 on its stream, the test's bound, 1.8e-4 measured; a median within 1e-6); the official float32 run was measured 2.8e-3
away at K = 1000 on CLIP features (issue 29), with the same predictions.

Where the official code differs from the paper or this port, this follows the code:
- The official step runs under fp16 autocast with a GradScaler (init scale 1e3): in float32 the scaled and
  unscaled gradients agree up to rounding, and the scaler's inf/nan step skipping never triggers.
- int(V * keep) views (the official count) is floored at one, which only matters below 1 / keep views.
- The confident views are chosen, and the loss and its gradient taken, on one product of the views with W(0)
  (the official code recomputes the kept views' logits under the step's graph, at S = 0: the same values).
Learning rate: 5e-3 as in the README's example run; 1e-3 on the cross-domain sets as the paper reports (the
official scripts take lr as an argument). Views: TPT's protocol, 63 random resized crops + flips and the
original on ImageNet and its variants (`augmix=len(set_id) > 1`, shift_classification.py:98-99); AugMix views
on the cross-domain sets (the card's `views: protocol`).

Text: the official runs pool a template ensemble and GPT-4 descriptors (gpt4_descriptors/<dataset>-gpt4.json)
into one prototype per class, in one of two ways (`pooled_prototypes`):
- 'means' (the default): the plain mean of the template mean and the descriptor mean (learnable_shift.py:77).
  It is what the official run does: the README's example run is
  scripts/shift/shift_text_per_class_mean_init_template_and_gpt4_micro.sh, which does not pass
  --macro_pooling (off by default, args.py:46);
- 'rows': every row with equal weight, the means weighted by their counts (`--macro_pooling`,
  learnable_shift.py:72-75; the repository's *_macro.sh scripts).
Several rows per class given to the method directly (M > K) are averaged with equal weight per row, i.e.
'rows'; to run 'means', give it one row per class, `pooled_prototypes(...)`. A sweep's template sets hold
templates only (no descriptors), where the two coincide.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from orchestrator.methods.adamw import BETA1, denominator
from orchestrator.methods.episodic import Episodic
from orchestrator.methods.prototypes import class_prototypes, confident_views, mean_prob_entropy_grad
from orchestrator.methods.views import gather_views, kept_count

EPS = 1e-8  # torch.optim.AdamW's default (the official optimizer's)
_BLOCK = 1 << 20     # elements of one [chunk, classes, d] block of the step (4 MB float32), its largest tensor


POOLINGS = ("means", "rows")


def pooled_prototypes(templates: list[torch.Tensor], descriptors: list[torch.Tensor],
                      pooling: str = "means") -> torch.Tensor:
    """One unit prototype per class [K, d] from each class's template rows [T_k, d] and descriptor rows
    [D_k, d] (unit prompt embeddings): 'means' (the official run's) (t + c) / 2 of the template mean t and the
    descriptor mean c, 'rows' (--macro_pooling) (T_k t + D_k c) / (T_k + D_k); renormalised (the official
    get_text_features)."""
    if pooling not in POOLINGS:
        raise ValueError(f"tps: pooling must be one of {POOLINGS}, got {pooling!r}")
    if len(templates) != len(descriptors):
        raise ValueError(f"tps: templates for {len(templates)} classes but descriptors for {len(descriptors)}")
    out = []
    for t, c in zip(templates, descriptors):
        wt, wc = (1.0, 1.0) if pooling == "means" else (float(len(t)), float(len(c)))
        out.append((wt * t.mean(0) + wc * c.mean(0)) / (wt + wc))
    return F.normalize(torch.stack(out), dim=1)


class TPS(Episodic):
    """Test-time prototype shifting: one AdamW step on per-class shifts, reset every sample."""

    name = "tps"
    chunk = 64          # samples per vectorised chunk: bounds the [chunk, V, K] view logits

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                 **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        self.prototypes = class_prototypes(class_embeddings, class_ids, num_classes)   # P
        self.norms = torch.linalg.vector_norm(self.prototypes, dim=1)                  # |P_k|: 1 up to rounding
        self.sq_norms = (self.prototypes ** 2).sum(dim=1)
        self.unit = F.normalize(self.prototypes, dim=1)                                 # W = normalize(P + 0)

    def shared_key(self, views: int) -> tuple:
        # The step direction q depends on the views, logit_scale and the number of views kept, not on lr.
        return (self.hp["logit_scale"], kept_count(views, self.hp["keep"]))

    def shared(self, chunk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each sample's step direction reduced to q_k . x0, q_k . P_k and |q_k| [3, B, K], and P_k . x0 [B, K]."""
        scale = self.hp["logit_scale"]
        directions = self.step_directions(chunk, scale * (chunk @ self.unit.T), scale, self.hp["keep"])
        return directions, chunk[:, 0] @ self.prototypes.T

    def solve(self, chunk: torch.Tensor, shared: tuple[torch.Tensor, torch.Tensor], start: int) -> torch.Tensor:
        (along_x0, along_p, size), base = shared
        step = float(torch.tensor(self.hp["lr"] / (1 - BETA1), dtype=torch.float32))   # AdamW's lr / bias_correction1
        dot = base - step * along_x0                                       # (P_k + S_k) . x0
        sq = self.sq_norms - 2 * step * along_p + (step * size) ** 2       # |P_k + S_k|^2
        # F.normalize divides by max(|P_k + S_k|, 1e-12).
        return torch.softmax(self.hp["logit_scale"] * dot / sq.clamp_min(1e-24).sqrt(), dim=-1)

    def step_directions(self, chunk: torch.Tensor, logits: torch.Tensor, scale: float,
                        keep: float) -> torch.Tensor:
        """[3, B, K]: each sample's AdamW step direction q [K, d] (its shifts S = -(lr / (1 - b1)) q), given its
        views [B, V, d] and their logits [B, V, K], reduced to q_k . x0, q_k . P_k and |q_k|."""
        B, _, d = chunk.shape
        K = self.num_classes
        index = confident_views(logits, keep)
        kept, views = gather_views(logits, index), gather_views(chunk, index)          # [B, k, K], [B, k, d]
        dz = mean_prob_entropy_grad(kept)
        coef = (dz * (scale / self.norms)).transpose(1, 2).contiguous()               # [B, K, k]
        x0 = chunk[:, 0, :, None]
        zero = chunk.new_zeros(())
        out = chunk.new_empty(3, B, K)
        width = max(1, _BLOCK // (B * d))
        space = chunk.new_empty(2, B * min(width, K) * d)     # one block's gradient and denominator, reused
        for lo in range(0, K, width):
            rows = slice(lo, lo + width)
            numel = B * (min(lo + width, K) - lo) * d
            grad = torch.bmm(coef[:, rows], views, out=space[0, :numel].view(B, -1, d))  # dH/dW_k / |P_k|
            # The projection as autograd takes it, from the gradient itself: components it cancels stay 0.
            radial = torch.einsum("bkd,kd->bk", grad, self.unit[rows])
            grad.addcmul_(self.unit[rows], radial[..., None], value=-1)                # dH/dS_k
            denom = denominator(grad, EPS, out=space[1, :numel].view(B, -1, d))
            q = torch.addcdiv(zero, grad, denom, value=1 - BETA1, out=grad)     # m / denom
            out[0, :, rows] = torch.bmm(q, x0)[..., 0]
            out[1, :, rows] = torch.einsum("bkd,kd->bk", q, self.prototypes[rows])
            out[2, :, rows] = torch.linalg.vector_norm(q, dim=-1)
        return out
