"""Test-time prompt tuning (TPT and its successors): CLIP's text tower run at test time over learnable context
tokens, the image side read from cached view features.

TPT's image encoder is frozen and runs under no_grad, so the cached views' features are exactly what its
computation sees (up to kernel rounding); only the text tower runs in the method. What a method is given:

    PromptText(tower, tokens, n_ctx, ctx=None)
        tower   TextTower: CLIP's text transformer as a torch module taking token *embeddings*
        tokens  [K, L] int64: class k's prompt "a photo of a {name}." tokenized, the n_ctx context tokens at
                positions 1..n_ctx (after the start token), as CoOp's PromptLearner lays them out
        n_ctx   how many context tokens are learnt (TPT: 4, initialised to "a photo of a")
        ctx     [n_ctx, w] a learned context to start from (a CoOp file, `orchestrator.clip.context`), standing
                for the context tokens' embeddings; None: those embeddings (the hand-written init)

`orchestrator.clip.prompts.prompt_text` builds one from a loaded backbone; nothing here reads a file.

ClassPrompts holds the K class prompts around a context and runs the text tower on many contexts' prompts in one
pass; PromptTuning (TPT, C-TPT, R-TPT) and DynaPrompt (online: a buffer of contexts along the stream,
`orchestrator.methods.dynaprompt`) both build on it.

PromptTuning (an `Episodic` method) solves a chunk of samples together: each sample's context is its own
[B, n_ctx, w] row, the B * K prompts go through the text tower in one pass, the per-sample losses are summed
(their gradients stay each sample's own) and one torch.optim.AdamW steps the [B, n_ctx, w] parameter, which is
elementwise and so each row steps exactly as a lone sample's optimizer would. `reference.py` of each method is
the plain per-sample loop the tests compare with.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from orchestrator.methods.base import Trace
from orchestrator.methods.encoder import norm_parameters
from orchestrator.methods.episodic import Episodic

CTX_INIT = "a photo of a"  # the official scripts' --ctx_init a_photo_of_a (TPT, C-TPT, R-TPT, DynaPrompt)
# Bytes of saved activations one pass may hold (the chunk of samples is sized to stay under it): the text
# tower's backward keeps about `TextTower.saved_bytes_per_prompt` per prompt, K prompts per sample.
PASS_BYTES = 2 << 30
MAX_CHUNK = 64
# A method rewarded by a CLIP teacher (its card's `teacher` hparam names the backbone: RLCF) reads the teacher's
# features in `run`'s auxiliary under these names: its features of the stream's views [n, V, D] and its class text
# features [K, D] (`orchestrator.sweep.pieces.with_teacher` reads both from the feature cache).
TEACHER_VIEWS = "teacher_views"
TEACHER_CLASSES = "teacher_classes"


class TextTower(torch.nn.Module):
    """CLIP's text tower from token embeddings: open_clip's `CLIP.encode_text` after its token-embedding lookup,
    so that learnt context vectors can stand in for some tokens (CoOp's TextEncoder)."""

    text_pool_type = "argmax"  # as the CLIP it was built from pools (checked there); MaPLe's text forward reads it

    def __init__(self, clip: torch.nn.Module) -> None:
        super().__init__()
        pool = getattr(clip, "text_pool_type", "argmax")
        if pool != "argmax" or not hasattr(clip, "token_embedding"):
            raise ValueError(f"prompt tuning needs a CLIP text tower that pools at the end-of-text token (open_clip's "
                             f"CLIP with text_pool_type 'argmax'), got {type(clip).__name__} with pooling {pool!r}")
        self.token_embedding = clip.token_embedding
        self.positional_embedding = clip.positional_embedding
        self.transformer = clip.transformer
        self.ln_final = clip.ln_final
        self.text_projection = clip.text_projection
        self.register_buffer("attn_mask", clip.attn_mask, persistent=False)
        for p in self.parameters():
            p.requires_grad_(False)

    @property
    def width(self) -> int:
        return int(self.positional_embedding.shape[-1])

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """[P, L] tokens -> [P, L, w] token embeddings (the part of encode_text the context replaces)."""
        return self.token_embedding(tokens)

    def forward(self, embedded: torch.Tensor, eot: torch.Tensor) -> torch.Tensor:
        """[P, L, w] token embeddings and [P] end-of-text positions -> [P, d] text features (not normalised)."""
        x = embedded + self.positional_embedding
        x = self.ln_final(self.transformer(x, attn_mask=self.attn_mask))
        x = x[torch.arange(x.shape[0], device=x.device), eot]
        if isinstance(self.text_projection, torch.nn.Linear):
            return self.text_projection(x)
        return x @ self.text_projection

    def saved_bytes_per_prompt(self, length: int, norm: bool = False) -> int:
        """Bytes autograd keeps for one prompt of `length` tokens through this tower (its activation memory per
        class in a tuning step), counted on a one-prompt pass; `norm`: with the tower's norm layers' affine
        parameters trainable instead of the tokens' embeddings (BATCLIP adapts them)."""
        tower = self
        if norm:
            tower = copy.deepcopy(self)
            for _, p in norm_parameters(tower):
                p.requires_grad_(True)
        total = 0

        def keep(t: torch.Tensor) -> torch.Tensor:
            nonlocal total
            if t.requires_grad or t.grad_fn is not None or not t.is_leaf:
                total += t.numel() * t.element_size()
            return t

        x = torch.zeros(1, length, self.width, device=self.positional_embedding.device, requires_grad=not norm)
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            tower(x, torch.zeros(1, dtype=torch.int64, device=x.device)).sum()
        return total


@dataclass(frozen=True)
class PromptText:
    """What a prompt-tuning method gets besides the features (module docstring); `names` (the K class names as
    prompted) and `tokenizer` (the backbone's) for a method that writes prompts of its own at test time (CLIPArTT's
    pseudo-captions)."""

    tower: TextTower
    tokens: torch.Tensor
    n_ctx: int
    names: tuple[str, ...] = ()
    tokenizer: Any = None
    ctx: torch.Tensor | None = None

    def initial_context(self) -> torch.Tensor:
        """[n_ctx, w] the context tuning starts from (and each sample's tuning resets to)."""
        if self.ctx is not None:
            return self.ctx
        with torch.no_grad():
            return self.tower.embed(self.tokens[:1, 1:1 + self.n_ctx])[0]


def check_prompt_text(method: str, text: Any, num_classes: int, device: torch.device) -> PromptText:
    """`text` as a method takes it, or a ValueError naming the method and what was expected."""
    if not isinstance(text, PromptText):
        raise ValueError(f"{method}: runs CLIP's text encoder at test time, so it needs text=PromptText(tower, tokens, "
                         f"n_ctx) (orchestrator.clip.prompts.prompt_text builds one from a backbone), got "
                         f"{type(text).__name__}")
    tokens = text.tokens
    if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.int64 or tokens.ndim != 2 \
            or tokens.shape[0] != num_classes:
        raise ValueError(f"{method}: text.tokens must be an int64 tensor [K, L] with K = {num_classes} (one prompt per "
                         f"class), got {getattr(tokens, 'dtype', type(tokens).__name__)} "
                         f"{tuple(getattr(tokens, 'shape', ()))}")
    if not 1 <= text.n_ctx < tokens.shape[1] - 1:
        raise ValueError(f"{method}: text.n_ctx must be in [1, {tokens.shape[1] - 2}], got {text.n_ctx}")
    if text.ctx is not None and (text.ctx.shape != (text.n_ctx, text.tower.width) or text.ctx.device != device):
        raise ValueError(f"{method}: text.ctx must be [{text.n_ctx}, {text.tower.width}] on {device}, got "
                         f"{tuple(text.ctx.shape)} on {text.ctx.device}")
    if tokens.device != device or text.tower.positional_embedding.device != device:
        raise ValueError(f"{method}: text tokens ({tokens.device}) and tower "
                         f"({text.tower.positional_embedding.device}) must be on the features' device {device}")
    return text


def avg_entropy(logits: torch.Tensor) -> torch.Tensor:
    """[..., N, K] logits of N views -> [...] entropy of their averaged probability, as TPT's avg_entropy computes
    it (log-probabilities averaged through logsumexp, clamped at float32's minimum)."""
    logp = logits - logits.logsumexp(dim=-1, keepdim=True)
    avg = logp.logsumexp(dim=-2) - math.log(logits.shape[-2])
    avg = torch.clamp(avg, min=torch.finfo(avg.dtype).min)
    return -(avg * torch.exp(avg)).sum(dim=-1)


def selected_views(method: str, views: int, keep: float) -> int:
    """int(V * keep): how many of a sample's V views the loss reads, as the official select_confident_samples
    counts them (TPT's, and C-TPT's, R-TPT's and DynaPrompt's copies); a ValueError where that is none. The official
    code then takes the entropy of no view, a NaN loss with a zero gradient: only AdamW's weight decay moves the
    prompt (C-TPT: its dispersion term alone), so it does not tune as its method says, and this is refused rather
    than run as something else."""
    count = int(views * keep)
    if count < 1:
        least = max(1, math.floor(1 / keep))
        while int(least * keep) < 1:           # the fewest views the float product gives one of
            least += 1
        raise ValueError(f"{method}: keep {keep:g} of {views} view{'s' if views != 1 else ''} selects int({views} * "
                         f"{keep:g}) = 0 views for the loss, where the official code (select_confident_samples) "
                         f"takes a NaN loss and leaves the prompt untuned; expected V * keep >= 1: at keep {keep:g} "
                         f"at least {least} views (the official protocol has 64), or a larger keep")
    return count


def confident_views(logits: torch.Tensor, keep: float, method: str) -> torch.Tensor:
    """[B, V, K] view logits -> [B, int(V * keep)] the lowest-entropy views, as TPT's select_confident_samples
    (its entropy, argsort ascending, int(V * keep) of them; none is refused: `selected_views`)."""
    entropy = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    return torch.argsort(entropy, dim=1, stable=True)[:, :selected_views(method, logits.shape[1], keep)]


class ClassPrompts:
    """The K class prompts around a learnable context, as CoOp's PromptLearner lays them out: class k's prompt is
    [SOS] ctx [name_k] . [EOS], and `features(ctx)` runs the text tower on B contexts' B * K prompts in one pass."""

    def __init__(self, method: str, text: Any, num_classes: int, device: torch.device) -> None:
        text = check_prompt_text(method, text, num_classes, device)
        self.tower, self.n_ctx, self.num_classes = text.tower, text.n_ctx, num_classes
        with torch.no_grad():
            embedded = self.tower.embed(text.tokens)
        self.prefix = embedded[:, :1]                          # [K, 1, w] start token
        self.ctx_init = text.initial_context().clone()          # [n_ctx, w] "a photo of a", or a learned one
        self.suffix = embedded[:, 1 + self.n_ctx:]             # [K, L - 1 - n_ctx, w] class name, '.', end, padding
        self.eot = text.tokens.argmax(dim=-1)
        with torch.no_grad():
            self.init_features = self.features(self.ctx_init[None])[0]   # [K, d]
        # activations one context's K prompts keep in a tuning step
        self.saved_bytes = num_classes * self.tower.saved_bytes_per_prompt(text.tokens.shape[1])

    def features(self, ctx: torch.Tensor) -> torch.Tensor:
        """[B, n_ctx, w] contexts -> [B, K, d] L2-normalised class text features, all B * K prompts in one pass."""
        B, K = ctx.shape[0], self.num_classes
        prompts = torch.cat([self.prefix.expand(B, -1, -1, -1), ctx[:, None].expand(-1, K, -1, -1),
                             self.suffix.expand(B, -1, -1, -1)], dim=2)
        feats = self.tower(prompts.reshape(B * K, *prompts.shape[2:]), self.eot.repeat(B))
        return F.normalize(feats, dim=-1).view(B, K, -1)


class PromptTuning(Episodic):
    """Base of TPT, C-TPT and R-TPT: per sample, the context starts at its init, `steps` AdamW steps minimise
    `loss` over the confident views, and the original view (view 0) is predicted with the tuned context.
    Subclasses set `name` and may override `loss`."""

    shared_hparams: ClassVar[tuple[str, ...]] = ("logit_scale",)

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int, *,
                 text: PromptText, **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        self.prompts = ClassPrompts(self.name, text, num_classes, class_embeddings.device)
        self.chunk = max(1, min(MAX_CHUNK, PASS_BYTES // max(1, self.prompts.saved_bytes)))

    def shared_key(self, views: int) -> tuple:
        return (self.hp["logit_scale"], selected_views(self.name, views, self.hp["keep"]))

    def _run(self, features: torch.Tensor) -> Trace:
        selected_views(self.name, features.shape[1], self.hp["keep"])    # refused before any work, empty or not
        return super()._run(features)

    def shared(self, chunk: torch.Tensor) -> torch.Tensor:
        """Each sample's confident views [c, k] by their logits at the initial context (official: chosen on the
        first step's output, which is at the initial context, and kept for the later steps)."""
        return confident_views(self.hp["logit_scale"] * chunk @ self.prompts.init_features.T, self.hp["keep"],
                               self.name)

    def loss(self, logits: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """[B] each sample's loss from its confident views' logits [B, k, K] and its class text features
        [B, K, d]: TPT's entropy of the averaged prediction."""
        return avg_entropy(logits)

    def optimizer(self, ctx: torch.Tensor) -> torch.optim.Optimizer:
        """The optimiser of a chunk's contexts: torch.optim.AdamW at lr, torch's defaults otherwise (TPT's)."""
        return torch.optim.AdamW([ctx], lr=self.hp["lr"])

    def solve(self, chunk: torch.Tensor, shared: torch.Tensor, start: int) -> torch.Tensor:
        B, scale = chunk.shape[0], self.hp["logit_scale"]
        views = torch.gather(chunk, 1, shared[..., None].expand(-1, -1, chunk.shape[-1]))     # [B, k, d]
        ctx = self.prompts.ctx_init.expand(B, -1, -1).clone().requires_grad_(True)
        optimizer = self.optimizer(ctx)   # fresh per sample: official optim_state reload
        with torch.enable_grad():
            for _ in range(self.hp["steps"]):
                features = self.prompts.features(ctx)
                logits = scale * views @ features.transpose(1, 2)
                optimizer.zero_grad()
                self.loss(logits, features).sum().backward()
                optimizer.step()
        with torch.no_grad():
            return self.predict(chunk, self.prompts.features(ctx))

    def predict(self, chunk: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """[B, K] posteriors of the samples' views [B, V, d] under their tuned class text features [B, K, d]: TPT
        predicts the original view, softmax(s x_0 T^T)."""
        return torch.softmax(self.hp["logit_scale"] * torch.einsum("bd,bkd->bk", chunk[:, 0], features), dim=-1)
