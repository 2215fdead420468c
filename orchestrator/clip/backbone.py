"""CLIP backbones through open_clip, resolved offline-first.

A backbone is named by an open_clip model name and a `pretrained` value: a tag ('openai' for the paper's
RN50, ViT-B-16, ViT-L-14), a local checkpoint file (open_clip state dict, safetensors, or OpenAI's original
TorchScript .pt), or None for random weights (tests and smoke runs).

Tags are never fetched behind the user's back: the weights are looked up in the Hugging Face cache and in
open_clip's URL cache first, and a tag that is not there fails at once with the places tried and how to
supply the weights, unless `allow_download=True`. open_clip itself would otherwise try the network and can
hang for minutes on a machine without it.

OpenAI's weights were trained with QuickGELU. open_clip applies it for the 'openai' tag's own config only
when the model name says so ('-quickgelu') or the tag does; a checkpoint *file* carries no such flag. Here
the activation is resolved once (`quick_gelu`): explicit argument, else the model config, else the tag's
setting, else True for a TorchScript archive (every OpenAI original is one), else False.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import logging
import os
import pickle
import warnings
import zipfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from orchestrator.device import auto_device

log = logging.getLogger(__name__)

RANDOM_INIT_SEED = 0  # pretrained=None: fixed init so every process builds the same random model
_HF_WEIGHTS = "open_clip_pytorch_model.bin"
_HF_SAFE_WEIGHTS = "open_clip_model.safetensors"
_TORCHSCRIPT_EXTRA_KEYS = ("input_resolution", "context_length", "vocab_size", "attn_mask")


class WeightsNotFoundError(FileNotFoundError):
    """The requested weights are not on this machine (and downloading was not allowed or failed)."""


@dataclass(frozen=True)
class BackboneSpec:
    """What names a backbone; cheap to build, hash and send to Ray workers (no weights loaded)."""

    model: str
    pretrained: str | None = None
    quick_gelu: bool | None = None  # None: resolved as the module docstring says

    @property
    def label(self) -> str:
        return f"{self.model}/{self.pretrained or 'random'}"


@dataclass(frozen=True)
class ResolvedWeights:
    """Where a spec's weights are and everything that decides the model's outputs (used in cache keys)."""

    model: str  # open_clip config name
    pretrained: str | None
    path: str | None  # weights file on disk; None for random weights
    torchscript: bool
    quick_gelu: bool
    preprocess: dict[str, Any]  # open_clip PreprocessCfg fields: size, mean, std, interpolation, resize_mode, ...
    weights_id: str  # 'tag:<model>:<tag>', 'sha256:<hex>' of a local file, or 'random:<seed>'

    def identity(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "weights": self.weights_id,
            "quick_gelu": self.quick_gelu,
            "preprocess": self.preprocess,
        }


# --------------------------------------------------------------------------------------------- resolution


def model_config(model: str) -> dict[str, Any]:
    import open_clip

    if model.startswith(("hf-hub:", "local-dir:")):
        raise ValueError(
            f"model {model!r}: schema names are not supported here; give an open_clip model name "
            f"(e.g. 'ViT-B-16') and its weights as `pretrained` (a tag or a checkpoint file)"
        )
    cfg = open_clip.get_model_config(model)
    if cfg is None:
        close = difflib.get_close_matches(model, open_clip.list_models(), n=5, cutoff=0.5)
        raise ValueError(
            f"unknown model {model!r}: open_clip has no config of that name"
            f"{' (did you mean ' + ', '.join(close) + '?)' if close else ''}. "
            f"List them with `python -c 'import open_clip; print(open_clip.list_models())'`; "
            f"register your own with open_clip.add_model_config(path_to_json)."
        )
    return cfg


def backbone_head(model: str) -> str:
    """'sigmoid' or 'softmax': how an open_clip model scores an image against a text (registry.backbones)."""
    from orchestrator.registry.backbones import head_of_config

    return head_of_config(model_config(model.replace("/", "-")))


def _is_torchscript(path: str) -> bool:
    """TorchScript archives (OpenAI's originals) hold a constants.pkl beside data.pkl; torch.save zips do not."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as z:
        return any(name.endswith("/constants.pkl") for name in z.namelist())


@cache
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    """Content hash of a weights file; memoised on (path, size, mtime) so a process hashes each file once."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    st = os.stat(path)
    return _file_sha256(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


def _hf_filenames(filename: str) -> list[str]:
    """The files open_clip would fetch for an hf_hub entry, safetensors first (as open_clip prefers)."""
    names = []
    if filename == _HF_WEIGHTS:
        names.append(_HF_SAFE_WEIGHTS)
    elif filename.endswith((".bin", ".pth")):
        names.append(filename[:-4] + ".safetensors")
    return names + [filename]


def _find_cached_tag(tag_cfg: dict[str, Any], weights_dir: str | None) -> tuple[str | None, list[str]]:
    """A locally cached weights file for a tag, without any network access; also the places looked at."""
    tried: list[str] = []
    if tag_cfg.get("file"):
        tried.append(tag_cfg["file"])
        if os.path.isfile(tag_cfg["file"]):
            return tag_cfg["file"], tried
    if tag_cfg.get("hf_hub"):
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.constants import HF_HUB_CACHE

        repo_id, filename = os.path.split(tag_cfg["hf_hub"])  # 'org/repo/' -> default file, 'org/repo/f.pt' -> f.pt
        for name in _hf_filenames(filename or _HF_WEIGHTS):
            tried.append(f"Hugging Face cache {weights_dir or HF_HUB_CACHE}: {repo_id}/{name}")
            found = try_to_load_from_cache(repo_id, name, cache_dir=weights_dir)
            if isinstance(found, str) and os.path.isfile(found):
                return found, tried
    if tag_cfg.get("url"):
        target = os.path.join(weights_dir or os.path.expanduser("~/.cache/clip"), os.path.basename(tag_cfg["url"]))
        tried.append(target)
        if os.path.isfile(target):
            return target, tried
    return None, tried


def resolve_weights(
    spec: BackboneSpec, *, weights_dir: str | None = None, allow_download: bool = False
) -> ResolvedWeights:
    """Find a spec's weights and settle its activation and preprocessing; builds no model."""
    import open_clip
    from open_clip.transform import PreprocessCfg

    model = spec.model.replace("/", "-")  # OpenAI writes 'ViT-B/16'; open_clip's configs are 'ViT-B-16'
    cfg = model_config(model)
    preprocess = {k: v for k, v in PreprocessCfg().__dict__.items()}
    tag_cfg: dict[str, Any] = {}
    path: str | None = None
    torchscript = False
    pretrained = spec.pretrained
    if pretrained is None:
        weights_id = f"random:{RANDOM_INIT_SEED}"
    else:
        tag_cfg = open_clip.get_pretrained_cfg(model, pretrained)
        if tag_cfg:
            path, tried = _find_cached_tag(tag_cfg, weights_dir)
            if path is None and allow_download:
                try:
                    path = open_clip.download_pretrained(tag_cfg, cache_dir=weights_dir)
                except Exception as e:  # noqa: BLE001 - any transport error becomes the same clear message
                    tried.append(f"download ({type(e).__name__}: {e})")
            if path is None:
                raise WeightsNotFoundError(
                    f"weights for model {model!r} with tag {pretrained!r} are not on this machine. Looked in: "
                    + "; ".join(tried)
                    + ". Supply them by (a) copying the Hugging Face cache from a machine that has fetched them "
                    f"(`python -c \"import open_clip; open_clip.create_model('{model}', pretrained='{pretrained}')\"` "
                    f"there, then copy ~/.cache/huggingface/hub, or point weights_dir / HF_HUB_CACHE at it), "
                    f"(b) passing the checkpoint file itself as pretrained (e.g. OpenAI's "
                    f"{os.path.basename(tag_cfg.get('url', '')) or 'model .pt'}), or (c) allow_download=True "
                    f"(`bca cache --allow-download`) where the network is reachable."
                )
            preprocess.update({k: v for k, v in tag_cfg.items() if k in preprocess and k != "size"})
            weights_id = f"tag:{model}:{pretrained}"
        elif os.path.isfile(pretrained):
            path = str(Path(pretrained).resolve())
            torchscript = _is_torchscript(path)
            weights_id = f"sha256:{file_sha256(path)}"
        elif os.sep in pretrained or Path(pretrained).suffix in (".pt", ".pth", ".bin", ".safetensors", ".npz"):
            raise WeightsNotFoundError(f"weights file {pretrained!r} (for model {model!r}) does not exist")
        else:
            tags = open_clip.list_pretrained_tags_by_model(model)
            raise ValueError(
                f"pretrained {pretrained!r} is neither a tag of model {model!r} (its tags: {tags or 'none'}) nor "
                f"an existing checkpoint file"
            )
    preprocess["size"] = cfg["vision_cfg"].get("image_size", preprocess["size"])
    preprocess = {k: list(v) if isinstance(v, tuple) else v for k, v in preprocess.items()}  # JSON-stable

    if spec.quick_gelu is not None:
        quick_gelu = spec.quick_gelu
    elif cfg.get("quick_gelu"):
        quick_gelu = True
    elif tag_cfg:
        quick_gelu = bool(tag_cfg.get("quick_gelu", False))
    else:
        quick_gelu = torchscript
    if torchscript and spec.quick_gelu is None and not cfg.get("quick_gelu"):
        log.info("%s is a TorchScript archive (OpenAI original): using QuickGELU", path)
    return ResolvedWeights(model, pretrained, path, torchscript, quick_gelu, preprocess, weights_id)


def _stored_tensors(resolved: ResolvedWeights, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The tensors `names` of a weights file, as open_clip.load_checkpoint would key them, without building the
    model (safetensors and torch.load's zip format are read lazily)."""
    if resolved.torchscript:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            state = torch.jit.load(resolved.path, map_location="cpu").state_dict()
    elif resolved.path.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(resolved.path, framework="pt") as f:
            state = {k: f.get_tensor(k) for k in f.keys() if k.removeprefix("module.") in names}
    else:
        state = torch.load(resolved.path, map_location="cpu", mmap=zipfile.is_zipfile(resolved.path),
                           weights_only=True)
        state = state.get("state_dict", state)
    return {k.removeprefix("module."): v for k, v in state.items() if k.removeprefix("module.") in names}


def learned_logits(resolved: ResolvedWeights) -> tuple[float, float | None]:
    """(logit scale, logit bias or None) of a backbone's weights: exp of the stored logit_scale (open_clip keeps its
    log) and the stored logit_bias; random weights take the config's initial values, as open_clip sets them."""
    cfg = model_config(resolved.model)
    if resolved.path is None:
        import math

        bias = cfg.get("init_logit_bias")
        return math.exp(cfg.get("init_logit_scale", math.log(1 / 0.07))), None if bias is None else float(bias)
    stored = _stored_tensors(resolved, ("logit_scale", "logit_bias"))
    if "logit_scale" not in stored:
        raise ValueError(f"weights file {resolved.path} (model {resolved.model!r}) holds no logit_scale; expected "
                         f"an open_clip or OpenAI checkpoint")
    bias = stored.get("logit_bias")
    return float(stored["logit_scale"].float().exp()), None if bias is None else float(bias.float())


# --------------------------------------------------------------------------------------------- loading


def _load_weights(net: torch.nn.Module, resolved: ResolvedWeights, weights_only: bool) -> None:
    import open_clip

    try:
        if resolved.torchscript:
            # TorchScript runs its own code on load: the equivalent of weights_only=False, which OpenAI's
            # originals need. Keys match open_clip's CLIP; drop the archive's scalar metadata and buffers.
            with warnings.catch_warnings():  # torch deprecates jit.load, but OpenAI's files exist only in it
                warnings.simplefilter("ignore", FutureWarning)
                state = torch.jit.load(resolved.path, map_location="cpu").state_dict()
            state = {k: v for k, v in state.items() if k not in _TORCHSCRIPT_EXTRA_KEYS}
            if "logit_scale" in state and state["logit_scale"].ndim != net.logit_scale.ndim:
                state["logit_scale"] = state["logit_scale"].reshape(net.logit_scale.shape)
            net.load_state_dict(state, strict=True)
        else:
            open_clip.load_checkpoint(net, resolved.path, strict=True, weights_only=weights_only)
    except pickle.UnpicklingError as e:
        raise ValueError(
            f"checkpoint {resolved.path} holds more than tensors and weights_only=True refused it ({e}). If you "
            f"trust the file, load it with weights_only=False."
        ) from e
    except RuntimeError as e:
        raise ValueError(
            f"checkpoint {resolved.path} does not fit model {resolved.model!r} "
            f"(quick_gelu={resolved.quick_gelu}): {str(e)[:600]}. Check the model name matches the checkpoint "
            f"(OpenAI's RN50.pt is 'RN50', ViT-B-16.pt is 'ViT-B-16', ViT-L-14.pt is 'ViT-L-14')."
        ) from e


def precision_for(device: torch.device) -> str:
    """fp16 autocast on a GPU (features returned in float32), plain float32 elsewhere."""
    return "amp_fp16" if device.type == "cuda" else "fp32"


@dataclass
class Backbone:
    """A loaded CLIP: image and text encoders returning L2-normalised float32 features on the CPU."""

    spec: BackboneSpec
    resolved: ResolvedWeights
    model: torch.nn.Module
    tokenizer: Any
    preprocess: Any  # PIL image -> [3, H, W] tensor, the backbone's own eval transform
    device: torch.device
    precision: str
    embed_dim: int
    encoder_calls: int = field(default=0)  # images encoded so far; lets tests and logs see cache hits

    def autocast(self):
        """fp16 autocast on a GPU (`precision_for`), nothing elsewhere."""
        return torch.autocast("cuda", dtype=torch.float16, enabled=self.precision == "amp_fp16")

    @torch.no_grad()
    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] preprocessed images -> [B, d] float32, L2-normalised, on the CPU."""
        self.encoder_calls += int(pixels.shape[0])
        with self.autocast():
            feats = self.model.encode_image(pixels.to(self.device, non_blocking=True))
        return F.normalize(feats.float(), dim=-1).cpu()

    @torch.no_grad()
    def encode_texts(self, prompts: list[str], batch_size: int = 256,
                     progress: Callable[[int, int], None] | None = None) -> torch.Tensor:
        """Prompts -> [P, d] float32, L2-normalised, on the CPU; `progress` hears (prompts done, prompts) after
        each batch."""
        out = []
        for start in range(0, len(prompts), batch_size):
            tokens = self.tokenizer(prompts[start:start + batch_size]).to(self.device)
            with self.autocast():
                feats = self.model.encode_text(tokens)
            out.append(F.normalize(feats.float(), dim=-1).cpu())
            if progress is not None:
                progress(min(start + batch_size, len(prompts)), len(prompts))
        return torch.cat(out)


def eval_transform(resolved: ResolvedWeights) -> Any:
    """The backbone's own eval transform (PIL image -> [3, H, W]), built from its settled preprocessing alone."""
    from open_clip.transform import PreprocessCfg, image_transform_v2

    cfg = PreprocessCfg(**{k: tuple(v) if isinstance(v, list) else v for k, v in resolved.preprocess.items()})
    return image_transform_v2(cfg, is_train=False)


@contextlib.contextmanager
def _hub_offline(enabled: bool):
    """Hugging Face Hub offline mode for the duration (read at call time by huggingface_hub), so a model
    config or tokenizer that would fetch from the Hub fails at once instead of waiting on the network."""
    if not enabled:
        yield
        return
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


class _DropRandomInitWarning(logging.Filter):
    """open_clip warns 'initialized randomly' for the empty model the checkpoint is loaded into next."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No pretrained weights loaded")


def load_backbone(
    model: str,
    pretrained: str | None = None,
    device: str | torch.device | None = None,
    *,
    quick_gelu: bool | None = None,
    weights_dir: str | None = None,
    allow_download: bool = False,
    weights_only: bool = True,
) -> Backbone:
    """Build an open_clip model and load its weights (see the module docstring for what `pretrained` takes).

    device: None or 'auto' picks CUDA when present. weights_dir: where tag weights are cached (default: the
    Hugging Face cache and ~/.cache/clip, as open_clip uses them). weights_only applies to plain checkpoint
    files; TorchScript archives are always loaded as TorchScript.
    """
    import open_clip

    spec = BackboneSpec(model, pretrained, quick_gelu)
    resolved = resolve_weights(spec, weights_dir=weights_dir, allow_download=allow_download)
    dev = auto_device(device)
    quiet = _DropRandomInitWarning() if resolved.path is not None else None
    if quiet:
        logging.getLogger().addFilter(quiet)
    try:
        with torch.random.fork_rng(devices=[]), _hub_offline(not allow_download):
            torch.manual_seed(RANDOM_INIT_SEED)
            net = open_clip.create_model(
                resolved.model,
                pretrained=None,
                device="cpu",
                force_preprocess_cfg=resolved.preprocess,
                pretrained_image=False,  # never fetch tower weights: the full checkpoint (or nothing) is loaded below
                pretrained_text=False,
                quick_gelu=resolved.quick_gelu,
            )
    finally:
        if quiet:
            logging.getLogger().removeFilter(quiet)
    if resolved.path is not None:
        _load_weights(net, resolved, weights_only)
    net = net.to(dev).eval()
    with _hub_offline(not allow_download):
        tokenizer = open_clip.get_tokenizer(resolved.model)
    return Backbone(
        spec=spec,
        resolved=resolved,
        model=net,
        tokenizer=tokenizer,
        preprocess=eval_transform(resolved),
        device=dev,
        precision=precision_for(dev),
        embed_dim=int(model_config(resolved.model)["embed_dim"]),
    )


_LOADED: dict[tuple, Backbone] = {}


def shared_backbone(spec: BackboneSpec, device: torch.device, **kwargs: Any) -> Backbone:
    """load_backbone memoised per process (one entry): trials reusing an actor do not reload the weights. `device`
    as its caller normalised it (`auto_device`)."""
    key = (spec, str(device), tuple(sorted(kwargs.items())))
    if key not in _LOADED:
        _LOADED.clear()  # one large model on the GPU at a time
        _LOADED[key] = load_backbone(spec.model, spec.pretrained, device, quick_gelu=spec.quick_gelu, **kwargs)
    return _LOADED[key]
