"""The embedded synthetic benchmark: CLIP-like embeddings that need no weights and no images.

A simulator for tests and demos, not a stand-in for real CLIP features. It reproduces the structure
that online test-time adaptation exploits, with every knob explicit:

- K text anchors ``t_k`` on the unit sphere (the zero-shot class embeddings; with ``templates_per_class``
  t > 1, each class gets t prompt embeddings jittered around its anchor, embedding m belonging to class m % K).
- A modality gap: every image feature carries a shared offset ``g`` that no text embedding has, so raw
  image-text cosines sit in a narrow band as they do in CLIP (about 0.2-0.35 for the scenarios; about 0.1 for
  the CLIP-like presets, whose prompts share a component, below), and logit_scale 100 matters.
- A domain shift of chosen severity: the image-side class centre is the anchor pulled towards a random
  class-specific direction, ``c_k = normalise(t_k + shift * r_k + gap * g)``. Zero-shot CLIP classifies
  against ``t_k``; adapting the class embeddings towards the image centres (BCA's likelihood) recovers
  accuracy, and a skewed label distribution rewards prior adaptation.
- Isotropic noise: ``f = normalise(c_y + noise * e / sqrt(d))``, e ~ N(0, I).

Scenarios decide the label sequence (the stream order is part of the benchmark, so the stream is
returned already ordered):

- ``iid``: uniform class frequencies, seeded shuffle.
- ``label_shift``: class frequencies drawn from Dirichlet(``dirichlet_alpha``), i.i.d. order.
- ``temporal``: class-correlated runs (geometric run lengths with mean ``mean_run_length``): a non-i.i.d. order.
- ``continual``: ``num_domains`` consecutive domains, each with its own shift directions ``r_k``.

Deterministic: the same arguments give bit-identical tensors.

``make_clip_like(preset)`` is a second generator, closer to how CLIP's zero-shot errors are structured
(the scenarios above keep their data exactly). In ``make_synthetic`` each class's shift points in a
random direction, so zero-shot errors carry no systematic confusion between classes, which is exactly
what a learned prior or adapted class embeddings correct. ``make_clip_like`` adds four properties that
real CLIP features have, each with one parameter:

- Semantic groups (``group_size``, ``text_similarity``): class names come in families (dog breeds,
  aircraft variants, textures), and the prompts of one family have much closer text embeddings than
  unrelated ones; CLIP's zero-shot confusions concentrate inside such families (most ImageNet errors are
  between WordNet siblings; fine-grained sets are hard because all their classes are one family). Anchor
  ``t_k = normalise(sqrt(rho) G_j + sqrt(1 - rho) u_k)`` for group centre ``G_j``: same-group anchors
  have cosine about ``rho``, unrelated ones about 0 (the common component every CLIP prompt shares moves
  all logits alike, so it is left out).
- Drift towards a neighbour (``drift``): images of a class sit nearer to another class's prompt than the
  text geometry alone says (a photo of a laptop looks like "a notebook computer" more than the reverse),
  so confusions are systematic and asymmetric. Each class k picks one other class a(k) of its group at
  random (a(a(k)) is usually not k) and its image centre moves a fraction ``drift`` of the way from its
  anchor to a(k)'s: ``c_k = normalise(t_k + drift (t_a(k) - t_k) + shift r_k + gap g)``.
- Uneven pull (``pull``): on a balanced test set zero-shot CLIP predicts some classes far more often
  than others (its label bias, the reason for logit-adjustment and prior corrections), because some
  prompts sit closer to where all images lie. Each class embedding gets a component ``pull_k g`` along
  the images' shared direction g, with pull_k ~ N(0, ``pull``^2): a per-class logit offset shared by
  every image, i.e. a wrong built-in prior.
- Class-frequency skew (``skew``): Zipf-like frequencies p_k ~ (1 + rank_k)^-skew over a random ranking of
  the classes (0: balanced like ImageNet's validation set; about 1: long-tailed like natural data).
- A component every prompt shares (``text_common``): CLIP's class prompts ("a photo of a ...") have text
  embeddings far closer to each other than unrelated directions are, so the logit margins between classes are
  small and zero-shot CLIP at logit scale 100 is fairly well calibrated. Each class embedding is
  ``normalise(sqrt(c) C + sqrt(1 - c) e_k)`` for one shared direction C: the margins shrink by sqrt(1 - c),
  the ranking (and so the accuracy) stays, the confidences come down to CLIP's.

The presets set these from the regime they mimic, ``noise`` so that zero-shot accuracy lands near CLIP
ViT-B/16's in that regime (ImageNet 67%, fine-grained sets such as DTD, Aircraft, EuroSAT 25-50%) and
``text_common`` so that its calibration does too (an ECE of a few percent, mean confidence near accuracy:
tests/test_synthetic_clip_statistics.py states the published targets and holds the presets to them); each
states the zero-shot accuracy it measures (tested within a band). Nothing was tuned on an adapted method's
accuracy. The stream is in dataset order with i.i.d. labels; stream protocols
(``orchestrator/data/streams.py``) reorder it.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import torch

from orchestrator.data.types import Benchmark

SYNTHETIC_SCENARIOS = ("iid", "label_shift", "temporal", "continual")


def _unit_rows(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def _label_sequence(scenario: str, n: int, num_classes: int, gen: torch.Generator, dirichlet_alpha: float,
                    mean_run_length: float) -> torch.Tensor:
    if scenario in ("iid", "continual"):
        return torch.randint(num_classes, (n,), generator=gen)
    if scenario == "label_shift":
        # torch.distributions takes no generator, so the Dirichlet is drawn from the seeded generator by hand.
        freqs = _seeded_dirichlet(num_classes, dirichlet_alpha, gen)
        return torch.multinomial(freqs, n, replacement=True, generator=gen)
    # temporal: runs of one class with geometric lengths, classes drawn uniformly per run.
    labels = torch.empty(n, dtype=torch.int64)
    stop_prob = 1.0 / max(mean_run_length, 1.0)
    pos = 0
    while pos < n:
        u = torch.rand((), generator=gen, dtype=torch.float64).clamp_min(1e-12)
        length = 1 + int(math.log(float(u)) / math.log1p(-stop_prob)) if stop_prob < 1.0 else 1
        labels[pos:pos + length] = int(torch.randint(num_classes, (), generator=gen))
        pos += length
    return labels


def _seeded_dirichlet(k: int, alpha: float, gen: torch.Generator) -> torch.Tensor:
    """Dirichlet(alpha) via normalised Gamma draws (Marsaglia-Tsang), using only the seeded generator."""
    boost = alpha < 1.0
    a = alpha + 1.0 if boost else alpha
    d = a - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    draws = []
    for _ in range(k):
        while True:
            x = float(torch.randn((), generator=gen, dtype=torch.float64))
            v = (1.0 + c * x) ** 3
            if v <= 0:
                continue
            u = float(torch.rand((), generator=gen, dtype=torch.float64))
            if math.log(max(u, 1e-300)) < 0.5 * x * x + d - d * v + d * math.log(v):
                g = d * v
                break
        if boost:
            g *= float(torch.rand((), generator=gen, dtype=torch.float64)) ** (1.0 / alpha)
        draws.append(max(g, 1e-300))
    w = torch.tensor(draws, dtype=torch.float64)
    return w / w.sum()


def make_synthetic(
    scenario: str = "iid",
    *,
    num_classes: int = 50,
    dim: int = 128,
    n: int = 4000,
    seed: int = 0,
    templates_per_class: int = 1,
    shift: float = 1.6,
    gap: float = 1.0,
    noise: float = 1.6,
    template_jitter: float = 0.15,
    dirichlet_alpha: float = 0.3,
    mean_run_length: float = 20.0,
    num_domains: int = 3,
) -> Benchmark:
    """Build one synthetic benchmark (see the module docstring for the generative model)."""
    if scenario not in SYNTHETIC_SCENARIOS:
        raise ValueError(f"unknown synthetic scenario {scenario!r}; expected one of {', '.join(SYNTHETIC_SCENARIOS)}")
    for name, value, low in (("num_classes", num_classes, 2), ("dim", dim, 2), ("n", n, 1),
                             ("templates_per_class", templates_per_class, 1), ("num_domains", num_domains, 1)):
        if int(value) != value or value < low:
            raise ValueError(f"synthetic {name} must be an integer >= {low}, got {value!r}")
    for name, value in (("shift", shift), ("gap", gap), ("noise", noise), ("template_jitter", template_jitter)):
        if not (value >= 0 and math.isfinite(value)):
            raise ValueError(f"synthetic {name} must be a finite number >= 0, got {value!r}")
    if not dirichlet_alpha > 0:
        raise ValueError(f"synthetic dirichlet_alpha must be > 0, got {dirichlet_alpha!r}")
    if not mean_run_length >= 1:
        raise ValueError(f"synthetic mean_run_length must be >= 1, got {mean_run_length!r}")

    gen = torch.Generator().manual_seed(int(seed))
    k, d = num_classes, dim
    anchors = _unit_rows(torch.randn(k, d, generator=gen, dtype=torch.float64))
    gap_dir = _unit_rows(torch.randn(d, generator=gen, dtype=torch.float64))
    jitter = torch.randn(templates_per_class, k, d, generator=gen, dtype=torch.float64) / math.sqrt(d)
    class_embeddings = _unit_rows(anchors.unsqueeze(0) + template_jitter * jitter).reshape(templates_per_class * k, d)
    class_ids = torch.arange(templates_per_class * k, dtype=torch.int64) % k

    domains = num_domains if scenario == "continual" else 1
    shift_dirs = _unit_rows(torch.randn(domains, k, d, generator=gen, dtype=torch.float64))
    centres = _unit_rows(anchors.unsqueeze(0) + shift * shift_dirs + gap * gap_dir)  # [domains, K, d]

    labels = _label_sequence(scenario, n, k, gen, dirichlet_alpha, mean_run_length)
    domain_of = torch.div(torch.arange(n) * domains, n, rounding_mode="floor")
    eps = torch.randn(n, d, generator=gen, dtype=torch.float64)
    features = _unit_rows(centres[domain_of, labels] + noise * eps / math.sqrt(d))

    name = f"synthetic-{scenario}"
    return Benchmark(
        name=name,
        features=features.to(torch.float32),
        labels=labels,
        image_ids=[f"{name}/{seed}/{i:07d}" for i in range(n)],
        class_names=[f"class_{c:04d}" for c in range(k)],
        class_embeddings=class_embeddings.to(torch.float32),
        class_ids=class_ids,
    )


@dataclass(frozen=True)
class ClipLikeParams:
    """``make_clip_like``'s generative parameters (see the module docstring)."""

    num_classes: int
    group_size: int          # classes per semantic group; must divide num_classes
    text_similarity: float   # cosine between the text anchors of one group, in [0, 1)
    drift: float             # fraction of the way towards the attractor's anchor, in [0, 1]
    pull: float              # std of the per-class pull along the images' shared direction
    skew: float              # Zipf exponent of the class frequencies (0: balanced)
    noise: float
    n: int
    dim: int = 128
    shift: float = 1.0
    gap: float = 1.0
    templates_per_class: int = 1
    template_jitter: float = 0.15
    text_common: float = 0.0  # cosine every prompt embedding shares, in [0, 1)

    def __post_init__(self) -> None:
        for name, low in (("num_classes", 2), ("group_size", 1), ("n", 1), ("dim", 2), ("templates_per_class", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"clip-like {name} must be an integer >= {low}, got {value!r}")
        if self.num_classes % self.group_size:
            raise ValueError(f"clip-like group_size must divide num_classes {self.num_classes}, got {self.group_size}")
        if not (isinstance(self.text_similarity, (int, float)) and 0 <= self.text_similarity < 1):
            raise ValueError(f"clip-like text_similarity must be a number in [0, 1), got {self.text_similarity!r}")
        if not (isinstance(self.text_common, (int, float)) and 0 <= self.text_common < 1):
            raise ValueError(f"clip-like text_common must be a number in [0, 1), got {self.text_common!r}")
        if not (isinstance(self.drift, (int, float)) and 0 <= self.drift <= 1):
            raise ValueError(f"clip-like drift must be a number in [0, 1], got {self.drift!r}")
        for name in ("pull", "skew", "noise", "shift", "gap", "template_jitter"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"clip-like {name} must be a finite number >= 0, got {value!r}")
        if self.drift > 0 and self.group_size < 2:
            raise ValueError(f"clip-like drift {self.drift} needs group_size >= 2 (a neighbour to drift towards)")


@dataclass(frozen=True)
class ClipLikePreset:
    params: ClipLikeParams
    mimics: str
    zero_shot_accuracy: float  # zero-shot CLIP top-1 measured at seeds 0-2 (tests hold it within a band)


CLIP_LIKE_PRESETS: dict[str, ClipLikePreset] = {
    "imagenet_like": ClipLikePreset(
        ClipLikeParams(num_classes=100, group_size=4, text_similarity=0.5, drift=0.3, pull=0.03, skew=0.0,
                       noise=1.3, n=5000, text_common=0.9),
        "ImageNet: many classes in small families of siblings, a balanced test set", 0.670),
    "fine_grained": ClipLikePreset(
        ClipLikeParams(num_classes=50, group_size=10, text_similarity=0.8, drift=0.3, pull=0.05, skew=0.0,
                       noise=1.0, n=3000, text_common=0.9),
        "fine-grained sets (Aircraft, DTD, EuroSAT): few families of near-identical class names", 0.417),
    "long_tailed": ClipLikePreset(
        ClipLikeParams(num_classes=100, group_size=4, text_similarity=0.5, drift=0.3, pull=0.03, skew=1.0,
                       noise=1.3, n=5000, text_common=0.9),
        "imagenet_like with long-tailed class frequencies, as in natural collections", 0.627),
}


def make_clip_like(preset: str, *, seed: int = 0, **overrides) -> Benchmark:
    """A preset's benchmark, with any ``ClipLikeParams`` field overridden (see the module docstring)."""
    if preset not in CLIP_LIKE_PRESETS:
        raise ValueError(f"unknown clip-like preset {preset!r}; expected one of {', '.join(CLIP_LIKE_PRESETS)}")
    known = {f.name for f in fields(ClipLikeParams)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown clip-like parameter {unknown[0]!r}; expected one of {sorted(known)}")
    p = replace(CLIP_LIKE_PRESETS[preset].params, **overrides)
    gen = torch.Generator().manual_seed(int(seed))
    k, d, groups = p.num_classes, p.dim, p.num_classes // p.group_size

    def gauss(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    group_of = torch.arange(k) // p.group_size
    centres_g = _unit_rows(gauss(groups, d))
    anchors = _unit_rows(math.sqrt(p.text_similarity) * centres_g[group_of]
                         + math.sqrt(1 - p.text_similarity) * _unit_rows(gauss(k, d)))
    gap_dir = _unit_rows(gauss(d))
    # Attractor: a random other member of the class's own group (offset 1..group_size-1 within the group).
    offset = (torch.randint(1, p.group_size, (k,), generator=gen) if p.group_size > 1
              else torch.zeros(k, dtype=torch.int64))
    attractor = group_of * p.group_size + (torch.arange(k) % p.group_size + offset) % p.group_size
    centres = _unit_rows(anchors + p.drift * (anchors[attractor] - anchors) + p.shift * _unit_rows(gauss(k, d))
                         + p.gap * gap_dir)
    pulled = anchors + p.pull * gauss(k, 1) * gap_dir
    jitter = gauss(p.templates_per_class, k, d) / math.sqrt(d)
    class_embeddings = _unit_rows(pulled.unsqueeze(0) + p.template_jitter * jitter).reshape(-1, d)
    class_ids = torch.arange(p.templates_per_class * k, dtype=torch.int64) % k

    rank = torch.randperm(k, generator=gen).to(torch.float64)
    freqs = (1.0 + rank) ** -p.skew
    labels = torch.multinomial(freqs / freqs.sum(), p.n, replacement=True, generator=gen)
    features = _unit_rows(centres[labels] + p.noise * gauss(p.n, d) / math.sqrt(d))
    if p.text_common > 0:  # drawn last, so the images are the same with or without it
        common = _unit_rows(gauss(d))
        class_embeddings = _unit_rows(math.sqrt(p.text_common) * common
                                      + math.sqrt(1 - p.text_common) * class_embeddings)

    name = f"synthetic-{preset}"
    return Benchmark(
        name=name,
        features=features.to(torch.float32),
        labels=labels,
        image_ids=[f"{name}/{seed}/{i:07d}" for i in range(p.n)],
        class_names=[f"class_{c:04d}" for c in range(k)],
        class_embeddings=class_embeddings.to(torch.float32),
        class_ids=class_ids,
    )


# ------------------------------------------------------------------------- a simulated auxiliary encoder
AUXILIARY_NOISE = 1.0
_AUXILIARY_STREAM = 7919  # offsets the auxiliary draw's seed from the benchmark's own


def auxiliary_features(bench: Benchmark, seed: int, noise: float = AUXILIARY_NOISE) -> torch.Tensor:
    """[n, d] features of a second, simulated image encoder for the benchmark's samples (what a backbone's DINOv2
    gives a real dataset): class centres of its own, drawn independently of the CLIP-like ones and with no text
    side, and isotropic noise, f = normalise(a_y + noise * e / sqrt(d)). It stands for an encoder whose image
    clusters are tighter than CLIP's (as COSMIC uses DINOv2), not for DINOv2's numbers. Its own generator: the
    benchmark's tensors are the same with or without it."""
    gen = torch.Generator().manual_seed(int(seed) * _AUXILIARY_STREAM + 1)
    k, d = len(bench.class_names), bench.features.shape[-1]
    centres = _unit_rows(torch.randn(k, d, generator=gen, dtype=torch.float64))
    eps = torch.randn(len(bench), d, generator=gen, dtype=torch.float64)
    return _unit_rows(centres[bench.labels] + noise * eps / math.sqrt(d)).to(torch.float32)


# ------------------------------------------------------------------------- one entry point for both kinds
SYNTHETIC_KINDS = SYNTHETIC_SCENARIOS + tuple(CLIP_LIKE_PRESETS)


def synthetic_defaults(kind: str) -> dict[str, Any]:
    """Every generative parameter of a scenario (`make_synthetic`'s) or a CLIP-like preset (its ClipLikeParams),
    with its value when the spec does not set it: what a run config pins."""
    if kind in CLIP_LIKE_PRESETS:
        return asdict(CLIP_LIKE_PRESETS[kind].params)
    if kind not in SYNTHETIC_SCENARIOS:
        raise ValueError(f"unknown synthetic scenario or preset {kind!r}; expected one of {', '.join(SYNTHETIC_KINDS)}")
    return {name: p.default for name, p in inspect.signature(make_synthetic).parameters.items()
            if name not in ("scenario", "seed")}


def synthesize(kind: str, *, seed: int, **params: Any) -> Benchmark:
    """A scenario's or a preset's benchmark; a parameter the kind does not have is a ValueError naming it."""
    known = synthetic_defaults(kind)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"{unknown[0]} is not a parameter of synthetic {kind!r}; expected some of {sorted(known)}")
    if kind in CLIP_LIKE_PRESETS:
        return make_clip_like(kind, seed=seed, **params)
    return make_synthetic(kind, seed=seed, **params)
