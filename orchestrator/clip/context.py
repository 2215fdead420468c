"""Learned starting points: a context file as CoOp and MaPLe release it.

CoOp (KaiyangZhou/CoOp, trainers/coop.py) saves its PromptLearner through Dassl's save_checkpoint as
`<output>/prompt_learner/model.pth.tar-<epoch>`: a torch pickle {state_dict, epoch, optimizer, scheduler, ...}
whose state_dict holds `ctx` ([n_ctx, width] a generic context, [n_cls, n_ctx, width] class-specific with
CSC) and the token_prefix / token_suffix buffers, which CoOp's own load_model drops (they are the class names'
token embeddings, recomputed for the classes at hand). TPT's official code starts from such a file with
`--load`: `torch.load(args.load)['state_dict']['ctx']`, asserting a generic context (`ctx.size(0) == n_ctx`),
copied into its prompt learner as the context each sample's tuning resets to. That is what a prompt-tuning
method's `context:` does here (`load_context`); the class prompts are laid out as CoOp's ("X" * n_ctx, the class
name, "."), the context after the start token. On a frozen-feature method (tda, bca, ...) a CoOp context gives
the class embeddings, one per class: CoOp's own classifier (its CustomCLIP's text features of those prompts) as
the method's starting point. CoOp leaves the image encoder as it is, so the images' features are the plain cache
entry's.

MaPLe (muzairkhattak/multimodal-prompt-learning, trainers/maple.py) saves its whole CustomCLIP as
`MultiModalPromptLearner/model.pth.tar-<epoch>`; its prompts are the `prompt_learner.*` keys (`load_maple`):
`ctx` [n_ctx, w_text] (the text context of the first layer), `proj.{weight,bias}` (Linear w_text -> w_vision:
proj(ctx) is the vision prompt of the first layer), `compound_prompts_text.<i>` [n_ctx, w_text] and
`compound_prompt_projections.<i>.{weight,bias}` (i < depth - 1: the text prompt of layer i + 1 and its
projection, the vision prompt of that layer). Its CLIP weights in the same file are left out (the backbone entry
gives them), as are token_prefix / token_suffix (MaPLe's load_model drops them too). MaPLe prompts the image
encoder, so its image features depend on the file: a frozen-feature method's `context:` reads features encoded
through the prompted towers (`orchestrator.clip.maple`), cached per (backbone, file).
"""

from __future__ import annotations

import os
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from orchestrator.clip.backbone import file_sha256

COOP = "CoOp"
MAPLE = "MaPLe"
MAPLE_PREFIX = "prompt_learner."
# the keys that make a state_dict MaPLe's (its deep prompts and the vision projection)
_MAPLE_KEYS = ("proj.weight", "compound_prompts_text.", "compound_prompt_projections.")
_RELEASED = ("CoOp's prompt_learner/model.pth.tar-<epoch> or MaPLe's "
             "MultiModalPromptLearner/model.pth.tar-<epoch>")


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


@dataclass(frozen=True)
class MapleContext:
    """MaPLe's prompts, float32: the first layer's text context `ctx` [n_ctx, w_t] and its projection to the vision
    side (`proj_weight` [w_v, w_t], `proj_bias` [w_v]); per deeper layer j = 1 .. depth - 1 the text prompt
    `text_deep[j - 1]` [n_ctx, w_t] and its projection `vision_deep[j - 1]` (weight, bias). The file's path and
    sha256; `patch_size`: the patch size of the ViT it was learnt on, read from the CLIP weights MaPLe's trainer
    saves beside its prompts (None where the file holds none), so a file is not run on another ViT of equal
    widths (ViT-B/16's on ViT-B/32)."""

    ctx: torch.Tensor
    proj_weight: torch.Tensor
    proj_bias: torch.Tensor
    text_deep: tuple[torch.Tensor, ...]
    vision_deep: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    path: str
    sha256: str
    patch_size: int | None = None
    source: str = MAPLE

    @property
    def n_ctx(self) -> int:
        return int(self.ctx.shape[0])

    @property
    def text_width(self) -> int:
        return int(self.ctx.shape[1])

    @property
    def vision_width(self) -> int:
        return int(self.proj_weight.shape[0])

    @property
    def depth(self) -> int:
        """Layers prompted in each tower (MaPLe's PROMPT_DEPTH): the first, and one per deeper prompt."""
        return 1 + len(self.text_deep)

    def vision_prompts(self) -> list[torch.Tensor]:
        """[n_ctx, w_v] per prompted layer: proj(ctx) for the first, then each deeper text prompt through its own
        projection (MultiModalPromptLearner.forward)."""
        first = self.ctx @ self.proj_weight.T + self.proj_bias
        return [first, *(t @ w.T + b for t, (w, b) in zip(self.text_deep, self.vision_deep))]


class _Dropped:
    """What a training object pickled in a checkpoint (Dassl's scheduler state) is read as: nothing of it is kept
    and none of its code runs."""

    def __setstate__(self, state: Any) -> None:
        pass


def _plain_dict(*factory: Any) -> dict:
    """collections.defaultdict read as a plain dict (an optimizer's `state`, pickled inside the scheduler's)."""
    return {}


def _training_globals() -> list[Any]:
    """Dassl's warmup scheduler (CoOp's and MaPLe's configs warm up one epoch) keeps the scheduler it hands over to as
    an attribute, so the checkpoint's `scheduler` entry pickles that scheduler and its optimizer as objects, which
    weights_only loading refuses: their names are read as `_Dropped` (and defaultdict as a dict), nothing else."""
    classes = {f"{c.__module__}.{c.__name__}" for module in (torch.optim, torch.optim.lr_scheduler)
               for c in vars(module).values()
               if isinstance(c, type) and issubclass(c, (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler))}
    return [dict, (_plain_dict, "collections.defaultdict"), *((_Dropped, name) for name in sorted(classes))]


def _state_dict(path: Path) -> dict[str, Any]:
    try:
        # weights_only: tensors, numbers and dicts are all that is read (the training objects: `_training_globals`);
        # mmap: MaPLe's holds all of CLIP besides its prompts, which are all that is read
        with torch.serialization.safe_globals(_training_globals()):
            checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as exc:
        raise ValueError(f"context file {path}: not a torch checkpoint that loads with weights_only=True "
                         f"({str(exc).splitlines()[0][:200]}); expected {_RELEASED}") from None
    state = checkpoint.get("state_dict") if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        found = sorted(checkpoint)[:8] if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise ValueError(f"context file {path}: no 'state_dict' (found {found}); expected a Dassl checkpoint "
                         f"{{'state_dict': {{...}}, 'epoch': ...}} ({_RELEASED})")
    return state


def _existing(path: str | os.PathLike) -> Path:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"context file {path} does not exist; expected {_RELEASED}")
    return path


def _maple_keys(state: dict[str, Any]) -> list[str]:
    return sorted(k for k in state if any(k.startswith(MAPLE_PREFIX + m) for m in _MAPLE_KEYS))


def context_source(path: str | os.PathLike) -> str:
    """COOP or MAPLE: whose released format a context file is in (a ValueError naming the file if it is neither a
    file nor a checkpoint)."""
    return MAPLE if _maple_keys(_state_dict(_existing(path))) else COOP


def load_context(path: str | os.PathLike) -> LearnedContext:
    """The generic context of a CoOp checkpoint, or a ValueError naming the file and what it holds instead (a
    MaPLe checkpoint, a class-specific context, no `ctx`)."""
    path = _existing(path)
    return _coop(path, _state_dict(path))


def _coop(path: Path, state: dict[str, Any]) -> LearnedContext:
    maple = _maple_keys(state)
    if maple:
        raise ValueError(f"context file {path} is MaPLe's (it holds {', '.join(maple[:3])}"
                         f"{', ...' if len(maple) > 3 else ''}): its prompts enter the image encoder too, so tuning "
                         f"them re-encodes every view through the prompted vision tower at each step, which the "
                         f"prompt-tuning methods (a text context over cached image features) do not do; expected a "
                         f"CoOp context (state_dict['ctx']) for them, or the MaPLe file on promptalign (which tunes "
                         f"MaPLe's prompts) or on a frozen-feature method (tda, bca, ...)")
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


def load_maple(path: str | os.PathLike) -> MapleContext:
    """MaPLe's prompts from its released checkpoint (module docstring), or a ValueError naming the file, the key and
    the shape expected."""
    path = _existing(path)
    return _maple(path, _state_dict(path))


def _maple(path: Path, state: dict[str, Any]) -> MapleContext:
    if not _maple_keys(state):
        raise ValueError(f"context file {path} is not MaPLe's (no {MAPLE_PREFIX}proj.weight or compound prompts; "
                         f"keys: {sorted(state)[:8]}); expected MaPLe's MultiModalPromptLearner/model.pth.tar-<epoch> "
                         f"(a CoOp context gives the class prompts only)")

    def tensor(key: str, shape: tuple[int | None, ...]) -> torch.Tensor:
        value = state.get(MAPLE_PREFIX + key)
        fits = isinstance(value, torch.Tensor) and value.is_floating_point() and value.ndim == len(shape) and all(
            want is None or have == want for have, want in zip(value.shape, shape))
        if not fits:
            found = (f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor)
                     else "missing" if value is None else type(value).__name__)
            expected = " x ".join("*" if n is None else str(n) for n in shape)
            raise ValueError(f"context file {path}: {MAPLE_PREFIX}{key} is {found}; expected a floating-point "
                             f"[{expected}] tensor as MaPLe's MultiModalPromptLearner saves it")
        return value.detach().float().contiguous()

    ctx = tensor("ctx", (None, None))
    n_ctx, w_t = ctx.shape
    proj_weight = tensor("proj.weight", (None, w_t))
    w_v = int(proj_weight.shape[0])
    proj_bias = tensor("proj.bias", (w_v,))
    deeper = sum(1 for k in state if k.startswith(MAPLE_PREFIX + "compound_prompts_text."))
    text_deep = tuple(tensor(f"compound_prompts_text.{i}", (n_ctx, w_t)) for i in range(deeper))
    vision_deep = tuple((tensor(f"compound_prompt_projections.{i}.weight", (w_v, w_t)),
                         tensor(f"compound_prompt_projections.{i}.bias", (w_v,))) for i in range(deeper))
    conv = state.get("image_encoder.conv1.weight")  # [w_v, 3, patch, patch]
    patch = int(conv.shape[-1]) if isinstance(conv, torch.Tensor) and conv.ndim == 4 else None
    return MapleContext(ctx, proj_weight, proj_bias, text_deep, vision_deep, str(path.resolve()), file_sha256(path),
                        patch)


def load_learned(path: str | os.PathLike) -> LearnedContext | MapleContext:
    """A context file as its format gives it: CoOp's generic context or MaPLe's prompts (`load_context`,
    `load_maple`), its checkpoint read once."""
    path = _existing(path)
    state = _state_dict(path)
    return _maple(path, state) if _maple_keys(state) else _coop(path, state)


def image_prompts(context: LearnedContext | MapleContext | None) -> MapleContext | None:
    """What a context prompts the image encoder with: MaPLe's prompts; CoOp's context enters the text tower only."""
    return context if isinstance(context, MapleContext) else None


def context_issue(path: str, model: str, width: int, max_ctx: int) -> str | None:
    """What is wrong with a CoOp context file for a model whose text tower has this width and room for this many
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


@dataclass(frozen=True)
class SourceStatistics:
    """PromptAlign's source statistics of MaPLe's vision tokens (jameelhassan/PromptAlign, TPT.VIS_MEANS and
    TPT.VIS_VARS: `ImgNetpre_vis_means.pt`, `ImgNetpre_vis_vars.pt`, computed once on ImageNet's training set through
    the MaPLe prompts by their code and released beside it): per block of the vision tower, the mean and the variance
    over images of each token's input to that block, [layers, 1 + patches + n_ctx, w_v] each, float32 here. The
    files' paths and sha256."""

    means: torch.Tensor
    vars: torch.Tensor
    paths: tuple[str, str]
    sha256: tuple[str, str]


def _statistics_tensor(path: Path, what: str, shape: tuple[int, int, int] | None) -> torch.Tensor:
    expected = ("a float tensor [layers, tokens, width]" if shape is None
                else f"a float tensor [{shape[0]}, {shape[1]}, {shape[2]}] (the vision tower's layers, 1 + patches + "
                     f"n_ctx tokens, width)")
    if not path.is_file():
        raise ValueError(f"{what} file {path} does not exist; expected PromptAlign's torch-saved {expected}")
    try:
        value = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as exc:
        raise ValueError(f"{what} file {path}: not a torch file that loads with weights_only=True "
                         f"({str(exc).splitlines()[0][:200]}); expected {expected}") from None
    fits = isinstance(value, torch.Tensor) and value.is_floating_point() and value.ndim == 3 and (
        shape is None or tuple(value.shape) == shape)
    if not fits:
        found = f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"{what} file {path} holds {found}; expected {expected}")
    return value.detach().float().contiguous()


def load_statistics(means: str | os.PathLike, variances: str | os.PathLike,
                    shape: tuple[int, int, int] | None = None) -> SourceStatistics:
    """PromptAlign's source means and variances (`SourceStatistics`), or a ValueError naming the file, what it holds
    and the shape expected (`shape`: [layers, tokens, width] of the tower they are for; None: any, alike in both)."""
    m = _statistics_tensor(Path(means), "vis_means", shape)
    v = _statistics_tensor(Path(variances), "vis_vars", tuple(m.shape))
    return SourceStatistics(m, v, (str(Path(means).resolve()), str(Path(variances).resolve())),
                            (file_sha256(means), file_sha256(variances)))
