"""DynaPrompt one sample at a time, transcribed from the official test_time_adapt_eval and test_time_tuning
(zzzx1224/DynaPrompt dynap_classification.py, --onlinetpt) and its PromptLearner (clip/custom_clip_lessctx.py) in
float32: one parameter holding every prompt's context offset, each prompt's K class prompts through the text tower
on their own and with gradients (the code's forward), the selection on the detached logits (each prompt's
entropy and plpd on its own, so that equal prompts tie exactly), a fresh torch.optim.AdamW per sample. Ties in
the code's topk rank by prompt id (the method's module notes). The tests hold
`DynaPrompt` to it."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from orchestrator.methods.prompt import PromptText
from orchestrator.methods.tpt.reference import avg_entropy


def entropy(outputs: torch.Tensor) -> torch.Tensor:
    logits = outputs - outputs.logsumexp(dim=-1, keepdim=True)
    return -(logits * logits.exp()).sum(dim=-1)


def topk_order(values: torch.Tensor) -> torch.Tensor:
    return torch.sort(values, descending=True, stable=True).indices


def select_confident_samples(logits: torch.Tensor, top: float) -> tuple[torch.Tensor, torch.Tensor]:
    batch_entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    if batch_entropy.dim() > 1:
        batch_entropy = batch_entropy.mean(-1)
    idx = torch.argsort(batch_entropy, descending=False, stable=True)[:int(logits.size()[0] * top)]
    return logits[idx], idx


class PromptLearner(torch.nn.Module):
    """num_p prompts: ctx [num_p, n_ctx, w] offsets from the initial context, zero at the start."""

    def __init__(self, text: PromptText, num_p: int) -> None:
        super().__init__()
        with torch.no_grad():
            embedding = text.tower.embed(text.tokens)
        self.init_ctx = text.initial_context().clone()
        self.ctx = torch.nn.Parameter(torch.zeros(num_p, *self.init_ctx.shape, device=self.init_ctx.device))
        self.ctx_order = list(range(num_p))
        self.ctx_use = [0] * num_p
        self.token_prefix, self.token_suffix = embedding[:, :1], embedding[:, 1 + text.n_ctx:]
        self.tower, self.eot = text.tower, text.tokens.argmax(dim=-1)

    def text_features(self, p: int) -> torch.Tensor:
        """[K, d] prompt p's class text features."""
        K = self.token_prefix.shape[0]
        ctx = (self.ctx[p] + self.init_ctx)[None].expand(K, -1, -1)
        t = self.tower(torch.cat([self.token_prefix, ctx, self.token_suffix], dim=1), self.eot)
        return t / t.norm(dim=-1, keepdim=True)


def run_reference(views: torch.Tensor, text: PromptText, lr: float, steps: int, keep: float, logit_scale: float,
                  prompts: int, selection: str = "code") -> tuple[torch.Tensor, list[dict]]:
    """[n, V, d] views -> ([n, K] posteriors, per sample the buffer after it: 'chosen', 'order', 'uses',
    'deleted' (the prompt reset at its start, or None))."""
    num_p = prompts
    learner = PromptLearner(text, num_p)
    optimizer = torch.optim.AdamW([learner.ctx], lr)
    optim_state = {k: v for k, v in optimizer.state_dict().items()}
    out, log = [], []
    for images in views:
        deleted = None
        with torch.no_grad():
            if learner.ctx_use.count(0) == 0:
                deleted = learner.ctx_order[0]
                learner.ctx_use[deleted] = 0
                learner.ctx[deleted] = learner.ctx[deleted] * 0
        optimizer.load_state_dict(optim_state)
        for _ in range(steps):
            with torch.enable_grad():
                # each prompt's logits, entropy and plpd on their own: equal prompts tie exactly
                outputs = [logit_scale * images @ learner.text_features(p).t() for p in range(num_p)]   # [V, K]
                output = torch.stack(outputs, dim=1)                                                  # [V, P, K]
                p_ent = torch.stack([entropy(o.detach()).mean(0) for o in outputs])
                if images.shape[0] > 1:
                    plpd = torch.stack([(o.detach()[0].max(-1)[0].unsqueeze(0) - o.detach()[1:].max(dim=-1)[0]).mean(0)
                                        for o in outputs])
                else:
                    plpd = torch.zeros(num_p)
                init_p_position = learner.ctx_order[0]
                if selection == "intended":
                    exactnumber = [j for j in range(num_p) if p_ent[j] < p_ent[init_p_position]
                                   and plpd[j] > plpd[init_p_position]] + [init_p_position]
                else:
                    ent_order = topk_order(p_ent)
                    exact = torch.where(ent_order == init_p_position)[0].item()
                    plpd_order = topk_order(plpd)
                    list1 = ent_order[min(exact + 1, num_p - 1):]
                    list2 = plpd_order[:exact]
                    alllist = np.intersect1d(list1.numpy(), list2.numpy())
                    if set(alllist):
                        exactnumber = torch.cat([ent_order[alllist], ent_order[[exact]]]).tolist()
                    else:
                        exactnumber = [ent_order[exact].item()]
                output = output[:, exactnumber]                                          # [V, m, K]
                for i in exactnumber:
                    learner.ctx_order.remove(i)
                    learner.ctx_use[i] += 1
                    learner.ctx_order.append(i)
                output, _ = select_confident_samples(output, keep)
                loss = avg_entropy(output).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        with torch.no_grad():
            logits = torch.stack([logit_scale * images[0] @ learner.text_features(p).t() for p in exactnumber]).mean(0)
            out.append(F.softmax(logits, dim=-1))
        log.append({"chosen": list(exactnumber), "order": list(learner.ctx_order), "uses": list(learner.ctx_use),
                    "deleted": deleted})
    return torch.stack(out), log
