"""HisTPT one sample at a time, transcribed from the official memory code (jingyi0000/HisTPT@aaf5479
modeling/language/vlpencoder.py update_st_memory, update_st_prompt, update_hard_memory, update_hard_prompt,
update_ema_prompt; modeling/architectures/seem_model_v1.py forward_seg_coop) on TPT's per-sample prompt learner
(`orchestrator.methods.tpt.reference.PromptLearner`), in the dtype of the text tower and views it is given (the
tests run it in float64). The classification choices the method's module notes explain (confident views, the
softmax entropy, `steps`) are taken as there. The tests hold `HisTPT` to it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from orchestrator.methods.prompt import PromptText
from orchestrator.methods.tpt.reference import PromptLearner, select_confident_samples


class Memory:
    """The official LanguageEncoder's memory attributes and their update functions, one sample at a time."""

    def __init__(self, size: int, topk: int, momentum: float) -> None:
        self.size, self.topk, self.momentum = size, topk, momentum
        self.init_local = self.init_hard = self.init_global = True

    def update_st_memory(self, emb: torch.Tensor, entropy: torch.Tensor) -> None:
        if self.init_local:
            self.memory_local = emb.repeat(self.size, 1, 1)
            self.entropy = entropy.expand(self.size)
            self.init_local = False
        else:
            self.memory_local[1:] = self.memory_local[:-1].clone()
            self.memory_local[:1] = emb.clone()
            self.entropy = torch.cat([entropy.unsqueeze(0), self.entropy[:-1]], dim=0)
        self.st = self.memory_local.clone().mean(0)

    def update_hard_memory(self, emb: torch.Tensor) -> None:
        if self.init_hard:
            self.memory_hard = emb.repeat(self.size, 1, 1)
            self.init_hard = False
        else:
            _, indices = torch.topk(self.entropy, self.topk, dim=0)
            new_hard_emb = self.memory_local[indices].mean(0)
            self.memory_hard[1:] = self.memory_hard[:-1].clone()
            self.memory_hard[:1] = new_hard_emb.clone()
        self.hard = self.memory_hard.clone().mean(0)

    def update_ema_prompt(self, emb: torch.Tensor) -> None:
        if self.init_global:
            self.ema = emb
            self.init_global = False
        else:
            new_global_emb = 1 / 2 * (self.memory_local[-1] + self.memory_hard[-1])
            self.ema = self.ema.clone() * self.momentum + new_global_emb.clone() * (1 - self.momentum)


def neg_entropy(logits: torch.Tensor) -> torch.Tensor:
    """forward_seg_coop's global/local/hard_entropy: sum p log p (a negative entropy)."""
    return (logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)


def run_reference(views: torch.Tensor, text: PromptText, lr: float, steps: int, keep: float, logit_scale: float,
                  memory_size: int, hard_top: int, ema_momentum: float) -> tuple[torch.Tensor, list[dict]]:
    """[n, V, d] views -> ([n, K] posteriors, per sample its 'label' (the fused pseudo-label), 'current' (the
    original view's label under the context before the sample's step) and 'weights' (the global, local and hard
    memories' weights))."""
    learner = PromptLearner(text)
    optimizer = torch.optim.AdamW([learner.ctx], lr)    # made once: the context and the optimiser are never reset
    memory = Memory(memory_size, hard_top, ema_momentum)
    out, log = [], []
    for images in views:
        label = selected_idx = None
        for _ in range(steps):
            with torch.enable_grad():
                text_features = learner.text_features()
                logits = logit_scale * images @ text_features.t()
                if selected_idx is None:
                    selected_idx = select_confident_samples(logits, keep)
                    with torch.no_grad():
                        sample = logits.detach()[selected_idx]
                        sample_entropy = (-(sample.softmax(1) * sample.log_softmax(1)).sum(1)).mean()
                        emb = text_features.detach()
                        memory.update_st_memory(emb, sample_entropy)
                        memory.update_hard_memory(emb)
                        memory.update_ema_prompt(emb)
                        outputs_global = logit_scale * images[0] @ memory.ema.t()
                        outputs_local = logit_scale * images[0] @ memory.st.t()
                        outputs_hard = logit_scale * images[0] @ memory.hard.t()
                        weight = F.softmax(torch.stack([neg_entropy(outputs_global), neg_entropy(outputs_local),
                                                        neg_entropy(outputs_hard)]), dim=-1)
                        softmax_fuse = F.softmax(weight[0] * outputs_global + weight[1] * outputs_local
                                                 + weight[2] * outputs_hard, dim=-1)
                        label = softmax_fuse.argmax(-1)
                    log.append({"label": int(label), "current": int(logits[0].argmax()), "weights": weight.tolist()})
                loss = F.cross_entropy(logits[selected_idx], label.repeat(len(selected_idx)))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        with torch.no_grad():
            out.append(F.softmax(logit_scale * images[0] @ learner.text_features().t(), dim=-1))
    return torch.stack(out), log
