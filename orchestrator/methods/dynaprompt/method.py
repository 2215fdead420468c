"""DynaPrompt (Xiao et al., "DynaPrompt: Dynamic Test-Time Prompt Tuning", ICLR 2025), as its official code runs it
(zzzx1224/DynaPrompt@acd33cf: dynap_classification.py with --tpt --onlinetpt --num_prompts 12 --ctx_init
a_photo_of_a, its PromptLearner in clip/custom_clip_lessctx.py; run_dynap.sh and scripts/test_dynap.sh).

Online: a buffer of P prompts (P = 12) lives across the stream. Each prompt's context is "a photo of a" plus a
learnt offset (the official parameter is the offset, zero at the start, so AdamW's weight decay pulls it back to
zero). The buffer keeps `order`, the prompts by when they were last chosen (least recently first, ctx_order), and
`uses`, how often each was chosen since it was last fresh (ctx_use). Per sample with views X [V, d] (view 0 the
original):

1. deletion: if every prompt has been used, the least recently chosen one (order[0]) is reset to a fresh
   prompt: offset 0, uses 0 (it stays first in `order`);
2. a fresh torch.optim.AdamW (lr 5e-3, torch's defaults otherwise: weight decay 0.01) over the whole buffer, and
   `steps` (1) steps, each:
   a. every prompt's logits on every view, z [V, P, K] = s X T_p^T; per prompt its entropy (mean over the views
      of each view's softmax entropy) and its "plpd", the mean over the augmented views v >= 1 of
      max_k z_0k - max_k z_vk (view 0's largest logit minus view v's);
   b. selection: the fresh prompt is init = order[0] (the least recently chosen, which is fresh: chosen prompts go
      to the end of `order`, so fresh ones stay in front). Rank the prompts by entropy and by plpd, highest
      first; r = init's entropy rank; `later` = the prompts ranked after init by entropy (with the code's
      min(r + 1, P - 1), so init itself when it ranks last), `top` = the r prompts of highest plpd. The chosen
      prompts are ent_order[a] for each a in sorted(later & top), then init (`selection: code`, module notes);
   c. each chosen prompt goes to the end of `order` and its use count grows by one (a prompt chosen twice, twice);
   d. loss: the views are ranked by their softmax entropy averaged over the chosen prompts and the int(V * keep)
      lowest kept; per chosen prompt TPT's entropy of its averaged prediction over those views; the loss is the
      mean over the chosen prompts; one AdamW step on the buffer (every offset decays, only the chosen ones move);
3. prediction: the logits of view 0 under each chosen prompt (as tuned), averaged over them; the posterior is
   their softmax.
So every sample appends a prompt (the fresh one is always chosen) and tunes the buffer's prompts that look more
confident and more augmentation-sensitive than it, and after P samples each sample first deletes the least
recently chosen prompt. The outputs depend on the stream's order: no sharding, no lockstep.

Where the official code and the paper or this port differ (this follows the code unless said):
- The chosen buffer prompts are `ent_order[a]` for the qualifying prompt ids a: the code indexes the entropy
  ranking by prompt ids, not ranks, and takes `top` as the r highest-plpd prompts with r the fresh prompt's
  *entropy* rank. `selection: intended` (not the default) takes what this construction evidently aims at: the
  prompts whose entropy is below and whose plpd is above the fresh prompt's, in id order, then the fresh one.
- The paper calls the second criterion a probability difference; the code's plpd is a difference of the largest
  scaled logits, each view's own largest class, and this follows it.
- Ties: the fresh prompts are equal, and so are prompts chosen and tuned together from one state (twins); their
  entropies and plpds tie, which the code's batched fp16 forward breaks by rounding noise and its torch.topk
  leaves unspecified. Here equal prompts are one context for the tower, the logits, the entropy and the plpd,
  so they tie exactly, and ties rank by prompt id (a stable sort): on the first sample only the fresh prompt is
  chosen.
- Precision: as TPT's, the official code keeps CLIP's weights and the contexts in float32 under fp16 autocast,
  with one GradScaler(init_scale=1000) carried across samples; here everything is float32 (as TPT).
- int(V * keep) views feed the loss, as the code counts them (select_confident_samples); where that is none
  (fewer than 10 views at keep 0.1) the code's loss is NaN and only weight decay acts, so the run is refused (as
  TPT). s is the logit_scale hparam.
- The code's one forward runs every prompt with gradients; here that forward (selection and confident views) runs
  without them, over the distinct contexts; then only the chosen prompts' contexts run again with gradients, a
  block at a time, each prompt's gradient scaled by its share of the mean: the code's gradient (its loss reads
  the chosen prompts alone), up to rounding, with a step's activations bounded by one pass's budget
  (`PASS_BYTES`) instead of growing with the buffer.
- An AdamW first step moves each entry by about lr in its gradient's sign; the entropy of a confident view has
  gradient entries below float32's (and fp16's) rounding noise, whose sign is then arbitrary. Two faithful
  implementations, this one and `reference.py`, agree to 1e-5 on the tests' streams, and part by up to 2 lr in
  such entries on streams where the buffer's prompts grow very confident.
- The "noapp" ablation (no deletion) and CoCoOp initialisation are not part of the method and are left out.
The class embeddings a sweep passes are not used: the class text features are the prompts' own, from the text
tower. `reference.py` is the plain per-sample loop (every prompt through the text tower alone, as the code's
forward) that the tests hold this to.
"""

from __future__ import annotations

from typing import Any

import torch

from orchestrator.methods.base import Method, StageTimer, Trace
from orchestrator.methods.prompt import PASS_BYTES, ClassPrompts, PromptText, avg_entropy, selected_views


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Softmax entropy over the last axis, as the code's `entropy` writes it."""
    logp = logits - logits.logsumexp(dim=-1, keepdim=True)
    return -(logp * logp.exp()).sum(dim=-1)


def ranked(values: torch.Tensor) -> list[int]:
    """Indices by value, highest first, ties by index (the code's topk(P)[1], module notes)."""
    return torch.sort(values, descending=True, stable=True).indices.tolist()


def choose(logits: torch.Tensor, row: torch.Tensor, init: int, rule: str) -> list[int]:
    """The prompts a sample tunes and predicts with (test_time_tuning's selection, module docstring step 2b;
    repeats possible), from the view logits [V, u, K] of the buffer's distinct contexts (no gradient), `row` [P]
    each prompt's context and the fresh prompt `init`. Entropy and plpd are taken per context, so that equal
    prompts tie exactly."""
    ent = entropy(logits).mean(0)[row]
    top = logits.max(dim=-1).values
    pd = ((top[0] - top[1:]).mean(0) if logits.shape[0] > 1 else torch.zeros_like(top[0]))[row]
    P = len(row)
    if rule == "intended":
        return [j for j in range(P) if ent[j] < ent[init] and pd[j] > pd[init]] + [init]
    ent_order = ranked(ent)
    r = ent_order.index(init)
    later = set(ent_order[min(r + 1, P - 1):])
    top_pd = set(ranked(pd)[:r])
    return [ent_order[a] for a in sorted(later & top_pd)] + [init]


class DynaPrompt(Method):
    """Dynamic test-time prompt tuning: an online buffer of prompts, chosen, tuned, appended and deleted per
    sample (module docstring)."""

    name = "dynaprompt"

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int, *,
                 text: PromptText, **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        self.prompts = ClassPrompts(self.name, text, num_classes, class_embeddings.device)
        P = self.hp["prompts"]
        self.offsets = torch.zeros(P, *self.prompts.ctx_init.shape, device=class_embeddings.device,
                                   requires_grad=True)        # the code's ctx parameter
        self.order = list(range(P))                           # ctx_order: least recently chosen first
        self.uses = [0] * P                                   # ctx_use: times chosen since last fresh
        self.deleted = 0                                      # prompts reset to fresh so far
        self.chunk = max(1, PASS_BYTES // max(1, self.prompts.saved_bytes))   # distinct contexts per backward

    def _run(self, features: torch.Tensor) -> Trace:
        selected_views(self.name, features.shape[1], self.hp["keep"])    # refused before any work, empty or not
        return self.run_steps(features)

    def contexts(self, prompts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The distinct contexts [u, n_ctx, w] of these prompts, by value, and each prompt's row in them: prompts
        tuned together from one state stay equal (twins), and go through the tower as one, so that their
        entropies and plpds tie exactly as the code's equal prompts do (module notes)."""
        offsets = self.offsets.detach()[prompts]
        distinct, row = torch.unique(offsets.flatten(1), dim=0, return_inverse=True)
        return self.prompts.ctx_init + distinct.view(-1, *offsets.shape[1:]), row

    def tune(self, views: torch.Tensor, chosen: list[int], optimizer: torch.optim.Optimizer) -> None:
        """One AdamW step on the mean over the chosen prompts (repeats counted) of TPT's entropy over the kept views
        [k, d]. Each distinct context's gradient is taken once, over blocks of `chunk` contexts (a step's
        activations stay within one pass's budget whatever the buffer's size), and each chosen prompt's gradient is
        its context's times its share of the mean; the other prompts' gradients are zero."""
        distinct = list(dict.fromkeys(chosen))
        ctx, row = self.contexts(distinct)
        grads = []
        with torch.enable_grad():
            for s in range(0, len(ctx), self.chunk):
                block = ctx[s:s + self.chunk].clone().requires_grad_(True)
                z = self.hp["logit_scale"] * torch.einsum("vd,ckd->cvk", views, self.prompts.features(block))
                grads.append(torch.autograd.grad(avg_entropy(z).sum(), block)[0])
        grads = torch.cat(grads)
        grad = torch.zeros_like(self.offsets)
        for i, j in enumerate(distinct):
            grad[j] = (chosen.count(j) / len(chosen)) * grads[row[i]]
        self.offsets.grad = grad
        optimizer.step()

    def _step(self, views: torch.Tensor, timer: StageTimer) -> tuple[torch.Tensor, int, bool]:
        if 0 not in self.uses:
            j = self.order[0]
            self.uses[j] = 0
            with torch.no_grad():
                self.offsets[j] = 0.0
            self.deleted += 1
        optimizer = torch.optim.AdamW([self.offsets], lr=self.hp["lr"])   # fresh per sample: the code's reload
        for _ in range(self.hp["steps"]):
            with timer("logits"), torch.no_grad():
                ctx, row = self.contexts(list(range(len(self.uses))))
                logits = self.hp["logit_scale"] * torch.einsum("vd,ukd->vuk", views, self.prompts.features(ctx))
                chosen = choose(logits, row, self.order[0], self.hp["selection"])
                # the views of lowest entropy averaged over the chosen prompts (select_confident_samples)
                z = logits[:, row[chosen]]
                view_entropy = (-(z.softmax(-1) * z.log_softmax(-1)).sum(-1)).mean(-1)
                keep = torch.argsort(view_entropy, stable=True)[:selected_views(self.name, views.shape[0],
                                                                                 self.hp["keep"])]
            for j in chosen:
                self.order.remove(j)
                self.order.append(j)
                self.uses[j] += 1
            with timer("update"):
                self.tune(views[keep], chosen, optimizer)
        with timer("posterior"), torch.no_grad():
            ctx, row = self.contexts(chosen)
            logits = self.hp["logit_scale"] * self.prompts.features(ctx) @ views[0]
            post = torch.softmax(logits[row].mean(0), dim=-1)
        return post, -1, False
