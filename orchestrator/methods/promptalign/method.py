"""PromptAlign (Abdul Samadh et al., "Align Your Prompts: Test-Time Prompting with Distribution Alignment for
Zero-Shot Generalization", NeurIPS 2023) as its official code runs it (jameelhassan/PromptAlign@9290564
trainers/prompt_align.py: test_time_adapt_eval, test_time_tuning, select_confident_samples, avg_entropy,
distr_align_loss; clip/model.py: ResidualAttentionBlock_MaPLe, VisionTransformer_MaPLe).

MaPLe's prompts (`orchestrator.clip.context.MapleContext`: the text context ctx, its projection to the vision side,
the deeper text prompts and their projections) are tuned per test sample, both CLIP towers run at each step
(`orchestrator.clip.maple`). Per sample with V pixel views x_0 .. x_{V-1} (x_0 the original, the others random
resized crops with flips: AugMixAugmenter with augmix=False):

1. every prompt parameter is reset to the file's values and AdamW (torch defaults: betas (0.9, 0.999), eps 1e-8,
   weight decay 0.01) to a fresh state (episodic);
2. `steps` times: logits = s * normalize(f_P(x_v)) normalize(g_P(class prompts))^T for all V views; on the first
   step the views are ranked by their softmax entropy, the int(V keep) lowest for the entropy and the
   int(V align_keep) lowest for the alignment (later steps keep the alignment's choice for both, as the official
   `output[selected_idx]` does); loss = avg_entropy(chosen logits) + align_weight / (align_to - align_from) *
   sum over blocks l in [align_from, align_to - 1) of 0.5 |mean_l - M_l|_1 + 0.5 |var_l - S_l|_1, where mean_l and
   var_l (population variance) are over the chosen views of block l's input tokens (class token, patches, the vision
   prompts: every token, after the layer's prompts are spliced in), |.|_1 the mean absolute difference (F.l1_loss),
   M_l, S_l the source statistics (`orchestrator.clip.context.SourceStatistics`); one AdamW step on all prompts;
3. the prediction: softmax of the original view's logits through both towers with the tuned prompts.

The official loop runs over range(ALIGN_LAYER_FROM, ALIGN_LAYER_TO - 1), so its defaults (0, 3) align blocks 0 and
1 while dividing the weight by 3; this keeps that. align_weight 0 is the paper's "MaPLe + TPT" (no statistics).

What differs: the official run keeps CLIP in fp16 (PREC fp16) under autocast with a GradScaler; here float32, with
precision 'amp_fp16' autocasting the forward on CUDA (no scaler: its unscaled step is the plain one where no gradient
overflows).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F

from orchestrator.methods.maple import image_features, prompted_text
from orchestrator.methods.base import Method, StageTimer, Trace, empty_trace
from orchestrator.methods.prompt import avg_entropy, check_prompt_text


_MAPLE = ("ctx", "proj_weight", "proj_bias", "text_deep", "vision_deep")  # MapleContext's prompts


@dataclass(frozen=True)
class AlignVision:
    """What PromptAlign takes besides the text side: the backbone's vision tower (open_clip's `CLIP.visual`, a ViT,
    frozen), MaPLe's prompts (`orchestrator.clip.context.MapleContext`) and the source statistics
    (`orchestrator.clip.context.SourceStatistics`; None: align_weight 0 only)."""

    tower: torch.nn.Module
    prompts: Any
    statistics: Any = None


def confident(logits: torch.Tensor, keep: float) -> torch.Tensor:
    """The int(V keep) views of lowest softmax entropy (select_confident_samples)."""
    entropy = -(logits.softmax(1) * logits.log_softmax(1)).sum(1)
    return torch.argsort(entropy, descending=False, stable=True)[:int(entropy.shape[0] * keep)]


class PromptAlign(Method):
    name = "promptalign"

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int, *,
                 text: Any, vision: Any, **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        device = class_embeddings.device
        self.text = check_prompt_text(self.name, text, num_classes, device)
        if not isinstance(vision, AlignVision) or not all(hasattr(vision.prompts, a) for a in _MAPLE):
            raise ValueError(f"{self.name}: tunes MaPLe's prompts in both towers, so it needs vision=AlignVision(tower, "
                             f"MaPLe prompts, source statistics), got {type(vision).__name__}")
        # its own frozen copy: no gradient reaches the tower the process shares
        self.visual, prompts = copy.deepcopy(vision.tower).float().eval().requires_grad_(False), vision.prompts
        layers = len(getattr(getattr(self.visual, "transformer", None), "resblocks", ()))
        if prompts.n_ctx != text.n_ctx or prompts.text_width != text.tower.width:
            raise ValueError(f"{self.name}: the class prompts hold {text.n_ctx} context tokens of width "
                             f"{text.tower.width}, MaPLe's file {prompts.n_ctx} of width {prompts.text_width}; expected "
                             f"MaPLe's class prompts (`orchestrator.clip.maple.class_tokens`) for its file")
        if hparams["precision"] == "amp_fp16" and device.type != "cuda":
            raise ValueError(f"{self.name}: precision 'amp_fp16' (CUDA fp16 autocast) needs a CUDA device, the run is "
                             f"on {device}; expected precision 'fp32'")
        self.aligned = range(hparams["align_from"], hparams["align_to"] - 1) if hparams["align_weight"] else range(0)
        if self.aligned and not hparams["align_to"] - 1 <= layers:
            raise ValueError(f"{self.name}: align_to {hparams['align_to']} aligns blocks up to "
                             f"{hparams['align_to'] - 2}, the vision tower has {layers}")
        stats = vision.statistics
        if self.aligned and stats is None:
            raise ValueError(f"{self.name}: align_weight {hparams['align_weight']} needs the source statistics "
                             f"(vision.statistics: PromptAlign's vis_means and vis_vars); none given")
        shape = (layers, int(self.visual.positional_embedding.shape[0]) + prompts.n_ctx, prompts.vision_width)
        if self.aligned and (tuple(stats.means.shape) != shape or tuple(stats.vars.shape) != shape):
            raise ValueError(f"{self.name}: the source statistics are {tuple(stats.means.shape)} and "
                             f"{tuple(stats.vars.shape)}; expected {shape} (the vision tower's blocks, its tokens with "
                             f"the {prompts.n_ctx} prompts, its width)")
        self.stats = None if not self.aligned else (stats.means.to(device), stats.vars.to(device))
        self.initial = [t.to(device) for t in (prompts.ctx, prompts.proj_weight, prompts.proj_bias,
                                               *prompts.text_deep, *(t for wb in prompts.vision_deep for t in wb))]
        self.depth = prompts.depth

    @classmethod
    def check_hparams(cls, hp: dict[str, Any], num_embeddings: int, num_classes: int) -> dict[str, Any]:
        if hp["align_to"] <= hp["align_from"]:
            raise ValueError(f"{cls.name}: align_to ({hp['align_to']}) must exceed align_from ({hp['align_from']}): "
                             f"the alignment weight is divided by their difference")
        return hp

    def towers(self, params: list[torch.Tensor], pixels: torch.Tensor, inputs: list[torch.Tensor] | None = None
               ) -> torch.Tensor:
        """[B, K] logits of the pixels through both towers prompted by `params` (ctx, proj weight and bias, the
        deeper text prompts, their projections' weights and biases); the vision blocks' inputs into `inputs`."""
        ctx, pw, pb = params[:3]
        deep = params[3:3 + self.depth - 1]
        proj = params[3 + self.depth - 1:]
        vision = [ctx @ pw.T + pb, *(t @ proj[2 * i].T + proj[2 * i + 1] for i, t in enumerate(deep))]
        with torch.autocast("cuda", dtype=torch.float16, enabled=self.hp["precision"] == "amp_fp16"):
            image = image_features(self.visual, pixels, vision, inputs)
            text = prompted_text(self.text.tower, self.text.tokens, [ctx, *deep])
        return self.hp["logit_scale"] * F.normalize(image.float(), dim=-1) @ F.normalize(text.float(), dim=-1).T

    def align_loss(self, inputs: list[torch.Tensor], chosen: torch.Tensor) -> torch.Tensor:
        """distr_align_loss over the chosen views' block inputs, weighted as the official DISTR_LOSS_W."""
        means, variances = self.stats
        loss = torch.zeros((), device=chosen.device)
        for layer in self.aligned:
            tokens = inputs[layer][chosen].float()
            mean = tokens.mean(0)
            var = ((tokens - mean) ** 2).mean(0)
            loss = loss + 0.5 * F.l1_loss(mean, means[layer]) + 0.5 * F.l1_loss(var, variances[layer])
        return self.hp["align_weight"] / (self.hp["align_to"] - self.hp["align_from"]) * loss

    def adapt(self, views: torch.Tensor) -> torch.Tensor:
        """One sample's [V, 3, H, W] views: tune from the file's prompts, return the original view's logits [K]."""
        params = [t.clone().requires_grad_(True) for t in self.initial]
        optimizer = torch.optim.AdamW(params, lr=self.hp["lr"])
        chosen = keep = None
        with torch.enable_grad():
            for _ in range(self.hp["steps"]):
                inputs: list[torch.Tensor] = []
                logits = self.towers(params, views, inputs)
                if chosen is None:
                    keep, chosen = confident(logits, self.hp["keep"]), confident(logits, self.hp["align_keep"])
                    loss = avg_entropy(logits[keep])
                else:
                    loss = avg_entropy(logits[chosen])
                if self.aligned:
                    loss = loss + self.align_loss(inputs, chosen)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        with torch.no_grad():
            return self.towers(params, views[:1])[0]

    def load_state_tensors(self, state: Mapping[str, Any]) -> None:
        """Nothing carries from one sample to the next (episodic), so a resumed run goes on from its saved rows."""

    def run(self, features: torch.Tensor, auxiliary: Mapping[str, torch.Tensor] | None = None) -> Trace:
        """`features`: the samples' pixel views [n, V, 3, H, W] float32 (view 0 the original) on the class
        embeddings' device, in stream order."""
        device = self.class_embeddings.device
        if not isinstance(features, torch.Tensor) or features.dtype != torch.float32 or features.ndim != 5 \
                or features.shape[2] != 3:
            raise ValueError(f"{self.name}: takes each sample's pixel views, float32 [n, V, 3, H, W] (view 0 the "
                             f"original), got {getattr(features, 'dtype', type(features).__name__)} "
                             f"{tuple(getattr(features, 'shape', ()))}")
        if features.device != device:
            raise ValueError(f"{self.name}: views are on {features.device} but the class embeddings on {device}")
        v = int(features.shape[1])
        for hp in ("keep", "align_keep"):
            if features.shape[0] and int(v * self.hp[hp]) < 1:
                raise ValueError(f"{self.name}: {hp} {self.hp[hp]} of {v} views chooses none (int(V {hp}) = 0; the "
                                 f"official code would not tune); expected more views or a larger {hp}")
        return self._run(features)

    def _run(self, features: torch.Tensor) -> Trace:
        posteriors, selected, gated, gated_prior = empty_trace(features.shape[0], self.num_classes,
                                                                features.device)
        timer = StageTimer()
        for i in range(features.shape[0]):
            with timer("update"):
                logits = self.adapt(features[i])
            with timer("posterior"):
                posteriors[i] = torch.softmax(logits, dim=0)
                gated[i] = True
        return Trace(posteriors, selected, gated, gated_prior, timings=timer.seconds)
