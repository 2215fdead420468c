"""Learned starting points for the prompt-tuning methods: a context file as CoOp and MaPLe release it.

CoOp (KaiyangZhou/CoOp, trainers/coop.py) saves its PromptLearner through Dassl's save_checkpoint as
`<output>/prompt_learner/model.pth.tar-<epoch>`: a torch pickle {state_dict, epoch, optimizer, scheduler, ...}
whose state_dict holds `ctx` ([n_ctx, width] a generic context, [n_cls, n_ctx, width] class-specific with
CSC) and the token_prefix / token_suffix buffers, which CoOp's own load_model drops (they are the class names'
token embeddings, recomputed for the classes at hand). TPT's official code starts from such a file with
`--load`: `torch.load(args.load)['state_dict']['ctx']`, asserting a generic context (`ctx.size(0) == n_ctx`),
copied into its prompt learner as the context each sample's tuning resets to. That is what a method's `context:`
does here; the class prompts are laid out as CoOp's ("X" * n_ctx, the class name, "."), the context after the
start token.

MaPLe (muzairkhattak/multimodal-prompt-learning, trainers/maple.py) saves its whole CustomCLIP as
`MultiModalPromptLearner/model.pth.tar-<epoch>` with `prompt_learner.ctx`, `prompt_learner.proj.*` (the context
projected into the vision encoder's first layer), `prompt_learner.compound_prompts_text.<i>` and
`prompt_learner.compound_prompt_projections.<i>.*` (deep prompts of the text and vision layers). MaPLe always
prompts the image encoder (proj(ctx)), so its text context alone is not MaPLe's model, and the encoders here take
no deep prompts: such a file is refused, naming what it holds (`load_context`).
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from orchestrator.clip.backbone import file_sha256

COOP = "CoOp"
MAPLE_PREFIX = "prompt_learner."
# the keys that make a state_dict MaPLe's (its deep prompts and the vision projection)
_MAPLE_KEYS = ("proj.weight", "compound_prompts_text.", "compound_prompt_projections.")


@dataclass(frozen=True)
class LearnedContext:
    """A generic learned context: vectors [n_ctx, width] float32, the file's path and sha256."""

    vectors: torch.Tensor
    path: str
    sha256: str
    source: str = COOP

    @property
    def n_ctx(self) -> int:
        return int(self.vectors.shape[0])

    @property
    def width(self) -> int:
        return int(self.vectors.shape[1])


def _state_dict(path: Path) -> dict[str, Any]:
    try:
        # weights_only: a released file holds tensors, numbers and dicts (Dassl's optimizer and scheduler states)
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as exc:
        raise ValueError(f"context file {path}: not a torch checkpoint that loads with weights_only=True "
                         f"({str(exc).splitlines()[0][:200]}); expected CoOp's released "
                         f"prompt_learner/model.pth.tar-<epoch>") from None
    state = checkpoint.get("state_dict") if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        found = sorted(checkpoint)[:8] if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise ValueError(f"context file {path}: no 'state_dict' (found {found}); expected CoOp's released "
                         f"checkpoint {{'state_dict': {{'ctx': ...}}, 'epoch': ...}}")
    return state


def load_context(path: str | os.PathLike) -> LearnedContext:
    """The generic context of a CoOp checkpoint, or a ValueError naming the file and what it holds instead (a
    MaPLe checkpoint, a class-specific context, no `ctx`)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"context file {path} does not exist; expected CoOp's released "
                         f"prompt_learner/model.pth.tar-<epoch>")
    state = _state_dict(path)
    maple = sorted(k for k in state if any(k.startswith(MAPLE_PREFIX + m) for m in _MAPLE_KEYS))
    if maple:
        raise ValueError(f"context file {path} is MaPLe's (it holds {', '.join(maple[:3])}"
                         f"{', ...' if len(maple) > 3 else ''}): MaPLe prompts the image encoder with proj(ctx) and "
                         f"both encoders' deeper layers with its compound prompts, which the encoders here do not "
                         f"take, and its text context alone is not MaPLe's model; not supported. Expected a CoOp "
                         f"context (state_dict['ctx'])")
    ctx = state.get("ctx")
    if not isinstance(ctx, torch.Tensor):
        raise ValueError(f"context file {path}: its state_dict has no tensor 'ctx' (keys: {sorted(state)[:8]}); "
                         f"expected CoOp's prompt learner state (ctx, token_prefix, token_suffix)")
    if ctx.ndim == 3:
        raise ValueError(f"context file {path}: a class-specific context (CoOp's CSC, ctx {tuple(ctx.shape)} = "
                         f"n_cls x n_ctx x width); TPT's official code starts from a generic one only (its --load "
                         f"asserts ctx.size(0) == n_ctx); expected ctx of shape [n_ctx, width]")
    if ctx.ndim != 2 or not ctx.is_floating_point() or ctx.shape[0] < 1:
        raise ValueError(f"context file {path}: ctx is {ctx.dtype} {tuple(ctx.shape)}; expected a floating-point "
                         f"[n_ctx, width] tensor")
    return LearnedContext(ctx.detach().float().contiguous(), str(path.resolve()), file_sha256(path))


def context_issue(path: str, model: str, width: int, max_ctx: int) -> str | None:
    """What is wrong with a context file for a model whose text tower has this width and room for this many
    context vectors, or None."""
    try:
        context = load_context(path)
    except ValueError as exc:
        return str(exc)
    if context.width != width:
        return (f"context file {path}: ctx width {context.width} does not fit {model}'s text tower (width "
                f"{width}); expected a context learnt on the same CLIP model")
    if context.n_ctx > max_ctx:
        return f"context file {path}: {context.n_ctx} context vectors leave no room for a class name in {max_ctx + 2}"
    return None
