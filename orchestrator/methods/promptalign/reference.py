"""PromptAlign one sample at a time, transcribed from the official code (jameelhassan/PromptAlign@9290564
trainers/prompt_align.py: MultiModalPromptLearner, CustomCLIP.forward, test_time_adapt_eval, test_time_tuning,
select_confident_samples, avg_entropy, distr_align_loss; clip/model.py: VisionTransformer_MaPLe.forward,
ResidualAttentionBlock_MaPLe.forward storing its input as `visual_feat`, LND) over an open_clip CLIP's modules, in
any dtype (the tests run it in float64 as the truth and in float32 to measure float32's drift)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class MultiModalPromptLearner(nn.Module):
    """The official prompt learner's parameters, set from the MaPLe file, with their initial states for `reset`."""

    def __init__(self, maple: Any, dtype: torch.dtype) -> None:
        super().__init__()
        self.ctx = nn.Parameter(maple.ctx.to(dtype).clone())
        self.proj = nn.Linear(maple.text_width, maple.vision_width).to(dtype)
        self.compound_prompts_text = nn.ParameterList([nn.Parameter(t.to(dtype).clone()) for t in maple.text_deep])
        self.compound_prompt_projections = nn.ModuleList([nn.Linear(maple.text_width, maple.vision_width).to(dtype)
                                                          for _ in maple.vision_deep])
        with torch.no_grad():
            self.proj.weight.copy_(maple.proj_weight)
            self.proj.bias.copy_(maple.proj_bias)
            for layer, (w, b) in zip(self.compound_prompt_projections, maple.vision_deep):
                layer.weight.copy_(w)
                layer.bias.copy_(b)
        self.init_state = copy.deepcopy(self.state_dict())

    def reset(self) -> None:
        self.load_state_dict(self.init_state)

    def forward(self):
        return (self.ctx, self.proj(self.ctx), list(self.compound_prompts_text),
                [layer(t) for layer, t in zip(self.compound_prompt_projections, self.compound_prompts_text)])


def vision_forward(visual: nn.Module, x: torch.Tensor, shared_ctx: torch.Tensor, deeper: list[torch.Tensor]
                   ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """VisionTransformer_MaPLe.forward; also each block's `visual_feat` (its input after the splice, [L, N, D])."""
    x = visual.conv1(x)
    x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)
    x = torch.cat([visual.class_embedding + torch.zeros(x.shape[0], 1, x.shape[-1], dtype=x.dtype), x], dim=1)
    x = x + visual.positional_embedding
    x = torch.cat([x, shared_ctx.expand(x.shape[0], -1, -1)], dim=1)
    x = visual.ln_pre(x).permute(1, 0, 2)  # NLD -> LND
    n_ctx, counter, feats = shared_ctx.shape[0], 0, []
    for i, block in enumerate(visual.transformer.resblocks):
        if i > 0 and counter <= len(deeper) - 1:
            x = torch.cat([x[:x.shape[0] - n_ctx], deeper[counter].expand(x.shape[1], -1, -1).permute(1, 0, 2)], 0)
            counter += 1
        feats.append(x)  # self.visual_feat = x
        x = block(x.permute(1, 0, 2)).permute(1, 0, 2)  # open_clip's blocks are batch-first
    x = visual.ln_post(x.permute(1, 0, 2)[:, 0, :])
    return x @ visual.proj, feats


def text_forward(clip: nn.Module, tokens: torch.Tensor, ctx: torch.Tensor, deeper: list[torch.Tensor]
                 ) -> torch.Tensor:
    """TextEncoder.forward of MaPLe's prompts (construct_prompts: prefix, ctx, suffix)."""
    embedding = clip.token_embedding(tokens)
    n_ctx = ctx.shape[0]
    x = torch.cat([embedding[:, :1], ctx.expand(tokens.shape[0], -1, -1), embedding[:, 1 + n_ctx:]], 1)
    x = x + clip.positional_embedding
    counter = 0
    for i, block in enumerate(clip.transformer.resblocks):
        if i > 0 and counter <= len(deeper) - 1:
            x = torch.cat([x[:, :1], deeper[counter].expand(x.shape[0], -1, -1), x[:, 1 + n_ctx:]], 1)
            counter += 1
        x = block(x, attn_mask=clip.attn_mask)
    x = clip.ln_final(x)
    return x[torch.arange(x.shape[0]), tokens.argmax(dim=-1)] @ clip.text_projection


def select_confident_samples(logits, top_tpt, top_align):
    batch_entropy = -(logits.softmax(1) * logits.log_softmax(1)).sum(1)
    idx_tpt = torch.argsort(batch_entropy, descending=False, stable=True)[:int(batch_entropy.size()[0] * top_tpt)]
    idx_align = torch.argsort(batch_entropy, descending=False, stable=True)[:int(batch_entropy.size()[0] * top_align)]
    return logits[idx_tpt], idx_align


def avg_entropy(outputs):
    logits = outputs - outputs.logsumexp(dim=-1, keepdim=True)
    avg_logits = logits.logsumexp(dim=0) - np.log(logits.shape[0])
    avg_logits = torch.clamp(avg_logits, min=torch.finfo(avg_logits.dtype).min)
    return -(avg_logits * torch.exp(avg_logits)).sum(dim=-1)


def distr_align_loss(out_feat, targ_feat, layers_from=0, layers_to=12):
    distr_loss = 0
    out_means, out_vars = out_feat
    targ_means, targ_vars = targ_feat
    for l in range(layers_from, layers_to - 1):  # noqa: E741 - the official name
        distr_loss += 0.5 * F.l1_loss(out_means[l], targ_means[l]) + 0.5 * F.l1_loss(out_vars[l], targ_vars[l])
    return distr_loss


def run_reference(views: torch.Tensor, clip: nn.Module, tokens: torch.Tensor, maple: Any,
                  means: torch.Tensor | None, variances: torch.Tensor | None, *, lr: float = 4e-2, steps: int = 1,
                  keep: float = 0.1, align_keep: float = 0.1, align_weight: float = 100.0, align_from: int = 0,
                  align_to: int = 3, logit_scale: float = 100.0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """[n, V, 3, H, W] views (view 0 the original) -> [n, K] posteriors; align_weight 0: DISTR_ALIGN off."""
    model = copy.deepcopy(clip).to(dtype).eval().requires_grad_(False)
    learner = MultiModalPromptLearner(maple, dtype)
    optimizer = torch.optim.AdamW(learner.parameters(), lr)
    optim_state = copy.deepcopy(optimizer.state_dict())
    target = None if not align_weight else (means.to(dtype), variances.to(dtype))

    def forward(images):
        ctx, shared_ctx, text_deep, vision_deep = learner()
        text = text_forward(model, tokens, ctx, text_deep)
        image, feats = vision_forward(model.visual, images.to(dtype), shared_ctx, vision_deep)
        image = image / image.norm(dim=-1, keepdim=True)
        text = text / text.norm(dim=-1, keepdim=True)
        return logit_scale * image @ text.t(), feats

    out = []
    for images in views:
        with torch.no_grad():
            learner.reset()
        optimizer.load_state_dict(optim_state)
        selected_idx = None
        for _ in range(steps):
            with torch.enable_grad():
                output, feats = forward(images)
                if selected_idx is not None:
                    output = output[selected_idx]
                else:
                    output, selected_idx = select_confident_samples(output, keep, align_keep)
                loss = avg_entropy(output)
                if target is not None:
                    out_mean = torch.cat([torch.mean(f[:, selected_idx, :], dim=1, keepdim=True).permute(1, 0, 2)
                                          for f in feats])
                    out_var = torch.cat([torch.mean((f[:, selected_idx, :] - out_mean[i].unsqueeze(0).permute(1, 0, 2))
                                                    ** 2, dim=1, keepdim=True).permute(1, 0, 2)
                                         for i, f in enumerate(feats)])
                    weight = align_weight / (align_to - align_from)
                    loss = loss + weight * distr_align_loss((out_mean, out_var), target, align_from, align_to)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        with torch.no_grad():
            out.append(forward(images[:1])[0][0].softmax(0))
    return torch.stack(out)
