"""TPT, C-TPT and R-TPT one sample at a time, transcribed from the official test_time_tuning and
test_time_adapt_eval (azshue/TPT tpt_classification.py; C-TPT's and R-TPT's variants in their repositories) in
float32: a CoOp prompt learner with its own context parameter and a fresh torch.optim.AdamW per sample, the text
tower run on the K prompts of that one sample. The tests hold the chunked methods to it."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from orchestrator.methods.prompt import PromptText


def select_confident_samples(logits: torch.Tensor, top: float) -> torch.Tensor:
    """The official count, int(V * top): none below V * top = 1 (the methods refuse that case)."""
    batch_entropy = -(logits.softmax(1) * logits.log_softmax(1)).sum(1)
    return torch.argsort(batch_entropy, descending=False, stable=True)[:int(batch_entropy.size()[0] * top)]


def avg_entropy(outputs: torch.Tensor) -> torch.Tensor:
    """Of no view as of several, as the official np.log: log(0) = -inf, so the loss is NaN."""
    logits = outputs - outputs.logsumexp(dim=-1, keepdim=True)
    n = logits.shape[0]
    avg_logits = logits.logsumexp(dim=0) - (math.log(n) if n else -math.inf)
    avg_logits = torch.clamp(avg_logits, min=torch.finfo(avg_logits.dtype).min)
    return -(avg_logits * torch.exp(avg_logits)).sum(dim=-1)


def text_dispersion(text_features: torch.Tensor) -> torch.Tensor:
    """C-TPT's l2_norm_mean: the mean distance of the class text features from their centroid."""
    return torch.linalg.norm(text_features - text_features.mean(0), dim=-1).mean()


class PromptLearner(torch.nn.Module):
    def __init__(self, text: PromptText) -> None:
        super().__init__()
        with torch.no_grad():
            embedding = text.tower.embed(text.tokens)
        self.ctx_init_state = text.initial_context().clone()  # official --load: the CoOp ctx
        self.ctx = torch.nn.Parameter(self.ctx_init_state.clone())
        self.token_prefix, self.token_suffix = embedding[:, :1], embedding[:, 1 + text.n_ctx:]
        self.tower, self.eot = text.tower, text.tokens.argmax(dim=-1)

    def reset(self) -> None:
        self.ctx.copy_(self.ctx_init_state)

    def text_features(self) -> torch.Tensor:
        K = self.token_prefix.shape[0]
        prompts = torch.cat([self.token_prefix, self.ctx[None].expand(K, -1, -1), self.token_suffix], dim=1)
        t = self.tower(prompts, self.eot)
        return t / t.norm(dim=-1, keepdim=True)


def entropy_avg(outputs: torch.Tensor) -> torch.Tensor:
    """R-TPT's loss: the mean of the views' entropies."""
    return (-(outputs.softmax(1) * outputs.log_softmax(1)).sum(1)).mean()


def get_top_sim(sim_matrix: torch.Tensor, k: int) -> torch.Tensor:
    return sim_matrix.topk(k, dim=-1).values.mean(dim=-1)


def rtpt_output(images: torch.Tensor, tuned_outputs: torch.Tensor, neighbours: int, temperature: float,
                exclude: str) -> torch.Tensor:
    """R-TPT's reliability-weighted ensemble of the tuned views' logits (rtpt.py test_time_adapt_eval)."""
    sim = images @ images.t()
    if exclude == "self":
        sim.fill_diagonal_(float("-inf"))
    else:
        sim[sim >= 1.0] = float("-inf")
    weight = F.softmax(get_top_sim(sim, min(neighbours, images.shape[0] - 1)) / temperature, dim=-1)
    return weight @ tuned_outputs


def run_reference(views: torch.Tensor, text: PromptText, lr: float, steps: int, keep: float, logit_scale: float,
                  ctpt_lambda: float = 0.0, rtpt: dict | None = None,
                  extra: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """[n, V, d] views -> [n, K] posteriors, one sample after another (ctpt_lambda > 0: C-TPT's loss; rtpt: R-TPT's
    loss and prediction with these neighbours, reliability_temp and exclude; extra: a further loss term of the
    step's class text features [K, d], O-TPT's)."""
    learner = PromptLearner(text)
    optimizer = torch.optim.AdamW([learner.ctx], lr)
    optim_state = {k: v for k, v in optimizer.state_dict().items()}
    out = []
    for images in views:
        with torch.no_grad():
            learner.reset()
        optimizer.load_state_dict(optim_state)
        selected_idx = None
        for _ in range(steps):
            with torch.enable_grad():
                text_features = learner.text_features()
                output = logit_scale * images @ text_features.t()
                if selected_idx is None:
                    selected_idx = select_confident_samples(output, keep)
                loss = entropy_avg(output[selected_idx]) if rtpt else avg_entropy(output[selected_idx])
                if ctpt_lambda:
                    loss = loss + (-ctpt_lambda * text_dispersion(text_features))
                if extra is not None:
                    loss = loss + extra(text_features)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        with torch.no_grad():
            if rtpt:
                tuned = logit_scale * images @ learner.text_features().t()
                out.append(F.softmax(rtpt_output(images, tuned, rtpt["neighbours"], rtpt["reliability_temp"],
                                                 rtpt["exclude"]), dim=-1))
            else:
                out.append(F.softmax(logit_scale * images[0] @ learner.text_features().t(), dim=-1))
    return torch.stack(out)
