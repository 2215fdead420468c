"""Methods that adapt CLIP's image encoder at test time (Tent, SAR, DeYO, WATT): the images in the loop.

Every other method adapts on top of cached features; these change the encoder, so they see the images. What such a
method is given besides the class embeddings every method gets (from the same prompt code):

    vision   torch.nn.Module: the backbone's vision tower (open_clip's `CLIP.visual`), [B, 3, H, W] preprocessed
             images -> [B, d] image features (not normalised). The method adapts its own deep copy, so one tower
             serves every run of a process and is never changed.

`run(images)` takes [n, 3, H, W] float32 images preprocessed by the backbone's eval transform (the 'single' view,
`orchestrator.features.images.StreamImages` decodes them in stream order), on the class embeddings' device, and
returns a Trace as every method does. The classifier is zero-shot CLIP's: logit_scale * normalize(f(x)) @ T^T, T the
class prototypes (`class_prototypes`: each class's prompt embeddings averaged and renormalised).

The stream is cut into batches of `batch_size` consecutive images (the card's official size unless a sweep sets
another; a caller running a stream in parts keeps parts at multiples of it, as for every `BatchMethod`). Each batch:
reset first where the run is episodic (the card's `image_encoder.episodic`), then `adapt(batch)` returns the logits
it predicts [b, K] and which images its loss used [b] (the trace's `gated`). Its optimiser steps the parameters the
card names (`image_encoder.params`; 'norm': every norm layer's affine scale and shift, BatchNorm on the batch's own
statistics, as Tent's `configure_model` sets it; 'lora': low-rank adapters on the attention projections of the tower
in eval mode, `add_lora`).

State: `state_tensors()` is the adapted parameters (enc__<name>), the optimiser's state (opt__<k>__<key>) and the
method's own (`extra_state`, x__<key>), every name a valid array name of the run's state file; `load_state_tensors`
restores them. A continual run's trial saves them with each part it writes, so a resumed run goes on from its last
part's state instead of replaying the stream (`orchestrator.sweep.trial.execute_run`).

Precision: 'fp32' (default) or 'amp_fp16', the forward under CUDA fp16 autocast as TTABC's CLIP versions run it
(the loss and the optimiser in float32); 'amp_fp16' needs a CUDA device.
"""

from __future__ import annotations

import copy
import math
from abc import abstractmethod
from typing import Any, Mapping

import torch
import torch.nn.functional as F

from orchestrator.methods.base import Method, StageTimer, Trace, concat_traces, empty_trace
from orchestrator.methods.prototypes import class_prototypes

NORM_LAYERS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.LayerNorm, torch.nn.GroupNorm)
_ENC, _OPT, _EXTRA = "enc__", "opt__", "x__"


def softmax_entropy(x: torch.Tensor) -> torch.Tensor:
    """[b, K] logits -> [b] entropy of their softmax (Tent's, SAR's and DeYO's softmax_entropy)."""
    return -(x.softmax(1) * x.log_softmax(1)).sum(1)


def norm_parameters(model: torch.nn.Module, skip: tuple[str, ...] = (), kinds: tuple[type, ...] = NORM_LAYERS
                    ) -> list[tuple[str, torch.nn.Parameter]]:
    """The affine weight and bias of every norm layer of `kinds` whose module name contains none of `skip`, in
    module order (Tent's and SAR's collect_params; WATT's collect_ln_params takes LayerNorm alone)."""
    out = []
    for module_name, module in model.named_modules():
        if any(s in module_name for s in skip) or not isinstance(module, kinds):
            continue
        for name, p in module.named_parameters(recurse=False):
            if name in ("weight", "bias"):
                out.append((f"{module_name}.{name}", p))
    return out


def configure_norm(model: torch.nn.Module, params: list[torch.nn.Parameter]) -> None:
    """Train mode, every parameter frozen but `params`, BatchNorm on the batch's own statistics in every mode
    (Tent's configure_model)."""
    model.train()
    model.requires_grad_(False)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.track_running_stats = False
            m.running_mean = None
            m.running_var = None
    for p in params:
        p.requires_grad_(True)


def check_vision(method: str, vision: Any, class_embeddings: torch.Tensor) -> torch.nn.Module:
    """`vision` as a method takes it, or a ValueError naming the method and what was expected."""
    if not isinstance(vision, torch.nn.Module):
        raise ValueError(f"{method}: adapts CLIP's image encoder, so it needs vision=<the backbone's vision tower> "
                         f"(open_clip's CLIP.visual, a torch.nn.Module), got {type(vision).__name__}")
    first = next(vision.parameters(), None)
    if first is None or first.device != class_embeddings.device:
        raise ValueError(f"{method}: the vision tower ({None if first is None else first.device}) must be on the "
                         f"class embeddings' device {class_embeddings.device}")
    return vision


def validate_images(method: str, images: Any, device: torch.device) -> None:
    if not isinstance(images, torch.Tensor):
        raise ValueError(f"{method}: images must be a torch.Tensor [n, 3, H, W], got {type(images).__name__}")
    if images.dtype != torch.float32 or images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"{method}: images must be float32 [n, 3, H, W] (preprocessed by the backbone's eval "
                         f"transform), got {images.dtype} {tuple(images.shape)}")
    if images.device != device:
        raise ValueError(f"{method}: images are on {images.device} but the class embeddings on {device}")
    if not bool(torch.isfinite(images).all()):
        raise ValueError(f"{method}: images contain non-finite values (nan or inf)")


class EncoderMethod(Method):
    """Base of the methods that adapt the image encoder (module docstring). Subclasses set `name`, implement
    `make_optimizer` and `adapt`, and may override `parameters_to_adapt`, `extra_state` / `load_extra_state` and
    `reset_extra`."""

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int, *,
                 vision: Any, **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        device = class_embeddings.device
        check_vision(self.name, vision, class_embeddings)
        if hparams.get("precision", "fp32") == "amp_fp16" and device.type != "cuda":
            raise ValueError(f"{self.name}: precision 'amp_fp16' (CUDA fp16 autocast) needs a CUDA device, the run is "
                             f"on {device}; expected precision 'fp32'")
        self.model = copy.deepcopy(vision).float()
        self.text = class_prototypes(class_embeddings, class_ids, num_classes)
        self.adapted = self.parameters_to_adapt(self.model)
        if not self.adapted:
            raise ValueError(f"{self.name}: the vision tower {type(vision).__name__} has no parameters of the kind "
                             f"it adapts ({self.card().image_encoder.params})")
        if self.card().image_encoder.params == "lora":
            # adapters on the tower as CLIP runs it: eval mode, BatchNorm on its running statistics
            self.model.eval().requires_grad_(False)
            for _, p in self.adapted:
                p.requires_grad_(True)
        else:
            configure_norm(self.model, [p for _, p in self.adapted])
        self.optimizer = self.make_optimizer([p for _, p in self.adapted])
        self.episodic = self.card().image_encoder.is_episodic(hparams)
        self.initial = self.state_tensors()

    # ------------------------------------------------------------------------------------ what subclasses say
    def parameters_to_adapt(self, model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
        """(name, parameter) of what the optimiser steps, as the card's `image_encoder.params` says: 'norm', every
        norm layer's affine parameters; 'lora', the low-rank adapters `add_lora` puts on the tower's attention (its
        `image_encoder.lora`); 'all', every parameter."""
        use = self.card().image_encoder
        if use.params == "norm":
            return norm_parameters(model)
        if use.params == "lora":
            return add_lora(model, use.lora)
        return list(model.named_parameters())

    @abstractmethod
    def make_optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        """The optimiser over the adapted parameters, as the official code builds it."""

    @abstractmethod
    def adapt(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch [b, 3, H, W]: its adaptation step(s); (the logits it predicts [b, K], detached; which images
        its loss used [b] bool)."""

    def extra_state(self) -> dict[str, torch.Tensor]:
        """The method's own state beyond parameters and optimiser (SAR's moving average)."""
        return {}

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        return None

    # --------------------------------------------------------------------------------------------- the loop
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """[b, d] float32 image features through the adapted tower (not normalised), under fp16 autocast where the
        run's precision says so."""
        with torch.autocast("cuda", dtype=torch.float16, enabled=self.hp.get("precision") == "amp_fp16"):
            features = self.model(images)
        return features.float()

    def logits(self, images: torch.Tensor) -> torch.Tensor:
        """[b, K] zero-shot CLIP logits of the images through the adapted tower (module docstring)."""
        return self.hp["logit_scale"] * F.normalize(self.encode(images), dim=-1) @ self.text.T

    def run(self, images: torch.Tensor, auxiliary: Mapping[str, torch.Tensor] | None = None) -> Trace:
        """`images` in stream order; `auxiliary` as `Method.run` takes it (no image-encoder method reads any)."""
        validate_images(self.name, images, self.class_embeddings.device)
        return self._run(images)

    def _run(self, images: torch.Tensor) -> Trace:
        b, n = self.batch_size, images.shape[0]
        trace = (Trace(*empty_trace(0, self.num_classes, images.device)) if n == 0 else
                 concat_traces([self._batch(images[s:s + b]) for s in range(0, n, b)]))
        trace.state = self.state_tensors()
        return trace

    def _batch(self, images: torch.Tensor) -> Trace:
        posteriors, selected, gated, gated_prior = empty_trace(images.shape[0], self.num_classes, images.device)
        timer = StageTimer()
        if self.episodic:
            self.load_state_tensors(self.initial)
        with timer("update"), torch.enable_grad():
            logits, used = self.adapt(images)
        with timer("posterior"):
            posteriors[:] = torch.softmax(logits.float(), dim=1)
            gated[:] = used
        return Trace(posteriors, selected, gated, gated_prior, timings=timer.seconds)

    # -------------------------------------------------------------------------------------------- the state
    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Copies of the adapted parameters, the optimiser's state and the method's own (module docstring)."""
        state = {_ENC + name.replace(".", "__"): p.detach().clone() for name, p in self.adapted}
        for k, entry in self.optimizer.state_dict()["state"].items():
            for key, value in entry.items():
                if value is not None:
                    state[f"{_OPT}{k}__{key}"] = torch.as_tensor(value).detach().clone()
        state.update({_EXTRA + key: value.detach().clone() for key, value in self.extra_state().items()})
        return state

    def load_state_tensors(self, state: dict[str, Any]) -> None:
        """Restore what `state_tensors` gave (other entries of a run's state file are ignored)."""
        with torch.no_grad():
            for name, p in self.adapted:
                p.copy_(torch.as_tensor(state[_ENC + name.replace(".", "__")]))
        entries: dict[int, dict[str, Any]] = {}
        for key, value in state.items():
            if key.startswith(_OPT):
                k, _, field = key[len(_OPT):].partition("__")
                # as saved (the CPU for a state file's): load_state_dict moves each to where its parameter is, but
                # keeps Adam's step count where it is given, which a non-capturable Adam wants on the CPU
                entries.setdefault(int(k), {})[field] = torch.as_tensor(value)
        fresh = self.optimizer.state_dict()
        self.optimizer.load_state_dict({"state": entries, "param_groups": fresh["param_groups"]})
        self.load_extra_state({key[len(_EXTRA):]: torch.as_tensor(value) for key, value in state.items()
                               if key.startswith(_EXTRA)})


class LoRADelta(torch.nn.Module):
    """A parametrization of a weight W [out, in] whose rows are `chunks` stacked projections (nn.MultiheadAttention's
    packed q, k, v: 3; a Linear: 1): W + scale * the chosen chunks' B A (the others zero)."""

    def __init__(self, weight: torch.Tensor, chunks: int, chosen: tuple[int, ...], rank: int, scale: float,
                 generator: torch.Generator) -> None:
        super().__init__()
        rows, fan_in = weight.shape[0] // chunks, weight.shape[1]
        bound = 1 / math.sqrt(fan_in)  # loralib's kaiming_uniform_(A, a=sqrt(5))
        self.chunks, self.chosen, self.scale = chunks, chosen, scale
        self.A = torch.nn.ParameterList([
            torch.nn.Parameter(((torch.rand(rank, fan_in, generator=generator) * 2 - 1) * bound).to(weight))
            for _ in chosen])
        self.B = torch.nn.ParameterList([torch.nn.Parameter(weight.new_zeros(rows, rank)) for _ in chosen])

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        blocks = list(torch.zeros_like(weight).chunk(self.chunks))
        for i, a, b in zip(self.chosen, self.A, self.B):
            blocks[i] = b @ a
        return weight + self.scale * torch.cat(blocks)


def add_lora(model: torch.nn.Module, lora: Any) -> list[tuple[str, torch.nn.Parameter]]:
    """Put LoRA adapters (`orchestrator.registry.card.LoRA`: rank, alpha, targets) on every attention of the tower,
    as parametrizations of its projection weights: a ViT's nn.MultiheadAttention (packed in_proj_weight: q, k, v;
    out_proj: out) and a ModifiedResNet's attention pool (q_proj, k_proj, v_proj; c_proj: out). A is drawn from a
    generator seeded 0 in module order, so every run's adapters start alike; B is zero, so the tower starts as
    CLIP's. Returns (name, parameter) of every A and B."""
    from torch.nn.utils import parametrize

    generator = torch.Generator().manual_seed(0)
    scale = lora.alpha / lora.rank
    qkv = tuple(i for i, t in enumerate(("q", "k", "v")) if t in lora.targets)
    adapters = []
    for module in list(model.modules()):
        if isinstance(module, torch.nn.MultiheadAttention):
            if module.in_proj_weight is None:
                raise ValueError("LoRA: an nn.MultiheadAttention without a packed in_proj_weight (kdim or vdim "
                                 "differ from embed_dim) is not supported")
            places = [(module, "in_proj_weight", 3, qkv)] if qkv else []
            out = module.out_proj
        elif all(isinstance(getattr(module, n, None), torch.nn.Linear) for n in ("q_proj", "k_proj", "v_proj",
                                                                                  "c_proj")):
            places = [(getattr(module, f"{t}_proj"), "weight", 1, (0,)) for t in ("q", "k", "v") if t in lora.targets]
            out = module.c_proj
        else:
            continue
        if "out" in lora.targets:
            places.append((out, "weight", 1, (0,)))
        for owner, name, chunks, chosen in places:
            delta = LoRADelta(getattr(owner, name), chunks, chosen, lora.rank, scale, generator)
            parametrize.register_parametrization(owner, name, delta)
            adapters += [*delta.A, *delta.B]
    ids = {id(p) for p in adapters}
    return [(name, p) for name, p in model.named_parameters() if id(p) in ids]


class SAM:
    """Sharpness-aware minimisation over a base optimiser (davda54/sam as SAR and DeYO vendor it, adaptive=False):
    `first_step` climbs to w + rho * g / ||g|| from the current gradients, `second_step` returns to w and steps the
    base optimiser with the gradients taken there."""

    def __init__(self, base: torch.optim.Optimizer, rho: float) -> None:
        self.base, self.rho = base, rho
        self.old: dict[int, torch.Tensor] = {}

    @torch.no_grad()
    def first_step(self) -> None:
        params = [p for group in self.base.param_groups for p in group["params"] if p.grad is not None]
        grad_norm = torch.norm(torch.stack([p.grad.norm(p=2) for p in params]), p=2)
        scale = self.rho / (grad_norm + 1e-12)
        for p in params:
            self.old[id(p)] = p.data.clone()
            p.add_(p.grad * scale.to(p))
        self.base.zero_grad()

    @torch.no_grad()
    def second_step(self) -> None:
        for group in self.base.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.data = self.old[id(p)]
        self.base.step()
        self.base.zero_grad()


def entropy_margin(fraction: float, num_classes: int) -> float:
    """SAR's and DeYO's margins are given as fractions of the uniform entropy ln K (official: `* math.log(1000)`,
    `* math.log(num_class)`)."""
    return fraction * math.log(num_classes)


def saved_bytes_per_image(vision: torch.nn.Module, image_size: int) -> int:
    """Bytes autograd keeps for one image's step through the tower with its norm layers' affine parameters trainable
    (an encoder method's activation memory per image, `ImageEncoderUse.mb_per_image`), counted on a one-image pass."""
    model = copy.deepcopy(vision).float()
    configure_norm(model, [p for _, p in norm_parameters(model)])
    total = 0

    def keep(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    x = torch.zeros(1, 3, image_size, image_size, device=next(model.parameters()).device)
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model(x).sum()
    return total
