"""A method's card: plain data (no torch) holding every fact about it that the rest of the project asks
(see `orchestrator.registry.methods`, the table of registered cards, for how cards are found)."""

from __future__ import annotations

import ast
import importlib
import itertools
import math
import numbers
import operator
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterator, Mapping

from orchestrator.registry.corruptions import benchmark_key, parse_variant
from orchestrator.registry.datasets import GROUPS, canonical_dataset, dataset_card, dataset_key
from orchestrator.registry.templates import TEMPLATE_SET_NAMES
from orchestrator.registry.views import AUGMENTED_KINDS, VIEW_KINDS, ViewConfig, parse_views

KINDS = ("float", "int", "str", "bool")
ROLES = ("threshold", "count", "rate", "weight", "scale", "size", "choice", "flag", "seed")
INPUTS = ("single", "views", "either")
# the auxiliary image encoders a backbone may name beside CLIP (`orchestrator.clip.auxiliary`) and a card may read
AUXILIARY_ENCODERS = ("dinov2",)
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
# A kind's valid values in words (error messages, the docs).
KIND_NOUNS = {"float": "a number", "int": "an integer", "str": "a string", "bool": "true or false"}


def coerce_kind(kind: str, value: Any) -> Any:
    """`value` (not None) in `kind`: a bool or str as it is, a finite real number as a float, or an integral one
    as an int (so n1=30000.0 and n1=30000 are one value); a ValueError "expected <KIND_NOUNS[kind]>" otherwise.
    The one kind rule: an hparam's check (`HParam.check`) and a stored run config's (`results.schema`) use it."""
    if kind == "bool":
        ok = isinstance(value, bool)
    elif kind == "str":
        ok = isinstance(value, str)
    else:
        ok = (not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(float(value))
              and (kind == "float" or float(value).is_integer()))
        if ok:
            value = float(value) if kind == "float" else int(value)
    if not ok:
        raise ValueError(f"expected {KIND_NOUNS[kind]}")
    return value


@dataclass(frozen=True)
class HParam:
    """One hyperparameter of a method.

    kind: float | int | str | bool; default: its value (None only with `nullable`); low / high: inclusive
    bounds unless low_open / high_open; choices: the allowed strings of a str; nullable: None is a valid value;
    null_means: the hparam whose value a None takes (tau_likelihood null = tau), resolved at the edge
    (`MethodCard.resolve`, `MethodCard.grid_points`) so that null and the equal explicit value are one run; log: spans
    decades (charts use a log axis); per_dataset: defaults that differ by benchmark dataset (any spelling, stored
    canonical; a corruption benchmark's name, `cifar10-c`, holds for each of its corruptions and severities); when: the hparam matters only when other hparams take these values ({"update": ("decay",)}),
    else it is dropped from a run's config.
    """

    name: str
    kind: str
    default: Any
    doc: str
    role: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] = ()
    nullable: bool = False
    null_means: str | None = None
    log: bool = False
    per_dataset: Mapping[str, Any] = field(default_factory=dict)
    when: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"hparam name {self.name!r}: expected lower-case letters, digits and _")
        if self.null_means is not None and not self.nullable:
            raise ValueError(f"hparam {self.name!r}: null_means needs nullable=True")
        if self.kind not in KINDS:
            raise ValueError(f"hparam {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.role not in ROLES:
            raise ValueError(f"hparam {self.name!r}: role must be one of {ROLES}, got {self.role!r}")
        per_dataset = {benchmark_key(k) or canonical_dataset(k): v for k, v in self.per_dataset.items()}
        object.__setattr__(self, "per_dataset", MappingProxyType(per_dataset))
        object.__setattr__(self, "when", MappingProxyType(dict(self.when)))
        for value in (self.default, *per_dataset.values()):
            self.check("registry", value)

    @property
    def expected(self) -> str:
        """What a valid value is, in words (for error messages and the docs)."""
        if self.kind == "str":
            text = f"one of {list(self.choices)}"
        elif self.kind == "bool":
            text = KIND_NOUNS["bool"]
        else:
            noun = KIND_NOUNS[self.kind]
            if self.low is None and self.high is None:
                text = noun
            elif self.high is None:
                text = f"{noun} {'>' if self.low_open else '>='} {self.low:g}"
            else:
                lo = "(" if self.low_open else "["
                hi = ")" if self.high_open else "]"
                low = "-inf" if self.low is None else f"{self.low:g}"
                high = "inf" if self.high is None else f"{self.high:g}"
                text = f"{noun} in {lo}{low}, {high}{hi}"
        return text + (" or null" if self.nullable else "")

    def check(self, method: str, value: Any) -> Any:
        """The value in its kind (an integral float becomes an int), or a ValueError naming method and hparam."""
        def bad() -> ValueError:
            return ValueError(f"{method}: hparam {self.name!r} must be {self.expected} ({self.doc}), got {value!r}")

        if value is None:
            if self.nullable:
                return None
            raise bad()
        try:
            value = coerce_kind(self.kind, value)
        except ValueError:
            raise bad() from None
        if self.kind == "str" and value not in self.choices:
            raise bad()
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            raise bad()
        if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            raise bad()
        return value


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _arithmetic(text: str, names: Mapping[str, Any], what: str) -> float:
    """The value of `text`, an expression of numbers, `names` and + - * / ( ) only (a card's plain-data formula)."""
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name) and node.id in names and isinstance(names[node.id], (int, float)):
            return names[node.id]
        raise ValueError(f"{what}: {text!r} must use numbers, + - * / ( ) and the names {sorted(names)} "
                         f"(numeric ones), got {ast.unparse(node)!r}")

    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"{what}: {text!r} is not an arithmetic expression ({e.msg})") from None
    return value(tree)


DEVICES = ("gpu", "any")

# What a method does on a backbone that scores with a sigmoid and a bias (SigLIP: sigmoid(s cos + b), see
# `orchestrator.registry.backbones`) where CLIP's official codes take a softmax at CLIP's scale 100. No official
# code of these methods ran on such a backbone, so each rule is the principled reading of its code.
SIGMOID_RULES = {
    "backbone_scale": "softmax over the classes at the backbone's learned logit scale: the run's logit_scale "
                      "defaults to it (a spec's value wins); the bias is dropped, since a bias shared by every class "
                      "cancels in a softmax (the argmax is the sigmoid's)",
    "unchanged": "runs as on CLIP: it has no logit_scale (it scores cosine similarities with its own temperatures) "
                 "and takes no bias",
    "refuse": "refused (exit 2 when the spec is checked)",
}


@dataclass(frozen=True)
class SigmoidRule:
    """What a method does on a backbone that scores with a sigmoid and a bias (SigLIP): rule, a key of SIGMOID_RULES;
    why: the reason, the refusal's message where the rule is 'refuse'."""

    rule: str
    why: str = ""

    def __post_init__(self) -> None:
        if self.rule not in SIGMOID_RULES:
            raise ValueError(f"sigmoid rule must be one of {tuple(SIGMOID_RULES)}, got {self.rule!r}")
        if self.rule == "refuse" and not self.why:
            raise ValueError("sigmoid rule 'refuse' needs a why (the refusal's message)")

    def text(self) -> str:
        """The rule in words, for the docs and the refusal."""
        return SIGMOID_RULES[self.rule] + (f": {self.why}" if self.why else "")


# The rule of a card that gives none, by family; else 'refuse' where the trial hands it CLIP's text tower
# (`orchestrator.methods.prompt.TextTower` follows CLIP's), 'backbone_scale' where it has a logit_scale hparam (the
# official codes multiply the cosines by CLIP's learned scale, written 100 or read as logit_scale.exp(), whose
# counterpart is the backbone's own), else 'unchanged'.
TEXT_TOWER_WHY = ("it runs CLIP's text tower from token embeddings, pooled at the end-of-text token under a causal "
                  "mask; SigLIP's text tower pools the last token without one")
FAMILY_SIGMOID_RULES = {"prompt": SigmoidRule("refuse", f"prompt tuning: {TEXT_TOWER_WHY}")}


@dataclass(frozen=True)
class TextEncoderUse:
    """A method that runs CLIP's text encoder at test time (prompt tuning): the trial hands it the backbone's text
    tower and tokenized class prompts. device: 'gpu' (its backward through the text tower is impractical on a CPU
    at benchmark scale) or 'any'; mb_per_class: activation memory of one sample's step per class, float32, at the
    text tower of ViT-B/16 and RN50 (a sweep's memory plan: K classes need about K times it per sample)."""

    device: str
    mb_per_class: float

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"text encoder device must be one of {DEVICES}, got {self.device!r}")
        if not self.mb_per_class > 0:
            raise ValueError(f"text encoder mb_per_class must be > 0, got {self.mb_per_class!r}")

    def describe(self, num_classes: int | None = None) -> str:
        """In words, for the plan and the docs."""
        need = f"{self.mb_per_class:g} MB per class per sample"
        if num_classes:
            need += f" (~{self.mb_per_class * num_classes / 1024:,.1f} GB at K = {num_classes})"
        return f"CLIP's text encoder at test time, wants {'a GPU' if self.device == 'gpu' else 'any device'}, {need}"


ENCODER_PARAMS = ("norm", "lora", "all", "prompts")
LORA_TARGETS = ("q", "k", "v", "out")


@dataclass(frozen=True)
class LoRA:
    """Low-rank adapters on the image encoder's attention (Hu et al., LoRA, as microsoft/LoRA's loralib sets them
    up): each chosen projection W becomes W + (alpha / rank) B A, A [rank, in] Kaiming-uniform, B [out, rank] zero,
    so the adapted tower starts as CLIP's; only A and B are trained. targets: which projections, of 'q', 'k', 'v'
    (the attention's input projections) and 'out' (its output projection); loralib's examples adapt q and v."""

    rank: int = 4
    alpha: float = 8.0
    targets: tuple[str, ...] = ("q", "v")

    def __post_init__(self) -> None:
        if not (isinstance(self.rank, int) and self.rank >= 1):
            raise ValueError(f"LoRA rank must be an int >= 1, got {self.rank!r}")
        if not self.alpha > 0:
            raise ValueError(f"LoRA alpha must be > 0, got {self.alpha!r}")
        if not self.targets or any(t not in LORA_TARGETS for t in self.targets) or \
                len(set(self.targets)) != len(self.targets):
            raise ValueError(f"LoRA targets must be distinct names of {LORA_TARGETS}, got {self.targets!r}")


@dataclass(frozen=True)
class ImageEncoderUse:
    """A method that adapts CLIP's image encoder at test time: the trial streams the dataset's images (decoded and
    augmented by the view code that fills the feature cache) through its own copy of the backbone's vision tower.

    params: what it updates: 'norm' (the affine scale and shift of every LayerNorm / BatchNorm / GroupNorm,
    BatchNorm on the batch's statistics), 'lora' (low-rank adapters on attention), 'all', or 'prompts' (MaPLe's
    prompts from the run's MaPLe context, the tower frozen: PromptAlign); episodic: True (the
    encoder and optimiser are reset before every batch), False (continual: they carry along the stream), or the
    name of the bool hparam that chooses per run; lora: the adapters' rank, alpha and projections where params is
    'lora' (`LoRA`; None there: its defaults); device: 'gpu' (impractical on a CPU at benchmark scale) or
    'any'; mb_per_image: activation memory one image's adaptation step keeps, float32, at the ViT-B/16 vision
    tower (a sweep's memory plan: a batch of B images needs about B times it); text_tower: the method also runs
    CLIP's text tower at test time (BATCLIP adapts its norm layers too, CLIPArTT encodes pseudo-captions), so a run
    is handed it and the class prompts as prompt tuning is (`orchestrator.methods.prompt.PromptText`);
    text_mb_per_class: where the method adapts the text tower too (BATCLIP), the activation memory its step keeps per
    class prompt, float32, at the ViT-B/16 text tower (a step over K classes needs about K times it). Its batch
    size is the card's `batch_size` (None: one image a step), its views the card's `inputs` / `views`."""

    params: str
    episodic: bool | str
    mb_per_image: float
    device: str = "any"
    text_tower: bool = False
    lora: LoRA | None = None
    text_mb_per_class: float | None = None

    def __post_init__(self) -> None:
        if self.params not in ENCODER_PARAMS:
            raise ValueError(f"image encoder params must be one of {ENCODER_PARAMS}, got {self.params!r}")
        if self.params == "lora" and self.lora is None:
            object.__setattr__(self, "lora", LoRA())
        if self.params != "lora" and self.lora is not None:
            raise ValueError(f"image encoder lora is set but params is {self.params!r}; expected params 'lora'")
        if self.device not in DEVICES:
            raise ValueError(f"image encoder device must be one of {DEVICES}, got {self.device!r}")
        if not self.mb_per_image > 0:
            raise ValueError(f"image encoder mb_per_image must be > 0, got {self.mb_per_image!r}")
        if self.text_mb_per_class is not None and not (self.text_tower and self.text_mb_per_class > 0):
            raise ValueError(f"image encoder text_mb_per_class must be > 0 and needs text_tower, got "
                             f"{self.text_mb_per_class!r} with text_tower {self.text_tower}")
        if not isinstance(self.episodic, (bool, str)):
            raise ValueError(f"image encoder episodic must be true, false or a bool hparam's name, "
                             f"got {self.episodic!r}")

    def is_episodic(self, hparams: Mapping[str, Any]) -> bool:
        """Whether a run with these (resolved) hparams resets the encoder before every batch."""
        return self.episodic if isinstance(self.episodic, bool) else bool(hparams[self.episodic])

    def describe(self, batch_size: int | None = None, num_classes: int | None = None, views: int = 1) -> str:
        """In words, for the plan and the docs; `views`: the views of each image a step runs (PromptAlign's 64)."""
        need = f"{self.mb_per_image:g} MB per image" + (" view" if views > 1 else "")
        if batch_size:
            each = f", {views} views each" if views > 1 else ""
            need += f" (~{self.mb_per_image * batch_size * views / 1024:,.1f} GB at batch size {batch_size}{each})"
        if self.text_mb_per_class is not None:
            need += f" and {self.text_mb_per_class:g} MB per class for its text tower"
            if num_classes:
                need += f" (~{self.text_mb_per_class * num_classes / 1024:,.1f} GB at K = {num_classes})"
        what = {"norm": "its norm layers' affine parameters", "all": "all its parameters",
                "prompts": "MaPLe's prompts in it, the tower frozen",
                "lora": self.lora and f"LoRA on its attention's {'/'.join(self.lora.targets)} projections, rank "
                                      f"{self.lora.rank}, alpha {self.lora.alpha:g}"}[self.params]
        text = ", running its text tower too" if self.text_tower else ""
        return (f"CLIP's image encoder adapted at test time ({what}){text}, wants "
                f"{'a GPU' if self.device == 'gpu' else 'any device'}, {need}")


@dataclass(frozen=True)
class Views:
    """The augmented views of a method's official protocol, where it takes views (the card's `inputs`), and when a
    method taking either is handed them.

    kind: the view kind ('augmix' or 'crops'; None: the dataset's own protocol) and count how many (the original
    included); scope: 'all' (its protocol augments every dataset) or 'protocol' (only the datasets whose own protocol
    has views, ImageNet-A/-V2/-R/-Sketch: on the others it gets the single view as V = 1); groups: the views of its
    official loader on a dataset group where they differ from the above ({"ood": "crops"}: TPT-derived code takes
    crops on ImageNet and its variants, AugMix elsewhere; a kind takes `count` views, 'single' the original alone);
    datasets: the same for single datasets where its loader differs within a group ({"imagenet-r": "augmix"}: DLAE's
    loader picks the transform dataset by dataset); single_datasets: where its official protocol takes the single view
    all the same (BoostAdapter on ImageNet; StatA's harness on ImageNet-A/-V2/-R/-Sketch, where a single-feature
    method otherwise gets the dataset's own AugMix protocol); when: for inputs 'either', a run is handed a stream's
    views only when its hparams take these values ({"view_selection": ("adaptive",)}; empty: always), else the views'
    confident means (`MethodCard.wants_views`)."""

    kind: str | None = None
    count: int = 64
    scope: str = "all"
    groups: Mapping[str, str] = field(default_factory=dict)
    datasets: Mapping[str, str] = field(default_factory=dict)
    single_datasets: tuple[str, ...] = ()
    when: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind not in AUGMENTED_KINDS:
            raise ValueError(f"views kind must be one of {AUGMENTED_KINDS} or None, got {self.kind!r}")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"views count must be an integer >= 1, got {self.count!r}")
        if self.scope not in ("all", "protocol"):
            raise ValueError(f"views scope must be 'all' or 'protocol', got {self.scope!r}")
        bad = {g: v for g, v in self.groups.items() if g not in GROUPS or v not in VIEW_KINDS}
        if bad:
            raise ValueError(f"views groups maps a dataset group ({GROUPS}) to one of {VIEW_KINDS}, got {bad}")
        bad = {d: v for d, v in self.datasets.items() if dataset_key(d) is None or v not in VIEW_KINDS}
        if bad:
            raise ValueError(f"views datasets maps a registered dataset to one of {VIEW_KINDS}, got {bad}")
        unknown = [d for d in self.single_datasets if dataset_key(d) is None]
        if unknown:
            raise ValueError(f"views single_datasets names registered datasets, got {unknown[0]!r}")
        object.__setattr__(self, "groups", MappingProxyType(dict(self.groups)))
        object.__setattr__(self, "datasets", MappingProxyType(
            {canonical_dataset(d): v for d, v in self.datasets.items()}))
        object.__setattr__(self, "single_datasets", tuple(canonical_dataset(d) for d in self.single_datasets))
        object.__setattr__(self, "when", MappingProxyType(dict(self.when)))


@dataclass(frozen=True)
class Prior:
    """A method that learns a prior V, saved with the run (state.npz: V, C2, ...) for the dashboard's prior view;
    count: the hparam its counter C2 starts from (None: none)."""

    count: str | None = None


@dataclass(frozen=True)
class Cost:
    """What a method costs, for a sweep's cost model, memory plan and the methods table.

    samples_per_s: single-stream samples/s on one CPU core at K = M = 1000, d = 512 (benchmarks.methods, its log in
    benchmarks/logs): the prior of a sweep's cost model before any run of it has finished; None: unknown.
    gpu_samples_per_s: config-samples/s on one H100 at the same shapes (view methods: 8 views a sample): lockstep at
    G = 32 configs a pass where the method has a runner (the BCA family: its 32-config pack), else single-stream (a
    batch method at its official size; prompt tuning: a sample's step through the ViT-B/16 text tower at K = 1000);
    from `orchestrator.sweep.cost.GPU_RATES_LOGS`, which a test holds them to; the dry run's projected GPU-hours;
    None: not measured on a GPU (CPU rate used, and named).
    state_words: the memory its state holds, in 4-byte words (an int64 counts 2, a bool 1/4), as an expression in K
    (classes), d (embedding width), n (samples seen), w (a text tower's token width, d unless given), a (an auxiliary
    encoder's width, d unless given) and its hparams (at their defaults): what its method object keeps from sample
    to sample (tests/test_state_memory.py holds it to a real run's tensors); `MethodCard.state_bytes` evaluates it
    for the cost model's memory plan of a GPU pack and for the methods table; None: unknown (a plugin)."""

    samples_per_s: float | None = None
    gpu_samples_per_s: float | None = None
    state_words: str | None = None

    def __post_init__(self) -> None:
        for name in ("samples_per_s", "gpu_samples_per_s"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, numbers.Real) and value > 0):
                raise ValueError(f"cost {name} must be a number > 0 or None, got {value!r}")
        if self.state_words is not None and not isinstance(self.state_words, str):
            raise ValueError(f"cost state_words must be an arithmetic expression (a string) or None, "
                             f"got {self.state_words!r}")


@dataclass(frozen=True)
class Lockstep:
    """A method's lockstep runner: runner, "module:function" (or the function), `run(methods, features) ->
    list[Trace]`: every config of a pack whose card names the same runner goes to it in one call, so a runner that
    several cards name takes a mix of their methods (the BCA family's engine) or splits them
    (`orchestrator.methods.lockstep.per_card`); inputs: the features it takes ('single', 'views', 'either'; None:
    as the card's `inputs`), other features run each config on its own."""

    runner: Any
    inputs: str | None = None

    def __post_init__(self) -> None:
        if self.inputs is not None and self.inputs not in INPUTS:
            raise ValueError(f"lockstep inputs must be one of {INPUTS} or None, got {self.inputs!r}")


@dataclass(frozen=True)
class MethodCard:
    """One method: its identity and hyperparameters, composed with focused records for the rest (each with its own
    validation; a card leaves out a record that holds only defaults).

    name: the spec's and the results' key; label: as tables write it; order: display order (tables, legends);
    family: methods that share a colour family in charts; summary: what adapts (the README's table);
    impl: "module:Class" of its `orchestrator.methods.Method` subclass (or the class); hparams: its `HParam`s;
    inputs: 'single' (features [n, d]), 'views' (features [n, V, d], view 0 the original) or 'either' (both;
    augmented views used as its official code uses them); views: the views of its official protocol (`Views`);
    batch_size: the batch size its official code adapts on (`orchestrator.methods.base.BatchMethod`: the method sees
    the stream a batch at a time; None: a per-sample method, which runs at batch size 1); stream_length: the hparam a
    sweep sets to the stream's length where it is null (a schedule over the whole stream, while the trial feeds it in
    parts); templates: the template set its official run embeds (`orchestrator.clip.prompts`) where that is not the
    dataset's own, what a spec's default `templates: protocol` gives its runs (None: the dataset's own templates);
    auxiliary: the auxiliary encoders (AUXILIARY_ENCODERS) whose features it reads beside CLIP's: its method's
    `_run(features, auxiliary)` gets each one's [n, d'] features of the original view, in stream order (the backbone
    names the encoder; a synthetic dataset simulates it, `orchestrator.data.synthetic`); baseline: zero-shot CLIP,
    which gains are measured against; state: names of the state tensors its trace exposes; prior: a `Prior` where it
    learns one; cost: its `Cost` (rates and state memory); lockstep: its `Lockstep` runner, or None (each config runs
    on its own); text_encoder: a `TextEncoderUse` where the method runs CLIP's text encoder at test time (the trial
    gives it the text tower: real datasets only), else None; image_encoder: an `ImageEncoderUse` where the method
    adapts CLIP's image encoder on the images (the trial gives it the vision tower and the stream's images: real
    datasets only), else None; sigmoid: its `SigmoidRule` on a backbone scoring with a sigmoid and a bias (None: its
    family's, FAMILY_SIGMOID_RULES, else 'refuse' for a method handed CLIP's text tower, 'backbone_scale' with a
    logit_scale hparam, 'unchanged' without: `sigmoid_rule`); source: the official code it follows.
    """

    name: str
    label: str
    order: int
    family: str
    summary: str
    impl: Any
    hparams: tuple[HParam, ...] = ()
    inputs: str = "single"
    views: Views = field(default_factory=Views)
    batch_size: int | None = None
    stream_length: str | None = None
    templates: str | None = None
    auxiliary: tuple[str, ...] = ()
    baseline: bool = False
    state: tuple[str, ...] = ()
    prior: Prior | None = None
    cost: Cost = field(default_factory=Cost)
    lockstep: Lockstep | None = None
    text_encoder: TextEncoderUse | None = None
    image_encoder: ImageEncoderUse | None = None
    sigmoid: SigmoidRule | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"method name {self.name!r}: expected lower-case letters, digits and _")
        for name, kind in (("views", Views), ("prior", Prior), ("cost", Cost), ("lockstep", Lockstep),
                           ("text_encoder", TextEncoderUse), ("image_encoder", ImageEncoderUse),
                           ("sigmoid", SigmoidRule)):
            value = getattr(self, name)
            if not isinstance(value, kind) and (value is not None or name in ("views", "cost")):
                optional = "" if name in ("views", "cost") else " or None"
                raise ValueError(f"method {self.name!r}: {name} must be a {kind.__name__}{optional}, got {value!r}")
        unknown = [a for a in self.auxiliary if a not in AUXILIARY_ENCODERS]
        if unknown:
            raise ValueError(f"method {self.name!r}: auxiliary encoder {unknown[0]!r} is not one of "
                             f"{AUXILIARY_ENCODERS}")
        if self.inputs not in INPUTS:
            raise ValueError(f"method {self.name!r}: inputs must be one of {INPUTS}, got {self.inputs!r}")
        if self.batch_size is not None and (not isinstance(self.batch_size, int) or self.batch_size < 1):
            raise ValueError(f"method {self.name!r}: batch_size must be an integer >= 1 or None, got {self.batch_size!r}")
        if self.templates is not None and self.templates not in TEMPLATE_SET_NAMES:
            raise ValueError(f"method {self.name!r}: templates must be one of {TEMPLATE_SET_NAMES} or None, "
                             f"got {self.templates!r}")
        names = [h.name for h in self.hparams]
        if self.image_encoder is not None:
            chooser = self.image_encoder.episodic
            if isinstance(chooser, str) and not any(h.name == chooser and h.kind == "bool" for h in self.hparams):
                raise ValueError(f"method {self.name!r}: image_encoder episodic {chooser!r} is not one of its bool "
                                 f"hparams")
            if self.text_encoder is not None:
                raise ValueError(f"method {self.name!r}: a method adapts the image encoder or the text encoder, "
                                 f"not both")
        if len(set(names)) != len(names):
            raise ValueError(f"method {self.name!r}: an hparam is declared twice in {names}")
        for h in self.hparams:
            unknown = set(h.when) - set(names)
            if unknown:
                raise ValueError(f"method {self.name!r}: hparam {h.name!r} depends on unknown {sorted(unknown)}")
            if h.null_means is not None and h.null_means not in names:
                raise ValueError(f"method {self.name!r}: hparam {h.name!r}: null_means {h.null_means!r} is not one "
                                 f"of its hparams")
        unknown = set(self.views.when) - set(names)
        if unknown or (self.views.when and self.inputs != "either"):
            raise ValueError(f"method {self.name!r}: views when needs inputs 'either' and its own hparams, got "
                             f"inputs {self.inputs!r} and {sorted(self.views.when)}")
        for what, value in (("prior count", self.prior and self.prior.count), ("stream_length", self.stream_length)):
            if value is not None and value not in names:
                raise ValueError(f"method {self.name!r}: {what} {value!r} is not one of its hparams")
        rule = self.sigmoid_rule.rule
        if rule == "backbone_scale" and "logit_scale" not in names:
            raise ValueError(f"method {self.name!r}: sigmoid rule 'backbone_scale' (its card's or its family's) needs "
                             f"a logit_scale hparam; expected SigmoidRule 'unchanged' or 'refuse' on its card")
        if self.cost.state_words is not None:
            self.state_bytes(1, 1)  # an expression naming anything but K, d, n, w, a and its hparams is refused here

    def state_bytes(self, num_classes: int, dim: int, samples: int = 0, text_width: int | None = None,
                    aux_width: int | None = None) -> int:
        """Bytes of its state (`Cost.state_words`) at K = num_classes, d = dim after `samples` samples, w = text_width
        (its text tower's token width; None: d, as in ViT-B/16), a = aux_width (an auxiliary encoder's width;
        None: d), hparams at their defaults; a ValueError where it has no state_words or they are not such an
        expression."""
        if self.cost.state_words is None:
            raise ValueError(f"method {self.name!r}: its card gives no cost state_words")
        names = {**self.defaults(), "K": num_classes, "d": dim, "n": samples,
                 "w": dim if text_width is None else text_width, "a": dim if aux_width is None else aux_width}
        return int(math.ceil(4 * _arithmetic(self.cost.state_words, names, f"method {self.name!r} state_words")))

    @property
    def sigmoid_rule(self) -> SigmoidRule:
        """Its rule on a sigmoid-scored backbone: the card's own, else refused where the run is handed CLIP's text
        tower, else its family's, else the default."""
        if self.sigmoid is not None:
            return self.sigmoid
        if self.takes_text:  # before the family's: an encoder-family method that runs the text tower too
            return SigmoidRule("refuse", TEXT_TOWER_WHY)
        if self.family in FAMILY_SIGMOID_RULES:
            return FAMILY_SIGMOID_RULES[self.family]
        return SigmoidRule("backbone_scale" if any(h.name == "logit_scale" for h in self.hparams) else "unchanged")

    @property
    def takes_views(self) -> bool:
        return self.inputs == "views"

    @property
    def views_everywhere(self) -> bool:
        """Whether its protocol gives it augmented views on every dataset (it cannot run on single-view data)."""
        views = self.views
        return (self.takes_views and views.scope == "all" and not views.single_datasets
                and "single" not in (*views.groups.values(), *views.datasets.values()))

    def protocol_views(self, dataset: str) -> ViewConfig:
        """The views of this method's official protocol on a benchmark dataset (a sweep's `views: protocol`,
        `registry.views.METHOD_PROTOCOL`): its view kind (63 views + the original unless `Views.count` says
        otherwise), its `Views.datasets` or `Views.groups` for the dataset, or the single view. Methods taking one
        feature get the dataset's own protocol (AugMix on ImageNet-A/-V2/-R/-Sketch, reduced to the confident
        views' mean).
        tests/official_protocols.py holds what each official loader feeds, and a test holds every card to it."""
        if self.image_encoder is not None and not self.takes_views:  # one image a sample, the eval transform's
            return parse_views("single")
        card = dataset_card(dataset)
        own = parse_views(card.views)
        views = self.views
        if card.name in views.single_datasets:
            return parse_views("single")
        if not self.takes_views:
            return own
        kind = views.datasets.get(card.name, views.groups.get(card.group))
        if kind is None:
            if views.kind is None or (views.scope == "protocol" and own.kind == "single"):
                return own
            kind = views.kind
        if kind == "single":
            return parse_views("single")
        return ViewConfig(kind, n_aug=views.count - 1, seed=1)

    def wants_views(self, hparams: Mapping[str, Any]) -> bool:
        """Whether a run with these hparams (unset ones at their defaults) is handed a stream's augmented views
        [n, V, d] rather than their confident-view means [n, d]."""
        if self.inputs != "either":
            return self.takes_views
        merged = {**self.defaults(), **hparams}
        return all(merged.get(name) in allowed for name, allowed in self.views.when.items())

    def hparam(self, name: str) -> HParam:
        for h in self.hparams:
            if h.name == name:
                return h
        raise ValueError(f"unknown hparam {name!r} for method {self.name!r}; valid hparams: {self.hparam_names}")

    @property
    def hparam_names(self) -> list[str]:
        return sorted(h.name for h in self.hparams)

    @property
    def tunes_maple(self) -> bool:
        """Whether it tunes MaPLe's prompts in both towers from a MaPLe context (image_encoder params 'prompts':
        PromptAlign)."""
        return self.image_encoder is not None and self.image_encoder.params == "prompts"

    @property
    def takes_text(self) -> bool:
        """Whether a run is handed CLIP's text tower and class prompts: prompt tuning (`text_encoder`) and the
        image-encoder methods that run the text tower too (`ImageEncoderUse.text_tower`)."""
        return self.text_encoder is not None or (self.image_encoder is not None and self.image_encoder.text_tower)

    def defaults(self, dataset: str | None = None) -> dict[str, Any]:
        """Every hparam with its default; for a benchmark dataset, its per-dataset defaults (a corruption variant's:
        its own, else its benchmark's)."""
        key = dataset_key(dataset) if dataset is not None else None
        variant = parse_variant(key) if key is not None else None
        bench = variant[0] if variant else None
        return {h.name: h.per_dataset.get(key, h.per_dataset.get(bench, h.default)) for h in self.hparams}

    def resolve(self, hparams: Mapping[str, Any], dataset: str | None = None) -> dict[str, Any]:
        """Defaults overlaid by `hparams`, each value checked and in its kind, a null that means another hparam
        replaced by that one's value (`derived`); unknown names are refused."""
        unknown = sorted(set(hparams) - {h.name for h in self.hparams})
        if unknown:
            raise ValueError(f"unknown hparam {unknown[0]!r} for method {self.name!r}; "
                             f"valid hparams: {self.hparam_names}")
        merged = {**self.defaults(dataset), **hparams}
        return self.derived({h.name: h.check(self.name, merged[h.name]) for h in self.hparams})

    def derived(self, hparams: Mapping[str, Any]) -> dict[str, Any]:
        """`hparams` (checked) with each null that means another hparam (`null_means`) set to that one's value."""
        out = dict(hparams)
        for h in self.hparams:
            if h.null_means is not None and out.get(h.name, h.default) is None and h.null_means in out:
                out[h.name] = out[h.null_means]
        return out

    def inert(self, hparams: Mapping[str, Any]) -> list[str]:
        """The hparams that cannot affect a run with these values (their `when` is not met)."""
        return [h.name for h in self.hparams
                if any(hparams.get(other) not in allowed for other, allowed in h.when.items())]

    def grid_points(self, grid: Mapping[str, Any], dataset: str | None = None) -> Iterator[dict[str, Any]]:
        """Every distinct point of a grid over its hparams ({name: [values]}; a name not given: its default, per
        dataset for a benchmark dataset), each a dict of every hparam in sorted order, values checked and in their
        kind, as a run's config stores them: an hparam whose `when` is not met at that point at its default (it
        cannot affect the run, so a grid over it gives one run), a null that means another hparam that one's
        value (null and the equal explicit value are one run). The order is fixed: per combination of the
        values of the hparams that `when` and `null_means` name (sorted by name, each in grid order), the
        product of the others in name order (`grid_axes`)."""
        names, grids = self.grid_axes(grid, dataset)
        seen: set[tuple[Any, ...]] = set()
        for sub in grids:
            for point in itertools.product(*sub):
                if len(grids) > 1:  # sub-grids overlap (an inert hparam at its default, a null resolved)
                    if point in seen:
                        continue
                    seen.add(point)
                yield dict(zip(names, point))

    def grid_axes(self, grid: Mapping[str, Any], dataset: str | None = None
                  ) -> tuple[tuple[str, ...], list[tuple[tuple[Any, ...], ...]]]:
        """A grid's hparam names (sorted) and its sub-grids, each one tuple of values per name: their products in
        turn, with the points an earlier sub-grid gave dropped, are `grid_points` (a plan hashes the products
        without building each point's dict). One sub-grid per combination of the values of the hparams that
        `when` and `null_means` name (a single one where none does)."""
        unknown = sorted(set(grid) - {h.name for h in self.hparams})
        if unknown:
            raise ValueError(f"unknown hparam {unknown[0]!r} for method {self.name!r}; "
                             f"valid hparams: {self.hparam_names}")
        defaults = self.defaults(dataset)
        hps = sorted(self.hparams, key=lambda h: h.name)
        axes = {h.name: tuple(dict.fromkeys(h.check(self.name, v) for v in grid.get(h.name, [defaults[h.name]])))
                for h in hps}
        controllers = sorted({other for h in hps for other in h.when}
                             | {h.null_means for h in hps if h.null_means is not None})
        grids = []
        for combo in itertools.product(*(axes[name] for name in controllers)):
            chosen = dict(zip(controllers, combo))
            sub = []
            for h in hps:
                if h.name in chosen:
                    values: tuple[Any, ...] = (chosen[h.name],)
                elif any(chosen[other] not in allowed for other, allowed in h.when.items()):
                    values = (h.check(self.name, defaults[h.name]),)
                else:
                    values = axes[h.name]
                if h.null_means is not None and h.name not in chosen:
                    values = tuple(dict.fromkeys(chosen[h.null_means] if v is None else v for v in values))
                sub.append(values)
            grids.append(tuple(sub))
        return tuple(h.name for h in hps), grids

    def implementation(self) -> type:
        """The Method subclass (imported on first use: the card itself needs no torch)."""
        return _load(self.impl)

    def lockstep_runner(self, view_features: bool) -> Any:
        """The lockstep runner for features [n, V, d] (view_features) or [n, d], or None where it has none."""
        if self.lockstep is None:
            return None
        inputs = self.lockstep.inputs or self.inputs
        if inputs != "either" and (inputs == "views") != view_features:
            return None
        return _load(self.lockstep.runner)


def _load(target: Any) -> Any:
    """A "module:attribute" string imported, or the object itself."""
    if not isinstance(target, str):
        return target
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)
